"""Run the conformance suite against every planted bug and say which properties caught it.

    python -m suites.mutants.kill_matrix [--profile kill|ci|thorough]
        [--mutants all|variants|field|latent]

It prints the matrix (mutants down, tests across), then for each test the
mutants only it catches, or a note naming the test that subsumes it.

One pytest run, spread over the cores, checks all mutants and the built-ins; the JUnit report
(each test case carries its backend as a property) gives, per backend, the
tests that failed. A mutant no test fails is a survivor, a gap in the suite.
The threshold mutants (``suites.mutants.thresholds``) are wrong only past a
production shape (a 256-key split, a 64-row query tile, page size 16, head
dim 128, GQA group 8, 64 sequences, int16 lengths and ids, 8 DP ranks), so
only a profile that draws such shapes kills them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness.conformance.runner import pytest_arguments
from harness.processes.supervisor import run
from suites.mutants.backends import FIELD_MUTANTS, LATENT_MUTANTS, MUTANTS, VARIANT_MUTANTS
from suites.mutants.dimensions import triage_rate

BUILTINS = ("reference", "sdpa", "reference-mla", "compiled-mla")


def mutant_specs(catalogue: tuple[type, ...] = MUTANTS) -> list[str]:
    """Each mutant as ``module:Class`` of the module that defines it."""
    return [f"{cls.__module__}:{cls.__name__}" for cls in catalogue]


@dataclass(frozen=True)
class SuiteVerdict:
    backend: str
    outcomes: dict[str, str]  # test function -> "failed" | "passed" | "skipped"
    seconds: dict[str, float] = field(default_factory=dict)  # test function -> time it took
    triage: tuple[dict, ...] = ()  # the run's failure groups (``harness.conformance.triage``)

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(sorted(t for t, o in self.outcomes.items() if o == "failed"))

    @property
    def caught(self) -> bool:
        return bool(self.failed)


SUBSUMED = {
    "test_physical_page_order_is_irrelevant": "every planted page-order bug also fails "
    "test_outputs_match_oracle, which draws shuffled pages too",
    "test_per_rank_and_shared_layouts_agree": "every planted layout bug also fails "
    "test_outputs_match_oracle, which draws both layouts",
    "test_every_rank_matches_oracle": "test_outputs_match_oracle checks every rank position "
    "one rank at a time; this test adds ranks sharing a pool",
    "test_each_rank_keeps_to_its_pages": "test_stateful_steps runs the same schedules among "
    "its random programs; this test names the DP partition",
    "test_ranks_together_equal_each_alone": "cross-rank interference large enough to plant "
    "also fails test_every_rank_matches_oracle, and run-to-run noise also fails "
    "test_second_run_is_bit_identical; this test catches sub-tolerance interference",
    "test_second_run_is_bit_identical": "test_ranks_together_equal_each_alone demands bit "
    "identity too and so also catches NonDeterministic; this is its single-rank form",
    "test_foreign_pages_rejected": "a whole foreign step is refused by a backend that checks "
    "either the block table (test_foreign_block_table_entry_rejected) or the slots "
    "(test_foreign_slot_rejected); this test needs only one of the two",
    "test_outputs_match_oracle": "every numeric bug also fails the other tests that compare "
    "with the oracle (ranks, steps, layouts); this is the one that names it plainly",
    "test_production_shapes_match_oracle": "the threshold mutants are also caught by the "
    "tests that draw a production shape one time in four",
    "test_only_mapped_slots_change": "test_each_rank_keeps_to_its_pages, "
    "test_production_shapes_write_only_mapped_slots and test_stateful_steps run the same "
    "canary (ZeroesPageTail, WritesPaddingSlots)",
    "test_stateful_steps": "test_each_rank_keeps_to_its_pages also steps one backend "
    "several times (StalePlanCache)",
    "test_production_shapes_write_only_mapped_slots": "test_only_mapped_slots_change draws "
    "production shapes one time in four",
    "test_bind_rejects_caches_without_the_ranks_pages": "the built-in base class makes this "
    "check for every subclass, so no planted bug can skip it alone",
    "test_constructor_rejects_bad_values": "the constructor's checks live in the base class "
    "(harness.core.validate.validate_backend_args)",
}
"""Why a test with no bug of its own is kept: which other test catches its planted bugs."""


def run_suite(
    specs: list[str],
    profile: str,
    workers: int | None = None,
    tests: dict[str, list[str] | str] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, SuiteVerdict]:
    """Per backend, each test's outcome: one pytest run of ``specs`` over ``workers``
    pytest-xdist processes.

    ``tests`` narrows each backend to the conformance tests it names (``"*"``:
    all; see ``suites.mutants.selection``); without it every backend runs the
    whole suite.

    Each backend's draws depend only on the test and the backend's claim
    (derandomized profiles), not on which process runs it, so the workers
    change the wall time, not the verdicts; an idle worker takes tests from a
    busy one's queue, so one costly bug does not hold the run up. ``workers``
    defaults to the usable cores (the suite runs torch on one thread per
    process). ``extra`` goes to pytest (``--max-shrinks 40``, ``--examples 20``).
    """
    count = max(1, min(workers or len(os.sched_getaffinity(0)), len(specs)))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # as `conform` runs it
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        narrowing: list[str] = []
        if tests is not None:
            selection = Path(tmp) / "backend-tests.json"
            selection.write_text(json.dumps({spec: tests[spec] for spec in specs}))
            narrowing = ["-p", "suites.mutants.selection", "--backend-tests", str(selection)]
        arguments = pytest_arguments(specs, profile, str(report), extra, workers=count)
        run(
            [sys.executable, "-m", "pytest", "-q", *narrowing, *arguments],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not report.exists():
            raise RuntimeError("the conformance run wrote no JUnit report")
        tree = ET.parse(report)
        triage = _read_triage(report.with_suffix(".coverage.json"))
    outcomes: dict[str, dict[str, str]] = defaultdict(dict)
    seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    _read_outcomes(tree, outcomes, seconds)
    return {
        spec: SuiteVerdict(spec, dict(outcomes[spec]), dict(seconds[spec]), triage.get(spec, ()))
        for spec in specs
    }


def _read_triage(path: Path) -> dict[str, tuple[dict, ...]]:
    """Each backend's failure groups, from the coverage file beside the JUnit report."""
    if not path.exists():
        return {}
    backends = json.loads(path.read_text())["backends"]
    return {name: tuple(backend.get("triage", ())) for name, backend in backends.items()}


def _read_outcomes(
    tree: ET.ElementTree,
    outcomes: dict[str, dict[str, str]],
    seconds: dict[str, dict[str, float]],
) -> None:
    """Each JUnit test case's outcome, under the backend its ``backend`` property names."""
    for case in tree.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        backend = props.get("backend")
        if backend is None:
            continue
        name = (case.get("name") or "").split("[")[0]
        seconds[backend][name] += float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        seen = outcomes[backend].get(name)  # parametrized tests: any failure counts
        if seen != "failed" and (seen is None or outcome != "skipped"):
            outcomes[backend][name] = outcome


def exclusive_catches(
    verdicts: dict[str, SuiteVerdict], mutants: list[str]
) -> dict[str, list[str]]:
    """Per test, the mutants that it and no other test catches."""
    only: dict[str, list[str]] = defaultdict(list)
    for spec in mutants:
        failed = verdicts[spec].failed
        if len(failed) == 1:
            only[failed[0]].append(spec)
    return only


def declared_catchers(verdicts: dict[str, SuiteVerdict], mutants: list[str]) -> dict[str, str]:
    """Per mutant, the one test to hold it to: the test that alone catches it, else the
    cheapest of those that catch it (by this run's time). What ``catchers.py`` records."""
    only = exclusive_catches(verdicts, mutants)
    exclusive = {spec: test for test, specs in only.items() for spec in specs}
    chosen = {}
    for spec in mutants:
        verdict = verdicts[spec]
        if spec in exclusive:
            chosen[spec] = exclusive[spec]
        elif verdict.failed:
            chosen[spec] = min(verdict.failed, key=lambda t: (verdict.seconds.get(t, 0.0), t))
    return chosen


def catchers_module(chosen: dict[str, str], profile: str) -> str:
    """The text of ``suites/mutants/catchers.py`` for ``chosen``."""
    lines = [
        '"""The conformance test that each planted bug is held to (``tests/test_mutants.py``).',
        "",
        "Written by ``python -m suites.mutants.kill_matrix --write-catchers`` from a full",
        f"``{profile}`` run: the test that alone catches the bug where one does, else the",
        "cheapest of the tests that catch it. The test suite runs each bug on its test only",
        "and requires that test to fail; the full matrix (every bug on every test, and which",
        "test alone catches which bug) is ``nox -s mutants``.",
        '"""',
        "",
        "CAUGHT_BY: dict[str, str] = {",
    ]
    lines += [f'    "{spec}": "{test}",' for spec, test in sorted(chosen.items())]
    lines += ["}", ""]
    return "\n".join(lines)


def print_matrix(verdicts: dict[str, SuiteVerdict], tests: list[str]) -> None:
    """Backends down, tests across (numbered, legend below): X caught, . passed, - skipped."""
    width = max(len(_short(v)) for v in verdicts)
    header = " ".join(f"{i:>2}" for i in range(1, len(tests) + 1))
    print(f"{'':{width}}  {header}")
    marks = {"failed": " X", "passed": " .", "skipped": " -"}
    for spec, verdict in verdicts.items():
        cells = " ".join(marks.get(verdict.outcomes.get(t, ""), "  ") for t in tests)
        print(f"{_short(spec):{width}}  {cells}")
    for i, test in enumerate(tests, 1):
        print(f"  {i:>2} {test}")


def _short(spec: str) -> str:
    return spec.rsplit(":", 1)[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="kill", choices=("kill", "ci", "thorough"))
    parser.add_argument(
        "--mutants",
        default="all",
        choices=("all", "variants", "field", "latent"),
        help="every planted bug, only the attention variants', the field catalogue's (real "
        "engine bugs) or MLA kernels' (default: all)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write each backend's outcomes and times"
    )
    parser.add_argument(
        "--write-catchers",
        action="store_true",
        help="rewrite suites/mutants/catchers.py (each bug's test) from this run; needs "
        "--mutants all",
    )
    args = parser.parse_args()
    catalogues = {
        "all": MUTANTS,
        "variants": VARIANT_MUTANTS,
        "field": FIELD_MUTANTS,
        "latent": LATENT_MUTANTS,
    }
    planted = mutant_specs(catalogues[args.mutants])
    specs = [*BUILTINS, *planted]
    print(
        f"running the {args.profile} profile over {len(specs)} backends in one pytest process "
        "(split over the usable cores; the matrix prints at the end)",
        flush=True,
    )
    started = time.perf_counter()
    verdicts = run_suite(specs, args.profile)
    print(f"ran in {time.perf_counter() - started:.0f} s\n")
    if args.json is not None:
        record = {s: {"outcomes": v.outcomes, "seconds": v.seconds} for s, v in verdicts.items()}
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    tests = sorted({t for v in verdicts.values() for t in v.outcomes})
    print_matrix(verdicts, tests)
    only = exclusive_catches(verdicts, planted)
    print("\ncaught by this test alone:")
    for test in tests:
        mine = ", ".join(_short(s) for s in only.get(test, []))
        print(f"  {test}: {mine or 'none; ' + SUBSUMED.get(test, 'NO NOTE: a gap to explain')}")
    mutants = [verdicts[s] for s in planted]
    killed = sum(v.caught for v in mutants)
    clean = all(not verdicts[b].caught for b in BUILTINS)
    survivors = [_short(v.backend) for v in mutants if not v.caught]
    print(
        f"kill rate: {killed}/{len(mutants)} ({100 * killed / len(mutants):.0f}%); "
        f"built-ins {'all pass' if clean else 'FAIL'}"
        + (f"; survivors: {', '.join(survivors)}" if survivors else "")
    )
    right, judged, wrong = triage_rate({s: verdicts[s].triage for s in planted})
    print(
        f"triage: {right}/{judged} planted bugs' failure groups name where the bug lives "
        f"(suites/mutants/dimensions.py)" + (f"; not: {', '.join(wrong)}" if wrong else "")
    )
    unexplained = [t for t in tests if not only.get(t) and t not in SUBSUMED]
    if args.write_catchers and killed == len(mutants) and args.mutants == "all":
        target = Path(__file__).with_name("catchers.py")
        target.write_text(catchers_module(declared_catchers(verdicts, planted), args.profile))
        print(f"wrote {target}")
    return 0 if killed == len(mutants) and clean and not unexplained else 1


if __name__ == "__main__":
    sys.exit(main())
