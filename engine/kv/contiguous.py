"""The reference KV layout: one contiguous tensor per layer, rolled on eviction.

This follows the Self Forcing index rule literally (tokens, `global_end` / `local_end`, a copy
that shifts the kept frames left when the window overflows). The engine uses the paged pool;
this class is kept as the baseline of `bench/engine_speed.py` and as an independent oracle for the
paged window logic in the tests.

`protect_sink` adds LongLive 1.0's rule (wan/modules/causal_model.py): a call that rewrites frames
already cached and does not start at frame 0 (a "recompute") leaves the sink tokens as they are,
unless it is the re-cache of a switch without a global sink (calls made while `write_sink` is set),
which LongLive runs on a zeroed cache (`zero`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.attention.backends import AttentionBackend
from engine.kv.errors import KVCapacityError
from engine.kv.protocol import KeyRotation


class ContiguousKVCache:
    """`SelfAttentionCache` with the reference layout [1, cache_tokens, heads, head_dim] per layer."""

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        tokens_per_frame: int,
        cache_frames: int,
        window_frames: int | None = None,
        sink_frames: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        protect_sink: bool = False,
    ) -> None:
        self.tokens_per_frame = tokens_per_frame
        self.size = (window_frames if window_frames is not None else cache_frames) * tokens_per_frame
        self.windowed = window_frames is not None
        self.sink = sink_frames * tokens_per_frame
        shape = (num_layers, 1, self.size, num_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.global_end = 0
        self.local_end = 0
        self.position_offset = 0  # a cached key's RoPE time position is its frame minus this
        self.protect_sink = protect_sink
        self.write_sink = False
        self._write: tuple[int, int] = (0, 0)
        self._skip = 0  # leading rows of the call that a protected sink does not take

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def zero(self) -> None:
        """Zero every cached K/V, keeping the indices (LongLive's reset before a sink re-cache)."""
        self.k.zero_()
        self.v.zero_()

    def begin(self, start_frame: int, num_frames: int) -> None:
        start = start_frame * self.tokens_per_frame
        n_new = num_frames * self.tokens_per_frame
        end = start + n_new
        recompute = end <= self.global_end and start > 0
        if self.windowed and end > self.global_end and n_new + self.local_end > self.size:
            evict = n_new + self.local_end - self.size
            rolled = self.local_end - evict - self.sink
            src = slice(self.sink + evict, self.sink + evict + rolled)
            dst = slice(self.sink, self.sink + rolled)
            self.k[:, :, dst] = self.k[:, :, src].clone()
            self.v[:, :, dst] = self.v[:, :, src].clone()
            local_end = self.local_end + end - self.global_end - evict
        else:
            local_end = self.local_end + end - self.global_end
        if local_end > self.size:
            raise KVCapacityError(f"contiguous KV cache of {self.size} tokens cannot hold {local_end} tokens")
        lo = local_end - n_new
        write_from = max(lo, self.sink) if self.protect_sink and recompute and not self.write_sink else lo
        self._skip = write_from - lo
        self._write = (write_from, local_end)
        self.global_end = max(self.global_end, end)
        self.local_end = local_end

    def rebase(self, offset: int, rotate: KeyRotation) -> None:
        """Give the cached keys time positions `frame - offset`, as `PagedSessionCache.rebase` does."""
        shift = self.position_offset - offset
        if shift:
            self.k[:, :, : self.local_end] = rotate(self.k[:, :, : self.local_end], shift)
            self.position_offset = offset

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        self.store(layer, k, v)
        hi = self._write[1]
        return backend.dense(q, self.k[layer, :, :hi], self.v[layer, :, :hi])

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        lo, hi = self._write
        self.k[layer, :, lo:hi] = k[:, self._skip :]
        self.v[layer, :, lo:hi] = v[:, self._skip :]
