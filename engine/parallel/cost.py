"""Bytes each rank sends per block under each plan, and the automatic choice among plans.

The model counts exactly what `engine.parallel` issues (tests compare it with the bytes
the wrapped collectives counted), per rank and per block = (denoising steps + the context pass)
forwards of `num_layers` self-attention layers plus one output gather per denoising step. The
context pass stops at its last layer's K/V (`CausalWanDiT._blocks_and_head`): that layer sends
only the all-to-all of the stacked k, v (half a Ulysses layer's bytes, one operation), no ring
hop, and the pass gathers no output.

  N = tokens per block, n = N / P (one rank's tokens), C = tokens the block attends to (its
  cached context, itself included), E = activation bytes, H heads of D channels, P = U x R.

  Ulysses, per layer:  one all-to-all of the stacked q, k, v and one of the output:
                       4 (U-1) * n * H/U * D * E
  Ring pass-KV:        R-1 hops of this rank's K and V shard: (R-1) * 2 * C/R * H/U * D * E
  Ring pass-Q:         R-1 hops of the query shard, then the R-1 partial outputs and their fp32
                       log-sum-exps go home: (R-1) * N/R * H/U * (2 D E + 4)
  Output gather:       (P-1) * n * out_channels * E per denoising step

In block diffusion N is one block and C a window of many blocks, so pass-Q moves about N / C of
pass-KV's bytes. Time is predicted as bytes / bandwidth + operations * latency on one link model,
an operation being one collective call or one ring hop (overlap with compute is not credited, so
every plan is judged the same way).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from engine.families.magi.parallel import check_magi_split
from engine.parallel.plan import ParallelConfigError, ParallelPlan, candidate_plans
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.sampling import BlockConfig

LOG = logging.getLogger(__name__)
LSE_BYTES = 4  # log-sum-exps always travel in float32
# Planning horizon of a global-attention session when none is given: the 21 latent frames
# (81 video frames) Self Forcing and CausVid generate.
DEFAULT_CONTEXT_FRAMES = 21


@dataclass(frozen=True)
class WorkloadShape:
    """Everything the communication of one block depends on."""

    num_heads: int
    head_dim: int
    num_layers: int
    tokens_per_frame: int
    frames_per_block: int
    context_frames: int  # latent frames one block attends to, itself included
    forwards_per_block: int  # denoising steps + the context pass
    out_channels: int  # values per token the head emits (patch volume x out_dim)
    element_bytes: int  # bytes of one activation (2 for bf16)

    def __post_init__(self) -> None:
        if self.context_frames < self.frames_per_block:
            raise ValueError(
                f"context_frames={self.context_frames} must include the block's own "
                f"frames_per_block={self.frames_per_block}"
            )

    @property
    def block_tokens(self) -> int:
        return self.frames_per_block * self.tokens_per_frame

    @property
    def context_tokens(self) -> int:
        return self.context_frames * self.tokens_per_frame

    @classmethod
    def from_config(
        cls,
        dit: WanDiTConfig,
        block: BlockConfig,
        *,
        latent_height: int,
        latent_width: int,
        denoising_steps: int,
        context_frames: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> WorkloadShape:
        """The shape of a session; `context_frames` defaults to the window (required when global)."""
        if context_frames is None:
            if block.is_global:
                raise ValueError("a global-attention session needs context_frames (how much history to plan for)")
            context_frames = block.local_attn_size
        return cls(
            num_heads=dit.num_heads,
            head_dim=dit.head_dim,
            num_layers=dit.num_layers,
            tokens_per_frame=dit.tokens_per_frame(latent_height, latent_width),
            frames_per_block=block.num_frame_per_block,
            context_frames=context_frames,
            forwards_per_block=denoising_steps + 1,
            out_channels=dit.out_dim * dit.patch_size[0] * dit.patch_size[1] * dit.patch_size[2],
            element_bytes=torch.empty((), dtype=dtype).element_size(),
        )


@dataclass(frozen=True)
class LinkModel:
    """One rank's link: bytes per second it can send, and the fixed cost of one operation."""

    bandwidth_bytes_per_s: float = 100e9
    latency_s: float = 20e-6

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0 or self.latency_s < 0:
            raise ValueError(f"link bandwidth must be > 0 and latency >= 0, got {self}")


@dataclass(frozen=True)
class CommCost:
    """Predicted traffic of one rank for one block, by phase."""

    plan: ParallelPlan
    ulysses_bytes: int
    ring_bytes: int
    gather_bytes: int
    operations: int  # collective calls and ring hops

    @property
    def total_bytes(self) -> int:
        return self.ulysses_bytes + self.ring_bytes + self.gather_bytes

    def seconds(self, link: LinkModel) -> float:
        return self.total_bytes / link.bandwidth_bytes_per_s + self.operations * link.latency_s

    def by_phase(self) -> dict[str, int]:
        return {"ulysses": self.ulysses_bytes, "ring": self.ring_bytes, "gather": self.gather_bytes}


def predict(plan: ParallelPlan, shape: WorkloadShape) -> CommCost:
    """Bytes and operations of one rank for one block under `plan` (see the module docstring)."""
    plan.check(shape.num_heads, shape.tokens_per_frame)
    u, r, p = plan.ulysses, plan.ring, plan.world_size
    heads, e = shape.num_heads // u, shape.element_bytes
    local_tokens = shape.block_tokens // p
    ring_query_tokens = shape.block_tokens // r
    ulysses_layer = 4 * (u - 1) * local_tokens * heads * shape.head_dim * e
    ulysses_ops = 2 if u > 1 else 0
    if plan.variant == "pass-kv":
        ring_layer = (r - 1) * 2 * (shape.context_tokens // r) * heads * shape.head_dim * e
        ring_ops = r - 1
    elif plan.variant == "pass-q":
        ring_layer = (r - 1) * ring_query_tokens * heads * (2 * shape.head_dim * e + LSE_BYTES)
        ring_ops = (r - 1) + 2
    else:
        ring_layer, ring_ops = 0, 0
    layers = shape.num_layers * shape.forwards_per_block - 1  # whole layers: all but the context pass's last
    steps = shape.forwards_per_block - 1
    gather = (p - 1) * local_tokens * shape.out_channels * e
    return CommCost(
        plan=plan,
        ulysses_bytes=layers * ulysses_layer + ulysses_layer // 2,
        ring_bytes=layers * ring_layer,
        gather_bytes=steps * gather,
        operations=layers * (ulysses_ops + ring_ops) + ulysses_ops // 2 + steps * (p > 1),
    )


@dataclass(frozen=True)
class ParallelConfig:
    """What a pod's operator sets: a strategy ('auto' = the cost model decides) and the link."""

    strategy: str = "auto"
    ulysses_degree: int | None = None  # fixes U for 'hybrid-*' / 'auto'
    link: LinkModel = field(default_factory=LinkModel)


@dataclass(frozen=True)
class PlanChoice:
    """The plan a pod runs, its predicted cost, and every valid alternative (cheapest first)."""

    plan: ParallelPlan
    cost: CommCost
    seconds: float
    alternatives: list[CommCost]
    rejected: dict[str, str]  # plan name -> why it cannot run

    def describe(self) -> str:
        cost = self.cost
        return (
            f"sequence parallel: {self.plan.name} (ulysses={self.plan.ulysses} ring={self.plan.ring}), "
            f"predicted {cost.total_bytes / 2**20:.2f} MiB/block/rank "
            f"(ulysses {cost.ulysses_bytes / 2**20:.2f}, ring {cost.ring_bytes / 2**20:.2f}, "
            f"gather {cost.gather_bytes / 2**20:.2f}), {cost.operations} operations, {self.seconds * 1e3:.3f} ms"
        )


def choose_plan(config: ParallelConfig, world_size: int, shape: WorkloadShape) -> PlanChoice:
    """The cheapest valid plan `config` allows on `world_size` ranks; logged with its prediction.

    Ties (equal predicted time) go to the larger Ulysses degree: it needs no log-sum-exp merge.
    A fixed strategy that cannot run raises `ParallelConfigError` with the reason.
    """
    costs: list[CommCost] = []
    rejected: dict[str, str] = {}
    for plan in candidate_plans(config.strategy, world_size, config.ulysses_degree):
        try:
            costs.append(predict(plan, shape))
        except ParallelConfigError as exc:
            rejected[plan.name] = str(exc)
    if not costs and len(rejected) == 1:
        raise ParallelConfigError(next(iter(rejected.values())))
    if not costs:
        raise ParallelConfigError(
            f"no sequence-parallel plan for strategy {config.strategy!r} on {world_size} ranks fits "
            f"num_heads={shape.num_heads}, tokens_per_frame={shape.tokens_per_frame}: " + "; ".join(rejected.values())
        )
    costs.sort(key=lambda c: (c.seconds(config.link), -c.plan.ulysses, c.plan.variant or ""))
    best = costs[0]
    choice = PlanChoice(best.plan, best, best.seconds(config.link), costs, rejected)
    LOG.info("%s [strategy=%s, world=%d]", choice.describe(), config.strategy, world_size)
    return choice


# ---- MAGI-1: Ulysses with heads split by KV group (engine.families.magi.parallel) ----------------


@dataclass(frozen=True)
class MagiWorkload:
    """The communication shape of MAGI-1 DiT forwards (one call: 1 pass distill, 3 passes cfg).

    Per layer a rank sends (U-1)/U of its n tokens' q, qx (H heads each) and K|V (2G groups' worth) and
    gets back core and cross (2H heads): (U-1) * n * (4H + 2G)/U * hd * E; the fp32 velocity is
    all-gathered once per forward: (P-1) * n * out_channels * 4.
    """

    num_heads: int
    kv_groups: int
    head_dim: int
    num_layers: int
    tokens_per_frame: int
    frames: int  # latent frames of all the forwards, batch elements included
    forwards: int  # DiT passes those frames are spread over
    out_channels: int  # values per token of the final linear (patch area x out_channels)
    element_bytes: int  # bytes of one attention activation (2 for bf16)


def predict_magi(ulysses: int, shape: MagiWorkload) -> CommCost:
    """Bytes and operations of one rank under Ulysses degree `ulysses` (= the pod size: no Ring for MAGI)."""
    check_magi_split(ulysses, shape.kv_groups, shape.tokens_per_frame)
    u = ulysses
    local_tokens = shape.frames * shape.tokens_per_frame // u
    heads, groups = shape.num_heads // u, shape.kv_groups // u
    # Summed over the forwards already: local_tokens counts the frames of all of them.
    layer = (u - 1) * local_tokens * (4 * heads + 2 * groups) * shape.head_dim * shape.element_bytes
    gather = (u - 1) * local_tokens * shape.out_channels * 4  # the velocity is fp32
    return CommCost(
        plan=ParallelPlan(u, 1),
        ulysses_bytes=shape.num_layers * layer,
        ring_bytes=0,
        gather_bytes=gather,
        operations=(shape.num_layers * 2 + 1) * shape.forwards * (u > 1),
    )


def choose_magi_plan(world_size: int, shape: MagiWorkload, link: LinkModel | None = None) -> PlanChoice:
    """The MAGI-1 plan on `world_size` ranks: Ulysses U = world_size, heads split by KV group.

    Raises `ParallelConfigError` when U does not divide the KV groups or the tokens of a frame.
    """
    link = link or LinkModel()
    cost = predict_magi(world_size, shape)
    choice = PlanChoice(cost.plan, cost, cost.seconds(link), [cost], {})
    LOG.info("MAGI-1 %s [world=%d]", choice.describe(), world_size)
    return choice


__all__ = [
    "DEFAULT_CONTEXT_FRAMES",
    "CommCost",
    "LinkModel",
    "MagiWorkload",
    "ParallelConfig",
    "PlanChoice",
    "WorkloadShape",
    "choose_magi_plan",
    "choose_plan",
    "predict",
    "predict_magi",
]
