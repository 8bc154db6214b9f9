"""A pool of fixed-size KV pages shared by many sessions, with a page table per session.

Layout: one K and one V tensor of shape [num_layers, num_pages, page_size, heads, head_dim].
A page id names the same slot in every layer (as in vLLM), so a session's page table is one
list of ids. By default a page holds the tokens of one latent frame.

Sliding windows live in a ring. A windowed session takes its whole window's pages at its first
block, as one run of consecutive ids when the pool has one, and gives each frame a fixed slot:
the sink frames the first slots, every later frame `sink + (frame - sink) mod (window - sink)`.
A new frame overwrites the slot of the frame it evicts, so nothing is shifted, copied or
re-allocated as the window rolls. Attention reads the held slots in slot order: softmax
attention over an unmasked cache does not depend on the order of its keys (RoPE is applied
before caching), so once the window is full (or while it fills from its first slot) the read is
one view of the pool, whatever the frames' logical order. A frame's slot depends only on its
index, so every path that holds the same frames (a replay after a crash, a batched forward)
reads them in the same order and computes the same bits.

Fetching: when the pages attention reads form one ascending run it reads a view of the pool
(range fetch, no copy); otherwise it gathers the pages by id (index fetch), or hands the page
list to a backend with a native paged kernel.

The 8-bit page format is `engine.kv.page_codec`; one session's page table, ring and host tier is
`engine.kv.session_cache`.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from engine.kv.errors import KVCapacityError
from engine.kv.page_codec import (
    _SCALE_BYTES,
    _STORAGE,
    check_kv_dtype,
    dequantize_pages,
    quantize_pages,
)
from engine.kv.session_cache import PagedSessionCache, Pages


@dataclass(frozen=True)
class KVPoolSpec:
    """Shape and capacity of a pool. `host_pages=None` leaves the host tier unbounded."""

    num_layers: int
    num_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    host_pages: int | None = None
    kv_dtype: str = "auto"  # "auto": pages in `dtype`; "fp8" / "int8": 8-bit pages + scales

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "head_dim", "page_size", "num_pages"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVPoolSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.host_pages is not None and self.host_pages < 0:
            raise ValueError(f"KVPoolSpec.host_pages must be >= 0 or None, got {self.host_pages}")
        check_kv_dtype(self.kv_dtype)

    @property
    def quantized(self) -> bool:
        """Whether pages hold 8-bit K/V with scales (read back in `dtype`)."""
        return self.kv_dtype != "auto"

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype of the page tensors: `dtype`, int8, or uint8 holding fp8 e4m3 bits."""
        return _STORAGE[self.kv_dtype] if self.quantized else self.dtype

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: K and V, every layer (with their scales when 8-bit)."""
        element = torch.empty((), dtype=self.storage_dtype).element_size()
        values = 2 * self.num_layers * self.page_size * self.num_heads * self.head_dim * element
        scales = 2 * self.num_layers * self.num_heads * _SCALE_BYTES if self.quantized else 0
        return values + scales

    @property
    def total_bytes(self) -> int:
        return self.page_bytes * self.num_pages


@dataclass(frozen=True)
class PoolUsage:
    total_pages: int
    used_pages: int
    free_pages: int
    page_bytes: int
    host_pages_used: int
    sessions: int

    @property
    def used_bytes(self) -> int:
        return self.used_pages * self.page_bytes

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_bytes

    @property
    def host_bytes_used(self) -> int:
        return self.host_pages_used * self.page_bytes


class KVPool:
    """Owns the page tensors, the free list and the host-tier accounting."""

    def __init__(self, spec: KVPoolSpec) -> None:
        self.spec = spec
        shape = (spec.num_layers, spec.num_pages, spec.page_size, spec.num_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=spec.storage_dtype, device=spec.device)
        self.v = torch.zeros(shape, dtype=spec.storage_dtype, device=spec.device)
        # One view per layer, what the DiT's calls read and write: a compiled step that wrote into
        # the whole [layers, ...] tensor several times would have inductor copy the whole pool per call.
        self.layer_k, self.layer_v = list(self.k.unbind(0)), list(self.v.unbind(0))
        # 8-bit pools: the fp32 scale of every (layer, page, head) of K and of V.
        self.k_scale: Tensor | None = None
        self.v_scale: Tensor | None = None
        self._layer_scales: dict[str, list[Tensor]] = {}
        if spec.quantized:
            scale_shape = (spec.num_layers, spec.num_pages, spec.num_heads)
            self.k_scale = torch.ones(scale_shape, dtype=torch.float32, device=spec.device)
            self.v_scale = torch.ones(scale_shape, dtype=torch.float32, device=spec.device)
            self._layer_scales = {"k": list(self.k_scale.unbind(0)), "v": list(self.v_scale.unbind(0))}
        self._free: list[int] = list(range(spec.num_pages))  # kept sorted: low ids first keeps runs
        self._lock = threading.RLock()
        self._sessions: dict[str, PagedSessionCache] = {}
        self._host_pages_used = 0
        self._is_cuda = self.k.is_cuda
        self._copy_stream = torch.cuda.Stream(device=self.k.device) if self._is_cuda else None
        # Pages whose contents an asynchronous copy still reads: freed once the copy is done.
        self._pending_free: list[tuple[torch.cuda.Event, list[int]]] = []

    # ---- sessions -------------------------------------------------------------------------
    def open_session(
        self,
        session_id: str,
        tokens_per_frame: int,
        window_frames: int | None = None,
        sink_frames: int = 0,
    ) -> PagedSessionCache:
        """Register a session. `window_frames=None` keeps every frame (global attention).

        A windowed session takes its whole ring at its first block, so a pool too small for one
        ring is refused here, not deep inside the first forward.
        """
        if window_frames is not None and tokens_per_frame % self.spec.page_size == 0:
            need = window_frames * (tokens_per_frame // self.spec.page_size)
            if need > self.spec.num_pages:
                raise KVCapacityError(
                    f"session {session_id!r} has an attention window of {window_frames} latent frames, "
                    f"{need} KV page(s), but the pool has {self.spec.num_pages} page(s) in all; give the "
                    f"pool at least {need} pages (e.g. pool_spec(..., frames={window_frames})) or shorten the window"
                )
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} already has a page table in this pool")
            cache = PagedSessionCache(self, session_id, tokens_per_frame, window_frames, sink_frames)
            self._sessions[session_id] = cache
            return cache

    def close_session(self, session_id: str) -> None:
        """Free every page of the session (device and host) and forget it."""
        with self._lock:
            cache = self._sessions.pop(session_id, None)
            if cache is None:
                raise KeyError(f"unknown session {session_id!r}")
            cache.drop()

    def session(self, session_id: str) -> PagedSessionCache:
        with self._lock:
            try:
                return self._sessions[session_id]
            except KeyError:
                raise KeyError(f"unknown session {session_id!r}") from None

    def session_ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    # ---- pages ----------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        with self._lock:
            self._reclaim(block=False)
            return len(self._free) + sum(len(p) for _, p in self._pending_free)

    def allocate(self, count: int, *, for_session: str = "?") -> list[int]:
        """Take `count` pages, preferring the lowest run of consecutive ids (keeps range fetch)."""
        with self._lock:
            self._reclaim(block=len(self._free) < count)
            if count > len(self._free):
                raise KVCapacityError(
                    f"KV pool out of pages: session {for_session!r} needs {count} page(s), "
                    f"{len(self._free)} of {self.spec.num_pages} free; finish or offload other "
                    f"sessions, shorten the attention window, or give the pool more pages"
                )
            start = self._find_run(count)
            if start is not None:
                taken = self._free[start : start + count]
                del self._free[start : start + count]
            else:
                taken = self._free[:count]
                del self._free[:count]
            return taken

    def _find_run(self, count: int) -> int | None:
        free = self._free
        run_start = 0
        for i in range(1, len(free) + 1):
            if i == len(free) or free[i] != free[i - 1] + 1:
                if i - run_start >= count:
                    return run_start
                run_start = i
        return None

    def release(self, pages: list[int]) -> None:
        with self._lock:
            for p in pages:
                bisect.insort(self._free, p)

    def _release_after(self, event: torch.cuda.Event | None, pages: list[int]) -> None:
        if event is None:
            self.release(pages)
        else:
            with self._lock:
                self._pending_free.append((event, pages))

    def _reclaim(self, block: bool) -> None:
        still: list[tuple[torch.cuda.Event, list[int]]] = []
        for event, pages in self._pending_free:
            if block:
                event.synchronize()
            if block or event.query():
                for p in pages:
                    bisect.insort(self._free, p)
            else:
                still.append((event, pages))
        self._pending_free = still

    def _reserve_host(self, count: int, session_id: str) -> None:
        with self._lock:
            limit = self.spec.host_pages
            if limit is not None and self._host_pages_used + count > limit:
                raise KVCapacityError(
                    f"KV host tier full: session {session_id!r} needs {count} page(s), "
                    f"{limit - self._host_pages_used} of {limit} free"
                )
            self._host_pages_used += count

    def _unreserve_host(self, count: int) -> None:
        with self._lock:
            self._host_pages_used -= count

    # ---- read and write -------------------------------------------------------------------
    @property
    def kv_read_path(self) -> Literal["direct", "dequantize-per-page"]:
        """How attention reads the pages: as stored, or dequantized page by page into `spec.dtype`
        (8-bit pools; no kernel here reads 8-bit pages directly)."""
        return "dequantize-per-page" if self.spec.quantized else "direct"

    def fetch_range(self, layer: int, first_page: int, count: int) -> tuple[Tensor, Tensor]:
        """K, V [count*page_size, H, D] of consecutive pages: views into the pool, no copy
        (an 8-bit pool: a dequantized copy)."""
        if first_page < 0 or first_page + count > self.spec.num_pages:
            raise IndexError(f"page range [{first_page}, {first_page + count}) outside the pool")
        run = (first_page, count)
        return self._read("k", layer, run).flatten(0, 1), self._read("v", layer, run).flatten(0, 1)

    def fetch_pages(self, layer: int, page_ids: list[int] | Tensor) -> tuple[Tensor, Tensor]:
        """K, V [len(page_ids)*page_size, H, D] of arbitrary pages in the given order (a copy)."""
        ids = torch.as_tensor(page_ids, dtype=torch.long, device=self.k.device)
        return self._read("k", layer, ids).flatten(0, 1), self._read("v", layer, ids).flatten(0, 1)

    def write(self, layer: int, pages: Pages, k: Tensor, v: Tensor) -> None:
        """Store K, V pages [n, page_size, H, D] of `layer` at a run (first, count) or page ids;
        an 8-bit pool quantizes each page with a fresh scale per head."""
        self._write("k", layer, pages, k)
        self._write("v", layer, pages, v)

    def _read(self, name: Literal["k", "v"], layer: int, pages: Pages) -> Tensor:
        data = (self.layer_k if name == "k" else self.layer_v)[layer]
        taken = data[pages[0] : pages[0] + pages[1]] if isinstance(pages, tuple) else data.index_select(0, pages)
        if not self.spec.quantized:
            return taken
        scale = self._layer_scales[name][layer]
        scales = scale[pages[0] : pages[0] + pages[1]] if isinstance(pages, tuple) else scale.index_select(0, pages)
        return dequantize_pages(taken, scales, self.spec.kv_dtype, self.spec.dtype)

    def _write(self, name: Literal["k", "v"], layer: int, pages: Pages, x: Tensor) -> None:
        data = (self.layer_k if name == "k" else self.layer_v)[layer]
        if self.spec.quantized:
            x, scales = quantize_pages(x, self.spec.kv_dtype)
            scale = self._layer_scales[name][layer]
            if isinstance(pages, tuple):
                scale[pages[0] : pages[0] + pages[1]] = scales
            else:
                scale.index_copy_(0, pages, scales)
        if isinstance(pages, tuple):
            data[pages[0] : pages[0] + pages[1]] = x
        else:
            data.index_copy_(0, pages, x.to(data.dtype))

    def _page_tensors(self) -> list[Tensor]:
        """Every tensor indexed [layer, page, ...]: what a session's pages are made of."""
        scales = [] if self.k_scale is None or self.v_scale is None else [self.k_scale, self.v_scale]
        return [self.k, self.v, *scales]

    # ---- accounting -----------------------------------------------------------------------
    def usage(self) -> PoolUsage:
        with self._lock:
            free = self.free_pages
            return PoolUsage(
                total_pages=self.spec.num_pages,
                used_pages=self.spec.num_pages - free,
                free_pages=free,
                page_bytes=self.spec.page_bytes,
                host_pages_used=self._host_pages_used,
                sessions=len(self._sessions),
            )
