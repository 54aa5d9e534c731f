"""Figures the docs quote from a command are checked against the code that produces them.

* docs/conformance.md's table of ``python -m harness.numerics.discrimination --variants``:
  one row per case of the code, in its order; each correct computation's worst
  ratio within 10% of the range the row gives (the figures differ between
  AVX-512 and AVX2 machines, so a row may give both), each bug's least ratio
  within 5% of its figure. The table is recomputed here (about 20 s on one
  thread).
* The coverage table of ``attn-harness conform --backend reference -v`` quoted in
  docs/conformance.md: its rows are
  ``claim_coverage.DIMENSIONS`` in order (``reference`` claims every variant,
  so every dimension has counts), then the pairs and the stateful runs, and
  ``CoverageLog.table`` prints the quoted counts exactly so; every row sums to
  the rank-steps; the test functions are those of the suite that count
  examples; the stateful runs are the ``ci`` profile's; the counts reach every
  value ``ci`` promises for ``reference``, and the pairs row every claimed
  cell; the JUnit property quoted beside it is the table's dtype row.

The counts themselves change with the code (hypothesis mixes the checkout's
constants into its draws), so they are not recomputed.

* docs/write-a-backend.md's figures, from ``python tools/guide_figures.py``:
  the quick check's case count and the conform test count are what
  ``--counts-only`` computes today; the top-left failure count is what the
  quick check finds on the guide's backend with ``visible.tril()`` (a few
  seconds), and the failure line it quotes names one of those cases; every
  time the guide gives (seconds, in prose or in a quoted output) sits in a
  paragraph naming that command, a date and the machine. The times are not
  rerun.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.conformance.claim_coverage import DIMENSIONS, BackendCoverage, CoverageLog
from harness.conformance.coverage_promises import Requirement, requirements
from harness.conformance.pair_coverage import PAIR_DIMENSIONS
from harness.conformance.profiles import get_profile
from harness.core.registry import default_registry
from harness.numerics import discrimination
from tools import guide_figures
from tools.doc_blocks import FENCE

pytestmark = pytest.mark.xdist_group("discrimination")  # one worker computes the tables

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "docs" / "conformance.md"
GUIDE = ROOT / "docs" / "write-a-backend.md"

CORRECT_SLACK = 0.10  # a correct figure: within 10% of the range the doc gives
BUG_SLACK = 0.05  # a bug's figure: within 5% (it is given to 2-3 digits)


# --- the variant discrimination table -------------------------------------------------


def _variant_rows() -> list[tuple[str, list[float], dict[str, float]]]:
    """(case, correct figures, {bug: figure}) for each row of the doc's table."""
    text = CONFORMANCE.read_text()
    start = text.index("| case | correct (FlashAttention-style")
    rows = []
    for line in text[start:].split("\n\n", 1)[0].splitlines()[2:]:
        case, correct, bugs = (cell.strip() for cell in line.strip("|").split("|"))
        figures = [float(f) for f in correct.split("/")]
        named = dict(entry.rsplit(":", 1) for entry in bugs.split(";"))
        rows.append((case, figures, {k.strip(): float(v) for k, v in named.items()}))
    return rows


def test_variant_table_has_a_row_per_case_in_order():
    cases = [c.name for c in discrimination.VARIANT_CASES]
    assert [case for case, _, _ in _variant_rows()] == cases


def test_variant_table_figures_stay_on_the_right_side_of_the_bound():
    for case, correct, bugs in _variant_rows():
        assert max(correct) <= 0.25, f"{case}: a correct figure over a quarter of the bound"
        assert min(bugs.values()) > 1.0, f"{case}: a bug's figure inside the bound"


@pytest.mark.parametrize(
    ("case", "correct", "bugs"), _variant_rows(), ids=[row[0] for row in _variant_rows()]
)
def test_variant_table_figures_match_the_command(variant_ratios, case, correct, bugs):
    measured = {(label, dtype): r for (label, dtype, c), r in variant_ratios.items() if c == case}
    table = discrimination.format_table(variant_ratios)
    worst = max(r for (label, _), r in measured.items() if label in discrimination.VARIANT_CORRECT)
    low, high = min(correct) / (1 + CORRECT_SLACK), max(correct) * (1 + CORRECT_SLACK)
    assert low <= worst <= high, f"{case}: correct worst {worst:.3g}, doc {correct}\n{table}"
    applied = {label for label, _ in measured if label in discrimination.VARIANT_BUGS}
    assert set(bugs) == applied, f"{case}: the doc names bugs {sorted(bugs)}, the code {applied}"
    for bug, figure in bugs.items():
        least = min(r for (label, _), r in measured.items() if label == bug)
        assert abs(least - figure) <= BUG_SLACK * figure, f"{case}, {bug}: {least:.3g}\n{table}"


# --- the coverage example ---------------------------------------------------------------

HEADER = re.compile(
    r"attn-harness coverage of '(?P<backend>[^']+)': (?P<examples>\d+) examples held in "
    r"(?P<tests>\d+) test functions, (?P<steps>\d+) rank-steps \(counted below\)"
)
STATEFUL = re.compile(
    r"(?P<runs>\d+) runs, forward steps per run median [\d.]+ \(p10 [\d.]+\); "
    r"runs reaching: (?P<reached>[^;]+)(?:; skipped: .+)?"
)


def _coverage_example(path: Path) -> list[str]:
    fenced = r"^```\w*\n(attn-harness coverage of .*?)^```"
    blocks = re.findall(fenced, path.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"{path.name}: {len(blocks)} coverage examples"
    return blocks[0].rstrip("\n").splitlines()


def _rows(lines: list[str]) -> dict[str, str]:
    """Each row's dimension and its cells, as printed."""
    rows = {}
    for line in lines[1:]:
        dimension, cells = line.strip().split(None, 1)
        rows[dimension] = cells
    return rows


def _counts(cells: str) -> Counter[str]:
    """``float32 1712  float16 1342`` as counts; labels may hold single spaces."""
    counts: Counter[str] = Counter()
    for cell in filter(None, cells.split("  ")):
        label, n = cell.strip().rsplit(" ", 1)
        counts[label] = int(n)
    return counts


def _counting_tests() -> list[str]:
    """The suite's test functions that count examples: they call ``check`` or record them."""
    counting = {"check", "record_examples", "record_run"}
    names = []
    for path in sorted((ROOT / "suites" / "conformance").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                calls = {
                    n.func.id
                    for n in ast.walk(node)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                }
                if calls & counting:
                    names.append(node.name)
    return names


@pytest.fixture(scope="module")
def example() -> list[str]:
    return _coverage_example(CONFORMANCE)


def _promised_for_reference() -> list[Requirement]:
    """What the ``ci`` profile promises ``reference`` reaches, pairs' cells included."""
    entry = default_registry().entry("reference")
    budget = get_profile("ci").budget
    return requirements(
        entry.capabilities,
        dp_aware=entry.accepts_dp,
        max_dp_size=budget.max_dp_size,
        max_context=budget.max_context,
        limit=budget.production,
        large_pool=True,  # the example's machine held a pool past 2^31 elements
    )


def _every_claimed_cell(wanted: list[Requirement]) -> dict[str, Counter[str]]:
    return {p: Counter(r.wanted for r in wanted if r.dimension == p) for p in PAIR_DIMENSIONS}


def test_coverage_example_has_every_dimension_in_the_codes_order(example):
    assert HEADER.fullmatch(example[0]), example[0]
    assert list(_rows(example)) == [*DIMENSIONS, "pairs", "stateful"]


def test_coverage_example_is_what_the_table_prints_for_its_counts(example):
    header = HEADER.fullmatch(example[0])
    assert header
    examples, tests = int(header["examples"]), int(header["tests"])
    rows = _rows(example)
    per_test = {f"test_{i}": 1 for i in range(tests - 1)} | {"last": examples - tests + 1}
    wanted = _promised_for_reference()
    single = {d: _counts(rows.get(d, "")) for d in DIMENSIONS}
    cover = BackendCoverage(
        examples=Counter(per_test), by_test={"all": single | _every_claimed_cell(wanted)}
    )
    log = CoverageLog(backends={header["backend"]: cover})
    printed = log.table(header["backend"], wanted)
    assert ["attn-harness " + printed[0], *printed[1:]] == example[:-1]


def test_coverage_example_rows_each_sum_to_the_rank_steps(example):
    header = HEADER.fullmatch(example[0])
    assert header
    for dimension, cells in _rows(example).items():
        if dimension not in ("pairs", "stateful"):
            assert sum(_counts(cells).values()) == int(header["steps"]), dimension


def test_coverage_example_counts_the_suites_test_functions(example):
    header = HEADER.fullmatch(example[0])
    assert header
    assert int(header["tests"]) == len(_counting_tests()), _counting_tests()


def test_coverage_example_stateful_runs_are_the_ci_profiles(example):
    stateful = STATEFUL.fullmatch(_rows(example)["stateful"])
    assert stateful, _rows(example)["stateful"]
    runs = int(stateful["runs"])
    assert runs == get_profile("ci").stateful_examples
    for reached in stateful["reached"].split(", "):
        n, of = reached.rsplit(" ", 1)[1].split("/")
        assert int(of) == runs, reached
        assert 0 < int(n) <= runs, reached


def test_coverage_example_reaches_everything_ci_promises_for_reference(example):
    header = HEADER.fullmatch(example[0])
    assert header
    assert header["backend"] == "reference"
    wanted = _promised_for_reference()
    rows = _rows(example)
    cover = BackendCoverage(by_test={"all": {d: _counts(rows.get(d, "")) for d in DIMENSIONS}})
    single = [r for r in wanted if r.dimension in DIMENSIONS]
    missing = [f"{r.dimension} {r.wanted}" for r in cover.missing(single)]
    assert not missing, missing
    claimed = _every_claimed_cell(wanted)
    expected = "  ".join(f"{p} {len(claimed[p])}/{len(claimed[p])}" for p in PAIR_DIMENSIONS)
    assert rows["pairs"] == expected  # every claimed cell of every pair checked


def test_junit_property_example_is_the_tables_dtype_row(example):
    quoted = re.findall(r"`coverage\[reference\]\.dtype = ([^`]+)`", CONFORMANCE.read_text())
    assert quoted, "docs/conformance.md quotes no JUnit coverage property"
    dtype = _counts(_rows(example)["dtype"])
    assert set(quoted) == {"; ".join(f"{label}={n}" for label, n in dtype.items())}


# --- the write-a-backend guide's figures ------------------------------------------------

CHECK_ROW = re.compile(
    r"^my_backend\.py:MyBackend +(?P<passed>\d+) +(?P<failed>\d+) +(?P<errors>\d+) "
    r"+(?P<unsupported>\d+) ",
    re.MULTILINE,
)
TOP_LEFT = re.compile(r"\(`visible\.tril\(\)`\).*?(\d+) of the (\d+) cases failed", re.DOTALL)
CONFORM_LINE = re.compile(
    r"PASSED: every property held for my_backend\.py:MyBackend \((\d+) tests[;)]"
)
QUOTED_FAILURE = re.compile(r"^FAILED +top_left\.py:TopLeft: ([^:]+): ", re.MULTILINE)
SECONDS = re.compile(r"\b\d+(?:\.\d+)? ?(?:s|seconds?|ms|min|minutes?)\b")
PRODUCED = re.compile(
    re.escape(guide_figures.COMMAND) + r"\b.*\b\d{4}-\d{2}-\d{2}\b.*\b\d+ cores?\b", re.DOTALL
)


def _guide_paragraphs() -> list[str]:
    """The guide's prose paragraphs; a code block is read with the paragraph after it,
    which says where its output came from. Headings are left out."""
    paragraphs, pending = [], ""
    for part in re.split(r"(^```[\w-]*\n.*?^```[ \t]*$)", GUIDE.read_text(), flags=re.M | re.S):
        if FENCE.fullmatch(part):
            pending += part + "\n"
            continue
        for paragraph in re.split(r"\n\s*\n", part):
            if paragraph.strip() and not paragraph.lstrip().startswith("#"):
                paragraphs.append(pending + paragraph)
                pending = ""
    return paragraphs


@pytest.fixture(scope="module")
def counts() -> dict[str, int]:
    """What ``python tools/guide_figures.py --counts-only`` prints, as figure -> count."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "guide_figures.py"), "--counts-only"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = re.findall(
        r"^\| `(\w+)` (\w+), my_backend\.py:MyBackend \| (\d+) \|$", done.stdout, re.M
    )
    assert len(rows) == 2, done.stdout
    return {f"{command} {what}": int(n) for command, what, n in rows}


@pytest.fixture(scope="module")
def top_left_failures(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The quick check's failed cases on the guide's backend with its mask aligned top-left."""
    from harness.conformance.check_matrix import run_quick_check
    from harness.core.registry import BackendRegistry
    from harness.core.threads import fixed_threads

    files = guide_figures.write_backends(tmp_path_factory.mktemp("guide"))
    entry = BackendRegistry(autoload=False).resolve(f"{files[guide_figures.TOP_LEFT_SPEC]}:TopLeft")
    with fixed_threads(1):
        results = run_quick_check(entry)
    return [r.case for r in results if r.status in ("FAILED", "ERROR")]


def test_guide_check_table_counts_the_quick_checks_cases(counts):
    row = CHECK_ROW.search(GUIDE.read_text())
    assert row, "the guide quotes no check table row for my_backend.py:MyBackend"
    assert int(row["failed"]) == int(row["errors"]) == int(row["unsupported"]) == 0
    assert int(row["passed"]) == counts["check cases"], "re-run python tools/guide_figures.py"


def test_guide_top_left_failures_are_the_quick_checks(counts, top_left_failures):
    text = GUIDE.read_text()
    figures = TOP_LEFT.search(text)
    assert figures, "the guide gives no top-left failure count"
    failed, of = int(figures[1]), int(figures[2])
    assert of == counts["check cases"], "re-run python tools/guide_figures.py"
    assert failed == len(top_left_failures), "re-run python tools/guide_figures.py"
    quoted = QUOTED_FAILURE.findall(text)
    assert quoted, "the guide quotes no failure line of top_left.py:TopLeft"
    assert set(quoted) <= set(top_left_failures), f"{quoted} do not fail"


def test_guide_conform_test_count_is_the_suites(counts):
    quoted = CONFORM_LINE.findall(GUIDE.read_text())
    assert quoted, "the guide quotes no passing conform line for my_backend.py:MyBackend"
    assert {int(n) for n in quoted} == {counts["conform tests"]}, "re-run tools/guide_figures.py"


def test_guide_top_left_variant_changes_only_the_mask():
    source = guide_figures.guide_backend()
    variant = guide_figures.top_left_backend(source).splitlines()
    changed = [(a, b) for a, b in zip(source.splitlines(), variant, strict=True) if a != b]
    assert [b for _, b in changed] == [
        "# top_left.py",
        "class TopLeft(PagedBackendBase):",
        '                logits = logits.masked_fill(~visible.tril(), float("-inf"))',
    ]
    assert "visible.tril(length - q_len)" in changed[-1][0]


def test_guide_times_name_the_command_date_and_machine():
    timed = [p for p in _guide_paragraphs() if SECONDS.search(p)]
    assert len(timed) >= 2, "the guide gives no times (check and conform)"
    for paragraph in timed:
        assert PRODUCED.search(paragraph), (
            f"a time in the guide without `{guide_figures.COMMAND}`, a date and the cores:\n"
            f"{paragraph}"
        )
