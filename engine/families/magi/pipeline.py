"""MAGI-1's chunk pipeline: a window of chunks denoised at staggered noise levels, one clean chunk out
per stage (MAGI1_README sections 4-9).

Beside the Self Forcing / CausVid block loop (`pipeline.py`), behind the same idea of a session: each
`generate_chunk()` runs model calls until the oldest chunk of the window is clean and returns it.
The first chunk needs `window_size` stages; after that every stage (steps_per_stage calls) emits one.

The KV cache holds only what is ever read: the K/V of *clean* chunks, written by the call in which a
chunk finished in the previous stage is prepended to the window at `clean_t`. They live in the paged
pool (pages per latent frame), as a rolling window of the look-back the KV ranges can reach, so a
session of any length holds a bounded cache. Rows of noisy chunks are never stored: the reference
writes them too, but always overwrites them before they are read.

Recovery: the only state that is not a function of the clean chunks is the partially denoised
latents of the chunks in flight. `ChunkOutput.carry` holds them as they are right after the chunk
is emitted; with the clean latents and carries of the last `lookback` chunks, `replay` re-runs the
exact calls that wrote their K/V (same inputs, same shapes: same bits) and the session continues
as if never interrupted, at a cost that does not grow with the video's length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from engine.families.magi.captions import null_rows, valid_rows
from engine.families.magi.dit import MagiDiT
from engine.families.magi.schedule import (
    ForwardCall,
    WindowSpec,
    cfg_scales,
    distill_dt,
    magi_timesteps,
    stage_calls,
    window_spec,
)
from engine.kv.pool import KVPool, KVPoolSpec
from engine.kv.session_cache import PagedSessionCache
from engine.noise import INITIAL_STEP, draw_seed
from inferix.errors import UserError
from inferix.profiling import profile
from inferix.spec.families.magi import MagiSampling

__all__ = [
    "CallRecord",
    "ChunkOutput",
    "MagiPipeline",
    "MagiLoop",
    "RecordedChunkNoise",
    "ReplayChunk",
    "SeededChunkNoise",
]


class ChunkNoise(Protocol):
    def initial(self, chunk: int, shape: tuple[int, ...]) -> Tensor:
        """The starting noise of `chunk`, [1, C, cw, h, w]."""
        ...


class SeededChunkNoise:
    """Noise keyed by (seed, chunk): any chunk's draw is the same on any worker, after any restart."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def initial(self, chunk: int, shape: tuple[int, ...]) -> Tensor:
        generator = torch.Generator().manual_seed(draw_seed(self.seed, chunk, INITIAL_STEP))
        return torch.randn(shape, generator=generator, dtype=torch.float32)


class RecordedChunkNoise:
    """Replays one recorded draw [1, C, T, h, w] (the reference's single `randn`), chunk by chunk."""

    def __init__(self, initial_noise: Tensor) -> None:
        self.initial_noise = initial_noise

    def initial(self, chunk: int, shape: tuple[int, ...]) -> Tensor:
        width = shape[2]
        noise = self.initial_noise[:, :, chunk * width : (chunk + 1) * width]
        if tuple(noise.shape) != tuple(shape):
            raise ValueError(f"the recorded noise has no chunk {chunk} of shape {list(shape)}")
        return noise


@dataclass
class ChunkOutput:
    """One clean chunk: latents [1, C, cw, h, w] and the in-flight latents right after it left the
    window ([1, C, k*cw, h, w], k chunks, oldest first; what recovery needs besides clean chunks)."""

    index: int
    latents: Tensor
    carry: Tensor
    denoise_s: float


@dataclass
class ReplayChunk:
    """A committed chunk as recovery replays it."""

    index: int
    latents: Tensor  # [1, C, cw, h, w]
    carry: Tensor  # [1, C, k*cw, h, w]


@dataclass
class CallRecord:
    """What one call computed, for golden checks: its input, each pass's raw output, the velocity."""

    index: int
    call: ForwardCall
    x: Tensor
    pass_outputs: list[Tensor]
    velocity: Tensor  # [1, C, len(denoising)*cw, h, w]


LATENT_CHANNELS = 16  # MAGI-1's VAE latent (the 24B DiT doubles it inside: half_channel_vae)
CaptionRows = Callable[[int], Tensor]  # chunk -> its valid caption rows [rows, caption_channels]


@dataclass
class _CallInputs:
    """What every pass of one call shares: the window, its timesteps (CPU), each chunk's caption rows,
    key ranges in rows of [cached prefix ; fresh rows], and the cached prefix (from chunk `first_cached`)."""

    x: Tensor
    t: Tensor
    captions: list[Tensor]
    ranges: list[tuple[int, int]]
    prefix: list[Tensor] | None
    first_cached: int


class MagiPipeline:
    """The DiT, the schedule and the KV pool shared by a worker's MAGI-1 sessions."""

    def __init__(self, dit: MagiDiT, sampling: MagiSampling, pool: KVPool | None = None) -> None:
        """Latents live on the DiT's device; noise and the schedule are computed on the CPU, the same on
        every machine."""
        self.dit = dit
        config = dit.config
        self.device = next(dit.parameters()).device
        self.sampling = sampling
        null, mask = null_rows(dit.y_embedder.null_caption_embedding.detach())
        self.null_rows = valid_rows(null, mask)  # every chunk's caption when the text is dropped
        self.kv_layout = (config.num_layers, config.num_query_groups, config.head_dim)
        self.patch = config.patch_size
        self.pool = pool
        self.timesteps = magi_timesteps(sampling.num_steps)
        self.latent_channels = LATENT_CHANNELS

    def window(self, num_chunks: int | None) -> WindowSpec:
        return window_spec(self.sampling, num_chunks)

    def tokens_per_frame(self, height: int, width: int) -> int:
        p = self.patch
        if height % p or width % p or height // p < 2 or width // p < 2:
            raise UserError(
                f"latent size {height}x{width} must be multiples of the patch {p}x{p} with at least 2 patches "
                "per side (MAGI-1's RoPE needs 2); pick a larger resolution"
            )
        return (height // p) * (width // p)

    @property
    def rank_kv_layout(self) -> tuple[int, int, int]:
        """`kv_layout` as this rank caches it: a sequence-parallel DiT (`kv_group_split` ranks) returns and
        reads only its share of the KV groups."""
        layers, groups, head_dim = self.kv_layout
        return layers, groups // self.dit.kv_group_split, head_dim

    def pool_spec(
        self, height: int, width: int, num_pages: int, device: str = "cpu", kv_dtype: str = "auto"
    ) -> KVPoolSpec:
        """A pool of `num_pages` pages of one latent frame at this latent size (this rank's KV groups),
        K/V stored as `kv_dtype` (see `KVPoolSpec`)."""
        layers, groups, head_dim = self.rank_kv_layout
        page = self.tokens_per_frame(height, width)
        return KVPoolSpec(layers, groups, head_dim, page, num_pages, device=device, kv_dtype=kv_dtype)

    def open_session(
        self,
        height: int,
        width: int,
        captions: CaptionRows,
        noise: ChunkNoise,
        num_chunks: int | None,
        session_id: str,
        keep_all_kv: bool = False,
    ) -> MagiLoop:
        spec = self.window(num_chunks)
        frames = None if keep_all_kv else max(1, spec.lookback_chunks) * spec.chunk_width
        pool = self.pool
        if pool is None:  # a pool of its own, sized for the rolling look-back (or a whole finite video)
            chunks = (num_chunks or spec.lookback_chunks) if keep_all_kv else spec.lookback_chunks + 1
            pool = KVPool(self.pool_spec(height, width, max(1, chunks) * spec.chunk_width, str(self.device)))
        cache = pool.open_session(session_id, self.tokens_per_frame(height, width), window_frames=frames)
        return MagiLoop(self, spec, height, width, captions, noise, cache, session_id)


class MagiLoop:
    """The chunk loop of one video."""

    def __init__(
        self,
        pipeline: MagiPipeline,
        spec: WindowSpec,
        height: int,
        width: int,
        captions: CaptionRows,
        noise: ChunkNoise,
        cache: PagedSessionCache,
        session_id: str,
    ) -> None:
        self.pipeline = pipeline
        self.spec = spec
        self.height, self.width = height, width
        self.captions = captions
        self.noise = noise
        self.cache = cache
        self.session_id = session_id
        self.ctn = spec.chunk_width * pipeline.tokens_per_frame(height, width)
        self.latents: dict[int, Tensor] = {}  # chunks in the window, and the one last emitted
        self.next_block_index = 0
        self.calls_made = 0
        self._calls = stage_calls(spec)
        self.observer: Callable[[CallRecord], None] | None = None
        self.on_clean_kv: Callable[[int, list[Tensor]], None] | None = None

    @property
    def finished(self) -> bool:
        return self.spec.num_chunks is not None and self.next_block_index >= self.spec.num_chunks

    @torch.no_grad()
    def generate_chunk(self) -> ChunkOutput:
        if self.finished:
            raise UserError(f"session {self.session_id} has made all its {self.spec.num_chunks} chunks")
        began = time.perf_counter()
        while True:
            call = next(self._calls)
            with profile("magi_call"):
                self._run(call)
            if call.emits is not None:
                break
        chunk = call.emits
        self.next_block_index = chunk + 1
        return ChunkOutput(chunk, self.latents[chunk], self._carry(chunk), time.perf_counter() - began)

    @torch.no_grad()
    def replay(self, chunks: Sequence[ReplayChunk]) -> None:
        """Continue after the last of `chunks` (consecutive, in order): the calls that wrote the K/V of
        all but the last are re-run from their clean latents and carries, and the last one's carry
        becomes the window. Pass at least the last `lookback_chunks + 1` committed chunks (all when
        fewer were made); earlier ones are not read again."""
        if not chunks:
            return
        indices = [c.index for c in chunks]
        if indices != list(range(indices[0], indices[0] + len(indices))):
            raise ValueError(f"replayed chunks must be consecutive, got {indices}")
        last = indices[-1]
        if indices[0] > max(0, last - self.spec.lookback_chunks):
            raise ValueError(
                f"replaying from chunk {indices[0]} leaves chunks before it out of chunk {last + 1}'s look-back; "
                f"pass chunks from {max(0, last - self.spec.lookback_chunks)} on"
            )
        self.cache.drop()
        for chunk in chunks[:-1]:
            self._restore_window(chunk)
            self._run(next(stage_calls(self.spec, first_stage=chunk.index + self.spec.window)), replaying=True)
        self._restore_window(chunks[-1])
        self._calls = stage_calls(self.spec, first_stage=last + self.spec.window)
        self.next_block_index = last + 1

    def _restore_window(self, chunk: ReplayChunk) -> None:
        cw = self.spec.chunk_width
        carry = chunk.carry
        device = self.pipeline.device
        self.latents = {chunk.index: chunk.latents.to(device, copy=True)}
        for j in range(carry.shape[2] // cw):
            self.latents[chunk.index + 1 + j] = carry[:, :, j * cw : (j + 1) * cw].to(device, copy=True)

    def _carry(self, emitted: int) -> Tensor:
        in_flight = sorted(c for c in self.latents if c > emitted)
        if not in_flight:
            return self.latents[emitted][:, :, :0].clone()
        return torch.cat([self.latents[c] for c in in_flight], dim=2)

    # ---- one call -----------------------------------------------------------------------------
    def _chunk_latents(self, chunk: int) -> Tensor:
        if chunk not in self.latents:
            cw = self.spec.chunk_width
            shape = (1, self.pipeline.latent_channels, cw, self.height, self.width)
            self.latents[chunk] = self.noise.initial(chunk, shape).to(self.pipeline.device, copy=True)
        return self.latents[chunk]

    def _timestep(self, step: int) -> Tensor:
        if step == self.spec.num_steps:
            return torch.tensor(self.pipeline.sampling.clean_t, dtype=torch.float32)
        return self.pipeline.timesteps[step]

    def _prefix(self, call: ForwardCall, replaying: bool) -> tuple[list[Tensor] | None, int]:
        """The cached K|V rows the call may read, per layer, and the first chunk they hold. A replayed
        call may reach before the cache: only its clean chunk's rows are kept, which see only itself."""
        if call.slice_point == 0 and not call.prepended:
            return None, 0
        frames = self.cache.frames
        if not frames:
            return None, call.slice_point
        first = frames[0] // self.spec.chunk_width
        lowest = min(start for start, _ in call.kv_ranges)
        if lowest < first and not replaying:
            raise RuntimeError(f"chunk {lowest} fell out of the KV look-back (cache starts at chunk {first})")
        rows = []
        for layer in range(self.pipeline.kv_layout[0]):
            k, v = self.cache.layer_kv(layer)
            rows.append(torch.cat([k, v], dim=-1))
        return rows, first

    def _run(self, call: ForwardCall, replaying: bool = False) -> None:
        x = torch.cat([self._chunk_latents(c) for c in call.chunks], dim=2)
        t = torch.stack([self._timestep(s) for s in call.steps]).reshape(1, -1)  # on the CPU: exact, cheap
        prefix, first = self._prefix(call, replaying)
        null = self.pipeline.null_rows
        inputs = _CallInputs(
            x=x,
            t=t,
            captions=[null if call.prepended and j == 0 else self.captions(c) for j, c in enumerate(call.chunks)],
            ranges=[((max(a, first) - first) * self.ctn, (b - first) * self.ctn) for a, b in call.kv_ranges],
            prefix=prefix,
            first_cached=first,
        )
        if self.pipeline.sampling.cfg_number == 1:
            velocity, outputs, fresh = self._distilled(call, inputs)
        else:
            velocity, outputs, fresh = self._guided(call, inputs)
        if call.prepended:
            self._write_clean(call.chunks[0], fresh)
        timesteps = self.pipeline.timesteps
        for chunk, step, v in zip(call.denoising, call.denoising_steps, velocity, strict=True):
            self.latents[chunk] = self.latents[chunk] + v * (timesteps[step + 1] - timesteps[step])
        if not replaying and self.observer is not None:
            self.observer(CallRecord(self.calls_made, call, x, outputs, torch.cat(velocity, dim=2)))
        self.calls_made += 1
        if call.prepended:  # the clean chunk's K/V is cached: its latents are no longer needed
            self.latents.pop(call.chunks[0], None)

    def _distilled(self, call: ForwardCall, inputs: _CallInputs) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """One pass (README section 7); a nearly clean oldest chunk is also run alone, appended, and
        its velocity blended from both."""
        sampling, cw, ctn = self.pipeline.sampling, self.spec.chunk_width, self.ctn
        skip = 1 if call.prepended else 0
        x, t, captions, ranges = inputs.x, inputs.t, inputs.captions, inputs.ranges
        nearly_clean = float(t[0, skip]) > sampling.distill_nearly_clean_chunk_threshold
        if nearly_clean:
            x = torch.cat([x, x[:, :, skip * cw : (skip + 1) * cw]], dim=2)
            t = torch.cat([t, t[:, skip : skip + 1]], dim=1)
            captions = [*captions, captions[skip]]
            end = (call.slice_point - inputs.first_cached + len(call.chunks) + 1) * ctn
            ranges = [*ranges, (end - ctn, end)]
        dt = distill_dt(self.spec.num_steps, call.step_in_stage)
        out, fresh = self.pipeline.dit(
            x, t.to(self.pipeline.device), [captions], ranges, inputs.prefix, self._rope_offset(call), False, dt
        )
        velocity = self._chunks(out, skip, len(call.denoising))
        if nearly_clean:
            scale = sampling.prev_chunks_scale
            velocity[0] = velocity[0] * scale + out[:, :, -cw:] * (1 - scale)
        return velocity, [out], fresh

    def _guided(self, call: ForwardCall, inputs: _CallInputs) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """The base model's three passes and their t-dependent combination (README section 8)."""
        sampling, cw, device = self.pipeline.sampling, self.spec.chunk_width, self.pipeline.device
        skip = 1 if call.prepended else 0
        x, t, null, offset = inputs.x, inputs.t.to(device), self.pipeline.null_rows, self._rope_offset(call)
        dit = self.pipeline.dit
        text, _ = dit(x, t, [inputs.captions], inputs.ranges, inputs.prefix, offset, False, None)
        nulls = [null] * len(call.chunks)
        context, fresh = dit(x, t, [nulls], inputs.ranges, inputs.prefix, offset, True, None)
        # Each denoising chunk alone: no context, no cache, its own frames from 0.
        alone = torch.cat([x[:, :, j * cw : (j + 1) * cw] for j in range(skip, len(call.chunks))], dim=0)
        count = alone.shape[0]
        uncond, _ = dit(alone, t[0, skip:].reshape(-1, 1), [[null]] * count, [(0, self.ctn)], None, 0, True, None)
        scales = cfg_scales(inputs.t[0, skip:], sampling.cfg_t_range, sampling.prev_chunk_scales, sampling.text_scales)
        text_v, context_v = self._chunks(text, skip, count), self._chunks(context, skip, count)
        velocity = [
            (1 - p) * uncond[j : j + 1] + (p - s) * context_v[j] + s * text_v[j] for j, (p, s) in enumerate(scales)
        ]
        return velocity, [text, context, uncond], fresh

    def _rope_offset(self, call: ForwardCall) -> int:
        return call.slice_point * self.spec.chunk_width

    def _chunks(self, out: Tensor, skip: int, count: int) -> list[Tensor]:
        cw = self.spec.chunk_width
        return [out[:, :, (skip + j) * cw : (skip + j + 1) * cw] for j in range(count)]

    def _write_clean(self, chunk: int, fresh: list[Tensor]) -> None:
        """Cache the prepended clean chunk's K|V rows (the first `ctn` fresh rows of every layer)."""
        cw = self.spec.chunk_width
        _, groups, head_dim = self.pipeline.rank_kv_layout
        rows = [f[: self.ctn] for f in fresh]
        self.cache.begin(chunk * cw, cw)
        for layer, kv in enumerate(rows):
            kv = kv.reshape(1, self.ctn, groups, 2 * head_dim)
            self.cache.store(layer, kv[..., :head_dim], kv[..., head_dim:])
        if self.on_clean_kv is not None:
            self.on_clean_kv(chunk, rows)
