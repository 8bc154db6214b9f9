"""Train the toyworld-play model on the CPU: `make train-toyworld-play` (seeded, reproducible).

A fine-tune of the shipped toyworld model (`engine/families/wan/weights/toyworld`), the way its
own DiT stage trains (`train.py`), on play clips (`play.py`): one object the arrow keys push.

- The DiT is toyworld's plus a Matrix-Game-style keyboard branch in its first blocks
  (`engine/families/wan/keyboard.py`); the branch starts fresh with a zero output
  projection, so the fine-tune starts from exactly the toyworld model, and trains at a higher
  learning rate than the rest.
- The VAE and the text encoder stay toyworld's (frozen, copied), and so does the latent
  normalisation: play clips are encoded with toyworld's VAE and statistics.
- Teacher forcing as in `train.py` (clean context K/V, faded and noised context, object-weighted
  flow loss), with the keys held in every frame given to both passes of each block (zeros before
  the clip's first frame: no key held, as at the start of a session).
- Then recovery, as `train.py`'s stage 3: faded context that may keep nothing of its object, so
  a block whose past lost it (or never drew it: after the first stage a session's first block
  came out empty in about a third of the sessions) draws it anew instead of continuing an empty
  scene.
- Then first-block rollouts (`first_block.py`): after recovery the first block, which sees no
  context, still came out empty for about one noise draw in six (the same draws for every
  prompt), and a trial lost its object before the key was pressed. The inference sampler rolls
  out first blocks, and the model trains at the states of its own path towards simulator blocks
  with the object where the path leaned, alongside recovery's teacher forcing.

`--reuse-dit DIR --resume STAGE` runs the stages from STAGE on from an earlier run's folder; a
run in steps gives the same weights as one run (each stage reads the last one's fp16 weights and
draws from its own seeds).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import save_file
from tqdm import tqdm

from engine.families.wan.checkpoint import load_dit
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.loader import MODEL_YAML, TOYWORLD_PLAY_WEIGHTS, TOYWORLD_WEIGHTS, byte_level_tokenizer
from engine.families.wan.text_encoder import UMT5Encoder
from inferix.spec.presets import ModelPreset, load_preset
from toyworld_lab.first_block import FirstBlockRollouts
from toyworld_lab.play import random_play_clip
from toyworld_lab.train import (
    DIT_FILE,
    TEXT_ENCODER_FILE,
    VAE_FILE,
    BlockSampler,
    DiTStage,
    LatentClips,
    LatentCodec,
    TrainConfig,
    _half,
    load_trained_vae,
    train_dit,
)
from toyworld_lab.world import BACKGROUND

PRESET = "toyworld-play"
BASE_PRESET = "toyworld"
PLAY_DIT_FILE = "toyworld_play_dit.safetensors"
# The stages after teacher forcing, in order: where a run from an earlier folder (--reuse-dit) starts.
RESUME_STAGES = ("recovery", "first-block")


@dataclass(frozen=True)
class PlayConfig:
    seed: int = 0
    # One thread: on a shared 2-core box two threads ran a step 10x slower than one (0.8 s).
    threads: int = 1
    clips: int = 960
    clip_blocks: int = 6
    window_blocks: int = 4
    steps: int = 1500
    batch: int = 8
    lr: float = 2e-4  # the toyworld DiT's own weights
    branch_lr: float = 1e-3  # the fresh keyboard branch
    warmup_steps: int = 50
    recovery_steps: int = 400
    recovery_lr: float = 2e-4
    recovery_window_blocks: int = 4  # two-block windows (half the loss on context-free blocks) did worse
    first_block_steps: int = 300
    first_block_lr: float = 1e-4  # half recovery's: a last touch to a model that already plays
    first_block_rollouts: int = 8  # first blocks the sampler rolls out for each step's first-block loss
    first_block_weight: float = 1.0  # of the first-block loss, added to the teacher-forcing loss

    def quick(self) -> PlayConfig:
        """A few steps: checks the whole path in a minute (weights are not useful)."""
        return replace(self, clips=16, steps=10, warmup_steps=2, recovery_steps=10, first_block_steps=10)

    def train_config(self) -> TrainConfig:
        """The toyworld trainer's settings for this fine-tune (context corruption, loss weights: its own)."""
        return replace(
            TrainConfig(),
            seed=self.seed,
            threads=self.threads,
            dit_clips=self.clips,
            clip_blocks=self.clip_blocks,
            window_blocks=self.window_blocks,
            dit_steps=self.steps,
            dit_batch=self.batch,
            dit_lr=self.lr,
            warmup_steps=self.warmup_steps,
            recovery_steps=self.recovery_steps,
            recovery_lr=self.recovery_lr,
        )

    def stage(self) -> DiTStage:
        base = DiTStage.teacher_forcing(self.train_config())
        return replace(base, name="DiT play", train_text=False, branch_lr=self.branch_lr)

    def recovery_stage(self) -> DiTStage:
        base = DiTStage.recovery(self.train_config())
        # The branch keeps its ratio to the rest's learning rate.
        branch_lr = self.branch_lr * self.recovery_lr / self.lr
        return replace(base, name="DiT play recovery", train_text=False, branch_lr=branch_lr)

    def first_block_stage(self) -> DiTStage:
        """Recovery's teacher forcing at a lower rate, to which `train` adds the first-block rollouts' loss."""
        base = DiTStage.fine_tuning(
            self.train_config(), "DiT play first block", self.first_block_steps, self.first_block_lr, seed_offset=5
        )
        branch_lr = self.branch_lr * self.first_block_lr / self.lr
        return replace(base, train_text=False, branch_lr=branch_lr)


def base_latent_stats(base: Path) -> tuple[list[float], list[float]]:
    """The latent mean and std of the toyworld model folder's `model.yaml`."""
    vae = yaml.safe_load((base / MODEL_YAML).read_text())["vae"]
    return [float(m) for m in vae["latent_mean"]], [float(s) for s in vae["latent_std"]]


@torch.no_grad()
def encode_play_clips(codec: LatentCodec, config: PlayConfig, rng: random.Random) -> LatentClips:
    """Simulate random play clips and encode them: normalised latents, prompts and key rows."""
    latents: list[torch.Tensor] = []
    keys: list[torch.Tensor] = []
    prompts: list[list[str]] = []
    batch = 8
    with tqdm(total=config.clips, desc="encode play clips", unit="clip", file=sys.stderr) as bar:
        while len(prompts) < config.clips:
            clips = [random_play_clip(rng, config.clip_blocks) for _ in range(batch)]
            latents.append(codec.encode(np.stack([c.frames for c in clips])))
            keys.append(torch.from_numpy(np.stack([c.keys for c in clips])))
            prompts.extend(c.block_prompts for c in clips)
            bar.update(batch)
    empty = np.full((1, 1, 64, 64, 3), BACKGROUND, np.uint8)
    background = codec.encode(empty)[0, 0].mean(dim=(1, 2), keepdim=True)
    n = config.clips
    return LatentClips(torch.cat(latents)[:n], prompts[:n], background, key_rows=torch.cat(keys)[:n])


def play_networks(preset: ModelPreset, base_preset: ModelPreset, base: Path) -> tuple[CausalWanDiT, UMT5Encoder]:
    """Toyworld's DiT with a fresh keyboard branch (zero output projection), and its text encoder."""
    dit = CausalWanDiT(preset.dit, attention_backend="sdpa")
    trained = load_dit(base / DIT_FILE, base_preset.dit, dtype=torch.float32, attention_backend="sdpa")
    missing, unexpected = dit.load_state_dict(trained.state_dict(), strict=False)
    fresh = [name for name in missing if ".keyboard." not in name]
    if fresh or unexpected:
        raise RuntimeError(f"toyworld DiT does not match toyworld-play's: missing {fresh}, unexpected {unexpected}")
    text = UMT5Encoder.from_checkpoint(base / TEXT_ENCODER_FILE, base_preset.text_encoder, dtype=torch.float32)
    return dit, text


def load_play_networks(folder: Path, preset: ModelPreset, base_preset: ModelPreset) -> tuple[CausalWanDiT, UMT5Encoder]:
    """The fp16 DiT of a toyworld-play folder in fp32 (as stored: a run in steps equals one run), its text encoder."""
    dit = load_dit(folder / PLAY_DIT_FILE, preset.dit, dtype=torch.float32, attention_backend="sdpa")
    text = UMT5Encoder.from_checkpoint(folder / TEXT_ENCODER_FILE, base_preset.text_encoder, dtype=torch.float32)
    return dit, text


def export(out: Path, base: Path, dit: CausalWanDiT, mean: list[float], std: list[float], header: str) -> None:
    """The model folder: the trained DiT in fp16, toyworld's VAE, text encoder and tokenizer, `model.yaml`."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(_half(dit), str(out / PLAY_DIT_FILE))
    if base.resolve() != out.resolve():
        for name in (VAE_FILE, TEXT_ENCODER_FILE):
            shutil.copyfile(base / name, out / name)
        shutil.copytree(base / "tokenizer", out / "tokenizer", dirs_exist_ok=True)
    model_yaml = {
        "preset": PRESET,
        "vae": {"latent_mean": [round(m, 6) for m in mean], "latent_std": [round(s, 6) for s in std]},
    }
    (out / MODEL_YAML).write_text(header + yaml.safe_dump(model_yaml, sort_keys=False))


def train(
    out: Path,
    config: PlayConfig,
    base: Path = TOYWORLD_WEIGHTS,
    command: str = "",
    reuse_dit: Path | None = None,
    resume: str = RESUME_STAGES[0],
) -> float:
    """Fine-tune and write the model folder `out`; returns the wall time in seconds. `reuse_dit`
    takes an earlier run's folder instead of the stages before `resume` (`RESUME_STAGES`) and
    runs that stage and the ones after it."""
    began = time.perf_counter()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    base_preset = load_preset(BASE_PRESET)
    mean, std = base_latent_stats(base)
    preset = load_preset(PRESET)
    preset = replace(preset, vae=replace(preset.vae, latent_mean=tuple(mean), latent_std=tuple(std)))
    codec = LatentCodec.of(load_trained_vae(base, base_preset), mean, std)
    data = encode_play_clips(codec, config, random.Random(config.seed + 1))

    def header() -> str:
        minutes = (time.perf_counter() - began) / 60
        return (
            f"# Written by `{command or 'make train-toyworld-play'}` ({minutes:.1f} min on {config.threads} "
            f"threads, torch {torch.__version__}), fine-tuned from the toyworld model.\n"
            f"# Training config: {json.dumps(asdict(config))}\n"
        )

    # The stages after teacher forcing train on the same clips, in windows of their own length.
    fine_tuning = replace(config.train_config(), window_blocks=config.recovery_window_blocks)
    rollouts = FirstBlockRollouts(
        data,
        BlockSampler.of(preset),
        codec,
        byte_level_tokenizer(preset.text_encoder.text_len),
        config.first_block_rollouts,
        fine_tuning.object_loss_weight,
        config.first_block_weight,
    )
    later = [
        (config.recovery_steps, config.recovery_stage(), None),
        (config.first_block_steps, config.first_block_stage(), rollouts.loss),
    ]
    if reuse_dit is None:
        networks = play_networks(preset, base_preset, base)
        dit, _ = train_dit(preset, data, config.train_config(), config.stage(), networks)
        export(out, base, dit, mean, std, header())
        earlier = out
    else:
        earlier = reuse_dit
        later = later[RESUME_STAGES.index(resume) :]
    for steps, stage, extra_loss in later:
        if steps > 0:
            networks = load_play_networks(earlier, preset, base_preset)
            dit, _ = train_dit(preset, data, fine_tuning, stage, networks, extra_loss=extra_loss)
            export(out, base, dit, mean, std, header())
            earlier = out
    seconds = time.perf_counter() - began
    print(f"toyworld-play model written to {out} in {seconds / 60:.1f} min")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m toyworld_lab.train_play",
        description="Fine-tune the toyworld model into toyworld-play (arrow keys push the object), on CPU.",
    )
    default = PlayConfig()
    parser.add_argument(
        "--out", type=Path, default=TOYWORLD_PLAY_WEIGHTS, help="model folder to write (default: the built-in one)"
    )
    parser.add_argument("--base", type=Path, default=TOYWORLD_WEIGHTS, help="the toyworld model folder to start from")
    parser.add_argument("--seed", type=int, default=default.seed)
    parser.add_argument("--threads", type=int, default=default.threads, help="torch CPU threads")
    parser.add_argument("--steps", type=int, default=default.steps)
    parser.add_argument("--clips", type=int, default=default.clips, help="simulated play clips to train on")
    parser.add_argument("--lr", type=float, default=default.lr, help="learning rate of the toyworld DiT's weights")
    parser.add_argument("--branch-lr", type=float, default=default.branch_lr, help="learning rate of the branch")
    parser.add_argument("--recovery-steps", type=int, default=default.recovery_steps)
    parser.add_argument(
        "--reuse-dit",
        type=Path,
        metavar="DIR",
        help="skip the teacher-forcing stage: take an earlier run's folder DIR and run the stages from --resume on",
    )
    parser.add_argument(
        "--resume",
        choices=RESUME_STAGES,
        default=RESUME_STAGES[0],
        help="with --reuse-dit: the first stage to run (first-block: DIR holds a recovery stage's output)",
    )
    parser.add_argument("--first-block-steps", type=int, default=default.first_block_steps)
    parser.add_argument(
        "--first-block-weight",
        type=float,
        default=default.first_block_weight,
        help="weight of the first-block rollouts' loss in the first-block stage (the teacher-forcing loss: 1)",
    )
    parser.add_argument("--first-block-lr", type=float, default=default.first_block_lr)
    parser.add_argument("--quick", action="store_true", help="a few steps (checks the path only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = PlayConfig(
        seed=args.seed,
        threads=args.threads,
        steps=args.steps,
        clips=args.clips,
        lr=args.lr,
        branch_lr=args.branch_lr,
        recovery_steps=args.recovery_steps,
        first_block_steps=args.first_block_steps,
        first_block_weight=args.first_block_weight,
        first_block_lr=args.first_block_lr,
    )
    if args.quick:
        config = config.quick()
    missing = [n for n in (VAE_FILE, DIT_FILE, TEXT_ENCODER_FILE, MODEL_YAML) if not (args.base / n).is_file()]
    if missing:
        print(f"--base {args.base}: no {', '.join(missing)} there", file=sys.stderr)
        return 2
    command = " ".join(["python -m toyworld_lab.train_play", *(sys.argv[1:] if argv is None else argv)])
    if args.reuse_dit is not None and not (args.reuse_dit / PLAY_DIT_FILE).is_file():
        print(f"--reuse-dit {args.reuse_dit}: no {PLAY_DIT_FILE} there", file=sys.stderr)
        return 2
    train(args.out, config, args.base, command, args.reuse_dit, args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
