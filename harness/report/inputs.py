"""What a report is built from: results files, pytest-benchmark JSON, conformance JUnit XML.

Every problem with an input ends in one ``ReportError`` naming the file and
what is wrong with it, before anything is written: a report is built from
inputs that all loaded, or not at all. A folder contributes every ``*.json``
and ``*.xml`` in it; there (and only there) a file that is recognisably some
other document, such as a GPU run's ``graph-check.json``, is passed over and
listed in ``Inputs.skipped``, while a damaged file of a known kind still
stops the build. ``NAME.coverage.json`` is read as the sibling of ``NAME.xml``.

Only ``load_results`` (and through it torch) is heavy; it is imported when a
results file is actually loaded.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.results.pairs import PairRecord
    from harness.results.store import RunRecord

RESULTS_SCHEMA = "attn-harness/results"
COVERAGE_SUFFIX = ".coverage.json"
OUTCOMES = ("passed", "failed", "unsupported")
JUNIT_ROOTS = ("testsuites", "testsuite")


class ReportError(ValueError):
    """An input cannot be used, or the report cannot be written; the message names the file."""


class _NotThisKind(ReportError):
    """A well-formed file that is neither kind of input: skipped inside a folder."""


@dataclass(frozen=True)
class ConformanceCase:
    """One JUnit testcase of a conformance run, reduced to what the report shows."""

    backend: str
    test: str  # the test function's name, without its [parameters]
    outcome: str  # "passed" | "failed" | "unsupported"
    message: str | None = None
    not_checked: int = 0  # examples an interpreted run's cost budget left out


@dataclass
class ConformanceRun:
    """One ``attn-harness conform --junitxml`` file and its coverage sibling."""

    path: Path
    cases: list[ConformanceCase]
    examples: dict[str, dict[str, int]]  # backend -> test -> examples held
    profile: str | None = None
    device: str | None = None
    created: str | None = None

    def failed(self) -> list[ConformanceCase]:
        return [c for c in self.cases if c.outcome == "failed"]


@dataclass
class BenchRun:
    """One benchmark run and the short label that tells it apart in a side-by-side view."""

    path: Path
    record: RunRecord
    label: str  # device + date + short git sha, disambiguated


@dataclass
class PairRun:
    """One paired A/B comparison (``attn-harness ab --out``)."""

    path: Path
    record: PairRecord


@dataclass
class Inputs:
    bench: list[BenchRun]
    conformance: list[ConformanceRun]
    skipped: list[str] = field(default_factory=list)  # "path: why", files passed over in folders
    pairs: list[PairRun] = field(default_factory=list)


# -- finding the files ------------------------------------------------------------------


def _expand(paths: Sequence[str | Path]) -> list[tuple[Path, bool]]:
    """``(file, named)`` for every input; ``named`` is False for a file found in a folder."""
    if not paths:
        raise ReportError("no input given: name results files, JUnit XML files or folders")
    found: list[tuple[Path, bool]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(_folder_files(path))
        elif path.is_file():
            found.append((path, True))
        elif path.exists():
            raise ReportError(f"{path}: not a regular file or folder")
        else:
            raise ReportError(f"{path}: no such file or folder")
    return _unique(found)


def _folder_files(folder: Path) -> list[tuple[Path, bool]]:
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise ReportError(f"{folder}: cannot list folder: {exc.strerror or exc}") from None
    chosen = [
        p
        for p in entries
        if p.suffix in (".json", ".xml") and not p.name.endswith(COVERAGE_SUFFIX) and p.is_file()
    ]
    if not chosen:
        raise ReportError(f"{folder}: folder holds no *.json or *.xml file to report on")
    return [(p, False) for p in chosen]


def _unique(found: list[tuple[Path, bool]]) -> list[tuple[Path, bool]]:
    """Each file once (named in two ways, it is still one run)."""
    seen: dict[Path, int] = {}
    unique: list[tuple[Path, bool]] = []
    for path, named in found:
        key = path.resolve()
        if key in seen:
            index = seen[key]
            unique[index] = (unique[index][0], unique[index][1] or named)
            continue
        seen[key] = len(unique)
        unique.append((path, named))
    return unique


# -- reading ----------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")  # a BOM is not content
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a text (UTF-8) file") from None


def _parse_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not valid JSON, or cut short (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None


def _load_json_run(path: Path, text: str) -> RunRecord:
    """A results file or suites/benchmarks pytest-benchmark JSON, as a checked ``RunRecord``."""
    from harness.results.store import ResultsError

    data = _parse_json(path, text)
    try:
        if isinstance(data, dict) and ("schema" in data or "schema_version" in data):
            from harness.results.store import load_results

            return load_results(path)
        if isinstance(data, dict) and "benchmarks" in data:
            return _converted(path, data)
    except ResultsError as exc:
        raise ReportError(_named(path, str(exc))) from None
    raise _NotThisKind(
        f"{path}: neither an attn-harness results file (no 'schema' field) nor pytest-benchmark "
        "JSON (no 'benchmarks' field)"
    )


def _converted(path: Path, data: dict[str, Any]) -> RunRecord:
    """pytest-benchmark JSON converted, then held to the results schema like a results file."""
    from harness.results.pytest_benchmark import from_pytest_benchmark
    from harness.results.store import validate_document

    record = from_pytest_benchmark(data, origin=str(path))
    validate_document(record.to_json(), origin=str(path))
    return record


def _named(path: Path, message: str) -> str:
    return message if str(path) in message else f"{path}: {message}"


def load_junit(path: Path) -> ConformanceRun:
    """A conformance run from JUnit XML, with per-test example counts from its coverage JSON."""
    path = Path(path)
    return _junit(path, _read_text(path))


def _junit(path: Path, text: str) -> ConformanceRun:
    root = _parse_xml(path, text)
    if root.tag not in JUNIT_ROOTS:
        raise _NotThisKind(
            f"{path}: not JUnit XML (root element <{root.tag}>, expected <testsuites> "
            "or <testsuite>)"
        )
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    elements = [case for suite in suites for case in suite.iter("testcase")]
    known = {b for e in elements if (b := _property(e, "backend"))}
    cases = [_case(path, e, known) for e in elements]
    coverage = _coverage(path.with_name(path.stem + COVERAGE_SUFFIX))
    return ConformanceRun(
        path=path,
        cases=cases,
        examples=_examples(path, coverage),
        profile=_text_or_none(coverage.get("profile")) if coverage else None,
        device=_global_property(suites, "device"),
        created=next((s.get("timestamp") for s in suites if s.get("timestamp")), None),
    )


def _parse_xml(path: Path, text: str) -> ET.Element:
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise ReportError(f"{path}: not valid XML, or cut short ({exc})") from None


def _property(element: ET.Element, name: str) -> str | None:
    for prop in element.iterfind("properties/property"):
        if prop.get("name") == name and prop.get("value") is not None:
            return prop.get("value")
    return None


def _global_property(suites: list[ET.Element], name: str) -> str | None:
    return next((v for s in suites if (v := _property(s, name))), None)


def _case(path: Path, element: ET.Element, known: set[str]) -> ConformanceCase:
    name = element.get("name")
    if not name:
        raise ReportError(f"{path}: a <testcase> has no name attribute")
    test, _, params = name.partition("[")
    params = params.removesuffix("]")
    backend = _property(element, "backend") or _backend_of(params, known)
    outcome, message = _outcome(element)
    left = _property(element, "not_checked") or "0"
    if not left.isdigit():
        raise ReportError(f"{path}: testcase {name!r}: not_checked is {left!r}, not a count")
    return ConformanceCase(backend, test, outcome, message, int(left))


def _backend_of(params: str, known: set[str]) -> str:
    """The backend a test ran on, from its parameters when no property names it.

    A backend's name may hold a ``-``, as pytest's joint of parameters does:
    the longest backend named elsewhere in the file wins, else the first part.
    """
    if not params:
        return "(no backend)"
    matches = [b for b in known if params == b or params.startswith(b + "-")]
    return max(matches, key=len) if matches else params.split("-", 1)[0]


def _outcome(element: ET.Element) -> tuple[str, str | None]:
    for tag in ("failure", "error"):
        found = element.find(tag)
        if found is not None:
            return "failed", _message(found) or tag
    skipped = element.find("skipped")
    if skipped is not None:
        return "unsupported", _message(skipped)
    return "passed", None


def _message(element: ET.Element) -> str | None:
    text = element.get("message") or (element.text or "").strip()
    return text or None


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _coverage(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = _parse_json(path, _read_text(path))
    if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
        raise ReportError(f"{path}: not a conformance coverage file (no 'backends' object)")
    return data


def _examples(xml_path: Path, coverage: dict[str, Any] | None) -> dict[str, dict[str, int]]:
    if coverage is None:
        return {}
    where = xml_path.with_name(xml_path.stem + COVERAGE_SUFFIX)
    examples: dict[str, dict[str, int]] = {}
    for backend, entry in coverage["backends"].items():
        by_test = entry.get("examples_by_test", {}) if isinstance(entry, dict) else None
        if not isinstance(by_test, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in by_test.values()
        ):
            raise ReportError(
                f"{where}: backends.{backend}.examples_by_test is not a map of test to count"
            )
        examples[str(backend)] = {str(t): int(n) for t, n in by_test.items()}
    return examples


# -- labels -----------------------------------------------------------------------------


def _base_label(record: RunRecord) -> str:
    env = record.environment if isinstance(record.environment, dict) else {}
    device = str(env.get("device") or "?")
    if device != "cpu" and env.get("device_name"):
        device = str(env["device_name"])
    git = env.get("git")
    git = git if isinstance(git, dict) else {}
    sha = str(git.get("sha") or "")[:7] or "no-git"
    if git.get("dirty"):
        sha += "-dirty"
    date = record.created[:10] or "undated"
    partial = " (partial)" if record.partial else ""  # cut short: fewer cases than planned
    return f"{device} {date} {sha}{partial}"


def _labels(runs: list[tuple[Path, RunRecord]]) -> list[str]:
    """Device, date and sha; then the time, then the file name, then a number, until unique."""
    labels = [_base_label(r) for _, r in runs]
    refinements = (
        lambda i: f"{labels[i]} {_time_of(runs[i][1].created)}".rstrip(),
        lambda i: f"{labels[i]} ({runs[i][0].name})",
        lambda i: f"{labels[i]} #{i + 1}",
    )
    for refine in refinements:
        clashes = {x for x in labels if labels.count(x) > 1}
        if not clashes:
            break
        labels = [refine(i) if x in clashes else x for i, x in enumerate(labels)]
    return labels


def _time_of(created: str) -> str:
    match = re.match(r"\d{4}-\d\d-\d\d[T ](\d\d:\d\d(:\d\d)?)", created)
    return match.group(1) if match else ""


# -- the whole set ----------------------------------------------------------------------


def _coverage_without_xml(path: Path, files: list[tuple[Path, bool]]) -> bool:
    xml = path.with_name(path.name.removesuffix(COVERAGE_SUFFIX) + ".xml").resolve()
    return all(p.resolve() != xml for p, _ in files)


def _looks_like_xml(path: Path, text: str) -> bool:
    """By content, so that a misnamed file gets the error of what it is."""
    start = text.lstrip("\ufeff \t\r\n")[:1]
    return start == "<" if start else path.suffix.lower() == ".xml"


def load_inputs(paths: Sequence[str | Path]) -> Inputs:
    """Load every input; ``ReportError`` on the first that cannot be used."""
    files = _expand(paths)
    runs: list[tuple[Path, RunRecord]] = []
    conformance: list[ConformanceRun] = []
    pairs: list[PairRun] = []
    skipped: list[str] = []
    for path, named in files:
        if path.name.endswith(COVERAGE_SUFFIX):
            if _coverage_without_xml(path, files):
                raise ReportError(
                    f"{path}: a coverage file is read beside its JUnit XML file; "
                    f"name {path.name.removesuffix(COVERAGE_SUFFIX)}.xml instead"
                )
            continue
        text = _read_text(path)
        try:
            if _looks_like_xml(path, text):
                conformance.append(_junit(path, text))
            elif (pair := _pair(path, text)) is not None:
                pairs.append(pair)
            else:
                runs.append((path, _load_json_run(path, text)))
        except _NotThisKind as exc:
            if named:
                raise ReportError(str(exc)) from None
            skipped.append(str(exc))
    if not runs and not conformance and not pairs:
        raise ReportError(
            "nothing to report on: no results file, pytest-benchmark JSON or JUnit XML among "
            + ", ".join(str(p) for p in paths)
        )
    bench = [BenchRun(p, r, label) for (p, r), label in zip(runs, _labels(runs), strict=True)]
    return Inputs(bench=bench, conformance=conformance, skipped=skipped, pairs=pairs)


def _pair(path: Path, text: str) -> PairRun | None:
    """A paired comparison's document, or ``None`` when the file is some other kind."""
    from harness.results.pairs import PairRecordError, is_pair_document, pair_from_json

    data = _parse_json(path, text)
    if not is_pair_document(data):
        return None
    try:
        return PairRun(path, pair_from_json(data, str(path)))
    except PairRecordError as exc:
        raise ReportError(str(exc)) from None
