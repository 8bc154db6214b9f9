"""Train the toyworld model from scratch on the CPU: `make train-toyworld` (seeded, reproducible).

Four stages, on clips simulated on the fly by `world.py`:

1. **VAE.** A pixel-space patch autoencoder (`engine/families/wan/patch_vae.py`: one 8x8
   patch <-> 8 latent channels, no time compression) learns to reconstruct simulated frames,
   object pixels weighted up. The per-channel mean and standard deviation of encoded clips become
   its latent normalisation. (The Wan VAE architecture at this width did not converge in a CPU
   budget.)
2. **DiT + text encoder.** Clips of `clip_blocks` blocks are encoded once; each step takes a
   window of `window_blocks` blocks (the inference attention window) from a random offset and
   trains block-causally with teacher forcing, exactly the way inference runs: block by block,
   a noisy pass that attends to the earlier blocks' clean K/V, then the context pass (t = 0) of
   the clean block that later blocks attend to. Flow-matching loss (`noise - x0`) at timesteps
   drawn half from the sampler's few steps, half from the shifted continuous schedule. Tokens at
   and next to objects weigh more in the loss (objects are a tenth of the tokens), and the clean
   context is sometimes faded towards the background and always slightly noised, to teach the
   model to restore full objects from an imperfect past instead of copying a fade (exposure bias).
3. **Recovery.** Teacher forcing again, with faded context that may keep nothing of its
   objects: a block whose past lost them (the model's failure over long videos) draws them anew
   from the prompt instead of continuing an empty scene.
4. **Oracle rollouts.** The model rolls out fresh scenes in its inference window (the inference
   sampler, no gradient through it) and fine-tunes on its own blocks as context, with targets
   from a simulator world that follows what it draws (`oracle.py`): it learns to continue its own
   output, drifting and fading as it is, the way the simulator would.

The result is a model folder (`model.yaml`, three safetensors in fp16, the byte-level tokenizer)
that `load_wan_model` reads like any other.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file
from torch import Tensor, nn
from tqdm import tqdm

from engine.attention.backends import AttentionBackend
from engine.contract import to_uint8_frames
from engine.families.wan.autoencoders import load_vae
from engine.families.wan.checkpoint import load_dit
from engine.families.wan.dit import CausalWanDiT, CrossAttentionKV
from engine.families.wan.loader import MODEL_YAML, byte_level_tokenizer, write_byte_level_tokenizer
from engine.families.wan.patch_vae import PatchVAE, reconstruction_loss
from engine.families.wan.text_encoder import UMT5Encoder
from engine.families.wan.tokenizer import PromptTokenizer
from engine.flow_match import FlowMatchSchedule
from inferix.errors import UserError
from inferix.spec.architectures import PatchVAEConfig
from inferix.spec.presets import ModelPreset, load_preset
from toyworld_lab.oracle import random_trackers
from toyworld_lab.world import BACKGROUND, Clip, random_clip

PRESET = "toyworld"
OBJECT_LOSS_WEIGHT = 10.0  # extra weight of object pixels in the VAE's reconstruction loss
# RMS distance (normalised latent units) from the empty-frame latent beyond which a token holds an
# object: empty tokens sit at ~0, object tokens at 1 to 4.
OBJECT_TOKEN_DISTANCE = 0.5


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    threads: int = 2
    vae_steps: int = 1500
    vae_batch: int = 16
    vae_lr: float = 2e-3
    dit_clips: int = 960
    clip_blocks: int = 6
    window_blocks: int = 4
    dit_steps: int = 3200
    dit_batch: int = 8
    dit_lr: float = 6e-4
    warmup_steps: int = 100
    context_noise_max: float = 0.15  # sigma of the noise added to clean context latents
    context_fade_probability: float = 0.5  # share of context blocks faded towards the background
    context_fade_min: float = 0.2  # a faded context keeps this much of its objects, at least
    object_loss_weight: float = 5.0  # extra flow-loss weight of latent tokens at and next to objects
    recovery_steps: int = 500  # stage 3: teacher forcing where faded context may lose its objects
    recovery_lr: float = 2e-4
    oracle_steps: int = 600  # stage 4: fine-tune on the model's own rollouts, targets from the oracle
    oracle_lr: float = 2e-4
    oracle_rounds: int = 3  # fresh rollouts of the current model for each round
    oracle_scenes: int = 64  # rollouts per round
    oracle_blocks: int = 16  # blocks per rollout

    def quick(self) -> TrainConfig:
        """A few steps of everything: checks the whole path in a minute (weights are not useful)."""
        return replace(
            self,
            vae_steps=20,
            dit_clips=16,
            dit_steps=20,
            recovery_steps=10,
            oracle_steps=10,
            oracle_rounds=2,
            oracle_scenes=8,
            oracle_blocks=6,
        )


# ---- data ---------------------------------------------------------------------------------------
def to_video_tensor(frames: np.ndarray) -> Tensor:
    """uint8 [..., T, H, W, 3] -> float [..., T, 3, H, W] in [-1, 1]."""
    x = torch.from_numpy(frames).float().div(127.5).sub(1.0)
    return x.movedim(-1, -3)


def vae_batches(config: TrainConfig, rng: random.Random) -> Iterator[Tensor]:
    """[1, 2B, 3, 64, 64]: two consecutive frames of each of `vae_batch` fresh random scenes."""
    while True:
        frames = np.concatenate(
            [random_clip(rng, blocks=1, frames_per_block=2).frames for _ in range(config.vae_batch)]
        )
        yield to_video_tensor(frames)[None]


# ---- VAE ----------------------------------------------------------------------------------------
def train_vae(preset: ModelPreset, config: TrainConfig, rng: random.Random) -> PatchVAE:
    if not isinstance(preset.vae, PatchVAEConfig):
        raise UserError(f"preset {preset.name!r}: the toyworld trainer fits a patch autoencoder (vae.type: patch)")
    vae = PatchVAE(preset.vae).train()
    optimizer = torch.optim.AdamW(vae.parameters(), lr=config.vae_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.vae_lr, total_steps=config.vae_steps)
    background = to_video_tensor(np.array(BACKGROUND, np.uint8).reshape(1, 1, 3))[:, 0, 0]
    batches = vae_batches(config, rng)
    with tqdm(range(config.vae_steps), desc="VAE", unit="step", file=sys.stderr) as bar:
        for _ in bar:
            video = next(batches)
            recon = vae.decode_raw(vae.encode_raw(video))
            loss = reconstruction_loss(recon, video, background, OBJECT_LOSS_WEIGHT)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return vae.eval().requires_grad_(False)


@dataclass
class LatentClips:
    latents: Tensor  # [N, F, z, h, w], normalised: the targets
    prompts: list[list[str]]  # per clip, per block
    background: Tensor  # [z, 1, 1]: the normalised latent of an empty frame
    # What later blocks see of each block ([N, F, z, h, w]), when not the targets (faded and
    # noised by `corrupt_context`): the model's own samples in oracle rollouts.
    context: Tensor | None = None
    # The keys held in each frame ([N, F, keys] of 0/1) for a DiT with a keyboard branch (toyworld-play).
    key_rows: Tensor | None = None


@torch.no_grad()
def encode_clips(
    vae: PatchVAE, config: TrainConfig, rng: random.Random
) -> tuple[LatentClips, list[float], list[float]]:
    """Simulate and encode the DiT's training clips; returns them normalised, with the statistics."""
    raw: list[Tensor] = []
    prompts: list[list[str]] = []
    batch = 8
    with tqdm(total=config.dit_clips, desc="encode clips", unit="clip", file=sys.stderr) as bar:
        while len(prompts) < config.dit_clips:
            clips: list[Clip] = [random_clip(rng, blocks=config.clip_blocks) for _ in range(batch)]
            video = torch.stack([to_video_tensor(c.frames) for c in clips])
            raw.append(vae.encode_raw(video))  # [B, F, z, h, w]: one latent frame per video frame
            prompts.extend(c.block_prompts for c in clips)
            bar.update(batch)
    latents = torch.cat(raw)[: config.dit_clips]
    prompts = prompts[: config.dit_clips]
    mean = latents.mean(dim=(0, 1, 3, 4))
    std = latents.std(dim=(0, 1, 3, 4))
    normalised = (latents - mean.view(1, 1, -1, 1, 1)) / std.view(1, 1, -1, 1, 1)
    empty = to_video_tensor(np.full((1, 1, *clips[0].frames.shape[1:3], 3), BACKGROUND, np.uint8))
    background = (vae.encode_raw(empty)[0, 0] - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    return LatentClips(normalised, prompts, background.mean(dim=(1, 2), keepdim=True)), mean.tolist(), std.tolist()


# ---- DiT ----------------------------------------------------------------------------------------
class TeacherForcingCache:
    """A `SelfAttentionCache` for training: clean K/V of earlier blocks, kept with their autograd graph.

    The noisy pass of a block attends to the stored clean K/V plus its own; the context pass
    (`store = True`) does the same and then stores its K/V for the blocks after it, like
    inference's paged cache. Lists instead of in-place pages, so gradients flow through the past.
    With `max_blocks` it keeps only the latest blocks, like inference's sliding window.
    """

    def __init__(self, max_blocks: int | None = None) -> None:
        self.keys: dict[int, list[Tensor]] = {}
        self.values: dict[int, list[Tensor]] = {}
        self.store = False
        self.max_blocks = max_blocks

    def begin(self, start_frame: int, num_frames: int) -> None:
        pass

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        keys = [*self.keys.get(layer, []), k]
        values = [*self.values.get(layer, []), v]
        out = backend.dense(q, torch.cat(keys, dim=1), torch.cat(values, dim=1))
        if self.store:
            self.keys.setdefault(layer, []).append(k)
            self.values.setdefault(layer, []).append(v)
            if self.max_blocks is not None and len(self.keys[layer]) > self.max_blocks:
                del self.keys[layer][0], self.values[layer][0]
        return out


def sample_timesteps(count: int, sampler_steps: Tensor, shift: float, generator: torch.Generator) -> Tensor:
    """Half from the sampler's own steps, half from the shifted continuous schedule (t = 1000 sigma)."""
    pick = sampler_steps[torch.randint(len(sampler_steps), (count,), generator=generator)].float()
    u = torch.rand(count, generator=generator)
    continuous = 1000 * shift * u / (1 + (shift - 1) * u)
    use_grid = torch.rand(count, generator=generator) < 0.5
    return torch.where(use_grid, pick, continuous)


def new_networks(preset: ModelPreset) -> tuple[CausalWanDiT, UMT5Encoder]:
    dit = CausalWanDiT(preset.dit, attention_backend="sdpa")
    # Start the output head at zero: the untrained DiT predicts no flow.
    nn.init.zeros_(dit.head.head.weight)
    nn.init.zeros_(dit.head.head.bias)
    return dit, UMT5Encoder(preset.text_encoder)


@dataclass(frozen=True)
class DiTStage:
    """One DiT training stage: teacher forcing (2), recovery (3), oracle rollouts (4)."""

    name: str
    steps: int
    lr: float
    warmup_steps: int
    fade_min: float  # a faded context keeps this much of its objects, at least
    seed_offset: int
    rounds: int = 1  # oracle rollouts: fresh rollouts of the current model for each round
    train_text: bool = True  # False: the text encoder stays frozen
    branch_lr: float | None = None  # learning rate of the keyboard branch (None: `lr`, like the rest)

    @classmethod
    def teacher_forcing(cls, config: TrainConfig) -> DiTStage:
        return cls("DiT", config.dit_steps, config.dit_lr, config.warmup_steps, config.context_fade_min, seed_offset=1)

    @classmethod
    def recovery(cls, config: TrainConfig) -> DiTStage:
        """Faded context may keep nothing of its objects: a block whose past lost them draws them anew."""
        return cls.fine_tuning(config, "DiT recovery", config.recovery_steps, config.recovery_lr, seed_offset=3)

    @classmethod
    def oracle(cls, config: TrainConfig) -> DiTStage:
        """The model's own rollouts as context, the oracle's continuation of them as targets (`oracle.py`)."""
        return cls.fine_tuning(
            config, "DiT oracle rollouts", config.oracle_steps, config.oracle_lr, 4, config.oracle_rounds
        )

    @classmethod
    def fine_tuning(
        cls, config: TrainConfig, name: str, steps: int, lr: float, seed_offset: int, rounds: int = 1
    ) -> DiTStage:
        """A stage after teacher forcing: a short warm-up, context faded down to nothing."""
        warmup = min(config.warmup_steps, steps // 10)
        return cls(name, steps, lr, warmup, 0.0, seed_offset, rounds)


def train_dit(
    preset: ModelPreset,
    data: LatentClips,
    config: TrainConfig,
    stage: DiTStage,
    networks: tuple[CausalWanDiT, UMT5Encoder],
    refresh: Callable[[CausalWanDiT, UMT5Encoder, torch.Generator], LatentClips] | None = None,
    extra_loss: Callable[[CausalWanDiT, UMT5Encoder, torch.Generator], Tensor] | None = None,
) -> tuple[CausalWanDiT, UMT5Encoder]:
    """Run one stage; `refresh` (oracle rollouts) replaces `data` at the start of each of its rounds;
    `extra_loss` (toyworld-play's first-block rollouts) is added to every step's loss."""
    generator = torch.Generator().manual_seed(config.seed + stage.seed_offset)
    dit, text = networks
    dit.train().requires_grad_(True)
    text.train().requires_grad_(stage.train_text)
    tokenizer = byte_level_tokenizer(preset.text_encoder.text_len)
    params = [*dit.parameters(), *(text.parameters() if stage.train_text else [])]
    optimizer = torch.optim.AdamW(_param_groups(dit, params, stage), lr=stage.lr, weight_decay=0.01, betas=(0.9, 0.99))

    def lr_at(step: int) -> float:
        if step < stage.warmup_steps:
            return (step + 1) / stage.warmup_steps
        progress = (step - stage.warmup_steps) / max(1, stage.steps - stage.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    sampler = BlockSampler.of(preset)
    nf = preset.pipeline.block.num_frame_per_block
    window = config.window_blocks
    round_steps = math.ceil(stage.steps / stage.rounds)
    with tqdm(range(stage.steps), desc=stage.name, unit="step", file=sys.stderr) as bar:
        for step in bar:
            if refresh is not None and step % round_steps == 0:
                dit.eval().requires_grad_(False)
                text.eval().requires_grad_(False)
                data = refresh(dit, text, generator)
                dit.train().requires_grad_(True)
                text.train().requires_grad_(stage.train_text)
            n_clips, clip_blocks = data.latents.shape[0], data.latents.shape[1] // nf
            clips = torch.randint(n_clips, (config.dit_batch,), generator=generator)
            offset = int(torch.randint(clip_blocks - window + 1, (1,), generator=generator))
            frames = slice(offset * nf, (offset + window) * nf)
            x0 = data.latents[clips, frames]  # [B, W*nf, z, h, w]
            context = None if data.context is None else data.context[clips, frames]
            block_prompts = [data.prompts[int(c)][offset : offset + window] for c in clips]
            key_rows = None
            if data.key_rows is not None and dit.config.action is not None:
                key_rows = window_key_rows(
                    data.key_rows[clips], offset * nf, window * nf, dit.config.action.rows_before
                )
            loss = _teacher_forcing_loss(
                dit,
                text,
                tokenizer,
                x0,
                data.background,
                block_prompts,
                offset * nf,
                sampler,
                stage,
                config,
                generator,
                context,
                key_rows,
            )
            if extra_loss is not None:
                loss = loss + extra_loss(dit, text, generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return dit.eval().requires_grad_(False), text.eval().requires_grad_(False)


def _param_groups(dit: CausalWanDiT, params: list[nn.Parameter], stage: DiTStage) -> list[dict[str, object]]:
    """One group at the stage's learning rate, or, with `branch_lr`, the keyboard branch in its own."""
    branch = {id(p) for name, p in dit.named_parameters() if ".keyboard." in name}
    if stage.branch_lr is None or not branch:
        return [{"params": params}]
    return [
        {"params": [p for p in params if id(p) not in branch]},
        {"params": [p for p in params if id(p) in branch], "lr": stage.branch_lr},
    ]


def window_key_rows(rows: Tensor, start: int, frames: int, before: int) -> Tensor:
    """[B, before + frames, keys]: the key rows [B, F, keys] of frames start - before .. start + frames - 1,
    zeros (no key held) before the clip's first frame, as the inference session passes them."""
    return F.pad(rows, (0, 0, before, 0))[:, start : start + before + frames]


def _teacher_forcing_loss(
    dit: CausalWanDiT,
    text: UMT5Encoder,
    tokenizer: PromptTokenizer,
    x0: Tensor,
    background: Tensor,
    block_prompts: list[list[str]],
    start_frame: int,
    sampler: BlockSampler,
    stage: DiTStage,
    config: TrainConfig,
    generator: torch.Generator,
    context: Tensor | None = None,
    key_rows: Tensor | None = None,
) -> Tensor:
    """Mean flow-matching loss over the blocks of a window, each denoised against the earlier ones.

    Later blocks see the earlier ones as the targets faded and noised (see `corrupt_context`), or,
    given `context` (oracle rollouts), as the model's own samples; then the first block, which sees
    nothing of the rollout before it, only serves as context. `key_rows` ([B, rows_before + frames,
    keys], `window_key_rows`): the keys held, which both passes of each block get.
    """
    batch, frames = x0.shape[:2]
    nf = frames // config.window_blocks
    before = 0 if key_rows is None else key_rows.shape[1] - frames
    unique = sorted({p for prompts in block_prompts for p in prompts})
    ids, mask = tokenizer(unique)
    embeds = text.prompt_embeds(ids, mask)
    row = {p: i for i, p in enumerate(unique)}
    cache = TeacherForcingCache()
    losses = []
    for block in range(config.window_blocks):
        prompt = dit.encode_prompt(embeds[[row[p[block]] for p in block_prompts]])
        start = start_frame + block * nf
        span = slice(block * nf, (block + 1) * nf)
        clean = x0[:, span]
        keys = None if key_rows is None else key_rows[:, block * nf : block * nf + before + nf]
        if context is None or block > 0:
            t = sample_timesteps(batch, sampler.timesteps, sampler.shift, generator)
            sigma = (t / 1000).view(batch, 1, 1, 1, 1)
            noise = torch.randn(clean.shape, generator=generator)
            noisy = (1 - sigma) * clean + sigma * noise
            cache.store = False
            flow = dit(noisy, t[:, None].expand(batch, nf).contiguous(), prompt, cache, start, key_rows=keys)
            weight = object_weight(clean, background, config.object_loss_weight)
            losses.append((weight * (flow - (noise - clean)).square()).mean() / weight.mean())
        if block + 1 < config.window_blocks:
            if context is not None:
                seen = context[:, span]
            else:
                seen = corrupt_context(clean, background, stage.fade_min, config, generator)
            cache.store = True
            dit(seen, torch.zeros(batch, nf), prompt, cache, start, key_rows=keys)
    return torch.stack(losses).mean()


@dataclass(frozen=True)
class BlockSampler:
    """The inference sampler of the preset (timesteps, sigmas, solver), for the oracle rollouts."""

    timesteps: Tensor  # the denoising steps, in the dtype the model is fed
    sigmas: Tensor  # sigma of each step, then 0
    solver: str
    shift: float
    frames_per_block: int

    @classmethod
    def of(cls, preset: ModelPreset) -> BlockSampler:
        sampling = preset.pipeline.sampling
        schedule = FlowMatchSchedule(sampling.schedule)
        timesteps = schedule.denoising_timesteps(sampling)
        sigmas = torch.cat([schedule.sigma(timesteps.float()), torch.zeros(1)])
        frames = preset.pipeline.block.num_frame_per_block
        return cls(timesteps, sigmas, sampling.solver, sampling.schedule.shift, frames)

    def sample(
        self,
        dit: CausalWanDiT,
        prompt: CrossAttentionKV,
        cache: TeacherForcingCache,
        start_frame: int,
        shape: torch.Size,
        generator: torch.Generator,
    ) -> Tensor:
        """One block, denoised the way `WanLoop.generate_block` does (cache read-only)."""
        return self.trajectory(dit, prompt, cache, start_frame, shape, generator)[-1].x0

    def trajectory(
        self,
        dit: CausalWanDiT,
        prompt: CrossAttentionKV,
        cache: TeacherForcingCache,
        start_frame: int,
        shape: torch.Size,
        generator: torch.Generator,
        key_rows: Tensor | None = None,
    ) -> list[SamplerStep]:
        """`sample`'s steps: the state each denoising step sees and its x0 prediction (the last one's
        is the block). `key_rows` ([B, rows_before + frames, keys]): the keys held, for a keyboard DiT."""
        cache.store = False
        batch, frames = shape[:2]
        x = torch.randn(shape, generator=generator)
        steps = []
        for i, t in enumerate(self.timesteps):
            flow = dit(x, t.float().expand(batch, frames).contiguous(), prompt, cache, start_frame, key_rows=key_rows)
            x0 = x - self.sigmas[i] * flow
            steps.append(SamplerStep(x, t.float(), self.sigmas[i], x0))
            noise = x0 + flow if self.solver == "euler" else torch.randn(shape, generator=generator)
            x = (1 - self.sigmas[i + 1]) * x0 + self.sigmas[i + 1] * noise
        return steps


@dataclass(frozen=True)
class SamplerStep:
    """One denoising step of `BlockSampler.trajectory`."""

    x: Tensor  # the noisy latents the step sees
    t: Tensor  # its timestep (scalar)
    sigma: Tensor  # its noise level (scalar)
    x0: Tensor  # the model's prediction of the clean block


@dataclass(frozen=True)
class LatentCodec:
    """The trained VAE with its latent statistics: uint8 frames <-> normalised latents."""

    vae: PatchVAE
    mean: Tensor  # [1, 1, z, 1, 1]
    std: Tensor

    @classmethod
    def of(cls, vae: PatchVAE, mean: list[float], std: list[float]) -> LatentCodec:
        return cls(vae, torch.tensor(mean).view(1, 1, -1, 1, 1), torch.tensor(std).view(1, 1, -1, 1, 1))

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> Tensor:
        """uint8 [B, F, H, W, 3] -> normalised latents [B, F, z, h, w]."""
        return (self.vae.encode_raw(to_video_tensor(frames)) - self.mean) / self.std

    @torch.no_grad()
    def decode(self, latents: Tensor) -> np.ndarray:
        """Normalised latents [B, F, z, h, w] -> uint8 [B, F, H, W, 3], the engine's frames."""
        video = self.vae.decode_raw(latents * self.std + self.mean)
        return np.stack([to_uint8_frames(clip[None]) for clip in video])


@torch.no_grad()
def oracle_rollouts(
    dit: CausalWanDiT,
    text: UMT5Encoder,
    tokenizer: PromptTokenizer,
    sampler: BlockSampler,
    codec: LatentCodec,
    background: Tensor,
    config: TrainConfig,
    rng: random.Random,
    generator: torch.Generator,
) -> LatentClips:
    """Roll the model out over fresh scenes, block by block in its inference window, from one block
    of the simulator; each scene's `Tracker` follows what it draws and renders the targets.

    Returns the targets as `latents` and the model's own blocks as `context` (block 0: the
    simulator's, for both), the clips `train_dit` draws its windows from.
    """
    nf = sampler.frames_per_block
    trackers, changes = random_trackers(rng, config.oracle_scenes, config.oracle_blocks, change_probability=0.4)
    cache = TeacherForcingCache(max_blocks=config.window_blocks - 1)
    targets, generated = [], []
    prompts: list[list[str]] = [[] for _ in trackers]
    for block in tqdm(range(config.oracle_blocks), desc="oracle rollouts", unit="block", file=sys.stderr, leave=False):
        for tracker, change in zip(trackers, changes, strict=True):
            if block in change:
                tracker.change_colour(change[block])
        target = codec.encode(np.stack([tracker.target_block(nf) for tracker in trackers]))
        for tracker, scene_prompts in zip(trackers, prompts, strict=True):
            scene_prompts.append(tracker.prompt)
        unique = sorted({tracker.prompt for tracker in trackers})
        embeds = text.prompt_embeds(*tokenizer(unique))
        prompt = dit.encode_prompt(embeds[[unique.index(tracker.prompt) for tracker in trackers]])
        start = block * nf
        if block == 0:
            latents = target
        else:
            latents = sampler.sample(dit, prompt, cache, start, target.shape, generator)
            for tracker, frames in zip(trackers, codec.decode(latents), strict=True):
                tracker.observe(frames)
        cache.store = True
        dit(latents, torch.zeros(len(trackers), nf), prompt, cache, start)
        targets.append(target)
        generated.append(latents)
    return LatentClips(torch.cat(targets, dim=1), prompts, background, context=torch.cat(generated, dim=1))


def object_weight(clean: Tensor, background: Tensor, extra: float) -> Tensor:
    """[B, F, 1, h, w]: 1 + `extra` on latent tokens that hold an object or touch one.

    Objects cover a few tokens of 64; unweighted, the loss is mostly empty background and the
    model learns to draw faint objects that fade away over a long video.
    """
    distance = (clean - background).square().mean(dim=2, keepdim=True).sqrt()  # [B, F, 1, h, w]
    holds = (distance > OBJECT_TOKEN_DISTANCE).float()
    touches = F.max_pool2d(holds.flatten(0, 1), kernel_size=3, stride=1, padding=1).view_as(holds)
    return 1.0 + extra * touches


def corrupt_context(
    clean: Tensor, background: Tensor, fade_min: float, config: TrainConfig, generator: torch.Generator
) -> Tensor:
    """The clean block as later blocks see it in training: faded towards the background and noised.

    At inference the context is the model's own output, which can come out fainter than the
    truth; training on faded context teaches the next block to restore full objects instead of
    copying the fade (exposure bias), and the noise makes it tolerate small errors.
    """
    batch = clean.shape[0]
    shape = (batch, 1, 1, 1, 1)
    fade = fade_min + (1 - fade_min) * torch.rand(shape, generator=generator)
    faded = torch.rand(shape, generator=generator) < config.context_fade_probability
    keep = torch.where(faded, fade, torch.ones(shape))
    sigma = torch.rand(shape, generator=generator) * config.context_noise_max
    return background + keep * (clean - background) + sigma * torch.randn(clean.shape, generator=generator)


# ---- export -------------------------------------------------------------------------------------
def _half(module: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}


VAE_FILE = "toyworld_vae.safetensors"
DIT_FILE = "toyworld_dit.safetensors"
TEXT_ENCODER_FILE = "toyworld_text_encoder.safetensors"


def save_vae(out: Path, vae: PatchVAE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(_half(vae), str(out / VAE_FILE))


def load_trained_vae(folder: Path, preset: ModelPreset) -> PatchVAE:
    """The fp16 VAE of a model folder, in fp32: exactly the VAE that ships, so it encodes the DiT's data."""
    if not isinstance(preset.vae, PatchVAEConfig):
        raise UserError(f"preset {preset.name!r}: the toyworld trainer fits a patch autoencoder (vae.type: patch)")
    return load_vae(folder / VAE_FILE, preset.vae, dtype=torch.float32)


def load_trained_networks(folder: Path, preset: ModelPreset) -> tuple[CausalWanDiT, UMT5Encoder]:
    """The fp16 DiT and text encoder of a model folder, in fp32, to train further."""
    dit = load_dit(folder / DIT_FILE, preset.dit, dtype=torch.float32, attention_backend="sdpa")
    text = UMT5Encoder.from_checkpoint(folder / TEXT_ENCODER_FILE, preset.text_encoder, dtype=torch.float32)
    return dit, text


def export(
    out: Path,
    dit: CausalWanDiT,
    text: UMT5Encoder,
    mean: list[float],
    std: list[float],
    config: TrainConfig,
    seconds: float,
) -> None:
    """Write the model folder (the VAE is already there, see `train`)."""
    save_file(_half(dit), str(out / DIT_FILE))
    save_file(_half(text), str(out / TEXT_ENCODER_FILE))
    export_metadata(out, mean, std, config, seconds)


def export_metadata(out: Path, mean: list[float], std: list[float], config: TrainConfig, seconds: float) -> None:
    """The tokenizer and `model.yaml` (preset + the VAE's latent statistics) of the model folder."""
    write_byte_level_tokenizer(out / "tokenizer")
    model_yaml = {
        "preset": PRESET,
        "vae": {"latent_mean": [round(m, 6) for m in mean], "latent_std": [round(s, 6) for s in std]},
    }
    header = (
        f"# Written by `make train-toyworld` ({seconds / 60:.1f} min, torch {torch.__version__}).\n"
        f"# Training config: {json.dumps(asdict(config))}\n"
    )
    (out / MODEL_YAML).write_text(header + yaml.safe_dump(model_yaml, sort_keys=False))


def train(
    out: Path,
    config: TrainConfig,
    reuse_vae: Path | None = None,
    vae_only: bool = False,
    reuse_dit: Path | None = None,
) -> None:
    """Train and write the model folder `out`.

    Stage 1 writes the VAE to `out` (`vae_only` stops there); `reuse_vae` takes an earlier
    folder's VAE instead. Stage 2 (teacher forcing) writes a full model folder; `reuse_dit` takes
    an earlier folder's stages 1 and 2 instead. Stages 3 (recovery) and 4 (oracle rollouts) each
    overwrite the DiT and text encoder. Every stage reads the previous one's weights as stored
    (fp16) and draws from its own seeds, so a run in one go and a run in steps give the same model.
    """
    began = time.perf_counter()
    torch.set_num_threads(config.threads)
    preset = load_preset(PRESET)
    earlier = reuse_dit or reuse_vae
    if earlier is None:
        torch.manual_seed(config.seed)
        save_vae(out, train_vae(preset, config, random.Random(config.seed)))
    else:
        _copy_files(earlier, out, [VAE_FILE])
    if vae_only:
        print(f"toyworld VAE written to {out / VAE_FILE} in {(time.perf_counter() - began) / 60:.1f} min")
        return
    vae = load_trained_vae(out, preset)
    data, mean, std = encode_clips(vae, config, random.Random(config.seed + 1))
    preset = replace(preset, vae=replace(preset.vae, latent_mean=tuple(mean), latent_std=tuple(std)))
    if reuse_dit is None:
        torch.manual_seed(config.seed + 1)
        networks = new_networks(preset)
        dit, text = train_dit(preset, data, config, DiTStage.teacher_forcing(config), networks)
        export(out, dit, text, mean, std, config, time.perf_counter() - began)
    else:
        _copy_files(reuse_dit, out, [DIT_FILE, TEXT_ENCODER_FILE])
        export_metadata(out, mean, std, config, time.perf_counter() - began)
    if config.recovery_steps > 0:
        dit, text = train_dit(preset, data, config, DiTStage.recovery(config), load_trained_networks(out, preset))
        export(out, dit, text, mean, std, config, time.perf_counter() - began)
    if config.oracle_steps > 0:
        stage = DiTStage.oracle(config)
        tokenizer = byte_level_tokenizer(preset.text_encoder.text_len)
        sampler = BlockSampler.of(preset)
        codec = LatentCodec.of(vae, mean, std)
        scenes = random.Random(config.seed + stage.seed_offset)

        def rollouts(dit: CausalWanDiT, text: UMT5Encoder, generator: torch.Generator) -> LatentClips:
            return oracle_rollouts(dit, text, tokenizer, sampler, codec, data.background, config, scenes, generator)

        dit, text = train_dit(preset, data, config, stage, load_trained_networks(out, preset), rollouts)
        export(out, dit, text, mean, std, config, time.perf_counter() - began)
    print(f"toyworld model written to {out} in {(time.perf_counter() - began) / 60:.1f} min")


def _copy_files(source: Path, out: Path, names: list[str]) -> None:
    if source.resolve() == out.resolve():
        return
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(source / name, out / name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m toyworld_lab.train",
        description="Train the built-in toyworld model (VAE, then DiT + text encoder) on simulated clips, on CPU.",
    )
    default = TrainConfig()
    parser.add_argument("--out", type=Path, required=True, help="model folder to write (load it with --model)")
    parser.add_argument("--seed", type=int, default=default.seed)
    parser.add_argument("--threads", type=int, default=default.threads, help="torch CPU threads")
    parser.add_argument("--vae-steps", type=int, default=default.vae_steps)
    parser.add_argument("--dit-steps", type=int, default=default.dit_steps)
    parser.add_argument("--clips", type=int, default=default.dit_clips, help="simulated clips the DiT trains on")
    parser.add_argument("--quick", action="store_true", help="a few steps of each stage (checks the path only)")
    parser.add_argument(
        "--reuse-vae",
        type=Path,
        metavar="DIR",
        help="skip the VAE stage: take the VAE of an earlier run's model folder DIR (retrain the DiT only)",
    )
    parser.add_argument("--vae-only", action="store_true", help="stop after the VAE stage (writes its weights)")
    parser.add_argument(
        "--reuse-dit",
        type=Path,
        metavar="DIR",
        help="skip the VAE and teacher-forcing stages: take an earlier run's model folder DIR (its VAE, DiT "
        "and text encoder) and run the recovery and oracle stages only",
    )
    parser.add_argument(
        "--recovery-steps", type=int, default=default.recovery_steps, help="steps of the recovery stage"
    )
    parser.add_argument("--oracle-steps", type=int, default=default.oracle_steps, help="steps of the oracle stage")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = TrainConfig(
        seed=args.seed,
        threads=args.threads,
        vae_steps=args.vae_steps,
        dit_steps=args.dit_steps,
        dit_clips=args.clips,
        recovery_steps=args.recovery_steps,
        oracle_steps=args.oracle_steps,
    )
    if args.quick:
        config = config.quick()
    if args.reuse_vae is not None and not (args.reuse_vae / VAE_FILE).is_file():
        print(f"--reuse-vae {args.reuse_vae}: no {VAE_FILE} there", file=sys.stderr)
        return 2
    if args.reuse_dit is not None:
        missing = [n for n in (VAE_FILE, DIT_FILE, TEXT_ENCODER_FILE) if not (args.reuse_dit / n).is_file()]
        if missing:
            print(f"--reuse-dit {args.reuse_dit}: no {', '.join(missing)} there", file=sys.stderr)
            return 2
    train(args.out, config, args.reuse_vae, args.vae_only, args.reuse_dit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
