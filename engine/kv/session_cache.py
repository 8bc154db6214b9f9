"""One session's pages in a `KVPool`: its page table, the ring of a sliding window, RoPE re-basing
and the host tier (offload / prefetch). See `engine.kv.pool` for the layout and the ring's rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from engine.attention.backends import AttentionBackend
from engine.kv.errors import KVCapacityError, KVOrderError
from engine.kv.protocol import KeyRotation

if TYPE_CHECKING:
    from engine.kv.pool import KVPool

# Pages to write or read: one run (first, count) or page ids.
Pages = tuple[int, int] | Tensor


def _as_run(pages: list[int]) -> tuple[int, int] | None:
    """(first, count) if `pages` is one ascending run of consecutive ids, else None."""
    if (
        pages
        and pages[-1] - pages[0] == len(pages) - 1
        and all(b - a == 1 for a, b in zip(pages, pages[1:], strict=False))
    ):
        return pages[0], len(pages)
    return None


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
        self._read_order: list[int] = []  # `read_pages`, set by `_table_changed`
        self.pages: list[int] = []  # device page ids of those frames, frame-major
        # A windowed session's ring: its device pages, slot-major (None until its first block).
        self._ring: list[int] | None = None
        self._first_frame = 0  # the session's first frame: the sink starts there
        self.position_offset = 0  # a cached key's RoPE time position is its frame minus this
        self.peak_pages = 0
        self._tier: Literal["device", "host"] = "device"
        self._host: tuple[Tensor, ...] | None = None  # the pages' tensors (`KVPool._page_tensors`)
        self._ready: torch.cuda.Event | None = None
        self._write: list[int] = []  # the pages `begin` prepared, in the call's frame order
        self._write_ids: Tensor | None = None
        self._write_run: tuple[int, int] | None = None
        self._table_ids: Tensor | None = None
        self._table_run: tuple[int, int] | None = None
        self._page_ids: Tensor | None = None  # every page, for batched attention (made when asked)
        # An 8-bit pool: the dequantized pages `layer_pages` last returned (layer, K, V), which the
        # layer's `store` brings up to date, and where in them the pages `begin` prepared sit.
        self._read_copy: tuple[int, Tensor, Tensor] | None = None
        self._write_rows: Tensor | None = None

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
        self._read_copy = self._write_rows = None

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        # Pages `layer_pages` just dequantized for this layer (the store below updates them) are reused.
        copy = self._read_copy if self._read_copy is not None and self._read_copy[0] == layer else None
        self.store(layer, k, v)
        pool = self.pool
        if copy is not None:
            _, k_all, v_all = copy
            return backend.dense(q, k_all.flatten(0, 1).unsqueeze(0), v_all.flatten(0, 1).unsqueeze(0))
        if pool.spec.quantized:  # a backend reads pages as stored: hand it dequantized ones
            pages: Pages | None = self._table_run if self._table_run is not None else self._table_ids
            assert pages is not None
            k_all, v_all = self._with_own_rows(pool._read("k", layer, pages), pool._read("v", layer, pages), k, v)
            return backend.dense(q, k_all.flatten(0, 1).unsqueeze(0), v_all.flatten(0, 1).unsqueeze(0))
        if self._table_run is not None:
            k_all, v_all = pool.fetch_range(layer, *self._table_run)
            return backend.dense(q, k_all.unsqueeze(0), v_all.unsqueeze(0))
        assert self._table_ids is not None
        return backend.paged(q, pool.layer_k[layer], pool.layer_v[layer], self._table_ids)

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Write the call's K/V [1, rows, H, D] into the pages `begin` prepared (whole pages)."""
        if k.shape[0] != 1:
            raise ValueError(f"a paged session cache holds one video; got batch size {k.shape[0]}")
        pool = self.pool
        page_size = pool.spec.page_size
        if k.shape[1] != len(self._write) * page_size:
            # An 8-bit page's scale is computed from the whole page: a write must cover whole pages.
            raise ValueError(
                f"session {self.session_id!r} stores {k.shape[1]} K/V rows but begin prepared "
                f"{len(self._write)} page(s) of {page_size} tokens: a write covers whole pages"
            )
        shape = (-1, page_size, pool.spec.num_heads, pool.spec.head_dim)
        pages = self._write_run if self._write_run is not None else self._write_ids
        assert pages is not None
        pool.write(layer, pages, k[0].reshape(shape), v[0].reshape(shape))
        if self._read_copy is not None and self._read_copy[0] == layer:
            self._refresh_read_copy(k, v)

    def _with_own_rows(self, k_pages: Tensor, v_pages: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Dequantized pages [n, page_size, H, D] (in read order) with the pages this call writes
        holding its own K/V [1, rows, H, D] in full precision: a block attends to itself unrounded
        (as vLLM's prefill does), to earlier blocks through their 8-bit pages. Solo and batched
        calls both read this, so they stay bit-identical."""
        if self._write_rows is None:
            row = {page: i for i, page in enumerate(self.read_pages())}
            self._write_rows = self._ids([row[page] for page in self._write])
        shape = (-1, *k_pages.shape[1:])
        k_pages.index_copy_(0, self._write_rows, k[0].reshape(shape).to(k_pages.dtype))
        v_pages.index_copy_(0, self._write_rows, v[0].reshape(shape).to(v_pages.dtype))
        return k_pages, v_pages

    def _refresh_read_copy(self, k: Tensor, v: Tensor) -> None:
        """Put the call's K/V into the copy `layer_pages` returned: a batched forward reads the
        session's pages before it stores the call's K/V, then attends over them."""
        assert self._read_copy is not None
        _, k_copy, v_copy = self._read_copy
        self._with_own_rows(k_copy, v_copy, k, v)
        self._read_copy = None  # its reader holds it; the cache need not keep it alive

    def write_pages(self) -> list[int]:
        """The pages the last `begin` prepared for the call's K/V, in the order of its frames."""
        return self._write

    def layer_pages(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """The pool's K and V pages of `layer` and this session's page ids, in the order attention
        reads them (frame order; slot order for a windowed session).

        An 8-bit pool returns the session's own pages dequantized, in that order, with ids 0..n-1;
        a `store` of the same layer that follows is written into them too.
        """
        pool = self.pool
        if not pool.spec.quantized:
            if self._page_ids is None:
                self._page_ids = self._ids(self.read_pages())
            return pool.layer_k[layer], pool.layer_v[layer], self._page_ids
        if self._table_run is not None:
            pages: Pages = self._table_run
        else:
            assert self._table_ids is not None
            pages = self._table_ids
        k, v = pool._read("k", layer, pages), pool._read("v", layer, pages)
        self._read_copy = (layer, k, v)
        if self._page_ids is None:
            self._page_ids = torch.arange(k.shape[0], dtype=torch.long, device=k.device)
        return k, v, self._page_ids

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
                # 8-bit keys are turned in `dtype` and re-quantized (a rebase is rare: its rounding stays small).
                self.pool._write("k", layer, ids, rotate(self.pool._read("k", layer, ids), shift))
        self.position_offset = offset

    def _on_device(self) -> None:
        """Bring offloaded pages back and make the current stream wait for their copy."""
        self.prefetch()
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
        """The pages attention reads, in its order: frame order, or slot order in a ring (kept from
        the last change of the page table: a static-buffer step asks for it on every call)."""
        return self._read_order

    def _compute_read_order(self) -> list[int]:
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
        read = self._read_order = self._compute_read_order()
        self._page_ids = None
        self._read_copy = self._write_rows = None
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
            host = tuple(t.index_select(1, ids) for t in pool._page_tensors())
            event = None
        else:
            pool._copy_stream.wait_stream(torch.cuda.current_stream(pool.k.device))
            with torch.cuda.stream(pool._copy_stream):
                host = tuple(_to_pinned(t.index_select(1, ids)) for t in pool._page_tensors())
                event = torch.cuda.Event()
                event.record(pool._copy_stream)
        pool._release_after(event, self._device_pages())
        self._host = host
        self.pages, self._ring = [], None
        self._tier = "host"
        self._table_changed()

    def prefetch(self) -> None:
        """Bring offloaded pages back to the device, ahead of the session's next block (asynchronously
        on CUDA; `begin` waits)."""
        if self._tier != "host":
            return
        assert self._host is not None
        pool = self.pool
        host_pages = self._host[0].shape[1]
        if self.window_frames is not None:
            self._ring = pool.allocate(self.window_frames * self.pages_per_frame, for_session=self.session_id)
            pages = self._pages_of(self.frames)
        else:
            pages = pool.allocate(host_pages, for_session=self.session_id)
        ids = self._ids(pages)
        if pool._copy_stream is None:
            for tensor, host in zip(pool._page_tensors(), self._host, strict=True):
                tensor.index_copy_(1, ids, host)
        else:
            pool._copy_stream.wait_stream(torch.cuda.current_stream(pool.k.device))
            with torch.cuda.stream(pool._copy_stream):
                for tensor, host in zip(pool._page_tensors(), self._host, strict=True):
                    tensor.index_copy_(1, ids, host.to(tensor.device, non_blocking=True))
                self._ready = torch.cuda.Event()
                self._ready.record(pool._copy_stream)
        pool._unreserve_host(host_pages)
        self._host = None
        self.pages = pages
        self._tier = "device"
        self._table_changed()

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
        self.prefetch()
        if not self.pages:
            spec = self.pool.spec
            empty = self.pool.k.new_zeros((0, spec.num_heads, spec.head_dim), dtype=spec.dtype)
            return empty, empty.clone()
        k, v = self.pool.fetch_pages(layer, self.pages)
        return k, v


def _to_pinned(t: Tensor) -> Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
