"""The conformance suite's ``check``: failures come back as text, detached from the frames
that raised them (hypothesis keeps every distinct failure, and those frames hold caches)."""

from __future__ import annotations

import pytest
import torch

from harness.conformance.properties import PropertyFailure
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario
from reference_backends.reference import ReferenceBackend
from suites.conformance.conftest import check

SCENARIO = Scenario()
ENTRY = BackendEntry(name="reference", cls=ReferenceBackend, origin="test")


def _fails(entry: BackendEntry, scenario: Scenario) -> None:
    big = torch.zeros(1024)  # stands for a step's caches, held by this frame
    raise PropertyFailure(f"violated on {scenario.describe()} ({big.numel()})")


def _crashes(entry: BackendEntry, scenario: Scenario) -> None:
    raise RuntimeError("kernel launch failed")


def test_a_property_failure_is_reraised_without_the_frames_that_raised_it():
    with pytest.raises(PropertyFailure, match="violated on dp 0/1") as info:
        check(_fails, ENTRY, SCENARIO)
    error = info.value
    assert error.__cause__ is None
    assert error.__context__ is None
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "_fails" not in frames


def test_a_crash_names_the_shape_and_keeps_only_text():
    with pytest.raises(PropertyFailure, match="_crashes crashed: RuntimeError") as info:
        check(_crashes, ENTRY, SCENARIO)
    assert "scenario: dp 0/1" in str(info.value)
    assert "kernel launch failed" in str(info.value)
    assert info.value.__context__ is None
