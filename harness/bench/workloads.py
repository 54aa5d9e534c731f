"""Named, versioned benchmark workloads, each with a CPU size and a GPU size.

A workload is a list of ``CaseSpec``\\ s: plain, JSON-ready data (sizes,
lengths, dtype, DP rank, seed) that ``CaseSpec.scenario`` turns into a
``harness.numerics.scenario.Scenario``, whose inputs are deterministic random values
from the seed (never zeros). Change a workload's cases and you bump its
``version``: results of different versions do not compare.

The CPU size is the default, small enough that ``nox -s bench`` stays in a
few minutes on two cores; the GPU size targets an H100/H200-class device
(bf16, long contexts), while keeping the float64 CPU oracle's check of
every case within seconds.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from harness.bench.metrics import AttentionWork
from harness.core.kv_pages import PoolLayout, pages_needed
from harness.core.variants import AttentionVariant
from harness.numerics.scenario import Scenario

SIZES = ("cpu", "gpu")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CaseSpec:
    """One benchmark case: a single step of one DP rank, one layer."""

    name: str
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "float32"
    causal: bool = True
    dp_size: int = 1
    dp_rank: int = 0
    layout: str = "shared"
    seed: int = 0
    sliding_window: int | None = None
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0
    kv_lora_rank: int | None = None  # MLA: head_dim is the latent width, one KV head

    def __post_init__(self) -> None:
        _ = self.variant  # validates the variant fields
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if len(self.context_lens) != len(self.query_lens) or not self.context_lens:
            raise ValueError(f"case {self.name!r}: context_lens and query_lens must match")
        if any(not 1 <= q <= n for q, n in zip(self.query_lens, self.context_lens, strict=True)):
            raise ValueError(f"case {self.name!r}: need 1 <= query_len <= context_len")
        PoolLayout(self.layout)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def variant(self) -> AttentionVariant:
        return AttentionVariant.from_kwargs(
            num_heads=self.num_heads,
            sliding_window=self.sliding_window,
            kv_cache_dtype=self.kv_cache_dtype,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def total_pages(self) -> int:
        """A pool where this rank's range holds all its sequences, plus one spare page."""
        per_rank = sum(pages_needed(n, self.page_size) for n in self.context_lens) + 1
        return per_rank * self.dp_size

    def scenario(self, device: str = "cpu") -> Scenario:
        return Scenario(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            page_size=self.page_size,
            total_pages=self.total_pages,
            num_layers=1,
            context_lens=self.context_lens,
            query_lens=self.query_lens,
            dtype=self.torch_dtype,
            causal=self.causal,
            dp_size=self.dp_size,
            dp_rank=self.dp_rank,
            layout=PoolLayout(self.layout),
            seed=self.seed,
            device=device,
            variant=self.variant,
            kv_lora_rank=self.kv_lora_rank,
        )

    def work(self) -> AttentionWork:
        cache_dtype = self.variant.cache_dtype
        return AttentionWork(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            element_bytes=self.torch_dtype.itemsize,
            query_lens=self.query_lens,
            seq_lens=self.context_lens,
            causal=self.causal,
            sliding_window=self.sliding_window,
            kv_element_bytes=None if cache_dtype is None else cache_dtype.itemsize,
            kv_lora_rank=self.kv_lora_rank,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["context_lens"] = list(self.context_lens)
        data["query_lens"] = list(self.query_lens)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseSpec:
        fields = dict(data)
        fields["context_lens"] = tuple(fields["context_lens"])
        fields["query_lens"] = tuple(fields["query_lens"])
        return cls(**fields)


@dataclass(frozen=True)
class Workload:
    """A named, versioned list of cases at a CPU size and a GPU size."""

    name: str
    version: int
    kind: str  # decode, prefill, extend, mixed, dp-scaling or targets
    description: str
    cpu: tuple[CaseSpec, ...]
    gpu: tuple[CaseSpec, ...]
    attention: str = "mha"  # the kind of backend it times (``Capabilities.kind``)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def cases(self, size: str) -> tuple[CaseSpec, ...]:
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        return self.cpu if size == "cpu" else self.gpu


def _seeded(workload: str, cases: list[CaseSpec]) -> tuple[CaseSpec, ...]:
    """Give each case a seed derived from its names: stable across runs and versions."""
    return tuple(
        replace(c, seed=zlib.crc32(f"{workload}/{c.name}".encode()) & 0x7FFFFFFF) for c in cases
    )


GPU: dict[str, Any] = {"dtype": "bfloat16"}


def _decode(batch: int, contexts: tuple[int, ...], **kw: Any) -> list[CaseSpec]:
    return [CaseSpec(f"ctx={n}", (n,) * batch, (1,) * batch, **kw) for n in contexts]


def _fp8_decode(batch: int, contexts: tuple[int, ...], **kw: Any) -> list[CaseSpec]:
    """Decode from an e4m3 cache; scales put randn K/V well inside e4m3's range (448)."""
    return [
        CaseSpec(
            f"fp8_e4m3 ctx={n} x{batch}",
            (n,) * batch,
            (1,) * batch,
            kv_cache_dtype="fp8_e4m3",
            k_scale=0.05,
            v_scale=0.02,
            **kw,
        )
        for n in contexts
    ]


def _prefill(shapes: tuple[tuple[int, int], ...], **kw: Any) -> list[CaseSpec]:
    return [CaseSpec(f"len={n} x{b}", (n,) * b, (n,) * b, **kw) for b, n in shapes]


def _extend(shapes: tuple[tuple[int, int, int], ...], **kw: Any) -> list[CaseSpec]:
    return [CaseSpec(f"ctx={n} chunk={q} x{b}", (n,) * b, (q,) * b, **kw) for b, n, q in shapes]


def _spec(batch: int, context: int, query: int, **kw: Any) -> CaseSpec:
    """A speculative-decoding verify step: ``batch`` requests, each ``query`` = drafts + 1."""
    extra = f" window={kw['sliding_window']}" if kw.get("sliding_window") else ""
    heads = f" H={kw['num_heads']}/{kw['num_kv_heads']}" if "num_heads" in kw else ""
    return CaseSpec(
        f"q={query} ctx={context} x{batch}{heads}{extra}",
        (context,) * batch,
        (query,) * batch,
        **kw,
    )


def _dp(global_seqs: int, context: int, **kw: Any) -> list[CaseSpec]:
    """The most loaded rank's share of a fixed global decode batch, for dp_size 1..8.

    That rank decides the step time; it is placed on the last rank, in a
    per-rank pool, so its pages start at a non-zero global offset.
    """
    cases = []
    for dp in range(1, 9):
        seqs = math.ceil(global_seqs / dp)
        cases.append(
            CaseSpec(
                f"dp={dp}",
                (context,) * seqs,
                (1,) * seqs,
                dp_size=dp,
                dp_rank=dp - 1,
                layout="per_rank",
                **kw,
            )
        )
    return cases


MLA: dict[str, Any] = {"num_heads": 16, "num_kv_heads": 1, "head_dim": 576, "kv_lora_rank": 512}
"""DeepSeek-V3's latent row (512 + 64) under the 16 heads a rank holds at TP 8 in its DP group."""
MLA_GPU: dict[str, Any] = {**MLA, "num_heads": 128, **GPU}  # one DP rank serving all 128 heads


def _mixed(decode: int, context: int, chunk: tuple[int, int], prompt: int, **kw: Any) -> CaseSpec:
    contexts = (context,) * decode + (chunk[0], prompt)
    queries = (1,) * decode + (chunk[1], prompt)
    name = f"{decode} decode@{context} + chunk {chunk[1]}/{chunk[0]} + prompt {prompt}"
    return CaseSpec(name, contexts, queries, **kw)


def _ragged(contexts: tuple[int, ...], **kw: Any) -> CaseSpec:
    return CaseSpec(f"ragged decode x{len(contexts)}", contexts, (1,) * len(contexts), **kw)


def _build() -> dict[str, Workload]:
    specs = [
        Workload(
            "decode-sweep",
            1,
            "decode",
            "one new token per sequence over a growing context: memory-bound KV reads",
            _seeded("decode-sweep", _decode(4, (512, 1024, 2048, 4096))),
            _seeded("decode-sweep", _decode(32, (1024, 2048, 4096, 8192, 16384), **GPU)),
        ),
        Workload(
            "prefill-sweep",
            1,
            "prefill",
            "whole prompts, causal: compute-bound, query length = context length",
            _seeded("prefill-sweep", _prefill(((1, 128), (1, 256), (1, 512), (1, 1024)))),
            _seeded(
                "prefill-sweep",
                _prefill(((8, 512), (4, 1024), (2, 2048), (1, 4096)), **GPU),
            ),
        ),
        Workload(
            "extend",
            1,
            "extend",
            "chunked prefill: a chunk of new tokens on top of a cached context",
            _seeded("extend", _extend(((2, 1024, 128), (2, 2048, 256)))),
            _seeded("extend", _extend(((4, 8192, 512), (2, 16384, 2048)), **GPU)),
        ),
        Workload(
            "mixed",
            1,
            "mixed",
            "ragged batches as a scheduler builds them: decode rows, a chunk and a prompt",
            _seeded(
                "mixed",
                [
                    _mixed(6, 1024, (768, 256), 128),
                    _ragged((100, 700, 1500, 3000, 257, 33)),
                ],
            ),
            _seeded(
                "mixed",
                [
                    _mixed(48, 4096, (8192, 1024), 512, **GPU),
                    _ragged((100, 700, 1500, 3000, 9000, 16000, 257, 33) * 4, **GPU),
                ],
            ),
        ),
        Workload(
            "dp-scaling",
            1,
            "dp-scaling",
            "one rank's share of a fixed global decode batch as dp_size grows 1..8",
            _seeded("dp-scaling", _dp(8, 1024)),
            _seeded("dp-scaling", _dp(64, 4096, **GPU)),
        ),
        Workload(
            "variants",
            1,
            "decode",
            "attention variants served models use: a Mistral-like 4096-key sliding window "
            "over a 16k context, and decode from an FP8 (e4m3) KV cache",
            _seeded(
                "variants",
                [
                    CaseSpec("window=4096 ctx=16384", (16384,), (1,), sliding_window=4096),
                    CaseSpec("window=1024 ctx=4096 x4", (4096,) * 4, (1,) * 4, sliding_window=1024),
                    *_fp8_decode(4, (1024, 4096)),
                ],
            ),
            _seeded(
                "variants",
                [
                    CaseSpec(
                        "window=4096 ctx=16384 x32",
                        (16384,) * 32,
                        (1,) * 32,
                        sliding_window=4096,
                        **GPU,
                    ),
                    CaseSpec(
                        "window=4096 ctx=16384 chunk=512 x2",
                        (16384,) * 2,
                        (512,) * 2,
                        sliding_window=4096,
                        **GPU,
                    ),
                    *_fp8_decode(32, (4096, 16384), **GPU),
                ],
            ),
        ),
        Workload(
            "spec-decode",
            1,
            "extend",
            "speculative-decoding verify steps (EAGLE, MTP, n-gram): every request the same "
            "3-7 new tokens over a long context, at Llama's GQA 4 and Qwen2.5-7B's 7, and "
            "with a sliding window",
            _seeded(
                "spec-decode",
                [
                    _spec(8, 2048, 4),
                    _spec(8, 1024, 7),
                    _spec(16, 4096, 3),
                    _spec(8, 2048, 4, num_heads=28, num_kv_heads=4),
                    _spec(4, 4096, 5, sliding_window=1024),
                ],
            ),
            _seeded(
                "spec-decode",
                [
                    _spec(64, 8192, 4, **GPU),
                    _spec(32, 16384, 7, **GPU),
                    _spec(64, 4096, 4, num_heads=28, num_kv_heads=4, **GPU),
                    _spec(32, 16384, 5, sliding_window=4096, **GPU),
                ],
            ),
        ),
        Workload(
            "mla-decode-sweep",
            1,
            "decode",
            "MLA decode over DeepSeek-V3's latent cache (512 + 64, pages of 16): one latent row "
            "per token read once for every head",
            _seeded("mla-decode-sweep", _decode(4, (512, 1024, 2048, 4096), **MLA)),
            _seeded("mla-decode-sweep", _decode(32, (1024, 4096, 8192, 16384), **MLA_GPU)),
            attention="mla",
        ),
        Workload(
            "mla-dp-scaling",
            1,
            "dp-scaling",
            "one DP rank's share of a fixed global MLA decode batch as dp_size grows 1..8 "
            "(DeepSeek-V3's latent cache, the layout DP attention exists for)",
            _seeded("mla-dp-scaling", _dp(8, 1024, **MLA)),
            _seeded("mla-dp-scaling", _dp(64, 4096, **MLA_GPU)),
            attention="mla",
        ),
        Workload(
            "targets",
            1,
            "targets",
            "the optimized backends' speed targets: CPU decode 32 x 2048 fp32; "
            "GPU decode 64 x 8192 and causal prefill 8 x 4096 in bf16",
            _seeded("targets", _decode(32, (2048,))),
            _seeded(
                "targets",
                _decode(64, (8192,), **GPU) + _prefill(((8, 4096),), **GPU),
            ),
        ),
    ]
    return {w.name: w for w in specs}


WORKLOADS: dict[str, Workload] = _build()
OPTIONAL_WORKLOADS = ("targets", "variants", "spec-decode", "mla-decode-sweep", "mla-dp-scaling")
DEFAULT_WORKLOADS: tuple[str, ...] = tuple(w for w in WORKLOADS if w not in OPTIONAL_WORKLOADS)
"""The five sweeps, at CPU size about a minute; the optional ones run when named."""


def list_workloads() -> list[Workload]:
    return list(WORKLOADS.values())


def get_workload(name: str) -> Workload:
    """A workload by name; ``KeyError`` lists the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"Unknown workload {name!r}. Available: {', '.join(WORKLOADS)}") from None
