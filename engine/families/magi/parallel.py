"""Ulysses sequence parallelism for the MAGI-1 DiT, heads split by KV group.

Layout on P = U ranks (pure Ulysses: MAGI-1 has no Ring variant here):
  * tokens: outside attention rank u holds tokens [u*S/P, (u+1)*S/P) of every latent frame (S tokens
    per frame), frame-major -- the Wan layout. A chunk is whole frames, so each rank's tokens of chunk j
    are again one contiguous run of S/P * chunk_frames rows: the per-chunk adaLN gates and the RoPE rows
    are sliced like the tokens and need no other change. P must divide the tokens of a frame.
  * self-attention: one all-to-all sends each rank every token of its KV groups [u*G/U, (u+1)*G/U) with
    their query heads (q and the cross-attention query qx) and their K|V, so grouped-query attention and
    the block-causal key ranges stay local and unchanged; U must divide G.
  * KV cache: the fresh K|V a rank returns (and its pool keeps) are all tokens x G/U groups, so the chunk
    pipeline's key ranges and page table (one latent frame per page) are the same on every rank.
  * cross-attention: each rank projects the caption K|V of its groups only and attends with its heads.
  * after attention one all-to-all returns this rank's tokens with every head (core and cross), because
    linear_proj interleaves the two over all heads; after the final linear an all-gather gives every rank
    the whole velocity, so every rank's chunk pipeline integrates identically.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from engine.families.magi.dit import MagiDiTConfig
from engine.parallel.attention import ulysses_gather_heads, ulysses_scatter_heads
from engine.parallel.comm import CommCounter, GroupComm
from engine.parallel.plan import ParallelConfigError


def check_magi_split(ulysses: int, kv_groups: int, tokens_per_frame: int | None = None) -> None:
    """Reject a split that is not even: each rank needs whole KV groups and as many tokens of every frame."""
    if ulysses < 1 or kv_groups % ulysses:
        raise ParallelConfigError(
            f"MAGI-1 Ulysses degree {ulysses} must divide the KV groups (num_query_groups={kv_groups}): heads are "
            f"split by KV group so grouped-query attention stays on one rank; use a degree dividing {kv_groups}"
        )
    if tokens_per_frame is not None and tokens_per_frame % ulysses:
        raise ParallelConfigError(
            f"MAGI-1 sequence parallel: {ulysses} ranks must divide the {tokens_per_frame} tokens of a latent frame "
            "(each rank holds an equal run of every frame); pick a latent size whose tokens per frame it divides"
        )


class MagiUlysses:
    """One rank's Ulysses context for `MagiDiT.set_sequence_parallel`; build it on every rank."""

    def __init__(self, comm: GroupComm, config: MagiDiTConfig) -> None:
        check_magi_split(comm.size, config.num_query_groups)
        self.comm = comm
        self.heads = config.num_attention_heads // comm.size  # query heads of this rank
        self.groups = config.num_query_groups // comm.size  # KV groups of this rank
        self.head_dim = config.head_dim

    @classmethod
    def over_world(cls, config: MagiDiTConfig, counter: CommCounter | None = None) -> MagiUlysses:
        """Ulysses over every rank of the initialised default process group (U = P)."""
        if not dist.is_initialized():
            raise RuntimeError("sequence parallelism needs torch.distributed initialised (run under torchrun)")
        ranks = list(range(dist.get_world_size()))
        return cls(GroupComm(None, ranks, counter if counter is not None else CommCounter()), config)

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def first_group(self) -> int:
        """This rank's first KV group (its groups are [first_group, first_group + groups))."""
        return self.comm.index * self.groups

    def check_tokens(self, tokens_per_frame: int) -> None:
        check_magi_split(self.size, self.groups * self.size, tokens_per_frame)

    def shard(self, rows: Tensor, frames: int) -> Tensor:
        """[frames*S, ...] rows in (frame, token) order -> this rank's run of every frame [frames*S/P, ...]."""
        per_frame = rows.unflatten(0, (frames, self.size, -1))
        return per_frame.select(1, self.comm.index).flatten(0, 1)

    def unshard(self, rows: Tensor, frames: int) -> Tensor:
        """Inverse of `shard` through an all-gather: every rank gets all [frames*S, ...] rows."""
        parts = [p.unflatten(0, (frames, -1)) for p in self.comm.all_gather(rows, "gather")]
        return torch.stack(parts, dim=1).flatten(0, 2)

    def scatter_heads(self, q: Tensor, kv: Tensor, qx: Tensor, frames: int) -> tuple[Tensor, Tensor, Tensor]:
        """This rank's tokens with all heads -> all tokens with this rank's heads, in one all-to-all.

        q, qx [s, N, H, hd] and kv [s, N, G, 2hd] -> [S, N, H/U, hd], [S, N, G/U, 2hd], [S, N, H/U, hd].
        Contiguous head chunks keep GQA local: query head h reads group h // (H/G), so rank u's heads
        [u*H/U, (u+1)*H/U) read exactly its groups [u*G/U, (u+1)*G/U).
        """
        s, n = q.shape[:2]
        u, hd = self.size, self.head_dim
        width_q, width_kv = self.heads * hd, self.groups * 2 * hd
        # One message per destination rank: its q heads, qx heads and K|V groups side by side.
        packed = torch.cat(
            [q.reshape(s, n, u, width_q), qx.reshape(s, n, u, width_q), kv.reshape(s, n, u, width_kv)], -1
        )
        received = ulysses_scatter_heads(packed.transpose(0, 1), frames, self.comm)  # [N, S, 1, W]
        full = received.squeeze(2).transpose(0, 1)  # [S, N, W]
        q_part, qx_part, kv_part = full.split([width_q, width_q, width_kv], dim=-1)
        return (
            q_part.unflatten(-1, (self.heads, hd)),
            kv_part.unflatten(-1, (self.groups, 2 * hd)),
            qx_part.unflatten(-1, (self.heads, hd)),
        )

    def gather_heads(self, core: Tensor, cross: Tensor, frames: int) -> tuple[Tensor, Tensor]:
        """Inverse all-to-all: core, cross [S, N, H/U*hd] -> this rank's tokens with every head [s, N, H*hd]."""
        packed = torch.cat([core, cross], dim=-1).transpose(0, 1).unsqueeze(2)  # [N, S, 1, 2*H/U*hd]
        received = ulysses_gather_heads(packed, frames, self.comm)  # [N, s, U, 2*H/U*hd], rank-major heads
        both = received.unflatten(-1, (2, -1)).transpose(0, 1)  # [s, N, U, 2, H/U*hd]
        s, n = both.shape[:2]
        return both.select(3, 0).reshape(s, n, -1), both.select(3, 1).reshape(s, n, -1)


__all__ = ["MagiUlysses", "check_magi_split"]
