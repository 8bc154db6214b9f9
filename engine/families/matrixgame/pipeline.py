"""Block-causal sampling of a Matrix-Game 2.0 world (README sections 4-5).

Per block of `num_frame_per_block` latent frames: denoise from noise over the warped few-step
schedule (x0 from the flow, re-noised to the next step), then one context pass on the clean x0 at
t = context_noise, which rewrites the block's entries of every cache (self-attention, keyboard,
mouse); finally the block is decoded from its fp16-rounded latents (the reference decodes in fp16),
by the Wan VAE or, when the model says so, by TAEHV (the same latents: the Wan 2.1 VAE's).

The self-attention K/V live in the paged pool (one page per latent frame, a ring of
`local_attn_size` frames); the action module's keyboard / mouse K/V in its side caches
(`rolling_cache`), rolled by the same window.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from engine.decoders.taehv import TAEHVDecoder
from engine.families.matrixgame.action import ActionInputs
from engine.families.matrixgame.conditioning import WorldConditioning
from engine.families.matrixgame.dit import ActionStep, MatrixGameDiT
from engine.families.matrixgame.rolling_cache import new_action_caches
from engine.families.wan.vae import WanVAE
from engine.flow_match import FlowMatchSchedule
from engine.kv.pool import KVPool, KVPoolSpec
from engine.kv.session_cache import PagedSessionCache
from engine.noise import NoiseSource
from inferix.spec.sampling import PipelineConfig


@dataclass
class StepRecord:
    """One denoising call: its input x_t, the flow predicted and the x0 derived ([1, F, C, h, w])."""

    x: Tensor
    flow: Tensor
    x0: Tensor


@dataclass
class WorldBlock:
    """A finished block: clean latents [1, F, C, h, w] and its pixel frames [1, T, 3, H, W] in [-1, 1]."""

    index: int
    start_frame: int
    latents: Tensor
    video: Tensor
    steps: list[StepRecord] = field(default_factory=list)
    context_flow: Tensor | None = None


class MatrixGamePipeline:
    """The DiT, the decoder and the sampling settings; opens world sessions. `decoder`: the Wan VAE
    (as the reference) or TAEHV; both stream a block at a time from the same latents."""

    def __init__(self, dit: MatrixGameDiT, decoder: WanVAE | TAEHVDecoder, config: PipelineConfig) -> None:
        if config.block.is_global:
            raise ValueError("Matrix-Game 2.0 generates with a local window: set local_attn_size (not -1)")
        self.dit = dit
        self.decoder = decoder
        self.config = config
        self.schedule = FlowMatchSchedule(config.sampling.schedule)
        self.timesteps = self.schedule.denoising_timesteps(config.sampling)

    def pool_spec(self, latent_height: int, latent_width: int) -> KVPoolSpec:
        """One session's self-attention pool: a page per latent frame, the window's frames."""
        cfg = self.dit.config.dit
        weight = self.dit.patch_embedding.weight
        return KVPoolSpec(
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.tokens_per_frame(latent_height, latent_width),
            num_pages=self.config.block.local_attn_size,
            dtype=weight.dtype,
            device=str(weight.device),
        )

    def open_session(
        self,
        conditioning: WorldConditioning,
        actions: ActionInputs,
        noise: NoiseSource,
        *,
        pool: KVPool | None = None,
        session_id: str | None = None,
        record_steps: bool = False,
    ) -> MatrixGameLoop:
        """A session generating `conditioning.num_frames` latent frames, in the shared `pool` or its own."""
        _, _, _, lat_h, lat_w = conditioning.cond_concat.shape
        pool = pool or KVPool(self.pool_spec(lat_h, lat_w))
        return MatrixGameLoop(self, pool, conditioning, actions, noise, session_id or uuid.uuid4().hex, record_steps)


class MatrixGameLoop:
    """One world rolled out block by block. `actions` holds the raw rows of the whole video (a copy);
    `hold_actions` sets the rows of the next block from a live key / mouse state."""

    def __init__(
        self,
        pipeline: MatrixGamePipeline,
        pool: KVPool,
        conditioning: WorldConditioning,
        actions: ActionInputs,
        noise: NoiseSource,
        session_id: str,
        record_steps: bool,
    ) -> None:
        self.pipeline = pipeline
        self.dit = pipeline.dit
        self.conditioning = conditioning
        self.actions = ActionInputs(actions.keyboard.clone(), None if actions.mouse is None else actions.mouse.clone())
        self.noise = noise
        self.record_steps = record_steps
        block = pipeline.config.block
        self.frames_per_block = block.num_frame_per_block
        if conditioning.num_frames % self.frames_per_block:
            raise ValueError(
                f"{conditioning.num_frames} latent frames are not a whole number of blocks of {self.frames_per_block}"
            )
        if conditioning.num_frames > self.dit.rope.max_positions:
            raise ValueError(
                f"{conditioning.num_frames} latent frames exceed the DiT's RoPE table "
                f"({self.dit.rope.max_positions} frames, as the reference's)"
            )
        _, _, _, lat_h, lat_w = conditioning.cond_concat.shape
        self.pool = pool
        self.cache: PagedSessionCache = pool.open_session(
            session_id,
            self.dit.config.dit.tokens_per_frame(lat_h, lat_w),
            window_frames=block.local_attn_size,
            sink_frames=block.sink_size,
        )
        self.session_id = session_id
        self.action_caches = new_action_caches(len(self.dit.action_layers), block.local_attn_size, block.sink_size)
        with torch.no_grad():
            self.context = self.dit.encode_context(conditioning.visual_context)
        # The VAE's or TAEHV's state, whichever `pipeline.decoder` is (each reads only its own).
        self.decode_state: Any = pipeline.decoder.new_decode_state()
        self.next_block_index = 0

    @property
    def num_blocks(self) -> int:
        return self.conditioning.num_frames // self.frames_per_block

    @property
    def finished(self) -> bool:
        return self.next_block_index >= self.num_blocks

    def hold_actions(self, keyboard: Tensor, mouse: Tensor | None = None) -> None:
        """Interactive control: keys [K] and mouse [axes] held during the next block. Like the
        reference's streaming pipeline, they fill the raw rows of the block's pixel frames, i.e.
        `[final - n, final)` with `final = 1 + 4 (last latent frame)` and `n` = the block's pixel
        frames (1 + 4(nf - 1) for the first block, 4 nf after)."""
        ratio = self.dit.config.action.vae_time_compression_ratio
        nf, start = self.frames_per_block, self.next_block_index * self.frames_per_block
        final = 1 + ratio * (start + nf - 1)
        count = 1 + ratio * (nf - 1) if start == 0 else ratio * nf
        if final > self.actions.keyboard.shape[1]:
            raise ValueError(f"the session's action rows end before row {final - 1} of the next block")
        self.actions.keyboard[0, final - count : final] = keyboard.to(self.actions.keyboard)
        if mouse is not None:
            if self.actions.mouse is None:
                raise ValueError("this session has no mouse input (keyboard-only actions)")
            self.actions.mouse[0, final - count : final] = mouse.to(self.actions.mouse)

    def close(self) -> None:
        self.pool.close_session(self.cache.session_id)

    @torch.no_grad()
    def generate_block(self) -> WorldBlock:
        if self.finished:
            raise RuntimeError(f"the session already produced its {self.num_blocks} blocks")
        pipeline = self.pipeline
        nf, index = self.frames_per_block, self.next_block_index
        start = index * nf
        device = self.dit.patch_embedding.weight.device
        cond = self.conditioning.cond_concat[:, start : start + nf].to(device)
        x = self.noise.initial(index, (1, nf, self.dit.config.dit.out_dim, *cond.shape[3:])).to(device)
        steps: list[StepRecord] = []
        x0 = x
        for i, t_value in enumerate(pipeline.timesteps):
            t = torch.full((1, nf), float(t_value), dtype=pipeline.timesteps.dtype, device=device)
            flow = self._call(x, cond, t, start)
            x0 = pipeline.schedule.x0_from_flow(x, flow, t)
            if self.record_steps:
                steps.append(StepRecord(x, flow, x0))
            if i + 1 < len(pipeline.timesteps):
                t_next = torch.full_like(t, float(pipeline.timesteps[i + 1]))
                eps = self.noise.renoise(index, i, tuple(x0.shape)).to(device)
                x = pipeline.schedule.add_noise(x0, eps, t_next)
        context_flow, video = self._commit(x0)
        return WorldBlock(index, start, x0, video, steps, context_flow if self.record_steps else None)

    @torch.no_grad()
    def replay_block(self, x0: Tensor) -> Tensor:
        """Continue from the next block's clean latents ``x0`` as made before (a restore): its context
        pass rewrites every cache the block wrote, its decode advances the decoder's state. Returns its video."""
        return self._commit(x0.to(self.dit.patch_embedding.weight.device, self.pipeline.timesteps.dtype))[1]

    def _commit(self, x0: Tensor) -> tuple[Tensor, Tensor]:
        """The end of the next block, from its clean latents: the context pass at t = context_noise
        (its flow) and the decode of the fp16-rounded latents (its video); the session moves on."""
        nf, start = self.frames_per_block, self.next_block_index * self.frames_per_block
        cond = self.conditioning.cond_concat[:, start : start + nf].to(x0.device)
        t = torch.full((1, nf), self.pipeline.config.sampling.context_noise, device=x0.device)
        context_flow = self._call(x0, cond, t.to(self.pipeline.timesteps.dtype), start)
        video = self.pipeline.decoder.decode_block(x0.half().to(x0.dtype), self.decode_state)
        self.next_block_index += 1
        return context_flow, video

    def _call(self, x: Tensor, cond: Tensor, t: Tensor, start: int) -> Tensor:
        action = ActionStep(self.actions, self.action_caches)
        return self.dit(torch.cat([x, cond], dim=2), t, self.context, self.cache, start, action)
