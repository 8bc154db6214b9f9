"""The model-agnostic block loop of block-diffusion video generation.

For every block of `num_frame_per_block` latent frames:
  1. start from noise; for each denoising timestep: flow = DiT(x, t) against the session's KV
     cache, x0 = x - sigma(t) * flow, then re-noise x0 to the next timestep with fresh noise
     (or, with the `euler` solver, with the noise estimate x0 + flow: the flow-matching ODE step);
  2. the last x0 is the block's output;
  3. one context pass DiT(x0, t=context_noise) re-writes the block's K/V with clean content.
Every call of a block writes the same cache frames; the next block attends to them.

A windowed session runs for as long as it is asked to: when a block would run past the end of the
DiT's RoPE table, the session shifts its time positions down (`rope.RopeRebase`: at a frame index
fixed by the table and the window alone) and turns its cached keys to match; attention, which sees
only distances between positions, is unchanged. Replay passes the same frame indices, so it
re-bases at the same points and rebuilds the same cache.

A `WanLoop` yields blocks one at a time (an iterator), takes prompt changes between
blocks, and can be rebuilt from committed block latents alone (recovery by recompute).

A block is written as a job: a generator that yields each DiT call it needs (`DiTCall`) and is
sent the flow prediction back. `generate_block` runs the job alone (`run_solo`); a
`engine.batching.BlockBatcher` runs many sessions' jobs together, one batched forward per
step. Either way the session computes exactly the same thing. A job may also yield an `Early`
value: what can leave before the job ends (a block's decoded frames, before the context pass that
only the next block needs); the runner hands it out and goes on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from engine.families.wan.dit import CausalWanDiT, CrossAttentionKV, DiTCall
from engine.flow_match import FlowMatchSchedule
from engine.kv import snapshot as kv_snapshot
from engine.kv.page_codec import check_kv_dtype
from engine.kv.pool import KVPool, KVPoolSpec
from engine.kv.session_cache import PagedSessionCache
from engine.noise import NoiseSource, SeededNoise
from inferix.profiling import profile
from inferix.spec.sampling import PipelineConfig, rope_rebase

T = TypeVar("T")


@dataclass(frozen=True)
class Early:
    """A job's output that is ready before the job ends (sent None back)."""

    value: object


# A computation that needs DiT forwards: yields each call, is sent its flow (None for a context
# pass, `DiTCall.cache_only`), returns a T; it may yield an `Early` output on the way.
DiTJob = Generator[DiTCall | Early, Tensor | None, T]


def run_solo(dit: CausalWanDiT, job: DiTJob[T]) -> T:
    """Run a job's DiT calls one by one, alone; its result."""
    try:
        call = next(job)
        while True:
            if isinstance(call, Early):  # alone, the result carries it too
                call = job.send(None)
                continue
            with profile(call.kind):
                flow = dit.forward_batch([call])[0]
            call = job.send(flow)
    except StopIteration as done:
        return cast(T, done.value)


@dataclass
class BlockTimings:
    denoise_s: float
    context_s: float

    @property
    def total_s(self) -> float:
        return self.denoise_s + self.context_s


@dataclass
class BlockOutput:
    """One finished block. `latents` is the clean block [1, F, C, h, w] (what a store persists)."""

    index: int
    start_frame: int
    latents: Tensor
    timings: BlockTimings
    step_x0: list[Tensor] = field(default_factory=list)
    recached: bool = False  # a prompt switch re-encoded the cache before this block (committed with it)


@dataclass
class ReplayBlock:
    """A committed block as the engine replays it: its first latent frame, clean latents, prompt
    embeddings, (a DiT with a keyboard branch) the keys held in each of its frames [F, keys], and
    whether its prompt switch re-encoded the cache before it (`BlockOutput.recached`)."""

    start_frame: int
    latents: Tensor
    prompt_embeds: Tensor
    key_rows: Tensor | None = None
    recached: bool = False


class WanPipeline:
    """Holds the model, the schedule and the KV pool; opens generation sessions.

    `kv_dtype` is how the pools the pipeline makes itself store K/V (see `KVPoolSpec`); by default
    that of `pool`, else "auto".
    """

    def __init__(
        self, dit: CausalWanDiT, config: PipelineConfig, pool: KVPool | None = None, kv_dtype: str | None = None
    ) -> None:
        if pool is not None and kv_dtype is not None and kv_dtype != pool.spec.kv_dtype:
            raise ValueError(f"the pool stores K/V as kv_dtype={pool.spec.kv_dtype!r}, not {kv_dtype!r}")
        self.dit = dit
        self.config = config
        self.schedule = FlowMatchSchedule(config.sampling.schedule)
        self.timesteps = self.schedule.denoising_timesteps(config.sampling)
        self.pool = pool
        self.kv_dtype = check_kv_dtype(kv_dtype or (pool.spec.kv_dtype if pool is not None else "auto"))

    @property
    def device(self) -> torch.device:
        return self.dit.patch_embedding.weight.device

    def cache_layout(self, latent_height: int, latent_width: int) -> tuple[int, int]:
        """(heads, tokens of one latent frame) that this process's KV cache holds.

        All of them, or this rank's shard when the DiT runs sequence-parallel (`engine.parallel`).
        """
        cfg = self.dit.config
        layout = (cfg.num_heads, cfg.tokens_per_frame(latent_height, latent_width))
        return layout if self.dit.parallel is None else self.dit.parallel.cache_layout(*layout)

    def pool_spec(self, latent_height: int, latent_width: int, frames: int, kv_dtype: str = "auto") -> KVPoolSpec:
        """A pool spec with one page per latent frame, room for `frames` frames in total, K/V stored
        as `kv_dtype` ("auto": the model's dtype; "fp8" / "int8": 8 bits and a scale per page and head)."""
        cfg = self.dit.config
        weight = self.dit.patch_embedding.weight
        heads, tokens_per_frame = self.cache_layout(latent_height, latent_width)
        return KVPoolSpec(
            num_layers=cfg.num_layers,
            num_heads=heads,
            head_dim=cfg.head_dim,
            page_size=tokens_per_frame,
            num_pages=frames,
            dtype=weight.dtype,
            device=str(weight.device),
            kv_dtype=kv_dtype,
        )

    def open_cache(
        self, pool: KVPool | None, session_id: str, latent_height: int, latent_width: int, frames: int = 0
    ) -> PagedSessionCache:
        """A page table shaped as this pipeline's sessions use it (window, sink), in `pool`, or
        (without one) in a pool of its own with room for `frames` frames and at least one window."""
        block = self.config.block
        window = None if block.is_global else block.local_attn_size
        if pool is None:
            pool = KVPool(self.pool_spec(latent_height, latent_width, max(frames, window or 0), self.kv_dtype))
        return pool.open_session(
            session_id,
            self.cache_layout(latent_height, latent_width)[1],
            window_frames=window,
            sink_frames=block.sink_size,
        )

    def session_frames(self, num_blocks: int | None) -> int:
        """Latent frames one session keeps in its cache at most (its window, or all its frames)."""
        block = self.config.block
        if not block.is_global:
            return block.local_attn_size
        if num_blocks is None:
            raise ValueError("a global-attention session needs num_blocks (its cache grows with every block)")
        return num_blocks * block.num_frame_per_block

    def open_session(
        self,
        prompt_embeds: Tensor,
        latent_height: int,
        latent_width: int,
        *,
        seed: int = 0,
        noise: NoiseSource | None = None,
        num_blocks: int | None = None,
        initial_latents: Tensor | None = None,
        session_id: str | None = None,
        record_steps: bool = False,
    ) -> WanLoop:
        """Start a session in the shared pool, or (without one) in a pool sized for this session alone."""
        if num_blocks is not None and num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 (or None for unbounded), got {num_blocks}")
        self.dit.config.tokens_per_frame(latent_height, latent_width)  # validates the size
        pool = self.pool
        if pool is None:
            init_frames = 0 if initial_latents is None else initial_latents.shape[1]
            frames = self.session_frames(num_blocks)
            if self.config.block.is_global:
                frames += init_frames
            pool = KVPool(self.pool_spec(latent_height, latent_width, frames, self.kv_dtype))
        return WanLoop(
            self,
            pool,
            prompt_embeds,
            latent_height,
            latent_width,
            noise=noise if noise is not None else SeededNoise(seed),
            num_blocks=num_blocks,
            initial_latents=initial_latents,
            session_id=session_id or uuid.uuid4().hex,
            record_steps=record_steps,
        )


class WanLoop:
    """One video being generated block by block; iterate it to get `BlockOutput`s."""

    def __init__(
        self,
        pipeline: WanPipeline,
        pool: KVPool,
        prompt_embeds: Tensor,
        latent_height: int,
        latent_width: int,
        *,
        noise: NoiseSource,
        num_blocks: int | None,
        initial_latents: Tensor | None,
        session_id: str,
        record_steps: bool,
    ) -> None:
        self.pipeline = pipeline
        self.dit = pipeline.dit
        self.block_config = pipeline.config.block
        self.sampling = pipeline.config.sampling
        self.latent_shape = (self.dit.config.in_dim, latent_height, latent_width)
        self.noise = noise
        self.num_blocks = num_blocks
        self.session_id = session_id
        self.record_steps = record_steps
        self.pool = pool
        block = self.block_config
        self.cache: PagedSessionCache = pipeline.open_cache(pool, session_id, latent_height, latent_width)
        self.rebase_rule = rope_rebase(self.dit.rope.max_positions, block)  # None: global, bounded by the table
        self.prompt_embeds = prompt_embeds
        self.prompt: CrossAttentionKV = self.dit.encode_prompt(prompt_embeds)
        self._pending_prompt: tuple[Tensor, bool] | None = None
        # Clean latents of the frames in the cache and of the last window's frames (a re-cache reads them).
        self._frame_latents: dict[int, Tensor] = {}
        # A DiT with a keyboard branch: the keys held in each frame ([keys]) that a later call's
        # windows still read, and those of the next block (`set_key_rows`; None: no key held).
        self._key_rows: dict[int, Tensor] = {}
        self._next_key_rows: Tensor | None = None
        self.next_block_index = 0
        self.next_frame = 0
        self.closed = False
        if initial_latents is not None:
            self._prefill(initial_latents)

    # ---- public API -----------------------------------------------------------------------
    def set_prompt(self, prompt_embeds: Tensor, recache: bool = False) -> None:
        """Switch prompt before the next block.

        The self-attention cache is kept, unless `recache` (or the model's `prompt_switch.recache`)
        asks for LongLive's KV re-cache: the recent frames are re-encoded under the new prompt, so
        the past no longer pulls the video towards the old prompt (see `_recache`).
        """
        width = self.dit.config.text_dim
        if prompt_embeds.dim() != 3 or prompt_embeds.shape[-1] != width:
            raise ValueError(
                f"prompt_embeds must have shape [1, tokens, text_dim={width}], got {list(prompt_embeds.shape)}"
            )
        self._pending_prompt = (prompt_embeds, recache)

    def set_key_rows(self, rows: Tensor) -> None:
        """The keys held in each frame of the next block: [num_frame_per_block, keys] of 0/1 (a DiT
        with a keyboard branch; a block without them holds no key)."""
        action = self.dit.config.action
        nf = self.block_config.num_frame_per_block
        if action is None:
            raise ValueError("this model takes no actions (its DiT has no keyboard branch)")
        if tuple(rows.shape) != (nf, action.keys):
            raise ValueError(f"key rows must have shape [{nf}, {action.keys}], got {list(rows.shape)}")
        self._next_key_rows = rows.float().cpu()

    def __iter__(self) -> Iterator[BlockOutput]:
        while not self.finished:
            yield self.generate_block()

    @property
    def finished(self) -> bool:
        return self.closed or (self.num_blocks is not None and self.next_block_index >= self.num_blocks)

    @torch.no_grad()
    def generate_block(self) -> BlockOutput:
        """Denoise the next block, write it into the cache with a context pass, and return it."""
        return run_solo(self.dit, self.block_job())

    def block_job(self, denoised: Callable[[BlockOutput], object] | None = None) -> DiTJob[BlockOutput]:
        """`generate_block` as a job (see the module docstring); run it under `torch.no_grad()`.
        `denoised`: called with the block once it is denoised, before its context pass; the job
        yields what it returns as `Early`."""
        if self.closed:
            raise RuntimeError(f"session {self.session_id} is closed")
        if self.num_blocks is not None and self.next_block_index >= self.num_blocks:
            raise RuntimeError(f"session {self.session_id} already produced its {self.num_blocks} blocks")
        began = time.perf_counter()
        recached = yield from self._apply_pending_prompt()
        nf = self.block_config.num_frame_per_block
        shape = (1, nf, *self.latent_shape)
        device = self.pipeline.device
        block, start = self.next_block_index, self.next_frame
        self._hold_keys(start, nf, self._next_key_rows)
        self._next_key_rows = None

        x = self.noise.initial(block, shape).to(device)
        steps = self.pipeline.timesteps
        step_x0: list[Tensor] = []
        x0 = x
        for i, t_value in enumerate(steps):
            t = torch.full((1, nf), 0, dtype=steps.dtype, device=device) + t_value.to(device)
            flow = yield from self._call(x, t, start, "denoise_step")
            assert flow is not None
            x0 = self.pipeline.schedule.x0_from_flow(x, flow, t)
            if self.record_steps:
                step_x0.append(x0.clone())
            if i + 1 < len(steps):
                t_next = torch.full((1, nf), 0, dtype=steps.dtype, device=device) + steps[i + 1].to(device)
                x = self.pipeline.schedule.add_noise(x0, self._step_noise(block, i, x0, flow), t_next)
        self._sync()
        denoised_s = time.perf_counter()
        output = BlockOutput(block, start, x0, BlockTimings(denoised_s - began, 0.0), step_x0, recached)
        if denoised is not None:
            yield Early(denoised(output))
        context_began = time.perf_counter()
        yield from self._context_pass(x0, start)
        self._sync()
        output.timings.context_s = time.perf_counter() - context_began

        self.next_block_index += 1
        self.next_frame += nf
        return output

    @torch.no_grad()
    def replay(
        self, blocks: Sequence[ReplayBlock], next_block_index: int | None = None, *, from_start: bool = True
    ) -> None:
        """Rebuild the KV cache from committed blocks (in order) by context passes alone.

        Every committed block must be replayed from the first: a cached frame's K/V depend on
        everything it attended to when it was written. One forward per block instead of
        steps + 1, and the result is identical to the original run's cache. A long history can
        be replayed in chunks: `from_start=False` continues the previous chunk's replay (only
        the chunk and the cache are in memory, never the whole history).
        """
        if from_start:
            self.cache.drop()
            self._frame_latents.clear()
        for committed in blocks:
            self._use_prompt(committed.prompt_embeds)
            if committed.recached:
                self.next_frame = committed.start_frame
                run_solo(self.dit, self._recache())
            self._hold_keys(committed.start_frame, committed.latents.shape[1], committed.key_rows)
            run_solo(self.dit, self._context_pass(committed.latents.to(self.pipeline.device), committed.start_frame))
            self.next_frame = committed.start_frame + committed.latents.shape[1]
        if next_block_index is not None:
            self.next_block_index = next_block_index

    def snapshot_state(self) -> dict[str, Any]:
        """A copy of what the next block reads besides its prompt (see `engine.snapshot`): the KV pages
        exactly as stored, the clean latents a re-cache re-encodes, the key rows a keyboard branch
        still reads, and the block and frame counters. Taken between blocks."""
        if self._pending_prompt is not None:
            raise RuntimeError(f"session {self.session_id}: a snapshot between a prompt switch and its block")
        latent_frames = sorted(self._frame_latents)
        key_frames = sorted(self._key_rows)
        return {
            "cache": kv_snapshot.capture(self.cache).to_tree(),
            "next_block": self.next_block_index,
            "next_frame": self.next_frame,
            "latent_frames": latent_frames,
            "latents": [self._frame_latents[f].detach().to("cpu", copy=True) for f in latent_frames],
            "key_frames": key_frames,
            "key_rows": [self._key_rows[f].clone() for f in key_frames],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from `snapshot_state` of a session like this one, in place of its first blocks."""
        if self.next_block_index or self.next_frame or self.cache.frames:
            raise RuntimeError(f"session {self.session_id}: a snapshot loads into a new session only")
        kv_snapshot.load(self.cache, kv_snapshot.CacheSnapshot.from_tree(state["cache"]))
        device = self.pipeline.device
        self._frame_latents = {f: t.to(device) for f, t in zip(state["latent_frames"], state["latents"], strict=True)}
        self._key_rows = dict(zip(state["key_frames"], state["key_rows"], strict=True))
        self.next_block_index = int(state["next_block"])
        self.next_frame = int(state["next_frame"])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.close_session(self.session_id)

    def __enter__(self) -> WanLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ------------------------------------------------------------------------
    def _step_noise(self, block: int, step: int, x0: Tensor, flow: Tensor) -> Tensor:
        """The noise x0 is mixed with to reach the next timestep (see `SamplingConfig.solver`)."""
        if self.sampling.solver == "euler":
            return x0 + flow  # the noise this step's prediction implies: x_t = (1 - s) x0 + s eps
        return self.noise.renoise(block, step, tuple(x0.shape)).to(x0.device)

    def _context_timesteps(self, frames: int) -> Tensor:
        dtype = self.pipeline.timesteps.dtype
        return torch.full((1, frames), self.sampling.context_noise, device=self.pipeline.device).to(dtype)

    def _call(self, x: Tensor, t: Tensor, start_frame: int, kind: str) -> DiTJob[Tensor | None]:
        """One DiT call over frames from `start_frame`, at the time positions the table holds.

        The offset is a function of the pass's last frame alone, so every pass of one block (and
        its replay) uses the same one; the cache turns its keys whenever the offset changes.
        """
        offset = 0 if self.rebase_rule is None else self.rebase_rule.offset(start_frame + x.shape[1])
        self.cache.rebase(offset, self.dit.rope.rotate_time)
        keys = self._call_key_rows(start_frame, x.shape[1])
        return (yield DiTCall(x, t, self.prompt, self.cache, start_frame, offset, kind, keys))

    def _hold_keys(self, start_frame: int, frames: int, rows: Tensor | None) -> None:
        """Record the keys held in frames [start_frame, +frames) (None: no key)."""
        action = self.dit.config.action
        if action is None:
            return
        for i in range(frames):
            self._key_rows[start_frame + i] = torch.zeros(action.keys) if rows is None else rows[i]

    def _call_key_rows(self, start_frame: int, frames: int) -> Tensor | None:
        """The key rows a call over frames [start_frame, +frames) reads (zeros before the video)."""
        action = self.dit.config.action
        if action is None:
            return None
        first = start_frame - action.rows_before
        none = torch.zeros(action.keys)
        missing = [f for f in range(max(first, 0), start_frame + frames) if f not in self._key_rows]
        if missing:  # a frame of the video whose keys were dropped: its windows would read wrong keys
            raise RuntimeError(f"session {self.session_id}: no key rows for frames {missing}")
        rows = torch.stack([self._key_rows.get(f, none) for f in range(first, start_frame + frames)])
        return rows.unsqueeze(0).to(self.pipeline.device)

    def _context_pass(self, latents: Tensor, start_frame: int) -> DiTJob[None]:
        yield from self._call(latents, self._context_timesteps(latents.shape[1]), start_frame, "context_pass")
        for i in range(latents.shape[1]):
            self._frame_latents[start_frame + i] = latents[:, i]
        # A re-cache re-runs the cached frames and (without a global sink) the whole last window.
        cached = set(self.cache.frames)
        block = self.block_config
        recent = -1 if block.is_global else start_frame + latents.shape[1] - block.local_attn_size
        for frame in [f for f in self._frame_latents if f not in cached and f < recent]:
            del self._frame_latents[frame]
        action = self.dit.config.action
        if action is not None and self._frame_latents:  # keep the key rows those passes read
            oldest = min(self._frame_latents) - action.rows_before
            for frame in [f for f in self._key_rows if f < oldest]:
                del self._key_rows[frame]

    def _prefill(self, initial_latents: Tensor) -> None:
        """Video continuation: write the given clean latents into the cache, block by block."""
        nf = self.block_config.num_frame_per_block
        c, h, w = self.latent_shape
        if initial_latents.dim() != 5 or tuple(initial_latents.shape[2:]) != (c, h, w):
            raise ValueError(
                f"initial_latents must have shape [1, frames, {c}, {h}, {w}], got {list(initial_latents.shape)}"
            )
        frames = initial_latents.shape[1]
        if frames % nf != 0:
            raise ValueError(f"initial_latents has {frames} frames; it must be a multiple of num_frame_per_block={nf}")
        with torch.no_grad():
            for start in range(0, frames, nf):
                chunk = initial_latents[:, start : start + nf].to(self.pipeline.device)
                self._hold_keys(start, nf, None)  # a continued video's frames: no key held
                run_solo(self.dit, self._context_pass(chunk, start))
        self.next_frame = frames

    def _use_prompt(self, prompt_embeds: Tensor) -> None:
        if prompt_embeds is self.prompt_embeds or torch.equal(prompt_embeds, self.prompt_embeds):
            return
        self.prompt_embeds = prompt_embeds
        self.prompt = self.dit.encode_prompt(prompt_embeds)

    def _apply_pending_prompt(self) -> DiTJob[bool]:
        """Switch to the pending prompt, if any; whether the switch re-encoded the cache."""
        if self._pending_prompt is None:
            return False
        embeds, recache = self._pending_prompt
        self._pending_prompt = None
        self._use_prompt(embeds)
        if not (recache or self.pipeline.config.prompt_switch.recache) or self.next_frame == 0:
            return False
        yield from self._recache()
        return True

    def _recache(self) -> DiTJob[None]:
        """LongLive's KV re-cache before the block at frame S = `next_frame`, under the new prompt.

        The reference runs one unmasked context pass over the last W = min(window, S) clean frames
        [S - W, S) (all S frames with global attention) and writes their K/V back, except that
        while frames precede them it protects the sink slots (`global_sink`): the sink keeps the
        K/V of the session's first frames, and the recomputed frames that would land there are
        dropped. Their K/V reach no other frame, so we compute only the frames whose K/V stay,
        [S - W + sink, S): exactly the window's frames after its sink, rewritten in place. Without
        a global sink the cache starts over at frame S - W: those W frames are all written, the
        first `sink` of them become the sink. The window then rolls on as usual.
        """
        block = self.block_config
        start = self.next_frame
        span = start if block.is_global else min(block.local_attn_size, start)
        first = start - span
        if first > 0 and self.pipeline.config.prompt_switch.global_sink:
            first += block.sink_size
        else:
            self.cache.drop()
        if first < start:
            chunk = torch.stack([self._frame_latents[f] for f in range(first, start)], dim=1)
            yield from self._context_pass(chunk, first)

    def _sync(self) -> None:
        if self.pipeline.device.type == "cuda":
            torch.cuda.synchronize(self.pipeline.device)
