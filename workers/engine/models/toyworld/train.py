"""Train the toyworld model from scratch on the CPU: `make train-toyworld` (seeded, reproducible).

Two stages, on clips simulated on the fly by `world.py`:

1. **VAE.** A pixel-space patch autoencoder (`models/patch_vae.py`: one 8x8 patch <-> 8 latent
   channels, no time compression) learns to reconstruct simulated frames, object pixels weighted
   up. The per-channel mean and standard deviation of encoded clips become its latent
   normalisation. (The Wan VAE architecture at this width did not converge in a CPU budget.)
2. **DiT + text encoder.** Clips of `clip_blocks` blocks are encoded once; each step takes a
   window of `window_blocks` blocks (the inference attention window) from a random offset and
   trains block-causally with teacher forcing, exactly the way inference runs: block by block,
   a noisy pass that attends to the earlier blocks' clean K/V, then the context pass (t = 0) of
   the clean block that later blocks attend to. Flow-matching loss (`noise - x0`) at timesteps
   drawn half from the sampler's few steps, half from the shifted continuous schedule; clean
   context latents get a little noise so the model tolerates its own imperfect past.

The result is a model folder (`model.yaml`, three safetensors in fp16, the byte-level tokenizer)
that `load_model` reads like any other.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file
from torch import Tensor, nn
from tqdm import tqdm

from inferix.errors import UserError
from workers.engine.attention.backends import AttentionBackend
from workers.engine.checkpoint import load_vae
from workers.engine.flow_match import FlowMatchSchedule
from workers.engine.model_dir import MODEL_YAML, byte_level_tokenizer, write_byte_level_tokenizer
from workers.engine.models.patch_vae import PatchVAE, PatchVAEConfig, reconstruction_loss
from workers.engine.models.toyworld.world import BACKGROUND, Clip, random_clip
from workers.engine.models.wan.dit import CausalWanDiT
from workers.engine.models.wan.text_encoder import UMT5Encoder
from workers.engine.models.wan.tokenizer import PromptTokenizer
from workers.engine.presets import ModelPreset, load_preset

PRESET = "toyworld"
OBJECT_LOSS_WEIGHT = 10.0  # extra weight of object pixels in the VAE's reconstruction loss


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    threads: int = 2
    vae_steps: int = 1500
    vae_batch: int = 16
    vae_lr: float = 2e-3
    dit_clips: int = 480
    clip_blocks: int = 6
    window_blocks: int = 4
    dit_steps: int = 2400
    dit_batch: int = 8
    dit_lr: float = 6e-4
    warmup_steps: int = 100
    context_noise_max: float = 0.08  # sigma of the noise added to clean context latents

    def quick(self) -> TrainConfig:
        """A few steps of everything: checks the whole path in a minute (weights are not useful)."""
        return replace(self, vae_steps=20, dit_clips=16, dit_steps=20)


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
    latents: Tensor  # [N, F, z, h, w], normalised
    prompts: list[list[str]]  # per clip, per block


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
    return LatentClips(normalised, prompts), mean.tolist(), std.tolist()


# ---- DiT ----------------------------------------------------------------------------------------
class TeacherForcingCache:
    """A `SelfAttentionCache` for training: clean K/V of earlier blocks, kept with their autograd graph.

    The noisy pass of a block attends to the stored clean K/V plus its own; the context pass
    (`store = True`) does the same and then stores its K/V for the blocks after it, like
    inference's paged cache. Lists instead of in-place pages, so gradients flow through the past.
    """

    def __init__(self) -> None:
        self.keys: dict[int, list[Tensor]] = {}
        self.values: dict[int, list[Tensor]] = {}
        self.store = False

    def begin(self, start_frame: int, num_frames: int) -> None:
        pass

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        keys = [*self.keys.get(layer, []), k]
        values = [*self.values.get(layer, []), v]
        out = backend.dense(q, torch.cat(keys, dim=1), torch.cat(values, dim=1))
        if self.store:
            self.keys.setdefault(layer, []).append(k)
            self.values.setdefault(layer, []).append(v)
        return out


def sample_timesteps(count: int, sampler_steps: Tensor, shift: float, generator: torch.Generator) -> Tensor:
    """Half from the sampler's own steps, half from the shifted continuous schedule (t = 1000 sigma)."""
    pick = sampler_steps[torch.randint(len(sampler_steps), (count,), generator=generator)].float()
    u = torch.rand(count, generator=generator)
    continuous = 1000 * shift * u / (1 + (shift - 1) * u)
    use_grid = torch.rand(count, generator=generator) < 0.5
    return torch.where(use_grid, pick, continuous)


def train_dit(preset: ModelPreset, data: LatentClips, config: TrainConfig) -> tuple[CausalWanDiT, UMT5Encoder]:
    generator = torch.Generator().manual_seed(config.seed + 1)
    dit = CausalWanDiT(preset.dit, attention_backend="sdpa").train()
    text = UMT5Encoder(preset.text_encoder).train()
    # Start the output head and every gate near zero: the untrained DiT predicts a small flow.
    nn.init.zeros_(dit.head.head.weight)
    nn.init.zeros_(dit.head.head.bias)
    tokenizer = byte_level_tokenizer(preset.text_encoder.text_len)
    params = [*dit.parameters(), *text.parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.dit_lr, weight_decay=0.01, betas=(0.9, 0.99))

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.dit_steps - config.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    schedule = FlowMatchSchedule(preset.pipeline.sampling.schedule)
    sampler_steps = schedule.denoising_timesteps(preset.pipeline.sampling)
    shift = preset.pipeline.sampling.schedule.shift
    nf = preset.pipeline.block.num_frame_per_block
    n_clips = data.latents.shape[0]
    window = config.window_blocks
    with tqdm(range(config.dit_steps), desc="DiT", unit="step", file=sys.stderr) as bar:
        for _ in bar:
            clips = torch.randint(n_clips, (config.dit_batch,), generator=generator)
            offset = int(torch.randint(config.clip_blocks - window + 1, (1,), generator=generator))
            x0 = data.latents[clips, offset * nf : (offset + window) * nf]  # [B, W*nf, z, h, w]
            block_prompts = [data.prompts[int(c)][offset : offset + window] for c in clips]
            loss = _teacher_forcing_loss(
                dit, text, tokenizer, schedule, x0, block_prompts, offset * nf, sampler_steps, shift, config, generator
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return dit.eval().requires_grad_(False), text.eval().requires_grad_(False)


def _teacher_forcing_loss(
    dit: CausalWanDiT,
    text: UMT5Encoder,
    tokenizer: PromptTokenizer,
    schedule: FlowMatchSchedule,
    x0: Tensor,
    block_prompts: list[list[str]],
    start_frame: int,
    sampler_steps: Tensor,
    shift: float,
    config: TrainConfig,
    generator: torch.Generator,
) -> Tensor:
    batch, frames = x0.shape[:2]
    nf = frames // config.window_blocks
    unique = sorted({p for prompts in block_prompts for p in prompts})
    ids, mask = tokenizer(unique)
    embeds = text.prompt_embeds(ids, mask)
    row = {p: i for i, p in enumerate(unique)}
    cache = TeacherForcingCache()
    losses = []
    for block in range(config.window_blocks):
        prompt = dit.encode_prompt(embeds[[row[p[block]] for p in block_prompts]])
        start = start_frame + block * nf
        clean = x0[:, block * nf : (block + 1) * nf]
        t = sample_timesteps(batch, sampler_steps, shift, generator)
        sigma = (t / 1000).view(batch, 1, 1, 1, 1)
        noise = torch.randn(clean.shape, generator=generator)
        noisy = (1 - sigma) * clean + sigma * noise
        cache.store = False
        flow = dit(noisy, t[:, None].expand(batch, nf).contiguous(), prompt, cache, start)
        losses.append(F.mse_loss(flow, noise - clean))
        if block + 1 < config.window_blocks:
            sigma_c = torch.rand(batch, 1, 1, 1, 1, generator=generator) * config.context_noise_max
            context = clean + sigma_c * torch.randn(clean.shape, generator=generator)
            cache.store = True
            dit(context, torch.zeros(batch, nf), prompt, cache, start)
    return torch.stack(losses).mean()


# ---- export -------------------------------------------------------------------------------------
def _half(module: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}


VAE_FILE = "toyworld_vae.safetensors"


def save_vae(out: Path, vae: PatchVAE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(_half(vae), str(out / VAE_FILE))


def load_trained_vae(folder: Path, preset: ModelPreset) -> PatchVAE:
    """The fp16 VAE of a model folder, in fp32: exactly the VAE that ships, so it encodes the DiT's data."""
    if not isinstance(preset.vae, PatchVAEConfig):
        raise UserError(f"preset {preset.name!r}: the toyworld trainer fits a patch autoencoder (vae.type: patch)")
    return load_vae(folder / VAE_FILE, preset.vae, dtype=torch.float32)


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
    save_file(_half(dit), str(out / "toyworld_dit.safetensors"))
    save_file(_half(text), str(out / "toyworld_text_encoder.safetensors"))
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


def train(out: Path, config: TrainConfig, reuse_vae: Path | None = None, vae_only: bool = False) -> None:
    """Train and write the model folder `out`.

    Stage 1 writes the VAE to `out` (`vae_only` stops there); `reuse_vae` takes an earlier
    folder's VAE instead. Stage 2 always encodes its clips with the VAE as stored (fp16) and draws
    from its own seeds, so a run in one go and a run in two steps give the same model.
    """
    began = time.perf_counter()
    torch.set_num_threads(config.threads)
    preset = load_preset(PRESET)
    if reuse_vae is None:
        torch.manual_seed(config.seed)
        save_vae(out, train_vae(preset, config, random.Random(config.seed)))
        reuse_vae = out
    elif reuse_vae.resolve() != out.resolve():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(reuse_vae / VAE_FILE, out / VAE_FILE)
    if vae_only:
        print(f"toyworld VAE written to {out / VAE_FILE} in {(time.perf_counter() - began) / 60:.1f} min")
        return
    vae = load_trained_vae(out, preset)
    data, mean, std = encode_clips(vae, config, random.Random(config.seed + 1))
    preset = replace(preset, vae=replace(preset.vae, latent_mean=tuple(mean), latent_std=tuple(std)))
    torch.manual_seed(config.seed + 1)
    dit, text = train_dit(preset, data, config)
    export(out, dit, text, mean, std, config, time.perf_counter() - began)
    print(f"toyworld model written to {out} in {(time.perf_counter() - began) / 60:.1f} min")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.engine.models.toyworld.train",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = TrainConfig(
        seed=args.seed,
        threads=args.threads,
        vae_steps=args.vae_steps,
        dit_steps=args.dit_steps,
        dit_clips=args.clips,
    )
    if args.quick:
        config = config.quick()
    if args.reuse_vae is not None and not (args.reuse_vae / VAE_FILE).is_file():
        print(f"--reuse-vae {args.reuse_vae}: no {VAE_FILE} there", file=sys.stderr)
        return 2
    train(args.out, config, args.reuse_vae, args.vae_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
