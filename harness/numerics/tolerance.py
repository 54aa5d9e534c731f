"""How close to the oracle a backend must be: one bound per dtype, in one place.

Errors are measured norm-wise per (token, head): ``e = ||o - o_exact||_2``
over ``head_dim``. The bound is derived from the unit roundoff ``u`` of the
inputs' dtype, never tuned per backend. It models what every production
kernel does (FlashAttention, flash-decoding, paged attention): inputs in the
dtype, logits and their accumulation in fp32, probabilities rounded to the
dtype before P.V, fp32 accumulation, the output rounded to the dtype. A
correct computation of that kind has these sources of error, each charged:

* the output's final rounding: at most ``u ||o||``;
* the rounding of each probability on its own: ``sum_j p_j d_j v_j`` with
  independent ``|d_j| <= u``, whose size is ``u * sqrt(sum_j p_j^2 ||v_j||^2)``
  (``rounding_scale``). This is what makes the bound discriminate at long
  contexts: spread over 4096 keys it is ``~u ||v|| / 64``, not ``u ||v||``,
  so one dropped key (weight ``~1/4096``) is no longer inside the noise.
  Partial results of a split-KV merge rounded to the dtype are of the same
  size;
* fp32 rounding of the logits: a relative error ``u32`` on a logit of
  magnitude ``s`` moves its weight by ``exp(u32 s)``, and the output by at
  most ``2 u32 s`` times the largest value norm (``logit_scale`` is the worst
  ``s``, from ``|q|.|k|`` so cancellation cannot hide it). A logit is itself
  an fp32 sum of ``D`` products, whose error grows like ``sqrt(D) u32`` (as
  the sums over keys below), so the term is ``2 sqrt(D) u32 s``. A blocked
  or 16-lane dot product rounds less, about ``sqrt(D / 16) u32 s``, but a
  kernel that vectorizes over keys and sums each logit in head-dim order
  (vLLM's CPU kernel in fp32) reaches the full ``sqrt(D)``: where a massive
  channel makes every partial sum as large as the logit, each of the ``D``
  additions rounds at that size. Charged at ``sqrt(D / 16)``, that kernel
  reached 1.10x the bound at D=256 (one key among three, ``massive-qk``);
* fp32 accumulation of P.V and of the softmax's sum over the ``n`` keys a
  token sees: each sum's rounding error grows like ``sqrt(n) u32`` times the
  largest value norm (the probabilistic bound of Higham and Mary, 2019, at
  lambda = 1; the worst case ``n u32`` is never reached by blocked or vector
  sums): ``sqrt(n) u32 value_scale``, with ``n`` at least 16 (so short sums
  keep the old ``4 u32 value_scale``), three times over: two such sums (P.V
  and the denominator) err together, and where every value shares a massive
  channel of one sign (``massive-v``) the partial sums grow steadily and a
  sum's error is a random walk that reaches about 1.5 of it in its tail. At
  a factor of one, a correct fp32 ``reference`` reached 1.01x the bound on a
  decode over 4096 keys with 57344 in one value channel; normal values reach
  about 0.1 of the bound now. A constant here left a correct fp32 computation over 2048 keys
  at 0.28 of the bound on AVX2 machines, where BLAS blocks its sums
  differently than with AVX-512. In fp32 this overlaps the two rounding
  terms above, so the larger of the two is charged, not their sum;
* anything else a same-dtype implementation does (accumulation order, the
  softmax's own rounding): four times the error of ``naive_attention`` at
  the same (token, head).

So ``bound = 4 e_naive + max(u (4 ||o|| + 6 rounding_scale), 3 sqrt(n) u32 value_scale)
+ 2 sqrt(D) u32 value_scale logit_scale``. The factors leave a correct
computation at a quarter of the bound or less (``python -m
harness.numerics.discrimination`` measures it), while an all-zeros output,
uniform attention, a wrong GQA head map, a 10% scale error, one skipped page,
one dropped key or a causal mask off by one fails in bf16 and fp16 at 1k-4k
contexts. Logits rounded to bf16 before the
softmax are not modelled: no production kernel keeps them in 16 bits.

Variants keep the same bound, with what they add to a logit counted in
``logit_scale`` (``harness.numerics.oracle``):

* soft-cap: ``cap * tanh(x / cap)`` is 1-Lipschitz in ``x``, so an fp32
  error in the raw logit ``x`` is not enlarged by the cap, and
  ``scale |q|.|k|`` still bounds it; evaluating ``tanh`` in fp32 adds a
  relative error on a value of size at most ``cap``, so ``cap`` is added to
  ``logit_scale``;
* ALiBi: the bias is exact in float64 and off by a relative ``u32`` in fp32,
  so its largest ``|bias|`` over the visible keys is added;
* sinks: ``exp(s - m)`` in fp32 likewise adds ``|s|``;
* sliding window: masks only, nothing to add;
* FP8 KV cache: the oracle reads the dequantized values the backend reads,
  so quantization is part of the input, never error. A kernel that
  dequantizes into the model dtype (bf16 with a non-power-of-two scale)
  rounds each K/V element once more; ``naive_attention`` does the same
  (its K/V are rounded to the dtype), so that error is inside the naive term.

The log-sum-exp (``forward_with_lse``) is compared absolutely:
``8 u32 (sqrt(D) logit_scale + |lse| + 1) + 2 u logit_scale``, fp32
accumulation of a D-term dot product and of the denominator, plus logits
formed from inputs rounded to the dtype (q pre-scaled, FP8 K dequantized to
bf16). A wrong base (log2), a missing max shift, a sink left out or an
unscaled logit is off by O(1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.numerics.oracle import OracleOutput

NAIVE_FACTOR = 4.0
OUTPUT_FACTOR = 4.0
ROUNDING_FACTOR = 6.0
ACCUMULATION_FACTOR = 3.0  # per sqrt(key) of the visible keys: two sums, three sigmas
MIN_SUM_LENGTH = 16.0  # keys counted at least: 4 u32 value_scale, as short sums round too
LOGIT_FACTOR = 2.0  # per sqrt(D): a logit's fp32 sum over the head dim, in order
ACCUMULATOR = torch.float32  # where production kernels keep logits, sums and accumulators


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon: the relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


def error_bound(
    oracle: OracleOutput, naive_error: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The allowed norm-wise error per (token, head), ``[T, H]``."""
    u, u32 = unit_roundoff(dtype), unit_roundoff(ACCUMULATOR)
    rounding = u * (OUTPUT_FACTOR * oracle.output_norm + ROUNDING_FACTOR * oracle.rounding_scale)
    keys = oracle.visible_keys
    length = torch.full_like(oracle.value_scale, MIN_SUM_LENGTH) if keys is None else keys
    sums = length.clamp_min(MIN_SUM_LENGTH).sqrt()
    accumulation = u32 * ACCUMULATION_FACTOR * sums * oracle.value_scale
    dot = float(oracle.dot_length) ** 0.5  # a logit's fp32 sum over the head dim
    logits = u32 * LOGIT_FACTOR * dot * oracle.value_scale * oracle.logit_scale
    return NAIVE_FACTOR * naive_error + torch.maximum(rounding, accumulation) + logits


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

    def describe(self, evidence: str | None = None) -> str:
        """The verdict in words; ``evidence`` (``nan_evidence``) explains non-finite values
        where the caller has the step, else a general hint does."""
        if self.checked_tokens == 0:
            return "no tokens checked"
        if self.nonfinite:
            why = evidence or (
                "cache memory outside the sequences holds NaN by design: a read past a "
                "sequence's end, or an overflow in the kernel's own arithmetic"
            )
            return (
                f"{self.nonfinite} non-finite output values; first at token "
                f"{self.worst_token}, head {self.worst_head} ({why})"
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
    return _verdict(error, bound, output.detach().cpu()[rows], rows)


def _verdict(
    error: torch.Tensor, bound: torch.Tensor, values: torch.Tensor, rows: torch.Tensor
) -> Comparison:
    """The worst (token, head) of ``error / bound`` over the checked ``rows``.

    ``values`` are the backend's checked values (``[N, H, ...]``): any
    non-finite one fails at once, naming the first.
    """
    token_ids = rows.nonzero().flatten()
    if error.numel() == 0:
        return Comparison(False, 0, 0, float("nan"), -1, -1, float("nan"), float("nan"))
    bad = ~torch.isfinite(values)
    nonfinite = int(bad.sum())
    if nonfinite:
        per_head = bad.flatten(2).any(-1) if bad.dim() > 2 else bad
        token, head = per_head.nonzero()[0].tolist()
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


LSE_FACTOR = 8.0


def lse_bound(oracle: OracleOutput, dtype: torch.dtype, head_dim: int) -> torch.Tensor:
    """The allowed absolute error of the log-sum-exp per (token, head), ``[T, H]``."""
    assert oracle.lse is not None
    u, u32 = unit_roundoff(dtype), unit_roundoff(ACCUMULATOR)
    fp32 = u32 * LSE_FACTOR * (head_dim**0.5 * oracle.logit_scale + oracle.lse.abs() + 1)
    return fp32 + 2 * u * oracle.logit_scale


def compare_lse(lse: torch.Tensor, oracle: OracleOutput, dtype: torch.dtype) -> Comparison:
    """Compare a backend's ``[T, H]`` log-sum-exp with the oracle's, padding rows excluded."""
    assert oracle.lse is not None
    rows = oracle.checked
    if tuple(lse.shape) != tuple(oracle.lse.shape):
        raise ValueError(f"lse shape {tuple(lse.shape)} != expected {tuple(oracle.lse.shape)}")
    got = lse.detach().to("cpu", torch.float64)[rows]
    error = (got - oracle.lse[rows]).abs()
    bound = lse_bound(oracle, dtype, oracle.dot_length)[rows]
    return _verdict(error, bound, got, rows)
