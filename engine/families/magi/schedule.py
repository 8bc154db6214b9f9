"""MAGI-1's sampling schedule and the bookkeeping of its staggered window (MAGI1_README sections 3-5).

Pure functions of the runtime config: which chunks a forward call sees, at which schedule index each
sits, which key rows each attends to, and which chunk leaves the pipeline after it. The chunk
pipeline (`engine.families.magi.pipeline`) runs these calls; nothing here touches a tensor but the
schedule itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from inferix.errors import UserError
from inferix.spec.families.magi import MagiSampling

# shortcut_mode "8,16,16": the 12-step schedule reuses three offsets of a 4-step one.
_SHORTCUT_OFFSETS = (0.0, 0.125, 0.1875)
_SD3_SHIFT = 3.0


def magi_timesteps(num_steps: int) -> Tensor:
    """The fp32 schedule t[0..S], 0 = noise -> 1 = clean, with MAGI-1's shift (README section 3)."""
    if num_steps < 1:
        raise UserError(f"num_steps must be >= 1, got {num_steps}")
    if num_steps == 12:
        offsets = torch.tensor(_SHORTCUT_OFFSETS, dtype=torch.float32)
        u = torch.cat([offsets + a for a in torch.linspace(0, 1, 5, dtype=torch.float32)])[:13]
    else:
        u = torch.linspace(0, 1, num_steps + 1, dtype=torch.float32)
    t = u**2
    shift = 1.0 / _SD3_SHIFT
    return shift * t / (1 + (shift - 1) * t)


def time_intervals(num_steps: int) -> list[float]:
    """Distill step sizes per step of a stage: [2, 1, 1] repeated when S % 3 == 0, else ones."""
    if num_steps % 3 == 0:
        return [2.0, 1.0, 1.0] * (num_steps // 3)
    return [1.0] * num_steps


def distill_dt(num_steps: int, step_in_stage: int) -> float:
    """The distilled model's second time input (README section 7)."""
    if num_steps == 12:
        return 4 / time_intervals(num_steps)[step_in_stage] * 2
    return num_steps / 4 * 2


@dataclass(frozen=True)
class WindowSpec:
    """The window of one run: `num_chunks` None streams without an end."""

    chunk_width: int  # latent frames per chunk
    window: int  # chunks denoised together
    num_steps: int
    noise2clean_kvrange: tuple[int, ...]
    clean_chunk_kvrange: int
    num_chunks: int | None = None

    def __post_init__(self) -> None:
        if self.window < 1 or self.chunk_width < 1:
            raise UserError(f"window_size and chunk_width must be >= 1, got {self.window} and {self.chunk_width}")
        if self.num_steps % self.window:
            raise UserError(
                f"num_steps {self.num_steps} must be a multiple of window_size {self.window} "
                "(each stage runs num_steps / window_size steps)"
            )
        if not self.noise2clean_kvrange or min(self.noise2clean_kvrange) < 1 or self.clean_chunk_kvrange < 1:
            raise UserError("noise2clean_kvrange and clean_chunk_kvrange must be chunk counts >= 1")
        if self.num_chunks is not None and self.num_chunks < 1:
            raise UserError(f"the video needs at least one chunk, got {self.num_chunks}")

    @property
    def steps_per_stage(self) -> int:
        return self.num_steps // self.window

    @property
    def lookback_chunks(self) -> int:
        """Clean chunks before the window that any call can read (the rest of the cache is dead)."""
        return max(*self.noise2clean_kvrange, self.clean_chunk_kvrange) - 1

    def kv_range(self, step: int) -> int:
        """Chunks of context a chunk at schedule index `step` attends to, itself included."""
        if step == self.num_steps:
            return self.clean_chunk_kvrange
        per = self.num_steps / len(self.noise2clean_kvrange)
        return self.noise2clean_kvrange[int(step // per)]


def window_spec(sampling: MagiSampling, num_chunks: int | None) -> WindowSpec:
    """The window of a run of `num_chunks` chunks (None: endless) with these sampling settings."""
    s = sampling
    return WindowSpec(
        s.chunk_width, s.window_size, s.num_steps, s.noise2clean_kvrange, s.clean_chunk_kvrange, num_chunks
    )


@dataclass(frozen=True)
class ForwardCall:
    """One model call of the pipeline (one integration step of every denoising chunk in the window)."""

    stage: int
    step_in_stage: int
    slice_point: int  # first chunk of the call's input; earlier chunks come from the cache
    chunks: tuple[int, ...]  # absolute chunk indices, oldest first (a prepended clean chunk first)
    steps: tuple[int, ...]  # schedule index of each chunk (num_steps for the prepended clean chunk)
    kv_ranges: tuple[tuple[int, int], ...]  # per chunk [start, end) in absolute chunks
    prepended: bool  # chunks[0] is the clean chunk finished in the previous stage
    emits: int | None  # the chunk that is clean after this call

    @property
    def denoising(self) -> tuple[int, ...]:
        return self.chunks[1:] if self.prepended else self.chunks

    @property
    def denoising_steps(self) -> tuple[int, ...]:
        return self.steps[1:] if self.prepended else self.steps


def stage_calls(spec: WindowSpec, first_stage: int = 0) -> Iterator[ForwardCall]:
    """Every call of the run from `first_stage` on, in order (endless when `spec.num_chunks` is None)."""
    w, sps, n = spec.window, spec.steps_per_stage, spec.num_chunks
    last_stage = None if n is None else n + w - 2
    stage = first_stage
    while last_stage is None or stage <= last_stage:
        cs = max(0, stage - w + 1)
        ce = stage + 1 if n is None else min(n, stage + 1)
        t_end = min(w, stage + 1)
        for d in range(sps):
            chunks = list(range(cs, ce))
            steps = [(t_end - 1 - k) * sps + d for k in range(len(chunks))]
            prepended = cs > 0 and d == 0
            if prepended:
                chunks.insert(0, cs - 1)
                steps.insert(0, spec.num_steps)
            slice_point = chunks[0]
            ranges = []
            for j, step in enumerate(steps):
                end = slice_point + j + 1
                ranges.append((max(0, end - spec.kv_range(step)), end))
            emits = cs if d == sps - 1 and stage >= w - 1 else None
            yield ForwardCall(stage, d, slice_point, tuple(chunks), tuple(steps), tuple(ranges), prepended, emits)
        stage += 1


def chunk_emitted_after_stage(spec: WindowSpec, chunk: int) -> int:
    """The stage whose last call makes `chunk` clean."""
    return chunk + spec.window - 1


def latent_frames(num_frames: int, chunk_width: int, temporal_factor: int = 4) -> int:
    """Latent T of a `num_frames` video: whole chunks (README section 4)."""
    return math.ceil((num_frames // temporal_factor) / chunk_width) * chunk_width


def cfg_scales(
    t: Tensor, t_range: Sequence[float], prev_chunk_scales: Sequence[float], text_scales: Sequence[float]
) -> list[tuple[float, float]]:
    """(prev_chunk_scale p, text_scale s) per chunk timestep, as the base model's guidance picks them."""
    edges = torch.tensor(t_range, dtype=torch.float32) - 1e-7
    index = torch.searchsorted(edges, t.to(torch.float32).contiguous()) - 1
    return [(prev_chunk_scales[k], text_scales[k]) for k in index.tolist()]
