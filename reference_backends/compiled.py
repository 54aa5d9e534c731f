"""``compiled``: paged attention in a small C++ kernel that reads K/V in place from the pages.

Approach. ``csrc/paged_attention.cpp`` is plain C++ (no torch headers, so it
builds in ~2.5 s with any g++/clang++ and needs neither ninja nor a
build-time torch), compiled on first use with ``-O3 -march=native -fopenmp``
into a library cached per source, flags, compiler and CPU (under
``$ATTN_HARNESS_BUILD_DIR``, else the user cache directory), and called
through ctypes with raw pointers and strides. The build happens in the
constructor, never in ``forward``; ``prepare`` builds the work list.

The kernel never gathers. A work item is a (query tile, key split) of one
sequence for a group of KV heads; each KV head's GQA group of query heads
shares every K/V row it loads. A tile of few rows per KV head (decode) uses
AVX2 micro-kernels: 4 query rows x 2 keys of FMA chains for the logits, 4 rows
x 16 floats of register accumulators for P.V. A tile of 16+ rows (prefill,
extend) lays its rows innermost (``Q^T``, ``S^T``, ``A^T``), so each K/V
element is one broadcast against vectors of rows in registers, in the widest
vectors the build's ISA has (AVX-512: 16 floats). Keys are read through the
block table and the cache's own strides (halves of a combined ``[pages, 2,
...]`` tensor work as they are); the softmax is online in fp32 over blocks of
32 keys, and no key outside a row's visible range is ever read, so NaN garbage
past a sequence's end cannot reach an output. The next block's rows are
software-prefetched in address order, a few lines between compute chunks: the
hardware prefetchers stop at 4 KiB pages and one head's rows sit a token row
apart, and a burst of prefetches stalls the core (spreading them cut the decode
time ~35%). Few items (a short batch) split their keys (flash-decoding) and a
second pass merges the partials. OpenMP shares torch's runtime
(``libgomp.so.1`` is already loaded) at torch's thread count. Without AVX2 a
portable C++ path runs; without a compiler the constructor raises
``CompilerUnavailable``.

Measured with ``python tools/measure_compiled.py`` (one process; interleaved
medians of 15 calls) on the 2-core AMD EPYC (Zen 4, AVX2) CI VM, while other
jobs kept its load average at ~2: decode 32 x 2048, H=32 KV=8 D=128 fp32,
page 16. Build: cold 2.7 s, cached 3.4 ms. 2 threads: ``compiled`` 57 ms,
contiguous SDPA 143 ms (0.40x), ``sdpa`` 204 ms (1.42x); 9.4 GB/s moved =
36% of the same moment's copy bandwidth (25.7 GB/s). 1 thread: 51 ms vs
134 ms (0.38x), 10.6 GB/s = 37% of copy (28.4 GB/s). On that loaded machine
2 threads lose to 1: a preempted OpenMP thread holds up the barrier.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.errors import Unsupported
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.validate import CacheGeometry, CheckedMetadata

SOURCE = Path(__file__).resolve().parent / "csrc" / "paged_attention.cpp"
ABI_VERSION = 3
CACHE_ENV = "ATTN_HARNESS_BUILD_DIR"  # where built libraries are kept (default ~/.cache)
TILE_FIELDS = 8  # q_token, q_count, q_pos, bt_off, k_begin, k_end, part, unused
MAX_TILE_ROWS = 64  # query rows (tokens x GQA group) of one KV head in a tile
MAX_ITEM_ROWS = 64  # query rows of all the KV heads one work item runs together
SPLIT_MIN_KEYS = 256  # a key split shorter than this costs more to merge than it saves
ITEMS_PER_THREAD = 4  # split keys until there are this many items per thread

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class CompilerUnavailable(RuntimeError):
    """The kernel cannot be built: no working C++ compiler on this machine."""


_INT, _PTR = ctypes.c_int64, ctypes.c_void_p


class _Params(ctypes.Structure):
    """``Params`` of the C++ source, field for field (all 8 bytes wide)."""

    _fields_ = [
        ("dtype", _INT),
        ("num_heads", _INT),
        ("num_kv_heads", _INT),
        ("head_dim", _INT),
        ("page_size", _INT),
        *[(name, _PTR if name == "q" else _INT) for name in ("q", "q_s0", "q_s1", "q_s2")],
        *[(name, _PTR if name == "k" else _INT) for name in ("k", "k_s0", "k_s1", "k_s2", "k_s3")],
        *[(name, _PTR if name == "v" else _INT) for name in ("v", "v_s0", "v_s1", "v_s2", "v_s3")],
        ("out", _PTR),
        ("block_table", _PTR),
        ("tiles", _PTR),
        ("num_tiles", _INT),
        ("merges", _PTR),
        ("num_merges", _INT),
        ("partials", _PTR),
        ("max_rows", _INT),
        ("heads_per_item", _INT),
        ("causal", _INT),
        ("num_threads", _INT),
        ("scale", ctypes.c_double),
        ("value_dim", _INT),
    ]


@dataclass(frozen=True)
class BuildInfo:
    """Where the library came from and what building it cost (0 when cached)."""

    path: Path
    seconds: float
    cached: bool
    command: tuple[str, ...]


_LOCK = threading.Lock()
_LIBRARY: ctypes.CDLL | None = None
_BUILD: BuildInfo | None = None


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise CompilerUnavailable(
        "the 'compiled' backend builds a C++ kernel on first use and found no compiler "
        "(set CXX, or install g++); use the 'sdpa' backend on this machine instead"
    )


def _cpu_fingerprint() -> str:
    """What ``-march=native`` depends on, so a cache shared across machines stays right."""
    keys = ("flags", "Features", "model name", "CPU part")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            lines = {line.split(":")[0].strip(): line for line in info if line.startswith(keys)}
        return "".join(sorted(lines.values()))
    except OSError:
        return platform.processor() or platform.machine()


def build_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attn-harness" / "compiled"


def _flag_sets() -> list[list[str]]:
    """Flags to try, best first: without -march=native or OpenMP where they fail."""
    base = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno"]
    return [
        [*base, "-march=native", "-fopenmp"],
        [*base, "-fopenmp"],
        [*base, "-march=native"],
        base,
    ]


def _build(force: bool = False) -> BuildInfo:
    """Compile the kernel into the cache (atomically), or find it there."""
    compiler = _compiler()
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=False, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilerUnavailable(f"{compiler} --version failed: {error}") from error
    errors: list[str] = []
    for flags in _flag_sets():
        digest = hashlib.sha256(
            b"\0".join(
                [source, " ".join(flags).encode(), version.encode(), _cpu_fingerprint().encode()]
            )
        ).hexdigest()[:16]
        target = build_dir() / f"paged_attention-{digest}.so"
        command = (compiler, *flags, str(SOURCE), "-o", str(target))
        if target.exists() and not force:
            return BuildInfo(target, 0.0, True, command)
        target.parent.mkdir(parents=True, exist_ok=True)
        # build beside the target and rename: concurrent builders never see half a file
        fd, scratch = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        start = time.perf_counter()
        result = subprocess.run(
            [*command[:-1], scratch], capture_output=True, text=True, check=False, timeout=600
        )
        seconds = time.perf_counter() - start
        if result.returncode == 0:
            os.replace(scratch, target)
            return BuildInfo(target, seconds, False, command)
        os.unlink(scratch)
        errors.append(f"$ {' '.join(command)}\n{result.stderr.strip()[-2000:]}")
    raise CompilerUnavailable(
        "the 'compiled' backend could not build its C++ kernel:\n" + "\n\n".join(errors)
    )


def load_library(force_build: bool = False, reload: bool = False) -> ctypes.CDLL:
    """The kernel library, built on first use and cached.

    ``force_build`` rebuilds it and ``reload`` looks it up again (both to time
    a build); otherwise the library loaded first is returned.
    """
    global _LIBRARY, _BUILD
    with _LOCK:
        if _LIBRARY is not None and not (force_build or reload):
            return _LIBRARY
        info = _build(force=force_build)
        library = ctypes.CDLL(str(info.path))
        library.paged_attention_abi_version.restype = ctypes.c_int64
        library.paged_attention_openmp.restype = ctypes.c_int64
        library.paged_attention_forward.argtypes = [ctypes.POINTER(_Params)]
        library.paged_attention_forward.restype = None
        if library.paged_attention_abi_version() != ABI_VERSION:
            raise RuntimeError(f"{info.path} is a stale build of the kernel; delete it")
        if not library.paged_attention_openmp():
            print(
                f"attn-harness: {info.path} was built without OpenMP: the compiled "
                "backend runs on one thread",
                file=sys.stderr,
            )
        _LIBRARY, _BUILD = library, info
        return library


def build_info() -> BuildInfo | None:
    """How the loaded library was obtained (``None`` before the first load)."""
    return _BUILD


@dataclass(frozen=True)
class CompiledPlan:
    """One step's work list for the kernel, built in ``prepare``."""

    tiles: torch.Tensor  # int32 [n, TILE_FIELDS]
    merges: torch.Tensor  # int32 [m, 4]: first partial, splits, q_token, q_count
    block_table: torch.Tensor  # int32, each real row's local page ids, concatenated
    max_rows: int  # most query rows of one tile, per KV head
    heads_per_item: int  # KV heads one work item runs, block by block
    partial_slots: int
    padded_tokens: bool  # query tokens of graph-mode padding rows (output zeroed)
    num_threads: int


def _tile_tokens(query_len: int, group: int) -> int:
    """Query tokens per tile: as many as keep a tile's rows within MAX_TILE_ROWS."""
    return max(1, min(query_len, MAX_TILE_ROWS // group))


def build_plan(
    checked: CheckedMetadata,
    geometry: CacheGeometry,
    *,
    num_heads: int,
    num_kv_heads: int,
    num_threads: int,
) -> CompiledPlan:
    """Tiles (query tile x key split) of every real row, in the kernel's layout."""
    group = num_heads // num_kv_heads
    causal = checked.causal
    starts = checked.query_start
    table: list[int] = []
    spans: list[tuple[int, int, int, int, int]] = []  # q_token, q_count, q_pos, bt_off, k_end
    padded = False
    for row, (length, pages) in enumerate(zip(checked.seq_lens, checked.pages, strict=True)):
        q_len = starts[row + 1] - starts[row]
        if length == 0:
            padded = padded or q_len > 0
            continue
        if q_len == 0:
            continue
        bt_off = len(table)
        table.extend(page - geometry.page_offset for page in pages)
        step = _tile_tokens(q_len, group)
        first = length - q_len
        for j in range(0, q_len, step):
            count = min(step, q_len - j)
            k_end = min(length, first + j + count) if causal else length
            spans.append((starts[row] + j, count, first + j, bt_off, k_end))
    rows = max((span[1] for span in spans), default=1) * group
    heads_per_item = max(1, min(num_kv_heads, MAX_ITEM_ROWS // rows))
    items = len(spans) * -(-num_kv_heads // heads_per_item)
    splits_wanted = 1
    if spans and items < ITEMS_PER_THREAD * num_threads:
        splits_wanted = -(-ITEMS_PER_THREAD * num_threads // items)
    tiles: list[list[int]] = []
    merges: list[list[int]] = []
    slots = 0
    for q_token, count, q_pos, bt_off, k_end in spans:
        splits = min(splits_wanted, max(1, k_end // SPLIT_MIN_KEYS))
        if splits == 1:
            tiles.append([q_token, count, q_pos, bt_off, 0, k_end, -1, 0])
            continue
        merges.append([slots, splits, q_token, count])
        chunk = -(-k_end // splits)
        for s in range(splits):
            begin = s * chunk
            tiles.append(
                [q_token, count, q_pos, bt_off, begin, min(k_end, begin + chunk), slots, 0]
            )
            slots += num_kv_heads
    tiles.sort(key=lambda t: t[5] - t[4], reverse=True)  # longest first: balanced threads

    def int32(rows: list[list[int]] | list[int], width: int) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int32).reshape(-1, width).contiguous()

    return CompiledPlan(
        tiles=int32(tiles, TILE_FIELDS),
        merges=int32(merges, 4),
        block_table=torch.tensor(table or [0], dtype=torch.int32),
        max_rows=rows,
        heads_per_item=heads_per_item,
        partial_slots=slots,
        padded_tokens=padded,
        num_threads=num_threads,
    )


class CompiledBackend(PagedBackendBase):
    """Paged attention through the C++ kernel; CPU only, DP-aware through the base."""

    per_sequence_rows = False
    devices = ("cpu",)

    def __init__(
        self,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        dp_size: int = 1,
        dp_rank: int = 0,
        validate: bool = True,
        kv_lora_rank: int | None = None,
    ) -> None:
        super().__init__(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            dp_size=dp_size,
            dp_rank=dp_rank,
            validate=validate,
            kv_lora_rank=kv_lora_rank,
        )
        self._library = load_library()  # the build (seconds, once per machine) happens here
        self._partials = torch.empty(0, dtype=torch.float32)

    @classmethod
    def capabilities(cls) -> Capabilities:
        """Float32/16/bf16 on the CPU: any page size, head dim, GQA group and DP size."""
        return Capabilities(
            dtypes=tuple(_DTYPE_CODES),
            devices=cls.devices,
            out_buffer=True,
            padding_rows="zero",  # a step with padded tokens gets a zeroed output
        )

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None:
        super().bind_kv_caches(layer_caches)
        geometry = self._require_bound()
        if geometry.device.type != "cpu" or geometry.dtype not in _DTYPE_CODES:
            self._geometry = None  # not bound: prepare and forward refuse to run
            raise Unsupported(
                f"the compiled backend runs on the CPU in {', '.join(map(str, _DTYPE_CODES))}, "
                f"not {geometry.device} {geometry.dtype}"
            )

    def plan_step(self, checked: CheckedMetadata, geometry: CacheGeometry) -> CompiledPlan:
        plan = build_plan(
            checked,
            geometry,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            num_threads=torch.get_num_threads(),
        )
        needed = plan.partial_slots * plan.max_rows * (self.value_dim + 2)
        if self._partials.numel() < needed:  # sized here, on the host, not in forward
            self._partials = torch.empty(needed, dtype=torch.float32)
        return plan

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        plan: CompiledPlan = step.plan
        if query.dtype not in _DTYPE_CODES:
            raise Unsupported(f"the compiled backend does not support {query.dtype}")
        alloc = torch.zeros if plan.padded_tokens else torch.empty
        out = alloc(query.shape[0], self.num_heads, self.value_dim, dtype=query.dtype)
        if plan.tiles.shape[0] == 0:
            return out
        key, value = cache.key, cache.value
        params = _Params(
            dtype=_DTYPE_CODES[query.dtype],
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            page_size=key.shape[1],
            q=query.data_ptr(),
            q_s0=query.stride(0),
            q_s1=query.stride(1),
            q_s2=query.stride(2),
            k=key.data_ptr(),
            k_s0=key.stride(0),
            k_s1=key.stride(1),
            k_s2=key.stride(2),
            k_s3=key.stride(3),
            v=value.data_ptr(),
            v_s0=value.stride(0),
            v_s1=value.stride(1),
            v_s2=value.stride(2),
            v_s3=value.stride(3),
            out=out.data_ptr(),
            block_table=plan.block_table.data_ptr(),
            tiles=plan.tiles.data_ptr(),
            num_tiles=plan.tiles.shape[0],
            merges=plan.merges.data_ptr(),
            num_merges=plan.merges.shape[0],
            partials=self._partials.data_ptr(),
            max_rows=plan.max_rows,
            heads_per_item=plan.heads_per_item,
            causal=int(step.checked.causal),
            num_threads=torch.get_num_threads(),
            scale=self.scale,
            value_dim=self.value_dim,
        )
        self._library.paged_attention_forward(ctypes.byref(params))
        return out


class CompiledMlaBackend(CompiledBackend):
    """MLA decode, prefill and extend through the same kernel (kind ``mla``; CPU only).

    MLA is one KV head whose value row is the first ``kv_lora_rank`` entries
    of its latent row, so the kernel's GQA path serves it unchanged: the
    whole head group (every query head) shares each latent row it loads, the
    value pointer is the latent cache itself and the value width
    ``kv_lora_rank``; split-KV merges run over that width.
    """

    @classmethod
    def capabilities(cls) -> Capabilities:
        """Float32/16/bf16 latent caches on the CPU: any latent geometry, page size, DP size."""
        return dataclasses.replace(super().capabilities(), kind="mla")
