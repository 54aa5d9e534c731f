"""A pytest plugin that turns cuDNN attention off for SDPA: ``-p harness.gpu.sdpa_cudnn_off``.

The GPU script runs the ``sdpa`` backend's conformance once more with it
loaded, so a failure that only cuDNN attention shows (torch picks it on sm90
for some shapes) is told apart from one of the backend's own.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


def pytest_report_header(config: pytest.Config) -> str:
    return "SDPA: cuDNN attention disabled (harness.gpu.sdpa_cudnn_off)"
