"""Engine-owned page formats: an engine's own KV page layout, seen by the harness as NHD views.

Compiled engine kernels keep the tokens of a page in their own order (vLLM's
CPU kernel stores a page's keys dimension-major and its values token-major,
both in one tensor per layer and KV head) and write them with their own op.
Written plainly into ``[page, token, head, dim]``, such a kernel reads
garbage. A backend whose kernel does so declares a ``PageFormat`` in
``Capabilities.page_format`` (and its ``name`` in ``cache_layouts``): every
layer cache the harness makes for it then comes from the format (the same
pages, global ids and DP ranges), as the engine's own tensor
(``LayerCache.storage``) with ``[pages, page_size, kv_heads, head_dim]``
views of its keys and values (``LayerCache.key``/``value``).

Those views are the read-back: the harness poisons unused memory with NaN,
writes a step's earlier tokens, watches the canary and checks what a step
stored through them, while the backend reads and writes ``storage`` with
its own ops. A format whose views do not say where the engine's write op
puts a token fails: after every step the suite compares the stored new K/V,
read back through the views, with what the step was given.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class PageTensors:
    """One layer's cache in an engine's format: its tensor, and NHD views of K and V in it."""

    storage: torch.Tensor
    key: torch.Tensor  # [num_pages, page_size, num_kv_heads, head_dim], a view of storage
    value: torch.Tensor


class PageFormat(ABC):
    """How an engine lays out one layer's pages; ``name`` is its ``LayerCache.layout``."""

    name: str = ""

    @abstractmethod
    def allocate(
        self,
        *,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> PageTensors:
        """One layer's cache of ``num_pages`` pages (contents unspecified) and its views."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def check_views(tensors: PageTensors, shape: tuple[int, int, int, int], fmt: PageFormat) -> None:
    """The format's views have the NHD shape asked for and lie inside its storage."""
    for which in ("key", "value"):
        view = getattr(tensors, which)
        if tuple(view.shape) != shape:
            raise ValueError(
                f"page format {fmt.name!r}: its {which} view has shape {tuple(view.shape)}, "
                f"not [pages, page_size, kv_heads, head_dim] = {list(shape)}"
            )
        if view.untyped_storage().data_ptr() != tensors.storage.untyped_storage().data_ptr():
            raise ValueError(
                f"page format {fmt.name!r}: its {which} view is not a view of its storage"
            )
