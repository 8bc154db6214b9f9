"""One rank's sequence-parallel context: the DiT hook (`SequenceParallelHook`) of a pod.

`SequenceParallel` shards a block's tokens after the patch embedding (a contiguous run of every
frame per rank, see `plan.py`), runs self-attention across ranks through `ShardedAttentionCache`
(Ulysses all-to-all, this rank's paged KV shard, Ring attention) and gathers the head output so
that every rank holds the same flow prediction and steps the sampler identically.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from engine.attention.backends import AttentionBackend
from engine.kv.protocol import SelfAttentionCache
from engine.parallel.attention import (
    PartialKernel,
    RingAttention,
    attention_with_lse,
    ulysses_gather_heads,
    ulysses_scatter_heads,
)
from engine.parallel.comm import CommCounter, GroupComm
from engine.parallel.plan import ParallelConfigError, ParallelPlan


class SequenceParallel:
    """The DiT hook of one rank. Build it on every rank, in the same order (it creates groups)."""

    def __init__(
        self,
        plan: ParallelPlan,
        counter: CommCounter | None = None,
        kernel: PartialKernel = attention_with_lse,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("sequence parallelism needs torch.distributed initialised (run under torchrun)")
        world = dist.get_world_size()
        if world != plan.world_size:
            raise ParallelConfigError(
                f"plan {plan.name} needs {plan.world_size} ranks (ulysses {plan.ulysses} x ring {plan.ring}) "
                f"but the pod has {world}; launch with --nproc-per-node {plan.world_size} or change the plan"
            )
        self.plan = plan
        self.rank = dist.get_rank()
        self.counter = counter if counter is not None else CommCounter()
        self.world = GroupComm(None, list(range(world)), self.counter)
        self.ulysses = self._member_of([plan.ulysses_group(r) for r in range(plan.ring)])
        ring = self._member_of([plan.ring_group(u) for u in range(plan.ulysses)])
        self.ring: RingAttention | None = None
        if ring is not None:
            assert plan.variant is not None
            self.ring = RingAttention(ring, plan.variant, kernel)

    def _member_of(self, groups: list[list[int]]) -> GroupComm | None:
        """Create every group of one kind (all ranks must) and return this rank's; None if size 1."""
        mine = None
        for ranks in groups:
            if len(ranks) == 1:
                continue
            group = dist.new_group(ranks)
            if self.rank in ranks:
                mine = GroupComm(group, ranks, self.counter)
        return mine

    # ---- SequenceParallelHook ---------------------------------------------------------------
    def cache_layout(self, num_heads: int, tokens_per_frame: int) -> tuple[int, int]:
        self.plan.check(num_heads, tokens_per_frame)
        return num_heads // self.plan.ulysses, tokens_per_frame // self.plan.ring

    def shard(self, tokens: Tensor, rotations: Tensor, frames: int) -> tuple[Tensor, Tensor]:
        per_frame = tokens.shape[1] // frames
        self.plan.check_tokens(per_frame)
        size = per_frame // self.plan.world_size
        lo = self.rank * size
        local = tokens.unflatten(1, (frames, per_frame))[:, :, lo : lo + size].flatten(1, 2)
        rot = rotations.unflatten(0, (frames, per_frame))[:, lo : lo + size].flatten(0, 1)
        return local, rot

    def attention_cache(self, cache: SelfAttentionCache | None) -> SelfAttentionCache:
        return ShardedAttentionCache(self, cache)

    def gather(self, tokens: Tensor, frames: int) -> Tensor:
        if self.plan.world_size == 1:
            return tokens
        shards = self.world.all_gather(tokens, "gather")  # each [B, F*s, C]
        per_frame = torch.stack([s.unflatten(1, (frames, -1)) for s in shards], dim=2)  # [B, F, P, s, C]
        return per_frame.flatten(1, 3)

    # ---- inspection -------------------------------------------------------------------------
    def gather_cache_kv(self, local: Tensor, frames: int) -> Tensor:
        """Reassemble one layer's cached K or V [T/R, H/U, D] of every rank into [T, H, D].

        A collective: every rank calls it. Used to compare a sharded cache with a single-rank one.
        """
        shards = self.world.all_gather(local, "inspect")
        u, r = self.plan.ulysses, self.plan.ring
        # rank p = ring r * U + ulysses u holds tokens chunk r of every frame for head group u.
        grid = torch.stack([s.unflatten(0, (frames, -1)) for s in shards])  # [P, F, S/R, H/U, D]
        grid = grid.unflatten(0, (r, u))  # [R, U, F, S/R, H/U, D]
        return grid.permute(2, 0, 3, 1, 4, 5).flatten(3, 4).flatten(0, 2)


class ShardedAttentionCache:
    """`SelfAttentionCache` that runs one layer's attention across the pod.

    q/k/v arrive as this rank's token shard with all heads; the Ulysses all-to-all turns them into
    the ring shard with this rank's heads; the rank's own paged cache (pages of S/R tokens x H/U
    heads) stores k/v exactly as a single-rank cache would; the ring backend (or, without a ring,
    the DiT's own backend) attends over every rank's shard; the inverse all-to-all restores the
    token shard. Without a cache the block attends to itself only, across ranks all the same.
    """

    def __init__(self, parallel: SequenceParallel, inner: SelfAttentionCache | None) -> None:
        self.parallel = parallel
        self.inner = inner
        self._frames = 0

    def begin(self, start_frame: int, num_frames: int) -> None:
        self._frames = num_frames
        if self.inner is not None:
            self.inner.begin(start_frame, num_frames)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        ulysses = self.parallel.ulysses
        self.parallel.plan.check_heads(q.shape[2])
        if ulysses is not None:
            q, k, v = ulysses_scatter_heads(torch.stack([q, k, v]), self._frames, ulysses).unbind(0)
        attention: AttentionBackend = self.parallel.ring if self.parallel.ring is not None else backend
        out = attention.dense(q, k, v) if self.inner is None else self.inner.attend(layer, q, k, v, attention)
        if ulysses is not None:
            out = ulysses_gather_heads(out, self._frames, ulysses)
        return out

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        """The rank's share of k/v (its heads of the ring shard, as `attend` stores them), stored."""
        ulysses = self.parallel.ulysses
        if ulysses is not None:
            k, v = ulysses_scatter_heads(torch.stack([k, v]), self._frames, ulysses).unbind(0)
        if self.inner is not None:
            self.inner.store(layer, k, v)


__all__ = ["SequenceParallel", "ShardedAttentionCache"]
