"""A planted slowdown for checking the gate: ``sdpa``, made a set fraction slower.

``forward`` runs the real ``sdpa`` forward, then spins for
``ATTN_HARNESS_SLOWDOWN`` (a fraction, default 0.30) times the time it just
took: a busy wait, not ``time.sleep``, whose wake-up overshoot would add
tens of microseconds to millisecond-scale calls. Outputs are unchanged, so
the case still passes its oracle check and only its time moves. On CUDA the
wait follows a synchronisation, so the added time is the device's too.

    ATTN_HARNESS_SLOWDOWN=0.30 attn-harness bench \\
        --backend suites/mutants/slowdown.py:SlowedSdpa --out slow.json
    attn-harness gate --baseline BASELINE slow.json \\
        --match suites/mutants/slowdown.py:SlowedSdpa=sdpa
"""

from __future__ import annotations

import os
import time

import torch

from reference_backends.sdpa import SdpaBackend

ENV = "ATTN_HARNESS_SLOWDOWN"


def slowdown_fraction() -> float:
    text = os.environ.get(ENV, "0.30")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: expected a fraction such as 0.30") from None
    if not 0.0 <= value <= 10.0:
        raise ValueError(f"{ENV}={text!r}: expected a fraction between 0 and 10")
    return value


class SlowedSdpa(SdpaBackend):
    """``sdpa`` with each forward followed by a busy wait of a fixed fraction of its time."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fraction = slowdown_fraction()

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        started = time.perf_counter_ns()
        out = super().forward(query, key, value, layer_idx)
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        ended = time.perf_counter_ns()
        deadline = ended + int((ended - started) * self.fraction)
        while time.perf_counter_ns() < deadline:
            pass
        return out
