"""What a conformance run promised to reach and what it reached: the coverage a
profile requires of each backend whose whole suite ran, the gaps, and the tally
as the coverage file and the JUnit report's properties hold it.

Each function reads a :class:`~harness.conformance.session.ConformanceSession`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.conformance.runner import suite_modules

if TYPE_CHECKING:
    from harness.conformance.session import ConformanceSession


def promised(run: ConformanceSession, entry: Any) -> list[Any]:
    """What the profile promises to reach inside ``entry``'s claim (nothing if it does not)."""
    from harness.conformance.coverage_promises import requirements

    profile = run.profile_for(entry)
    if not profile.enforces_coverage:
        return []
    budget = profile.budget
    return requirements(
        entry.capabilities,
        dp_aware=entry.accepts_dp,
        max_dp_size=budget.max_dp_size,
        max_context=budget.max_context,
        limit=budget.production,
        large_pool=large_pool_fits(run, entry),
        device=run.device,
    )


def large_pool_fits(run: ConformanceSession, entry: Any) -> bool:
    """Whether the machine that ran ``entry``'s tests could hold its large pool (a merge of
    shards asks what their machines said, not the machine it runs on)."""
    from harness.conformance.large_pool import large_pool_scenario, unavailable_reason

    if run.large_pools is not None and entry.name in run.large_pools:
        return run.large_pools[entry.name]
    large = large_pool_scenario(entry.capabilities, run.device)
    return large is not None and unavailable_reason(large) is None


def whole_suite_ran(run: ConformanceSession, name: str) -> bool:
    """Every conformance module ran for this backend and nothing was deselected (a shard
    ran a part: its promises are judged once the shards are merged)."""
    if run.options.shard is not None and run.options.shard.count > 1:
        return False
    return not run.deselected and suite_modules() <= run.modules.get(name, set())


def wanted(run: ConformanceSession) -> dict[str, list[Any]]:
    """Per backend whose whole suite ran: what the profile promises it reaches."""
    if run.coverage is None:
        return {}
    entries = {e.name: e for e in run.selected_entries()}
    return {
        name: promised(run, entries[name])
        for name in run.coverage.backends
        if name in entries and whole_suite_ran(run, name)
    }


def coverage_gaps(run: ConformanceSession) -> dict[str, list[Any]]:
    """Per backend whose whole suite ran: the promised values never checked."""
    return {
        name: run.coverage.backends[name].missing(values) for name, values in wanted(run).items()
    }


def coverage_json(run: ConformanceSession) -> dict[str, Any] | None:
    """The tally as the ``.coverage.json`` file holds it, with each backend's failure
    groups (``triage``); ``None`` when nothing ran."""
    from harness.conformance.triage import group_json

    groups = run.failure_groups()
    if run.coverage is None and not groups:
        return None
    backends = run.coverage.as_json(wanted(run)) if run.coverage is not None else {}
    for group in groups:
        backend = backends.setdefault(group.failures[0].backend, {})
        backend.setdefault("triage", []).append(group_json(group))
    return {
        "profile": run.options.profile,
        "examples_per_test": int(run.profile().settings.max_examples),
        "backends": backends,
    }


def junit_properties(run: ConformanceSession) -> list[tuple[str, str]]:
    """The tally as the JUnit report's test-suite properties: ``coverage[NAME].DIM``."""
    data = coverage_json(run)
    if data is None:
        return []
    properties = []
    for name, backend in data["backends"].items():
        if "examples" not in backend:
            continue  # failures, and no example counted (a rejection test's)
        properties.append((f"coverage[{name}].examples", str(backend["examples"])))
        for dimension, counts in backend["dimensions"].items():
            cells = "; ".join(f"{label}={n}" for label, n in counts.items())
            properties.append((f"coverage[{name}].{dimension}", cells))
        stateful = backend["stateful"]
        if stateful.get("runs"):
            properties.append(
                (
                    f"coverage[{name}].stateful",
                    f"runs={stateful['runs']} steps_median={stateful['steps_median']} "
                    f"steps_p10={stateful['steps_p10']}",
                )
            )
        if backend["never_checked"]:
            never = "; ".join(backend["never_checked"])
            properties.append((f"coverage[{name}].never_checked", never))
    for i, line in enumerate(run.triage_lines()):
        properties.append((f"triage.{i}", line))
    return properties
