"""How a dtype is written in results, reports and messages: ``bfloat16``, not ``torch.bfloat16``."""

from __future__ import annotations

import torch


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the name results files and tables use."""
    return str(dtype).removeprefix("torch.")
