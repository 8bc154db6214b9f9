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
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from workers.engine.attention.backends import AttentionBackend
from workers.engine.kv.errors import KVCapacityError, KVOrderError
from workers.engine.kv.protocol import KeyRotation


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

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "head_dim", "page_size", "num_pages"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVPoolSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.host_pages is not None and self.host_pages < 0:
            raise ValueError(f"KVPoolSpec.host_pages must be >= 0 or None, got {self.host_pages}")

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: K and V, every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.page_size * self.num_heads * self.head_dim * element

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


@dataclass(frozen=True)
class SessionUsage:
    session_id: str
    tier: Literal["device", "host", "empty"]
    frames: tuple[int, ...]
    device_pages: int
    host_pages: int
    peak_device_pages: int
    page_bytes: int

    @property
    def device_bytes(self) -> int:
        return self.device_pages * self.page_bytes

    @property
    def host_bytes(self) -> int:
        return self.host_pages * self.page_bytes


def _as_run(pages: list[int]) -> tuple[int, int] | None:
    """(first, count) if `pages` is one ascending run of consecutive ids, else None."""
    if (
        pages
        and pages[-1] - pages[0] == len(pages) - 1
        and all(b - a == 1 for a, b in zip(pages, pages[1:], strict=False))
    ):
        return pages[0], len(pages)
    return None


class KVPool:
    """Owns the page tensors, the free list and the host-tier accounting."""

    def __init__(self, spec: KVPoolSpec) -> None:
        self.spec = spec
        shape = (spec.num_layers, spec.num_pages, spec.page_size, spec.num_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=spec.dtype, device=spec.device)
        self.v = torch.zeros(shape, dtype=spec.dtype, device=spec.device)
        # One view per layer, what the DiT's calls read and write: a compiled step that wrote into
        # the whole [layers, ...] tensor several times would have inductor copy the whole pool per call.
        self.layer_k, self.layer_v = list(self.k.unbind(0)), list(self.v.unbind(0))
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
        """Register a session. `window_frames=None` keeps every frame (global attention)."""
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

    # ---- fetch ----------------------------------------------------------------------------
    def fetch_range(self, layer: int, first_page: int, count: int) -> tuple[Tensor, Tensor]:
        """K, V [count*page_size, H, D] of consecutive pages: views into the pool, no copy."""
        if first_page < 0 or first_page + count > self.spec.num_pages:
            raise IndexError(f"page range [{first_page}, {first_page + count}) outside the pool")
        k = self.layer_k[layer][first_page : first_page + count].flatten(0, 1)
        v = self.layer_v[layer][first_page : first_page + count].flatten(0, 1)
        return k, v

    def fetch_pages(self, layer: int, page_ids: list[int] | Tensor) -> tuple[Tensor, Tensor]:
        """K, V [len(page_ids)*page_size, H, D] of arbitrary pages in the given order (a copy)."""
        ids = torch.as_tensor(page_ids, dtype=torch.long, device=self.k.device)
        return (
            self.layer_k[layer].index_select(0, ids).flatten(0, 1),
            self.layer_v[layer].index_select(0, ids).flatten(0, 1),
        )

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


class PagedSessionCache:
    """One session's page table; implements the DiT's `SelfAttentionCache` protocol."""

    def __init__(
        self,
        pool: KVPool,
        session_id: str,
        tokens_per_frame: int,
        window_frames: int | None,
        sink_frames: int,
    ) -> None:
        page_size = pool.spec.page_size
        if tokens_per_frame % page_size != 0:
            raise ValueError(
                f"page_size={page_size} must divide tokens_per_frame={tokens_per_frame} "
                f"(a frame is a whole number of pages)"
            )
        if window_frames is not None and window_frames <= sink_frames:
            raise ValueError(f"window_frames={window_frames} must exceed sink_frames={sink_frames}")
        self.pool = pool
        self.session_id = session_id
        self.tokens_per_frame = tokens_per_frame
        self.pages_per_frame = tokens_per_frame // page_size
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        self.frames: list[int] = []  # absolute latent frame of each cached frame, ascending
        self.pages: list[int] = []  # device page ids of those frames, frame-major
        # A windowed session's ring: its device pages, slot-major (None until its first block).
        self._ring: list[int] | None = None
        self._first_frame = 0  # the session's first frame: the sink starts there
        self.position_offset = 0  # a cached key's RoPE time position is its frame minus this
        self.peak_pages = 0
        self._tier: Literal["device", "host"] = "device"
        self._host: tuple[Tensor, Tensor] | None = None
        self._ready: torch.cuda.Event | None = None
        self._write: list[int] = []  # the pages `begin` prepared, in the call's frame order
        self._write_ids: Tensor | None = None
        self._write_run: tuple[int, int] | None = None
        self._table_ids: Tensor | None = None
        self._table_run: tuple[int, int] | None = None
        self._page_ids: Tensor | None = None  # every page, for batched attention (made when asked)

    # ---- the SelfAttentionCache protocol ---------------------------------------------------
    def begin(self, start_frame: int, num_frames: int) -> None:
        """Prepare pages for frames [start_frame, start_frame + num_frames)."""
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        self._on_device()
        new = list(range(start_frame, start_frame + num_frames))
        if self.frames[-num_frames:] == new:
            write = self.pages[len(self.pages) - num_frames * self.pages_per_frame :]
        elif not self.frames or start_frame > self.frames[-1]:
            write = self._append(new)
        else:
            raise KVOrderError(
                f"session {self.session_id!r} wrote frames {new[0]}..{new[-1]} but holds frames "
                f"{self.frames[0]}..{self.frames[-1]}: write the next frames or rewrite the last ones"
            )
        self._write = write
        self._write_run = _as_run(write)
        self._write_ids = None if self._write_run else self._ids(write)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        self.store(layer, k, v)
        pool = self.pool
        if self._table_run is not None:
            k_all, v_all = pool.fetch_range(layer, *self._table_run)
            return backend.dense(q, k_all.unsqueeze(0), v_all.unsqueeze(0))
        assert self._table_ids is not None
        return backend.paged(q, pool.layer_k[layer], pool.layer_v[layer], self._table_ids)

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Write the call's K/V [1, rows, H, D] into the pages `begin` prepared."""
        if k.shape[0] != 1:
            raise ValueError(f"a paged session cache holds one video; got batch size {k.shape[0]}")
        pool = self.pool
        shape = (-1, pool.spec.page_size, pool.spec.num_heads, pool.spec.head_dim)
        k_pages, v_pages = k[0].reshape(shape), v[0].reshape(shape)
        if self._write_run is not None:
            first, count = self._write_run
            pool.layer_k[layer][first : first + count] = k_pages
            pool.layer_v[layer][first : first + count] = v_pages
        else:
            assert self._write_ids is not None
            pool.layer_k[layer].index_copy_(0, self._write_ids, k_pages.to(pool.k.dtype))
            pool.layer_v[layer].index_copy_(0, self._write_ids, v_pages.to(pool.v.dtype))

    def write_pages(self) -> list[int]:
        """The pages the last `begin` prepared for the call's K/V, in the order of its frames."""
        return self._write

    def layer_pages(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """The pool's K and V pages of `layer` and this session's page ids, in the order attention
        reads them (frame order; slot order for a windowed session)."""
        if self._page_ids is None:
            self._page_ids = self._ids(self.read_pages())
        return self.pool.layer_k[layer], self.pool.layer_v[layer], self._page_ids

    # ---- RoPE re-basing -------------------------------------------------------------------
    def rebase(self, offset: int, rotate: KeyRotation) -> None:
        """Give the cached keys time positions `frame - offset` (see `rope.RopeRebase`).

        Every cached key, in every layer, sink and window alike, turns by the change of offset:
        attention depends only on the distance between time positions, so it stays what it was,
        and the session's next blocks can use positions the RoPE table holds. V has no position.
        """
        shift = self.position_offset - offset
        if shift == 0:
            return
        self._on_device()
        if self.pages:
            ids = self._ids(self.pages)
            for layer in range(self.pool.spec.num_layers):
                keys = self.pool.k[layer].index_select(0, ids)
                self.pool.k[layer].index_copy_(0, ids, rotate(keys, shift))
        self.position_offset = offset

    def _on_device(self) -> None:
        """Restore offloaded pages and make the current stream wait for their copy."""
        self.restore()
        if self._ready is not None:
            torch.cuda.current_stream(self.pool.k.device).wait_event(self._ready)
            self._ready = None

    # ---- table edits ----------------------------------------------------------------------
    def _append(self, new_frames: list[int]) -> list[int]:
        with self.pool._lock:
            if self.window_frames is not None:
                return self._append_to_ring(new_frames, self.window_frames)
            return self._append_locked(new_frames)

    def _append_locked(self, new_frames: list[int]) -> list[int]:
        need = len(new_frames) * self.pages_per_frame
        pages = self.pool.allocate(need, for_session=self.session_id)
        self.frames.extend(new_frames)
        self.pages.extend(pages)
        self.peak_pages = max(self.peak_pages, len(self.pages))
        self._table_changed()
        return pages

    def _append_to_ring(self, new_frames: list[int], window: int) -> list[int]:
        """Give the new frames their ring slots, evicting the frames that held them."""
        first = new_frames[0] if not self.frames else self._first_frame
        sink_end = first + self.sink_frames
        rolling = window - self.sink_frames
        if sum(f >= sink_end for f in new_frames) > rolling:
            raise KVCapacityError(
                f"session {self.session_id!r} writes {len(new_frames)} frames at once but its attention window "
                f"keeps {rolling} frames after its {self.sink_frames} sink frame(s); use blocks of at most "
                f"{rolling} frames or a longer window"
            )
        if self._ring is None:  # before any edit: a full pool leaves the session as it was
            self._ring = self.pool.allocate(window * self.pages_per_frame, for_session=self.session_id)
            self.peak_pages = max(self.peak_pages, len(self._ring))
        self._first_frame = first
        # The ring keeps the sink and the last `rolling` frame indices: the rest give up their slots.
        oldest_kept = new_frames[-1] - rolling + 1
        self.frames = [f for f in self.frames if f < sink_end or f >= oldest_kept] + new_frames
        self._table_changed()
        return self._pages_of(new_frames)

    def _slot(self, frame: int) -> int:
        offset = frame - self._first_frame
        if offset < self.sink_frames:
            return offset
        assert self.window_frames is not None
        return self.sink_frames + (offset - self.sink_frames) % (self.window_frames - self.sink_frames)

    def _slot_pages(self, slot: int) -> list[int]:
        assert self._ring is not None
        ppf = self.pages_per_frame
        return self._ring[slot * ppf : (slot + 1) * ppf]

    def _pages_of(self, frames: list[int]) -> list[int]:
        return [page for frame in frames for page in self._slot_pages(self._slot(frame))]

    def read_pages(self) -> list[int]:
        """The pages attention reads, in its order: frame order, or slot order in a ring."""
        if self._ring is None:
            return self.pages
        return [page for slot in sorted(map(self._slot, self.frames)) for page in self._slot_pages(slot)]

    def drop(self) -> None:
        """Forget every cached frame (device and host); the session can be rebuilt by recompute."""
        self.pool.release(self._device_pages())
        if self._host is not None:
            self.pool._unreserve_host(self._host[0].shape[1])
        self._host = None
        self._tier = "device"
        self.frames, self.pages, self._ring = [], [], None
        self.position_offset = 0
        self._table_changed()

    def _device_pages(self) -> list[int]:
        """Every device page the session holds (a ring's unused slots included)."""
        return self._ring if self._ring is not None else self.pages

    def _ids(self, pages: list[int]) -> Tensor:
        return torch.tensor(pages, dtype=torch.long, device=self.pool.k.device)

    def _table_changed(self) -> None:
        if self._ring is not None:
            self.pages = self._pages_of(self.frames)
        read = self.read_pages()
        self._page_ids = None
        self._table_run = _as_run(read)
        self._table_ids = None if self._table_run else self._ids(read)

    # ---- host tier ------------------------------------------------------------------------
    @property
    def tier(self) -> Literal["device", "host", "empty"]:
        if not self.frames:
            return "empty"
        return self._tier

    def offload(self) -> None:
        """Move the session's pages to host memory and free its device pages.

        On CUDA the copy runs on a side stream into pinned memory; the device pages return to
        the pool only when the copy has finished reading them.
        """
        if self._tier == "host" or not self.pages:
            return
        pool = self.pool
        pool._reserve_host(len(self.pages), self.session_id)
        ids = self._ids(self.pages)
        if pool._copy_stream is None:
            host = (pool.k.index_select(1, ids), pool.v.index_select(1, ids))
            event = None
        else:
            pool._copy_stream.wait_stream(torch.cuda.current_stream(pool.k.device))
            with torch.cuda.stream(pool._copy_stream):
                host = (
                    _to_pinned(pool.k.index_select(1, ids)),
                    _to_pinned(pool.v.index_select(1, ids)),
                )
                event = torch.cuda.Event()
                event.record(pool._copy_stream)
        pool._release_after(event, self._device_pages())
        self._host = host
        self.pages, self._ring = [], None
        self._tier = "host"
        self._table_changed()

    def restore(self) -> None:
        """Bring offloaded pages back to the device (asynchronously on CUDA; `begin` waits)."""
        if self._tier != "host":
            return
        assert self._host is not None
        pool = self.pool
        host_k, host_v = self._host
        host_pages = host_k.shape[1]
        if self.window_frames is not None:
            self._ring = pool.allocate(self.window_frames * self.pages_per_frame, for_session=self.session_id)
            pages = self._pages_of(self.frames)
        else:
            pages = pool.allocate(host_pages, for_session=self.session_id)
        ids = self._ids(pages)
        if pool._copy_stream is None:
            pool.k.index_copy_(1, ids, host_k)
            pool.v.index_copy_(1, ids, host_v)
        else:
            pool._copy_stream.wait_stream(torch.cuda.current_stream(pool.k.device))
            with torch.cuda.stream(pool._copy_stream):
                pool.k.index_copy_(1, ids, host_k.to(pool.k.device, non_blocking=True))
                pool.v.index_copy_(1, ids, host_v.to(pool.v.device, non_blocking=True))
                self._ready = torch.cuda.Event()
                self._ready.record(pool._copy_stream)
        pool._unreserve_host(host_pages)
        self._host = None
        self.pages = pages
        self._tier = "device"
        self._table_changed()

    def prefetch(self) -> None:
        """Start restoring an offloaded session ahead of its next block."""
        self.restore()

    # ---- inspection -----------------------------------------------------------------------
    def usage(self) -> SessionUsage:
        host_pages = self._host[0].shape[1] if self._host is not None else 0
        return SessionUsage(
            session_id=self.session_id,
            tier=self.tier,
            frames=tuple(self.frames),
            device_pages=len(self._device_pages()),
            host_pages=host_pages,
            peak_device_pages=self.peak_pages,
            page_bytes=self.pool.spec.page_bytes,
        )

    def layer_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        """The cached K (post-RoPE) and V of one layer, [tokens, H, D] in frame order (a copy)."""
        self.restore()
        if not self.pages:
            empty = self.pool.k.new_zeros((0, self.pool.spec.num_heads, self.pool.spec.head_dim))
            return empty, empty.clone()
        k, v = self.pool.fetch_pages(layer, self.pages)
        return k, v


def _to_pinned(t: Tensor) -> Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
