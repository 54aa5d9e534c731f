"""The import paths outside backends are written against: the kit, and the moved ones."""

from __future__ import annotations

import importlib
import sys

import pytest

import harness
import harness.backend_kit as kit


def test_the_kit_offers_triton_s_cpu_mode_to_an_adapter() -> None:
    """An outside Triton adapter needs the interpreter switch without reaching into core."""
    from harness.core.triton_mode import interpret_triton_here, triton_interprets

    assert kit.interpret_triton_here is interpret_triton_here
    assert kit.triton_interprets is triton_interprets
    assert {"interpret_triton_here", "triton_interprets"} <= set(kit.__all__)
    assert all(hasattr(kit, name) for name in kit.__all__)


@pytest.mark.parametrize("old", ["contract", "errors"])
def test_a_moved_module_still_imports_and_says_where_it_went(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, f"harness.{old}", raising=False)
    with pytest.warns(DeprecationWarning, match=f"harness.{old} is deprecated.*harness.core.{old}"):
        module = importlib.import_module(f"harness.{old}")
    moved = importlib.import_module(f"harness.core.{old}")
    public = [name for name in harness.__all__ if hasattr(moved, name)]
    assert public  # the names users import from the old path
    assert all(getattr(module, name) is getattr(harness, name) for name in public)


def test_the_old_paged_base_path_still_imports_and_says_where_it_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "reference_backends.paged_base", raising=False)
    with pytest.warns(DeprecationWarning, match="paged_base is deprecated.*harness.backend_kit"):
        module = importlib.import_module("reference_backends.paged_base")
    assert module.PagedBackendBase is kit.PagedBackendBase
    assert module.PreparedStep is kit.PreparedStep
