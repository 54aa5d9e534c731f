"""The results files of a sweep's shards merged into the file the whole sweep writes.

``attn-harness bench --shard K/N`` runs one share of a sweep on whichever
machine a scheduler gives it (``harness.bench.sweep_plan``); its file's
``shard`` field names the whole sweep: every case, in the order a run without
``--shard`` writes them, and the backends. ``merge_results`` checks that the
shards belong together and cover the sweep exactly once, then lays their
records out in that order. A case's records (its peer and every backend) come
whole from one shard, and the gate compares each backend's ratio to its
in-run peer from the raw samples, so the merged file reports and gates as an
unsharded run of the same cases does.

Refused with a ``MergeError`` (a ``ValueError``) that names the file and the
problem: a file that is not a shard (a whole run, or one already merged); a
partial shard (it stopped before its last case); a shard missing, given twice,
or of a split into another count (``harness.core.shards.check_complete``);
shards of different sweeps (other cases, backends, workloads, harness version,
git commit, or timing settings); a case in two shards, outside the sweep, or
in none.

The merged record: the cases in the sweep's order, the workloads once, the
latest shard's ``created``; shard 1's ``environment``, ``ceilings`` and
``timing`` at the top level; every shard's own (and its command and case
count) in ``merged_from``; the shards' run flags, each once; no ``shard``
field, since the file is whole. Shards may run on different machines: each
case keeps the metrics its own shard computed against its own ceilings, and
withholding a contradicted ceiling's fractions stays within the shard whose
case exceeded it. A report recomputes roofline shares against the top-level
(shard 1's) ceilings, so where shards' machines differ the merged run says so
in a flag (``shards differ: ...``), which the report shows with the run.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.shards import Shard, check_complete
from harness.results.store import CaseRecord, RunRecord, load_results

SWEEP_TIMING = ("device", "cold_cache", "cuda_graph", "config", "prepare_config", "case_timeout_s")
"""The timing settings every shard of one sweep shares (the rest describe its machine)."""
MACHINE = (
    "device_name",
    "cpu_model",
    "cpus_allowed",
    "driver",
    "cuda_runtime",
    "python",
    "torch",
    "triton",
    "threads",
)
"""Environment fields whose difference between shards the merged run's flags name."""
SHOWN = 80  # characters of a differing value quoted in a message


class MergeError(ValueError):
    """Shards that cannot be merged; the message names the file and the problem."""


@dataclass(frozen=True)
class _Part:
    """One shard's record, the name its messages use, and its place in the sweep."""

    name: str
    record: RunRecord
    shard: Shard

    @property
    def sweep(self) -> dict[str, Any]:
        return self.record.shard or {}

    def label(self) -> str:
        return f"{self.name} (shard {self.shard})"


def merge_result_files(paths: Sequence[str | os.PathLike[str]]) -> RunRecord:
    """Load the shards' results files at ``paths``, check and merge them (``merge_results``).

    A file that cannot be read or is no results file raises the store's
    ``ResultsError``, a ``ValueError`` naming it; save the merged record with
    ``harness.results.store.save_results``.
    """
    records = [load_results(path) for path in paths]
    return merge_results(records, names=[os.fspath(path) for path in paths])


def merge_results(records: Sequence[RunRecord], names: Sequence[str] | None = None) -> RunRecord:
    """The whole sweep's record from its shards' ``records`` (any order); ``names`` (file
    names, by default ``results 1``, ``results 2``, ...) label them in messages."""
    if names is None:
        names = [f"results {i + 1}" for i in range(len(records))]
    if len(names) != len(records):
        raise ValueError(f"{len(records)} records but {len(names)} names")
    if not records:
        raise MergeError("no shards to merge")
    parts = sorted(
        (_part(name, record) for name, record in zip(names, records, strict=True)),
        key=lambda p: p.shard.index,
    )
    _check_complete(parts)
    first = parts[0]
    for part in parts[1:]:
        _check_same_sweep(first, part)
    cases = _cases_in_order(parts)
    return RunRecord(
        created=max(p.record.created for p in parts),
        tool={**first.record.tool, "command": None},  # each shard's own is in merged_from
        environment=copy.deepcopy(first.record.environment),
        ceilings=copy.deepcopy(first.record.ceilings),
        timing=copy.deepcopy(first.record.timing),
        workloads=copy.deepcopy(first.record.workloads),
        cases=cases,
        source=copy.deepcopy(first.record.source),
        flags=_flags(parts),
        merged_from=[_origin(p) for p in parts],
    )


def _part(name: str, record: RunRecord) -> _Part:
    if record.shard is None:
        if record.merged_from:
            raise MergeError(
                f"{name}: already merged from {len(record.merged_from)} shards; "
                "merge the shards' own files"
            )
        raise MergeError(
            f"{name}: not a shard's results (no 'shard' field): written by bench without --shard"
        )
    try:
        shard = Shard.from_json({k: record.shard.get(k) for k in ("index", "count")})
    except ValueError as exc:
        raise MergeError(f"{name}: {exc}") from None
    if record.partial:
        raise MergeError(
            f"{name}: shard {shard} is partial (it stopped before its last case); "
            "run that shard again"
        )
    return _Part(name, record, shard)


def _check_complete(parts: Sequence[_Part]) -> None:
    try:
        check_complete([p.shard for p in parts])
    except ValueError as exc:
        given = ", ".join(p.label() for p in parts)
        raise MergeError(f"cannot merge: {exc} (given: {given})") from None


def _identity(part: _Part) -> dict[str, Any]:
    """What makes two shards parts of one sweep."""
    record = part.record
    git = record.environment.get("git")
    return {
        "cases": part.sweep.get("cases"),
        "backends": part.sweep.get("backends"),
        "workloads": record.workloads,
        "harness version": (record.tool.get("name"), record.tool.get("version")),
        "git commit": git.get("sha") if isinstance(git, dict) else None,
        **{f"timing.{key}": record.timing.get(key) for key in SWEEP_TIMING},
    }


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _check_same_sweep(first: _Part, part: _Part) -> None:
    mine, theirs = _identity(part), _identity(first)
    differ = [key for key in theirs if mine[key] != theirs[key]]
    if differ:
        what = "; ".join(f"{key}: {_shown(mine[key])} vs {_shown(theirs[key])}" for key in differ)
        raise MergeError(f"{part.label()} is a shard of another sweep than {first.label()}: {what}")


def case_key(record: CaseRecord) -> str:
    """``workload@version/case``: the key a shard's ``cases`` lists the record's case by."""
    return f"{record.workload}@{record.workload_version}/{record.case}"


def _cases_in_order(parts: Sequence[_Part]) -> list[CaseRecord]:
    """Every record, each case's from the one shard that ran it, in the sweep's order."""
    order: list[str] = list(parts[0].sweep.get("cases") or [])
    places = set(order)
    owner: dict[str, _Part] = {}
    by_case: dict[str, list[CaseRecord]] = {}
    for part in parts:
        for record in part.record.cases:
            key = case_key(record)
            if key not in places:
                raise MergeError(f"{part.label()}: case {key!r} is not one of its sweep's cases")
            ran = owner.setdefault(key, part)
            if ran is not part:
                raise MergeError(
                    f"case {key!r} ran in two shards: {ran.label()} and {part.label()}"
                )
            by_case.setdefault(key, []).append(copy.deepcopy(record))
    missing = [key for key in order if key not in by_case]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise MergeError(
            f"{len(missing)} of the sweep's {len(order)} cases ran in no shard: {shown}"
        )
    return [record for key in order for record in by_case[key]]


def _flags(parts: Sequence[_Part]) -> list[str]:
    """The shards' run flags, each once, in shard order; and whether their machines differ."""
    flags = list(dict.fromkeys(f for p in parts for f in p.record.flags))
    envs = [p.record.environment for p in parts]
    differ = [k for k in MACHINE if len({_shown(env.get(k)) for env in envs}) > 1]
    if differ:
        each = "; ".join(
            f"{p.shard}: " + ", ".join(f"{k}={p.record.environment.get(k)}" for k in differ)
            for p in parts
        )
        flags.append(
            f"shards differ: {each} (each case's metrics are against its own shard's "
            "ceilings; the run's environment and ceilings are shard 1's)"
        )
    return flags


def _origin(part: _Part) -> dict[str, Any]:
    """What ``merged_from`` keeps of a shard: where, when and how it ran."""
    record = part.record
    return {
        "shard": part.shard.as_json(),
        "created": record.created,
        "command": record.tool.get("command"),
        "environment": copy.deepcopy(record.environment),
        "ceilings": copy.deepcopy(record.ceilings),
        "timing": copy.deepcopy(record.timing),
        "cases": len({case_key(c) for c in record.cases}),
    }
