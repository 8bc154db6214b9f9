"""Toyworld model: generation speed on one CPU core, and drift over a minute against the simulator.

    python bench/toyworld.py                       # the shipped model, 60 s videos, PNG plot
    python bench/toyworld.py --model DIR --seconds 30
    python bench/toyworld.py --seconds 30 --window 12    # another attention window (frames)

Prompt following: the colour of the object read from the pixels of 4 blocks, for 16 fixed prompts
(every colour, both shapes, one and two objects, every motion), and for 8 colour changes at
block 4 of 8 whether the new colour shows within two blocks and holds to the end.
Speed: pixel frames per second of `WanSession` (text encode, DiT blocks with the KV cache,
streaming VAE decode) with one torch thread, as a ratio to the 16 fps the video plays at.
Drift: for a fixed set of prompts, one video of `--seconds` each; every block is read from its
pixels (object present, centroid on screen, colour = the prompt's, object area) and set side by
side with the simulator's own rollout of the same scene read the same way. The curves (mean over
prompts, per block) go to a PNG.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model
from toyworld_lab.evaluate import (
    PROMPT_SET,
    BlockStats,
    generate_blocks,
    prompt_following,
    simulator_stats,
    video_stats,
)
from toyworld_lab.world import SceneSpec

SCENES = [
    SceneSpec("red", "ball", 1, "bouncing to the right"),
    SceneSpec("green", "square", 1, "falling"),
    SceneSpec("blue", "ball", 2, "bouncing around"),
    SceneSpec("yellow", "square", 2, "bouncing to the left"),
    SceneSpec("magenta", "ball", 1, "falling"),
    SceneSpec("cyan", "square", 1, "bouncing around"),
]


def blocks_for(seconds: float, fps: int, latent_frames: int, temporal_factor: int) -> int:
    """Blocks whose frames (1 + t(F-1) in the first block, then tF) cover `seconds` of video."""
    first = 1 + temporal_factor * (latent_frames - 1)
    return 1 + max(0, math.ceil((seconds * fps - first) / (temporal_factor * latent_frames)))


def measure_speed(generator: WanEngine, blocks: int) -> tuple[float, int, float]:
    began = time.perf_counter()
    frames = sum(f.shape[0] for f in generate_blocks(generator, SCENES[0].prompt(), blocks, seed=0))
    seconds = time.perf_counter() - began
    return frames / seconds, frames, seconds


def mean_curve(runs: list[list[BlockStats]], field: str, reference: list[list[BlockStats]] | None = None) -> np.ndarray:
    values = np.array([[getattr(s, field) for s in run] for run in runs], dtype=np.float64)
    if reference is not None:  # a ratio to the simulator's value of the same block
        ref = np.array([[getattr(s, field) for s in run] for run in reference], dtype=np.float64)
        values = values / np.maximum(ref, 1e-9)
    return values.mean(axis=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toyworld", help="model folder or built-in name (default: toyworld)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each drift video")
    parser.add_argument("--speed-blocks", type=int, default=20, help="blocks of the speed run")
    parser.add_argument("--window", type=int, help="attention window in latent frames (default: the preset's)")
    parser.add_argument("--png", type=Path, default=Path("bench/toyworld_drift.png"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_wan_model(args.model)
    if args.window is not None:
        pipeline = model.preset.pipeline
        windowed = replace(pipeline.block, local_attn_size=args.window)
        model = replace(model, preset=replace(model.preset, pipeline=replace(pipeline, block=windowed)))
    generator = WanEngine(model)
    fps = model.fps

    measure_speed(generator, 2)  # warm-up
    speed, frames, seconds = measure_speed(generator, args.speed_blocks)
    window = model.pipeline_config.block.local_attn_size
    print(f"model {model.name} ({model.width}x{model.height} @ {fps} fps, window {window} frames), one CPU thread")
    print(f"speed: {frames} frames in {seconds:.2f} s = {speed:.1f} frames/s = {speed / fps:.2f}x real time")

    following = prompt_following(generator)
    right, changed = sum(following.colour_right), sum(following.change_took)
    print(f"colour = prompt over 4 blocks: {right} of {len(PROMPT_SET)} prompts ({right / len(PROMPT_SET):.0%})")
    print(f"colour change within two blocks (and held): {changed} of {len(following.change_took)}")

    block = model.pipeline_config.block.num_frame_per_block
    blocks = blocks_for(args.seconds, fps, block, model.vae.config.temporal_factor)
    generated, simulated = [], []
    began = time.perf_counter()
    for seed, spec in enumerate(SCENES):
        frame_blocks = generate_blocks(generator, spec.prompt(), blocks, seed=seed)
        generated.append(video_stats(frame_blocks, [spec.colour] * blocks))
        simulated.append(simulator_stats(spec, blocks, seed))
    took = time.perf_counter() - began
    print(f"drift: {len(SCENES)} videos x {blocks} blocks ({args.seconds:.0f} s each) in {took:.0f} s")
    for spec, stats in zip(SCENES, generated, strict=True):
        on_screen = np.array([s.on_screen for s in stats])
        print(
            f"  {spec.prompt():<40} centroid on screen {on_screen.mean():.2f} "
            f"(last quarter {on_screen[blocks * 3 // 4 :].mean():.2f})"
        )

    times = np.array([s.first_frame for s in generated[0]], dtype=np.float64) / fps
    curves = {
        "object present": (mean_curve(generated, "present"), mean_curve(simulated, "present")),
        "centroid on screen": (mean_curve(generated, "on_screen"), mean_curve(simulated, "on_screen")),
        "colour = prompt": (mean_curve(generated, "colour_match"), mean_curve(simulated, "colour_match")),
        "area / simulator area": (mean_curve(generated, "area", simulated), np.ones(blocks)),
    }
    print(f"{'t (s)':>6} " + " ".join(f"{name:>24}" for name in curves))
    step = max(1, blocks // 6)
    for b in [*range(0, blocks, step), blocks - 1]:
        row = " ".join(f"{model_v[b]:>11.2f} (sim {sim_v[b]:4.2f})" for model_v, sim_v in curves.values())
        print(f"{times[b]:>6.1f} {row}")
    for label, span in (("whole video", slice(0, blocks)), ("last quarter", slice(blocks * 3 // 4, blocks))):
        summary = ", ".join(f"{name} {model_v[span].mean():.2f}" for name, (model_v, _) in curves.items())
        print(f"{label} of the {args.seconds:.0f} s (model): {summary}")

    figure, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3.2), constrained_layout=True)
    for axis, (name, (model_v, sim_v)) in zip(axes, curves.items(), strict=True):
        axis.plot(times, sim_v, color="0.6", linestyle="--", label="simulator")
        axis.plot(times, model_v, color="tab:blue", label=model.name)
        axis.set_title(name)
        axis.set_xlabel("video time (s)")
        axis.set_ylim(0, max(1.2, float(np.nanmax(model_v)) * 1.1))
    axes[0].legend(loc="lower left")
    figure.suptitle(f"{model.name}: drift over {args.seconds:.0f} s, mean of {len(SCENES)} prompts")
    args.png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.png, dpi=80)
    print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
