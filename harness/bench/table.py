"""The benchmark table: a results record as aligned text, as ``attn-harness bench`` prints it.

Pure formatting of a ``RunRecord`` (no timing, no torch), shared by the
command line, the report and the GPU script.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.text_table import aligned

if TYPE_CHECKING:
    from harness.results.store import CaseRecord, RunRecord

WIDTH = 110  # detail and legend lines below the table are wrapped to this
BACKEND_WIDTH = 28  # longer backend specs are shortened in the table
SUMMARY_KINDS = 3  # flag kinds the closing line names; the rest are counted


# -- flags and the closing verdict -------------------------------------------------


def all_flags(record: RunRecord) -> list[str]:
    """The run's flags, then each case's, as ``KIND: detail`` text."""
    return [*record.flags, *(flag for case in record.cases for flag in case.flags)]


def flag_kind(flag: str) -> str:
    """``measurement error: compute at 220% ...`` -> ``measurement error``."""
    kind, sep, _ = flag.partition(": ")
    return kind if sep else "note"


def flag_gist(flag: str) -> str:
    """The detail up to its first ``;`` or `` (``: what the closing line shows of a flag."""
    _, sep, detail = flag.partition(": ")
    detail = detail if sep else flag
    for stop in ("; ", " ("):
        detail = detail.split(stop, 1)[0]
    return detail


def flag_summary(flags: Sequence[str], kinds: int = SUMMARY_KINDS) -> str:
    """``no flags`` or ``3 flags: 2 measurement error (compute at 220% of its ceiling, ...),
    1 ceiling spread (...)``: the count, then the commonest kinds with a first example."""
    if not flags:
        return "no flags"
    by_kind: dict[str, list[str]] = {}
    for flag in flags:
        by_kind.setdefault(flag_kind(flag), []).append(flag_gist(flag))
    ranked = sorted(by_kind.items(), key=lambda item: -len(item[1]))
    parts = []
    for kind, gists in ranked[:kinds]:
        more = ", ..." if len(set(gists)) > 1 else ""
        parts.append(f"{len(gists)} {kind} ({gists[0]}{more})")
    if len(ranked) > kinds:
        parts.append(f"{sum(len(g) for _, g in ranked[kinds:])} more")
    return f"{len(flags)} flag{'' if len(flags) == 1 else 's'}: " + ", ".join(parts)


def bench_verdict(record: RunRecord) -> str:
    """``passed (4 PASSED, 2 UNSUPPORTED), no flags`` or ``FAILED (...), 3 flags: ...``.

    The counts are the backends' cases, as the report's "cases timed" counts them;
    the SDPA peer's are added only where one of them did not pass.

    The closing line of ``attn-harness bench`` (after ``bench: ``) and the bench
    part of the main job's closing line. Failed: a case failed, or nothing passed.
    """
    from harness.bench.peer import PEER_NAME

    def listed(counts: Counter[str]) -> str:
        return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))

    every = Counter(c.status for c in record.cases)
    from harness.results.store import FAILING_STATUSES  # here: the CLI's parser loads no store

    failed = any(s in FAILING_STATUSES for s in every) or "PASSED" not in every
    # the backends' cases, as the report counts them; the peer's only where one did not pass
    backends = Counter(c.status for c in record.cases if c.backend != PEER_NAME)
    peer = Counter(c.status for c in record.cases if c.backend == PEER_NAME)
    shown = listed(backends) or ("no backend cases" if peer else "no cases")
    if set(peer) - {"PASSED"}:
        shown += f"; peer: {listed(peer)}"
    partial = ", partial" if record.partial else ""
    verdict = "FAILED" if failed else "passed"
    return f"{verdict} ({shown}{partial}), {flag_summary(all_flags(record))}"


def format_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def short_backend_names(names: Sequence[str], width: int = BACKEND_WIDTH) -> dict[str, str]:
    """Name -> what the table shows, at most ``width`` characters.

    A longer spec is shown as ``file.py:Class`` or ``module:Class``, else as
    ``Class``, else cut short with ``...``; names that would be shown alike
    keep their full spelling. The table's legend names each shortened spec.
    """
    shown: dict[str, str] = {}
    for name in dict.fromkeys(names):
        target, sep, cls = name.rpartition(":")
        candidates = [name]
        if sep and target and cls:
            place = Path(target).name if target.endswith(".py") else target.rpartition(".")[2]
            candidates += [f"{place}:{cls}", cls]
        label = next((c for c in candidates if len(c) <= width), None)
        shown[name] = label or candidates[-1][: width - 3] + "..."
    counts: dict[str, int] = {}
    for label in shown.values():
        counts[label] = counts.get(label, 0) + 1
    return {name: (label if counts[label] == 1 else name) for name, label in shown.items()}


def _ratio(metrics: dict[str, Any], to: str = "peer") -> str:
    """``ratio_to_peer`` (or ``ratio_to_engine``) with its interval: ``1.26x [1.22-1.31]``."""
    ratio = metrics.get(f"ratio_to_{to}")
    if ratio is None:
        return "-"
    ci = metrics.get(f"ratio_to_{to}_ci")
    return f"{ratio:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")


def _roofline(metrics: dict[str, Any]) -> str:
    fraction = metrics.get("roofline_fraction")
    if fraction is None:
        return "-"
    bound = {"memory": " mem", "compute": " cmp"}.get(metrics.get("bound") or "", "")
    return f"{fraction:.0%}{bound}"


def _row(case: CaseRecord, backend: str, notes: list[int], engine: bool) -> list[str]:
    """One backend's row; a case that did not pass shows its status and nothing timed.
    ``engine``: the run has an engine peer, so the row has its ratio's column."""
    forward = ci = prepare = tokens = roof = ratio = to_engine = "-"
    if case.status == "PASSED" and case.forward is not None:  # only a correct answer is a time
        s = case.forward.summary()
        forward = format_ns(s.median)
        if s.median > 0:
            ci = f"±{(s.ci_high - s.ci_low) / 2 / s.median:.1%}"
        if case.prepare is not None:
            prepare = format_ns(case.prepare.summary().median)
        m = case.metrics or {}
        tokens, roof, ratio = _rate(m.get("tokens_per_s")), _roofline(m), _ratio(m)
        to_engine = _ratio(m, "engine")
    flags = "[" + ",".join(map(str, notes)) + "]" if notes else ""
    row = [f"    {backend}", case.status, forward, ci, prepare, tokens, roof, ratio]
    return [*row, *([to_engine] if engine else []), flags]


def _confidence(record: RunRecord) -> float:
    for case in record.cases:
        if case.forward is not None:
            return case.forward.confidence
    return 0.95


def _wrap(text: str, indent: str = "    ") -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _workload_line(record: RunRecord, case: CaseRecord) -> str:
    line = f"{case.workload}@{case.workload_version}"
    for w in record.workloads:
        if (w.get("name"), w.get("version")) == (case.workload, case.workload_version):
            if w.get("description"):
                line += f": {w['description']}"
            break
    return textwrap.shorten(line, WIDTH, placeholder=" ...")


def _case_line(case: CaseRecord) -> str:
    spec = case.spec or {}
    queries = spec.get("query_lens") or []
    shape = f"{len(queries)} seqs, {sum(queries)} new tokens, {spec.get('dtype', '?')}"
    if spec.get("dp_size", 1) > 1:
        shape += f", rank {spec.get('dp_rank')} of dp {spec.get('dp_size')}"
    return f"  {case.case}  ({shape})"


def _ceilings_lines(record: RunRecord) -> list[str]:
    """The ceilings used, and how many probe rounds they are the best of, with the spread."""
    ceilings = record.ceilings.get(record.ceilings.get("used") or "", None)
    if not ceilings:
        return []
    flops = ", ".join(
        f"{dtype} matmul {value / 1e9:.4g} GFLOP/s"
        for dtype, value in ceilings["matmul_flops"].items()
    )
    bandwidth = ceilings["memory_bandwidth"]
    shown = "-" if bandwidth is None else f"{bandwidth / 1e9:.4g} GB/s"
    how = ceilings["source"]
    probes = record.ceilings.get("probes") or []
    if how == "measured" and len(probes) > 1:
        spreads = record.ceilings.get("spread") or {}
        widest = max(spreads.items(), key=lambda kv: kv[1]["spread"], default=None)
        how += f", best of {len(probes)} probes"
        if widest is not None:
            name = "copy" if widest[0] == "copy" else f"{widest[0].removeprefix('matmul_')} matmul"
            how += f", widest spread {widest[1]['spread']:.0%} ({name})"
    return _wrap(f"ceilings ({how}): copy {shown}; {flops}")


def render(record: RunRecord) -> str:
    """The readable summary printed at the end of a run.

    One table, grouped by workload and case (the workload and case on their own
    lines, one row per backend), about 100 columns wide; errors, flags, long
    backend specs and what each column means follow on lines below it.
    """
    from harness.bench.engine_peer import engines_in
    from harness.bench.peer import PEER_NAME

    names = short_backend_names([c.backend for c in record.cases])
    engine = "/".join(engines_in(record.cases))  # an MHA case's engine, an MLA case's
    header = [
        "workload / case / backend",
        "status",
        "forward",
        f"{_confidence(record):.0%} CI",
        "prepare",
        "tok/s",
        "roofline",
        "x peer [95% CI]",
        *([f"x {engine} [95% CI]"] if engine else []),
        "flags",
    ]
    rows = [header]
    notes: list[str] = []
    details: list[str] = []
    workload = case_name = None
    for case in record.cases:
        if (case.workload, case.workload_version) != workload:
            workload = (case.workload, case.workload_version)
            case_name = None
            rows.append([_workload_line(record, case)])
        if case.case != case_name:
            case_name = case.case
            rows.append([_case_line(case)])
        where = f"{names[case.backend]} on {case.workload}@{case.workload_version} {case.case}"
        numbers = []
        for flag in case.flags:
            notes.append(f"[{len(notes) + 1}] {where}: {flag}")
            numbers.append(len(notes))
        rows.append(_row(case, names[case.backend], numbers, bool(engine)))
        if case.error and case.status != "PASSED":
            details.append(f"{case.status}: {where}: {case.error}")
    lines = [*aligned(rows), ""]
    for text in details:
        lines.extend(_wrap(text))
    if notes:
        lines.extend(
            _wrap(
                "flags: [n] points to note n below: a warning about that row, e.g. a rate "
                "above 100% of its ceiling (a measurement error, not a result)"
            )
        )
        for text in notes:
            lines.extend(_wrap(text))
    for name, label in names.items():
        if label != name:
            lines.extend(_wrap(f"backend {label} is {name}"))
    lines.extend(
        _wrap(
            f"columns: forward = median time of one forward call (validation off), with ± half "
            f"its CI's width; prepare = median prepare time (host clock); roofline = share of "
            f"the binding ceiling (mem: bandwidth, cmp: compute); x peer = forward time / "
            f"{PEER_NAME} forward time (> 1: slower)"
            + (f"; x {engine} = forward time / the engine's on the same pages" if engine else "")
            + "; a case that did not pass is not timed"
        )
    )
    lines.extend(_ceilings_lines(record))
    overhead = record.timing.get("overhead") or {}
    source = record.timing.get("threads_source")
    lines.extend(
        _wrap(
            f"timing: {record.timing['clock']}, torch threads {record.timing['threads']}"
            f"{f' ({source})' if source else ''}, "
            f"cold cache {'on' if record.timing['cold_cache'] else 'off'}, timer overhead "
            f"{format_ns(overhead.get('median_ns'))} (empty call)"
        )
    )
    for flag in record.flags:
        lines.extend(_wrap(f"run flag: {flag}"))
    lines.append(f"bench: {bench_verdict(record)}")
    return "\n".join(lines)
