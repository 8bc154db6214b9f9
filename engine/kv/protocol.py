"""The interface between the DiT's self-attention and a per-session KV cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from torch import Tensor

from engine.attention.backends import AttentionBackend


class SelfAttentionCache(Protocol):
    """Per-session self-attention K/V store used by the causal DiT.

    The DiT calls `begin` once per forward with the absolute latent frames it is about to write,
    then `attend` in every layer: the cache stores the block's (post-RoPE) K and V for those frames
    -- overwriting them if the frames are already cached, as every denoising step and the context
    pass of one block do -- and returns attention of q over every cached token, in frame order.
    A layer whose output nobody reads (the last one of a context pass) calls `store` instead.
    """

    def begin(self, start_frame: int, num_frames: int) -> None: ...

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor: ...

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Write this call's K/V [B, rows, H, D] for the frames `begin` prepared, as `attend` does."""
        ...


# Turns cached keys [..., head_dim] by a number of RoPE time positions (`RopeTable.rotate_time`).
KeyRotation = Callable[[Tensor, int], Tensor]


@runtime_checkable
class PagedAttentionCache(SelfAttentionCache, Protocol):
    """A cache whose K/V live in pages of a pool: a batched forward writes each session's K/V, then
    attends for many sessions in one kernel call over their page lists (`AttentionBackend.paged_batch`)."""

    def layer_pages(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """(K pages, V pages) of the whole pool [P, page_size, H, D] and the session's page ids in order."""
        ...
