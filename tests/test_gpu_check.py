"""The prepared GPU script degrades to a clear report where there is no GPU."""

from __future__ import annotations

import pytest
import torch

from harness.gpu_check import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_every_step_reports_and_the_run_fails(tmp_path, capsys):
    assert main([str(tmp_path), "--quick", "--backend", "sdpa"]) == 1
    out = capsys.readouterr().out
    assert "no CUDA device visible" in out
    assert "conformance (kill profile, cuda): exit 2" in out
    assert "no results file" in out
    assert "no CUDA device" in (tmp_path / "bench.log").read_text()
    assert (tmp_path / "environment.txt").exists()
    assert not (tmp_path / "bench-cuda.json").exists()
