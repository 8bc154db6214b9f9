"""A session's page table and pages, captured exactly and loaded into another pool.

What a snapshot of a `PagedSessionCache` holds: the cached frames (absolute latent indices), the
session's first frame (where its sink starts), its RoPE position offset, and the pages of those
frames in frame order, as the pool stores them: K and V in the pool's storage dtype (an 8-bit pool's
raw int8 / fp8 bytes) with, for 8-bit pools, the fp32 scale of every (layer, page, head). Nothing is
dequantized or re-quantized, so the loaded cache holds the same bits as the captured one.

Loading puts every frame back into the slot its index gives it (`PagedSessionCache._slot`), so the
loaded session reads its pages in the same order as the captured one did (see `engine.kv.pool`):
the next block attends to the same values in the same order and computes the same bits, whatever
page ids the new pool hands out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.kv.pool import KVPoolSpec
from engine.kv.session_cache import PagedSessionCache


@dataclass(frozen=True)
class CacheLayout:
    """What must match between the captured cache and the one it is loaded into."""

    num_layers: int
    num_heads: int
    head_dim: int
    page_size: int
    dtype: str
    kv_dtype: str
    tokens_per_frame: int
    window_frames: int | None
    sink_frames: int

    @classmethod
    def of(cls, cache: PagedSessionCache) -> CacheLayout:
        spec: KVPoolSpec = cache.pool.spec
        return cls(
            spec.num_layers,
            spec.num_heads,
            spec.head_dim,
            spec.page_size,
            str(spec.dtype),
            spec.kv_dtype,
            cache.tokens_per_frame,
            cache.window_frames,
            cache.sink_frames,
        )

    def to_tree(self) -> dict[str, object]:
        return dict(vars(self))


@dataclass
class CacheSnapshot:
    """A copy of one session's cache (CPU tensors). `tensors`: K, V (and K, V scales for an 8-bit pool),
    each [layers, pages, ...] with the pages in frame order (`pages_per_frame` per frame)."""

    layout: CacheLayout
    frames: list[int]
    first_frame: int
    position_offset: int
    tensors: list[Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def to_tree(self) -> dict[str, object]:
        """A tree `torch.load(weights_only=True)` reads back: tensors, ints, lists, dicts."""
        return {
            "layout": self.layout.to_tree(),
            "frames": list(self.frames),
            "first_frame": self.first_frame,
            "position_offset": self.position_offset,
            "tensors": list(self.tensors),
        }

    @classmethod
    def from_tree(cls, tree: dict[str, object]) -> CacheSnapshot:
        layout = tree["layout"]
        tensors = tree["tensors"]
        frames = tree["frames"]
        assert isinstance(layout, dict) and isinstance(tensors, list) and isinstance(frames, list)
        first, offset = tree["first_frame"], tree["position_offset"]
        assert isinstance(first, int) and isinstance(offset, int)
        return cls(CacheLayout(**layout), [int(f) for f in frames], first, offset, tensors)


def capture(cache: PagedSessionCache) -> CacheSnapshot:
    """A copy of `cache` (device or host tier) that later writes to the pool do not change."""
    pool = cache.pool
    if cache.tier == "host":  # offloaded: the host copies hold the pages in frame order already
        assert cache._host is not None
        tensors = [t.clone() for t in cache._host]
    elif cache.pages:
        ids = torch.tensor(cache.pages, dtype=torch.long, device=pool.k.device)
        tensors = [t.index_select(1, ids).cpu() for t in pool._page_tensors()]
    else:
        tensors = [t[:, :0].cpu() for t in pool._page_tensors()]
    return CacheSnapshot(CacheLayout.of(cache), list(cache.frames), cache._first_frame, cache.position_offset, tensors)


def load(cache: PagedSessionCache, snapshot: CacheSnapshot) -> None:
    """Make the empty `cache` hold exactly what `snapshot` captured (`ValueError` if the layouts differ)."""
    mine = CacheLayout.of(cache)
    if snapshot.layout != mine:
        raise ValueError(f"a KV snapshot of layout {snapshot.layout} cannot load into a cache of layout {mine}")
    if cache.frames or cache.pages or cache._ring is not None:
        raise ValueError(f"session {cache.session_id!r}: a KV snapshot loads into an empty cache only")
    pool = cache.pool
    cache._first_frame = snapshot.first_frame
    if snapshot.frames:
        with pool._lock:
            if cache.window_frames is not None:
                cache._ring = pool.allocate(cache.window_frames * cache.pages_per_frame, for_session=cache.session_id)
                cache.frames = list(snapshot.frames)
                pages = cache._pages_of(cache.frames)
            else:
                pages = pool.allocate(len(snapshot.frames) * cache.pages_per_frame, for_session=cache.session_id)
                cache.frames = list(snapshot.frames)
            cache.pages = pages
            cache.peak_pages = max(cache.peak_pages, len(cache._device_pages()))
        ids = torch.tensor(pages, dtype=torch.long, device=pool.k.device)
        for tensor, saved in zip(pool._page_tensors(), snapshot.tensors, strict=True):
            tensor.index_copy_(1, ids, saved.to(tensor.device, tensor.dtype))
    cache.position_offset = snapshot.position_offset
    cache._table_changed()
