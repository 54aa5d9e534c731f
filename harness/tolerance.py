"""How close to the oracle a backend must be: one bound per dtype, in one place.

Errors are measured norm-wise per (token, head): ``e = ||o - o_exact||_2``
over ``head_dim``. A correct backend's error has three sources, each bounded
from the input precision ``u`` (unit roundoff of the dtype), never tuned per
backend:

* rounding of probabilities, the P.V accumulation and the output: a few
  ``u`` times the largest value norm the token attends to (``value_scale``),
  because the output is a convex combination of those values;
* rounding of the logits: a relative error ``u`` on a logit of magnitude
  ``s`` perturbs its weight by ``exp(u s)``, which moves the output by at
  most ``2 u s`` times ``value_scale`` (``logit_scale`` is the worst ``s``,
  computed from ``|q|.|k|`` so cancellation cannot hide it);
* anything else a same-dtype implementation does: four times the error of
  ``naive_attention`` at the same (token, head).

So ``bound = 4 e_naive + u * value_scale * (4 + 2 * logit_scale)``. The
analytic term keeps a correct backend from failing on a draw where the naive
computation happened to be unusually lucky; the fp32 bound is tight enough
(about 1e-6 relative) that indexing, masking and head-mapping bugs show.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.oracle import OracleOutput

NAIVE_FACTOR = 4.0
ROUNDING_FLOOR = 4.0
LOGIT_FACTOR = 2.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon: the relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


def error_bound(
    oracle: OracleOutput, naive_error: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The allowed norm-wise error per (token, head), ``[T, H]``."""
    u = unit_roundoff(dtype)
    analytic = u * oracle.value_scale * (ROUNDING_FLOOR + LOGIT_FACTOR * oracle.logit_scale)
    return NAIVE_FACTOR * naive_error + analytic


def _norm_error(output: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return (output.detach().to("cpu", torch.float64) - exact).norm(dim=-1)


@dataclass(frozen=True)
class Comparison:
    """The verdict of one output against the oracle, with where it is worst."""

    passed: bool
    checked_tokens: int
    nonfinite: int
    worst_ratio: float  # max error / bound over checked (token, head); inf for NaN
    worst_token: int
    worst_head: int
    worst_error: float
    worst_bound: float

    def describe(self) -> str:
        if self.checked_tokens == 0:
            return "no tokens checked"
        if self.nonfinite:
            return (
                f"{self.nonfinite} non-finite output values; first at token "
                f"{self.worst_token}, head {self.worst_head}"
            )
        verdict = "within" if self.passed else "EXCEEDS"
        return (
            f"max error {self.worst_error:.3e} at token {self.worst_token}, head "
            f"{self.worst_head} ({verdict} bound {self.worst_bound:.3e}, "
            f"{self.worst_ratio:.2f}x)"
        )


def compare(
    output: torch.Tensor, oracle: OracleOutput, naive: torch.Tensor, dtype: torch.dtype
) -> Comparison:
    """Compare a backend's ``[T, H, D]`` output with the oracle, rows of padding excluded."""
    rows = oracle.checked
    if output.shape != oracle.output.shape:
        raise ValueError(
            f"output shape {tuple(output.shape)} != expected {tuple(oracle.output.shape)}"
        )
    error = _norm_error(output, oracle.output)[rows]
    bound = error_bound(oracle, _norm_error(naive, oracle.output), dtype)[rows]
    token_ids = rows.nonzero().flatten()
    if error.numel() == 0:
        return Comparison(False, 0, 0, float("nan"), -1, -1, float("nan"), float("nan"))
    finite = torch.isfinite(output.detach().cpu()[rows]).all(-1)
    nonfinite = int((~torch.isfinite(output.detach().cpu()[rows])).sum())
    if nonfinite:
        token, head = (~finite).nonzero()[0].tolist()
        return Comparison(
            False,
            int(rows.sum()),
            nonfinite,
            float("inf"),
            int(token_ids[token]),
            head,
            float("nan"),
            float(bound[token, head]),
        )
    ratio = torch.where(error == 0, torch.zeros_like(error), error / bound)
    flat = int(ratio.argmax())
    token, head = divmod(flat, ratio.shape[1])
    worst = float(ratio[token, head])
    return Comparison(
        worst <= 1.0,
        int(rows.sum()),
        0,
        worst,
        int(token_ids[token]),
        head,
        float(error[token, head]),
        float(bound[token, head]),
    )
