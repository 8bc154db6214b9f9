"""How a model samples a session, as data: the flow-matching schedule, the denoising steps of a
block, the block-causal structure (block size, window, sink) and the RoPE re-basing rule of
unbounded windowed sessions. Torch-free: the scheduler validates sessions with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class FlowMatchConfig:
    """Flow-matching noise schedule (Wan `FlowMatchScheduler` with `extra_one_step`)."""

    num_train_timesteps: int = 1000
    shift: float = 5.0
    sigma_min: float = 0.0
    sigma_max: float = 1.0


@dataclass(frozen=True)
class SamplingConfig:
    """How one block is denoised.

    `denoising_steps` are in the training-timestep scale (0..1000). With `warp` (Self Forcing)
    each value s is replaced by the shifted schedule's timestep at index 1000 - s; without it
    (CausVid) the raw values are used. `timestep_dtype` is the dtype the reference feeds the
    model: float32 for Self Forcing, int64 for CausVid (it matters: the embedding sees it).

    `solver` is how a step moves to the next timestep. ``renoise`` (Self Forcing, CausVid): re-noise
    the step's x0 prediction with fresh noise, right for few-step distilled models, whose x0 is
    a sample. ``euler``: the flow-matching ODE step, which keeps the step's own noise estimate
    (x0 + flow); for models trained only with the flow-matching loss, whose x0 is a posterior
    mean that fresh noise would blur into a grey average.
    """

    denoising_steps: tuple[float, ...] = (1000, 750, 500, 250)
    warp: bool = True
    timestep_dtype: Literal["float32", "int64"] = "float32"
    context_noise: float = 0.0
    solver: Literal["renoise", "euler"] = "renoise"
    schedule: FlowMatchConfig = field(default_factory=FlowMatchConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "denoising_steps", tuple(self.denoising_steps))
        if not self.denoising_steps:
            raise ValueError("denoising_steps must list at least one timestep, e.g. [1000, 750, 500, 250]")
        if self.timestep_dtype not in ("float32", "int64"):
            raise ValueError(f"timestep_dtype must be 'float32' or 'int64', got {self.timestep_dtype!r}")
        if self.solver not in ("renoise", "euler"):
            raise ValueError(f"solver must be 'renoise' or 'euler', got {self.solver!r}")


@dataclass(frozen=True)
class BlockConfig:
    """The block-causal structure of a session.

    `local_attn_size` and `sink_size` are in latent frames, as in Self Forcing: the window
    holds `local_attn_size` frames in total (sink and current block included); -1 = global.
    """

    num_frame_per_block: int = 3
    local_attn_size: int = -1
    sink_size: int = 0

    def __post_init__(self) -> None:
        if self.num_frame_per_block < 1:
            raise ValueError(f"num_frame_per_block must be >= 1, got {self.num_frame_per_block}")
        if self.local_attn_size != -1:
            if self.sink_size < 0:
                raise ValueError(f"sink_size must be >= 0, got {self.sink_size}")
            if self.local_attn_size < self.sink_size + self.num_frame_per_block:
                raise ValueError(
                    f"local_attn_size={self.local_attn_size} must be at least sink_size + "
                    f"num_frame_per_block = {self.sink_size + self.num_frame_per_block} (or -1 for global)"
                )
        elif self.sink_size != 0:
            raise ValueError("sink_size only applies with a local window: set local_attn_size or sink_size=0")

    @property
    def is_global(self) -> bool:
        return self.local_attn_size == -1


@dataclass(frozen=True)
class PromptSwitchConfig:
    """What a prompt switch does to the KV cache (LongLive 1.0's `_recache_after_switch`).

    `recache`: every switch re-encodes the recent frames under the new prompt (a client may also
    ask for it per switch). `global_sink`: the sink keeps the K/V of the session's first frames
    through a re-cache (LongLive's default); false: the re-cached window's first frames become the
    sink. Costs one DiT pass over the window at the switch.
    """

    recache: bool = False
    global_sink: bool = True

    def __post_init__(self) -> None:
        for name in ("recache", "global_sink"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class PipelineConfig:
    block: BlockConfig = field(default_factory=BlockConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    prompt_switch: PromptSwitchConfig = field(default_factory=PromptSwitchConfig)

    def __post_init__(self) -> None:
        block = self.block
        if self.prompt_switch.recache and block.sink_size > block.num_frame_per_block:
            # LongLive's loop never rewrites sink slots from a call that starts after frame 0, so its
            # sink frames after the first block keep the K/V of their first denoising step; the block
            # loop here rewrites them each step, as Self Forcing does, and would not match it.
            raise ValueError(
                f"prompt_switch.recache (LongLive's loop) needs sink_size <= num_frame_per_block, got sink_size="
                f"{block.sink_size} with num_frame_per_block={block.num_frame_per_block}: LongLive keeps the "
                f"first step's K/V of the sink frames after the first block, which this engine does not reproduce"
            )


@dataclass(frozen=True)
class RopeRebase:
    """When a windowed session shifts its time positions down, and by how much.

    A DiT pass over frames that end at frame index `end` uses time positions reduced by
    `offset(end)`: 0 while the table holds `end` (a session that never reaches the table's end is
    untouched), past it the smallest multiple of `stride = max_positions - keep` that brings `end`
    back into the table. The pass that crosses therefore starts at most `keep` positions into the
    table. With `keep` = the window's frames after its sink (`rope_rebase`), the window's recent
    frames keep positions >= 0 and only the sink's go negative; attention is unchanged either way.
    """

    max_positions: int  # length of the RoPE table
    keep: int  # positions left below a block that just re-based

    def __post_init__(self) -> None:
        if self.keep < 0 or self.stride < 1:
            raise ValueError(f"RoPE re-basing needs 0 <= keep < max_positions, got keep={self.keep}")

    @property
    def stride(self) -> int:
        """Positions one re-base shifts by."""
        return self.max_positions - self.keep

    def offset(self, end_frame: int) -> int:
        """Time positions of a pass over frames ending (exclusive) at `end_frame` are frame - offset."""
        overflow = end_frame - self.max_positions
        if overflow <= 0:
            return 0
        return -(-overflow // self.stride) * self.stride


def rope_rebase(max_positions: int, block: BlockConfig) -> RopeRebase | None:
    """The re-basing rule of a session, or None with global attention.

    A global session keeps every frame in its cache, so its time distances grow with it: the
    table bounds its length. A window holds at most `local_attn_size` frames; the table must hold
    the window's frames after its sink plus one more block, so that a re-base moves at least a block.
    """
    if block.is_global:
        return None
    keep = block.local_attn_size - block.sink_size
    if max_positions < keep + block.num_frame_per_block:
        raise ValueError(
            f"rope_max_positions={max_positions} is too short for a window of {block.local_attn_size} frames "
            f"with a sink of {block.sink_size}: it must be at least local_attn_size - sink_size + "
            f"num_frame_per_block = {keep + block.num_frame_per_block}"
        )
    return RopeRebase(max_positions, keep)
