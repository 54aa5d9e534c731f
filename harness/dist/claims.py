"""Whether a backend's claim covers a DP run, and fitting the run inside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from harness.core.dtypes import dtype_name
from harness.dist.schedule import DistSetup
from harness.numerics.latent import latent_pairs


def fit_claim(setup: DistSetup, caps: Any) -> DistSetup:
    """The run's page size and head dim moved inside the backend's claim, where it has one,
    and its padding rows in the backend's form.

    A backend that claims no page size 16 or head dim 32 is not wrong: the run
    takes the claimed value nearest to them instead of refusing it. An MLA
    backend's run takes one latent head of the first geometry it claims.
    """
    changes: dict[str, Any] = {}
    if caps.kind == "mla" and setup.kv_lora_rank is None:  # one latent head of a claimed width
        rank, rope = latent_pairs(caps)[0]
        setup = replace(setup, num_kv_heads=1, head_dim=rank + rope, kv_lora_rank=rank)
    if setup.padding_convention != caps.padding_convention:
        changes["padding_convention"] = caps.padding_convention
    rules = (
        ("page_size", caps.page_sizes, caps.allows_page_size, caps.page_size_multiple, 1),
        (
            "head_dim",
            caps.head_dims,
            caps.allows_head_dim,
            caps.head_dim_multiple,
            caps.min_head_dim,
        ),
    )
    for name, claim, allows, multiple, minimum in rules:
        wanted = getattr(setup, name)
        if allows(wanted) or claim == ():
            continue
        below = max(minimum, wanted // multiple * multiple)
        ruled = [below, below + multiple, -(-minimum // multiple) * multiple]
        candidates = [v for v in (claim or ruled) if allows(v)] or list(claim or ruled)
        changes[name] = min(candidates, key=lambda v: (abs(v - wanted), v))
    return replace(setup, **changes) if changes else setup


def claim_problems(
    entry: Any,
    *,
    dtype: Any,
    device: str,
    dp_sizes: Sequence[int],
    page_size: int,
    head_dim: int,
    longest: int,
    padding: bool = False,
) -> list[str]:
    """What the run needs that ``entry`` does not claim (empty: it can run)."""
    caps = entry.capabilities
    kind = device.split(":")[0]
    problems = []
    if not entry.accepts_dp and max(dp_sizes) > 1:
        problems.append("its constructor takes neither dp_size/dp_rank nor **kwargs")
    if dtype not in caps.dtypes_on(kind):
        problems.append(f"it does not claim {dtype_name(dtype)} on {kind!r}")
    if kind not in caps.devices:
        problems.append(f"it does not claim device {kind!r}")
    for name, value, allows in (
        ("page_size", page_size, caps.allows_page_size),
        ("head_dim", head_dim, caps.allows_head_dim),
    ):
        if not allows(value):
            problems.append(f"its {name} claim leaves out {value}")
    if caps.max_dp_size is not None and max(dp_sizes) > caps.max_dp_size:
        problems.append(f"it claims dp_size <= {caps.max_dp_size}, the run needs {max(dp_sizes)}")
    if caps.max_seq_len is not None and longest > caps.max_seq_len:
        problems.append(f"it claims contexts <= {caps.max_seq_len}, the run needs {longest}")
    if padding and not caps.graph_mode:
        problems.append("--graph pads every step, and it claims no graph-mode padding")
    return problems
