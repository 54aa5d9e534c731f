"""Engine kernels as backends: loading engine files by path, sglang-triton and vllm-triton.

The loader is tested on a package written here (an engine whose ``__init__``
would fail, as SGLang's does without its server's dependencies). The
adapters' own tests need the engines' wheels (``nox -s engines`` installs
them with ``--no-deps``); without one, the test checks that its backend
claims no device and says what to install.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from harness.conformance.check_matrix import run_quick_check
from harness.core.errors import Unsupported
from harness.core.registry import default_registry
from reference_backends.engine_modules import (
    EngineMissing,
    load_engine_files,
    package_root,
)
from reference_backends.sglang_triton import SglangTritonBackend
from reference_backends.vllm_triton import KVQuantMode, VllmTritonBackend


@pytest.fixture
def fake_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package ``fakeengine`` whose ``__init__`` raises, with two kernel files."""
    root = tmp_path / "fakeengine"
    (root / "ops").mkdir(parents=True)
    (root / "__init__.py").write_text("raise ImportError('the whole server is needed')\n")
    (root / "ops" / "base.py").write_text("SCALE = 3\n")
    (root / "ops" / "kernel.py").write_text(
        textwrap.dedent(
            """
            from fakeengine.ops.base import SCALE
            from fakeengine.utils import is_hip

            def run(x):
                return x * SCALE + (100 if is_hip() else 0)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fakeengine"


def test_kernel_files_load_without_the_engines_init(fake_engine):
    utils = ModuleType("fakeengine.utils")
    utils.is_hip = lambda: False  # type: ignore[attr-defined]
    loaded = load_engine_files(
        fake_engine, ["fakeengine.ops.base", "fakeengine.ops.kernel"], {"fakeengine.utils": utils}
    )
    assert loaded["fakeengine.ops.kernel"].run(2) == 6
    assert not [name for name in sys.modules if name.startswith("fakeengine")]  # nothing kept


def test_a_missing_engine_or_file_is_named(fake_engine):
    assert package_root("no_such_engine_here") is None
    with pytest.raises(EngineMissing, match="no_such_engine_here is not installed"):
        load_engine_files("no_such_engine_here", ["no_such_engine_here.k"], {})
    with pytest.raises(EngineMissing, match=r"has no ops/missing\.py"):
        load_engine_files(fake_engine, ["fakeengine.ops.missing"], {})
    with pytest.raises(ValueError, match=r"other\.module is not inside fakeengine"):
        load_engine_files(fake_engine, ["other.module"], {})


SGLANG = package_root("sglang") is not None


def test_sglang_triton_is_registered_with_what_it_claims():
    caps = default_registry().resolve("sglang-triton").capabilities
    assert caps.soft_cap
    assert caps.sinks
    assert caps.sliding_window
    assert not caps.alibi  # not an argument of SGLang's two kernels
    if SGLANG:
        assert "cpu" in caps.devices
    else:
        assert caps.devices == ()
        with pytest.raises(Unsupported, match="pip install --no-deps sglang"):
            SglangTritonBackend(num_heads=2, num_kv_heads=1, head_dim=8, scale=0.5)


@pytest.mark.skipif(not SGLANG, reason="needs the sglang wheel: nox -s engines installs it")
def test_sglang_kernels_pass_the_quick_check_interpreted():
    """SGLang's own decode and extend kernels, through the kit's ``sglang_metadata``, on
    the quick check's steps (DP ranks, page sizes 3 and 16, head dim 13, fp32 and fp16)."""
    from harness.core.triton_mode import interpret_triton_here

    if not interpret_triton_here():
        pytest.skip("triton was imported without its interpreter in this process")
    results = run_quick_check(default_registry().resolve("sglang-triton"))
    assert len(results) >= 40
    failed = [r for r in results if r.status != "PASSED"]
    assert not failed, failed[:3]


VLLM = package_root("vllm") is not None


def test_vllm_triton_is_registered_with_what_vllms_backend_declares():
    caps = default_registry().resolve("vllm-triton").capabilities
    assert (caps.soft_cap, caps.sinks, caps.sliding_window, caps.alibi) == (True,) * 4
    assert caps.page_size_multiple == 16  # TritonAttentionBackend: MultipleOf(16)
    assert caps.min_head_dim == 32  # supports_head_size: head_size >= 32
    assert set(caps.kv_cache_dtypes) == {"auto", "fp8_e4m3", "fp8_e5m2"}
    if VLLM:
        assert "cpu" in caps.devices
    else:
        assert caps.devices == ()
        with pytest.raises(Unsupported, match="pip install --no-deps vllm"):
            VllmTritonBackend(num_heads=2, num_kv_heads=1, head_dim=32, scale=0.5)


@pytest.mark.skipif(not VLLM, reason="needs the vllm wheel: nox -s engines installs it")
def test_the_supplied_kv_quant_modes_are_vllms():
    """The adapter's stand-in for ``KVQuantMode`` has the installed vLLM's values
    (read from its source: importing it would pull in vLLM's config)."""
    root = package_root("vllm")
    assert root is not None
    tree = ast.parse((root / "v1" / "kv_cache_interface.py").read_text())
    enum_class = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode"
    )
    values = {
        target.id: node.value.value
        for node in enum_class.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert {mode.name: mode.value for mode in KVQuantMode}.items() <= values.items()


@pytest.mark.skipif(not VLLM, reason="needs the vllm wheel: nox -s engines installs it")
def test_vllm_kernel_passes_the_quick_check_interpreted():
    """vLLM's ``unified_attention`` (2D and split-KV 3D launches) through the kit's
    ``vllm_metadata``, on the quick check's steps; vLLM's modules are not left behind."""
    from harness.core.triton_mode import interpret_triton_here

    if not interpret_triton_here():
        pytest.skip("triton was imported without its interpreter in this process")
    results = run_quick_check(default_registry().resolve("vllm-triton"))
    assert len(results) >= 40
    failed = [r for r in results if r.status != "PASSED"]
    assert not failed, failed[:3]
    assert not [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]


def test_vllm_triton_mla_is_registered_with_what_vllms_backend_declares():
    caps = default_registry().resolve("vllm-triton-mla").capabilities
    assert caps.kind == "mla"
    assert set(caps.dtypes) == {torch.float16, torch.bfloat16}  # TritonMLABackend's
    assert caps.page_size_multiple == 16  # MultipleOf(16)
    if not VLLM:
        assert caps.devices == ()


@pytest.mark.skipif(not VLLM, reason="needs the vllm wheel: nox -s engines installs it")
def test_vllm_triton_mla_passes_the_quick_check_interpreted():
    """vLLM's Triton MLA decode (split-KV, ``is_mla``) through the kit's ``decode_rows``
    on the quick check's MLA steps: prefill and extend rows run as decode rows."""
    from harness.core.triton_mode import interpret_triton_here

    if not interpret_triton_here():
        pytest.skip("triton was imported without its interpreter in this process")
    results = run_quick_check(default_registry().resolve("vllm-triton-mla"))
    assert len(results) >= 24  # fp16 on the CPU, pages of 16, two latent widths, dp 1 and 2
    failed = [r for r in results if r.status != "PASSED"]
    assert not failed, failed[:3]


@pytest.mark.parametrize(
    ("longest", "splits"), [(1, 1), (511, 1), (1024, 2), (3000, 8), (99999, 8)]
)
def test_vllm_triton_mla_splits_as_vllm_chooses(longest, splits):
    from reference_backends.vllm_triton_mla import num_kv_splits

    assert num_kv_splits(longest, multiprocessors=4) == splits
