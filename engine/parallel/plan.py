"""How a pod splits one block's self-attention: a Ulysses degree times a Ring degree.

A pod of P = U x R ranks. Rank p sits at Ulysses index u = p % U and Ring index r = p // U, so a
Ulysses group (the U ranks sharing r) is a run of consecutive ranks -- on one node, where the
all-to-all bandwidth is -- and a Ring group (the R ranks sharing u) is strided.

Sharding, for S tokens per latent frame and H heads:
  * tokens: rank p holds tokens [p*S/P, (p+1)*S/P) of every frame of the block, frame-major;
  * after the Ulysses all-to-all a rank holds its Ring shard -- tokens [r*S/R, (r+1)*S/R) of every
    frame -- for its H/U heads (u*H/U ...);
  * KV cache: each rank's pool holds exactly that: pages of S/R tokens x H/U heads, one page per
    cached frame. Every rank edits its page table identically (frames are never split across
    page-table decisions), so windows and sinks need no coordination.
Uneven splits are rejected when the plan is checked (at pod start-up), never padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from inferix.errors import UserError

RingVariant = Literal["pass-kv", "pass-q"]
Strategy = Literal["auto", "ulysses", "ring-pass-kv", "ring-pass-q", "hybrid-pass-kv", "hybrid-pass-q"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


class ParallelConfigError(UserError):
    """A sequence-parallel layout that cannot run this model at this resolution on this pod."""


@dataclass(frozen=True)
class ParallelPlan:
    """Degrees of one pod. `variant` is the ring algorithm; None exactly when there is no ring."""

    ulysses: int
    ring: int
    variant: RingVariant | None = None

    def __post_init__(self) -> None:
        if self.ulysses < 1 or self.ring < 1:
            raise ParallelConfigError(
                f"Ulysses and Ring degrees must be >= 1, got ulysses={self.ulysses} ring={self.ring}"
            )
        if self.ring > 1 and self.variant not in get_args(RingVariant):
            raise ParallelConfigError(
                f"a ring of {self.ring} ranks needs variant 'pass-kv' or 'pass-q', got {self.variant!r}"
            )
        if self.ring == 1 and self.variant is not None:
            raise ParallelConfigError(f"variant {self.variant!r} given but the ring degree is 1 (no ring)")

    @property
    def world_size(self) -> int:
        return self.ulysses * self.ring

    @property
    def name(self) -> str:
        """'single', 'ulysses', 'ring-pass-q', or 'hybrid-u4xr2-pass-q'."""
        if self.ring == 1:
            return "single" if self.ulysses == 1 else "ulysses"
        if self.ulysses == 1:
            return f"ring-{self.variant}"
        return f"hybrid-u{self.ulysses}xr{self.ring}-{self.variant}"

    def coords(self, rank: int) -> tuple[int, int]:
        """(Ulysses index, Ring index) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a pod of {self.world_size}")
        return rank % self.ulysses, rank // self.ulysses

    def ulysses_group(self, ring_index: int) -> list[int]:
        return [ring_index * self.ulysses + u for u in range(self.ulysses)]

    def ring_group(self, ulysses_index: int) -> list[int]:
        return [r * self.ulysses + ulysses_index for r in range(self.ring)]

    def check(self, num_heads: int, tokens_per_frame: int) -> None:
        """Reject a split that is not even: every rank must hold the same number of heads/tokens."""
        self.check_heads(num_heads)
        self.check_tokens(tokens_per_frame)

    def check_heads(self, num_heads: int) -> None:
        if num_heads % self.ulysses:
            raise ParallelConfigError(
                f"{self.name}: Ulysses degree {self.ulysses} must divide num_heads={num_heads} (each rank "
                f"attends with num_heads/ulysses heads); pick a degree dividing {num_heads}, or a ring "
                f"strategy (ring-pass-q / ring-pass-kv), or --strategy auto"
            )

    def check_tokens(self, tokens_per_frame: int) -> None:
        if tokens_per_frame % self.world_size:
            raise ParallelConfigError(
                f"{self.name}: the pod's {self.world_size} ranks must divide tokens_per_frame="
                f"{tokens_per_frame} (each rank holds tokens_per_frame/world tokens of every frame); "
                f"use a world size dividing {tokens_per_frame} or a latent size whose token count it divides"
            )


def candidate_plans(strategy: str, world_size: int, ulysses_degree: int | None = None) -> list[ParallelPlan]:
    """Every plan `strategy` allows on `world_size` ranks (the model's shape is checked later).

    Fixed strategies give one plan; 'hybrid-*' gives every U x R split with both degrees > 1
    (only U = ulysses_degree when given); 'auto' gives every split with both ring variants.
    """
    if world_size < 1:
        raise ParallelConfigError(f"world size must be >= 1, got {world_size}")
    if strategy not in STRATEGIES:
        raise ParallelConfigError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if ulysses_degree is not None and (ulysses_degree < 1 or world_size % ulysses_degree):
        raise ParallelConfigError(f"ulysses_degree={ulysses_degree} must divide the world size {world_size}")
    if world_size == 1:
        return [ParallelPlan(1, 1)]
    if strategy == "ulysses":
        return [ParallelPlan(world_size, 1)]
    if strategy in ("ring-pass-kv", "ring-pass-q"):
        return [ParallelPlan(1, world_size, "pass-kv" if strategy.endswith("kv") else "pass-q")]
    splits = [u for u in range(1, world_size + 1) if world_size % u == 0]
    if ulysses_degree is not None:
        splits = [ulysses_degree]
    variants: tuple[RingVariant, ...] = ("pass-kv", "pass-q")
    if strategy != "auto":
        splits = [u for u in splits if 1 < u < world_size]
        variants = ("pass-kv",) if strategy.endswith("kv") else ("pass-q",)
        if not splits:
            raise ParallelConfigError(
                f"{strategy}: {world_size} ranks cannot be split into Ulysses x Ring with both degrees > 1"
                + (f" and ulysses_degree={ulysses_degree}" if ulysses_degree is not None else "")
                + "; use ulysses, ring-pass-q or auto"
            )
    plans: list[ParallelPlan] = []
    for u in splits:
        ring = world_size // u
        plans.extend([ParallelPlan(u, 1)] if ring == 1 else [ParallelPlan(u, ring, v) for v in variants])
    return plans


__all__ = ["STRATEGIES", "candidate_plans", "ParallelConfigError", "ParallelPlan", "RingVariant", "Strategy"]
