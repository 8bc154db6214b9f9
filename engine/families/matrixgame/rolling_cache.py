"""The action module's K/V caches: one slot per latent frame, rolled as the window slides.

The self-attention cache of the DiT lives in the paged pool; the keyboard and mouse caches are
small (one token per frame, and per spatial position for the mouse), so they stay a side cache in
the reference layout `[rows, window, heads, head_dim]` with its index rule (README section 6): when
a new block would overflow, the oldest frames after the sink are evicted by shifting the kept
ones left. Repeated calls for the same frames (denoising steps, the context pass) overwrite them.
"""

from __future__ import annotations

from torch import Tensor


class RollingFrameCache:
    """K/V of the last `size` latent frames for `rows` independent sequences (allocated on first use)."""

    def __init__(self, size: int, sink: int = 0) -> None:
        if size <= sink:
            raise ValueError(f"cache size {size} must exceed its sink {sink}")
        self.size = size
        self.sink = sink
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.global_end = 0  # one past the last absolute frame written
        self.local_end = 0  # valid slots

    def update(self, start_frame: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v [rows, n, heads, head_dim] for frames [start_frame, start_frame + n); return
        every valid cached K and V (the new ones included), in slot order."""
        rows, n = k.shape[:2]
        if n > self.size - self.sink:
            raise ValueError(f"{n} frames do not fit a window of {self.size} frames with a sink of {self.sink}")
        if self.k is None or self.v is None:
            self.k = k.new_zeros(rows, self.size, *k.shape[2:])
            self.v = v.new_zeros(rows, self.size, *v.shape[2:])
        end = start_frame + n
        local_end = self.local_end + end - self.global_end
        if end > self.global_end and n + self.local_end > self.size:
            evict = n + self.local_end - self.size
            kept = self.local_end - evict - self.sink
            src = slice(self.sink + evict, self.sink + evict + kept)
            dst = slice(self.sink, self.sink + kept)
            self.k[:, dst] = self.k[:, src].clone()
            self.v[:, dst] = self.v[:, src].clone()
            local_end -= evict
        if not n <= local_end <= self.size:
            raise ValueError(
                f"frames [{start_frame}, {end}) are neither the next frames nor the last written ones "
                f"(the cache holds frames up to {self.global_end})"
            )
        self.k[:, local_end - n : local_end] = k
        self.v[:, local_end - n : local_end] = v
        self.global_end = max(self.global_end, end)
        self.local_end = local_end
        return self.k[:, :local_end], self.v[:, :local_end]


class ActionCache:
    """The keyboard and mouse caches of one action layer of one session."""

    def __init__(self, window: int, sink: int = 0) -> None:
        self.keyboard = RollingFrameCache(window, sink)
        self.mouse = RollingFrameCache(window, sink)


def new_action_caches(layers: int, window: int, sink: int = 0) -> list[ActionCache]:
    return [ActionCache(window, sink) for _ in range(layers)]


def slots_of(cache: RollingFrameCache) -> list[int]:
    """The absolute frames held by the valid slots in slot order: the sink (a session's first
    frames), then the most recent ones (the roll keeps them in frame order)."""
    recent = cache.local_end - min(cache.sink, cache.local_end)
    return list(range(cache.local_end - recent)) + list(range(cache.global_end - recent, cache.global_end))
