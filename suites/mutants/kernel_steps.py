"""What the field mutants share: reading a step and a tensor as a kernel would.

``suites.mutants.field`` plants bugs that shipped in real engines; these are
the pieces several of them need (which keys a logit row has, a speculative
step's shared query length, a strided tensor read as if dense).
"""

from __future__ import annotations

import itertools

import torch

from harness.core.paged_base import PreparedStep

SPEC_MAX_Q = 8  # longest draft (q_len_per_req) a uniform decode path takes


def key_count(logits: torch.Tensor, sinks: bool) -> int:
    """Keys in ``logits`` ``[H, q, L (+1)]``: the sink column, if any, is not a key."""
    return logits.shape[-1] - (1 if sinks else 0)


def nan_rows(probs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``probs`` with every ``(head, query)`` where ``rows`` is True set to NaN."""
    return probs.masked_fill(rows[..., None], float("nan"))


def contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides a dense tensor of ``shape`` has."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def read_as_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s storage read from its offset as if it were dense (a raw-pointer read)."""
    if tensor.is_contiguous():
        return tensor
    dense = contiguous_strides(tensor.shape)
    return tensor.as_strided(tensor.shape, dense, tensor.storage_offset())


def uniform_query_len(step: PreparedStep) -> int | None:
    """The shared query length of a speculative-decoding step, else ``None``.

    Such a step has two or more real rows, all with the same query length
    between 2 and 8 (a draft of 1..7 tokens plus the bonus token).
    """
    starts = step.checked.query_start
    lengths = [
        stop - start
        for (start, stop), rows in zip(itertools.pairwise(starts), step.sequence_rows, strict=True)
        if rows is not None and stop > start
    ]
    if len(lengths) < 2 or len(set(lengths)) != 1 or not 2 <= lengths[0] <= SPEC_MAX_Q:
        return None
    return lengths[0]


def window_excluded(query_len: int, length: int, window: int, device: torch.device) -> torch.Tensor:
    """``[q, L]``, True where a key lies at or before ``query_pos - window``."""
    query_pos = torch.arange(length - query_len, length, device=device)[:, None]
    key_pos = torch.arange(length, device=device)[None, :]
    return key_pos <= query_pos - window
