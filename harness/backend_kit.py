"""Everything a backend author imports: the paged base class and the contract's checks.

Two ways to write a backend:

- Subclass ``PagedBackendBase`` and implement ``attend(query, cache, step)``
  (and, optionally, ``plan_step(checked, geometry)`` for per-step data built
  once in ``prepare``). The base validates the constructor arguments, binds
  and checks the caches, checks the step's metadata and DP ownership in
  ``prepare``, writes the new K/V to their slots in ``forward``, and then
  calls ``attend``. ``step`` is a ``PreparedStep``: ``step.checked`` is the
  step's ``CheckedMetadata`` (``query_start``, ``seq_lens``, ``pages``,
  ``slots``, ``causal``), ``step.plan`` what ``plan_step`` returned, and
  ``self.sequences(cache, step)`` yields each real sequence's query rows
  with its keys and values gathered as ``[num_kv_heads, seq_len, head_dim]``.
- Write the three methods yourself and call the same checks the base calls:
  ``validate_backend_args`` in ``__init__``, ``validate_layer_caches`` and
  ``check_rank_is_bound`` in ``bind_kv_caches``, ``validate_metadata`` and
  ``check_rank_ownership`` in ``prepare`` (``read_metadata`` when checks are
  off), ``validate_forward_inputs`` in ``forward``. Each raises the
  ``ValueError`` the contract requires, with a message naming the problem.

``take_rows`` / ``put_rows`` read and write flattened cache rows (``page *
page_size + offset``, local to the bound tensors) on any strided cache view.

Attention variants: the base's constructor takes every variant keyword,
checks it (``AttentionVariant.from_kwargs``) into ``self.variant`` and
raises ``Unsupported`` for one the class does not claim in
``capabilities()``. Read ``cache.key_nhd`` / ``value_nhd`` to serve an HND
cache; ``self.sequences`` dequantizes an FP8 cache (``dequantize``);
``forward(..., out=)`` is handled here; claim ``lse`` and implement
``attend_with_lse`` for ``forward_with_lse``.

Engine kernels: ``vllm_metadata(step)``, ``flashinfer_metadata(step)`` and
``sglang_metadata(step)`` give the step's metadata in each engine's own form
(``decode_rows(step)``: one row per query token, for decode-only MLA kernels)
(local page ids and slots, the rank's offset taken off, padding made safe),
built once per step on its device; ``docs/engine-metadata.md`` has a worked
example of each. An ``attend`` that declares ``key`` and ``value`` keyword
parameters gets the step's new K/V too (an extend kernel takes them).

An engine that keeps its own page format subclasses ``PageFormat`` (its
``allocate`` returns the engine's tensor and NHD views of its K and V as a
``PageTensors``) and names it in ``Capabilities.page_format``; every cache the
harness makes for the backend then comes from it, read back through the views.

A backend that wraps a Triton kernel runs it on CPU tensors under Triton's
interpreter: call ``interpret_triton_here()`` before anything imports triton
(it also makes the interpreter's bf16 arithmetic that of compiled Triton);
``triton_interprets()`` says whether this process interprets.

MLA (``Capabilities(kind="mla")``): the constructor takes ``kv_lora_rank``;
each layer is one latent cache (``cache.latent``), ``forward`` stores each new
latent row once, ``self.sequences`` yields the latent rows as the keys and
their first ``kv_lora_rank`` entries as the values, and ``attend`` returns
``[T, num_heads, kv_lora_rank]`` (``self.value_dim``); ``docs/mla.md``.

Cache memory outside the sequences is unspecified; the conformance suite
fills it with NaN, so a kernel that reads past a sequence's end returns NaN.

``docs/write-a-backend.md`` builds a backend on this kit step by step;
``docs/contract.md`` states every rule it enforces.
"""

from __future__ import annotations

from harness.core.engine_metadata import (
    DecodeRows,
    FlashInferMetadata,
    SglangMetadata,
    VllmMetadata,
    decode_rows,
    flashinfer_metadata,
    sglang_metadata,
    vllm_metadata,
)
from harness.core.kv_pages import put_rows, take_rows
from harness.core.page_formats import PageFormat, PageTensors
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.triton_mode import interpret_triton_here, triton_interprets
from harness.core.validate import (
    CacheGeometry,
    CheckedMetadata,
    check_rank_is_bound,
    check_rank_ownership,
    read_metadata,
    validate_backend_args,
    validate_forward_inputs,
    validate_layer_caches,
    validate_metadata,
)
from harness.core.variants import AttentionVariant, dequantize, quantize

__all__ = [
    "AttentionVariant",
    "CacheGeometry",
    "CheckedMetadata",
    "DecodeRows",
    "FlashInferMetadata",
    "PageFormat",
    "PageTensors",
    "PagedBackendBase",
    "PreparedStep",
    "SglangMetadata",
    "VllmMetadata",
    "check_rank_is_bound",
    "check_rank_ownership",
    "decode_rows",
    "dequantize",
    "flashinfer_metadata",
    "interpret_triton_here",
    "put_rows",
    "quantize",
    "read_metadata",
    "sglang_metadata",
    "take_rows",
    "triton_interprets",
    "validate_backend_args",
    "validate_forward_inputs",
    "validate_layer_caches",
    "validate_metadata",
    "vllm_metadata",
]
