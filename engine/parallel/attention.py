"""Attention across ranks: the Ulysses all-to-alls and Ring attention (pass-KV and pass-Q).

Self-attention in block diffusion has no mask: a block's queries attend to every cached token
and to the block itself. So the keys can be split over ranks in any order and the softmax put
back together exactly from per-shard partial results (output, log-sum-exp):

    out = sum_i exp(lse_i - logsumexp_j lse_j) * out_i

Ring attention computes those partials where the K/V shards live:
  * pass-KV circulates each rank's K/V shard (its cached tokens of every frame) and merges locally;
  * pass-Q circulates the much smaller query shard (one block) and sends each partial result home
    with one all-to-all at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from engine.attention.backends import AttentionBackend
from engine.parallel.comm import GroupComm
from engine.parallel.plan import RingVariant

PartialKernel = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
_SCORE_BUDGET = 1 << 26  # elements of one score tile (256 MiB in fp32)


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax attention of q [B, Lq, H, D] over k, v [B, Lk, H, D], in float32.

    Returns (out [B, Lq, H, D] float32, lse [B, Lq, H] float32): the log-sum-exp is what lets
    partial results over disjoint key sets be merged exactly. Queries are tiled so one score
    tile stays within a fixed budget whatever the context length.
    """
    b, lq, h, d = q.shape
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2)
    vf = v.float().transpose(1, 2)
    scale = 1.0 / math.sqrt(d)
    rows = max(1, _SCORE_BUDGET // max(1, b * h * k.shape[1]))
    outs, lses = [], []
    for q_tile in qf.split(rows, dim=2):
        scores = torch.matmul(q_tile, kf.transpose(-1, -2)) * scale
        lse = torch.logsumexp(scores, dim=-1)
        outs.append(torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vf))
        lses.append(lse)
    return torch.cat(outs, dim=2).transpose(1, 2), torch.cat(lses, dim=2).transpose(1, 2)


def merge_partials(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    """Exact softmax over the union of disjoint key sets from their (out, lse) partials (float32)."""
    total = torch.logsumexp(torch.stack([lse.float() for lse in lses]), dim=0)
    merged = torch.zeros_like(outs[0], dtype=torch.float32)
    for out, lse in zip(outs, lses, strict=True):
        merged += out.float() * torch.exp(lse.float() - total).unsqueeze(-1)
    return merged


class RingAttention(AttentionBackend):
    """An attention backend whose K/V are this rank's shard of a ring group's keys.

    `dense(q, k, v)` returns attention of this rank's queries over the keys of every ring member;
    `paged` (inherited) gathers the shard's pages and calls `dense`, so `PagedSessionCache.attend`
    drives it unchanged: the cache writes the block's shard, then hands its whole shard here.
    """

    name = "ring"

    def __init__(self, comm: GroupComm, variant: RingVariant, kernel: PartialKernel = attention_with_lse) -> None:
        self.comm = comm
        self.variant = variant
        self.kernel = kernel

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.variant == "pass-kv":
            return self._pass_kv(q, k, v).to(q.dtype)
        return self._pass_q(q, k, v).to(q.dtype)

    def _pass_kv(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kv = torch.stack([k, v])
        outs, lses = [], []
        for step in range(self.comm.size):
            pending = self.comm.start_shift(kv, "ring") if step + 1 < self.comm.size else None
            out, lse = self.kernel(q, kv[0], kv[1])
            outs.append(out)
            lses.append(lse)
            if pending is not None:
                kv = pending.wait()
        return merge_partials(outs, lses)

    def _pass_q(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        size, me = self.comm.size, self.comm.index
        outs: list[Tensor] = [q] * size  # outs[j]: partial for member j's queries (placeholders)
        lses: list[Tensor] = [q] * size
        visiting = q.contiguous()
        for step in range(size):
            pending = self.comm.start_shift(visiting, "ring") if step + 1 < size else None
            owner = (me - step) % size
            out, lse = self.kernel(visiting, k, v)
            outs[owner], lses[owner] = out.to(q.dtype), lse
            if pending is not None:
                visiting = pending.wait()
        home_outs = self.comm.all_to_all(outs, "ring")
        home_lses = self.comm.all_to_all(lses, "ring")
        return merge_partials(home_outs, home_lses)


def ulysses_scatter_heads(x: Tensor, frames: int, comm: GroupComm) -> Tensor:
    """[..., B, F*s, H, D] token shard, all heads -> [..., B, F*s*U, H/U, D] group's tokens, my heads.

    Member j receives head group j of every member's tokens; tokens come back frame-major with
    the members' per-frame runs in member order, i.e. the group's contiguous run of each frame.
    """
    chunks = list(x.chunk(comm.size, dim=-2))
    received = comm.all_to_all(chunks, "ulysses")  # received[i]: member i's tokens, my heads
    per_frame = [r.unflatten(-3, (frames, -1)) for r in received]  # [..., B, F, s, H/U, D]
    return torch.stack(per_frame, dim=-4).flatten(-5, -3)


def ulysses_gather_heads(x: Tensor, frames: int, comm: GroupComm) -> Tensor:
    """Inverse of `ulysses_scatter_heads`: [B, F*s*U, H/U, D] -> [B, F*s, H, D]."""
    per_member = x.unflatten(-3, (frames, comm.size, -1))  # [B, F, U, s, H/U, D]
    chunks = [per_member.select(-4, i).flatten(-4, -3) for i in range(comm.size)]
    received = comm.all_to_all(chunks, "ulysses")  # received[j]: my tokens, head group j
    return torch.cat(received, dim=-2)


__all__ = [
    "PartialKernel",
    "RingAttention",
    "attention_with_lse",
    "merge_partials",
    "ulysses_gather_heads",
    "ulysses_scatter_heads",
]
