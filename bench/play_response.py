"""How fast a toyworld-play model's object answers a key, frame by frame, next to the simulator it learned
from (issue 40: the part of a press's latency that is the world, not the serving path).

In-engine, no mesh: each trial holds no key for 12 frames (the object comes to rest), then one arrow key,
and reads the object's centroid (`toyworld_lab.measure`) in each of the first `--frames` frames under the
key: its displacement the pressed way from the last frame before it. The simulator's row is a resting
object under the same key (`toyworld_lab.play.pushed_from_rest`). `bench/play_latency.py` counts a press's photon
at the first frame 3 px along (MOTION_PX); the frame at which each row passes it is printed, and per key
how many trials pass it by the simulator's frame and how many not within `--frames` (use `--trials 40`
or more: 4 trials a key once made the one-frame model look late downward, which 20 did not confirm).

`--steps` runs the model with other denoising steps (a model folder in a temporary directory with the
shipped weights and the steps overridden), to see whether the answer depends on the sampler.

    python -P bench/play_response.py --model toyworld-play-1f
    python -P bench/play_response.py --model toyworld-play
    python -P bench/play_response.py --model toyworld-play-1f --steps 1000,800,600,400,250,125,50
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import MODEL_YAML, TOYWORLD_PLAY_WEIGHTS
from inferix.spec.actions import parse_held_action
from toyworld_lab.measure import read_frame
from toyworld_lab.play import pushed_from_rest

PROMPT = "a red ball steered by the arrow keys"
REST_FRAMES = 12
MOTION_PX = 3.0  # bench/play_latency.py's photon
DIRECTIONS = {"right": (1.0, 0.0), "down": (0.0, 1.0)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="toyworld-play-1f", help="toyworld-play or toyworld-play-1f")
    parser.add_argument("--trials", type=int, default=8, help="seeds 1..N; odd seeds press right, even ones down")
    parser.add_argument("--frames", type=int, default=6, help="frames under the key to read")
    parser.add_argument("--steps", default="", help="denoising steps instead of the model's, e.g. 1000,750,500,250,50")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def model_folder(model: str, steps: str, root: Path) -> str | Path:
    """`model` itself, or a copy of the shipped play weights whose model.yaml runs it with `steps`."""
    if not steps:
        return model
    folder = root / "model"
    shutil.copytree(TOYWORLD_PLAY_WEIGHTS, folder)
    config = yaml.safe_load((folder / MODEL_YAML).read_text())
    config["preset"] = model
    config.setdefault("pipeline", {}).setdefault("sampling", {})["denoising_steps"] = [int(s) for s in steps.split(",")]
    (folder / MODEL_YAML).write_text(yaml.safe_dump(config))
    return folder


def trial(engine: WanEngine, seed: int, key: str, frames: int) -> list[float | None]:
    """The model's displacement the pressed way in each of the first `frames` frames under `key`."""
    schema = engine.action_schema
    assert schema is not None, "a play model takes actions"
    per_block = engine.model.preset.pipeline.block.num_frame_per_block
    rest, held = -(-REST_FRAMES // per_block), -(-frames // per_block)
    with engine.open(PROMPT, num_blocks=rest + held, seed=seed) as session:
        session.hold(parse_held_action(schema, [], [], "rest"))
        before = [f for _ in range(rest) for f in session.next_block().frames]
        session.hold(parse_held_action(schema, [key], [], "key"))
        under = [f for _ in range(held) for f in session.next_block().frames][:frames]
    start, (dx, dy) = read_frame(before[-1]).centroid, DIRECTIONS[key]
    moved: list[float | None] = []
    for frame in under:
        at = read_frame(frame).centroid
        moved.append(None if at is None or start is None else (at[0] - start[0]) * dx + (at[1] - start[1]) * dy)
    return moved


def photon_index(moved: Sequence[float | None]) -> int | None:
    """The first frame (1-based) at least MOTION_PX along, or None when none is."""
    return next((i + 1 for i, m in enumerate(moved) if m is not None and m >= MOTION_PX), None)


def photon_frame(moved: Sequence[float | None]) -> str:
    """`photon_index` as the tables print it ('-': none)."""
    index = photon_index(moved)
    return "-" if index is None else str(index)


def row(label: str, moved: Sequence[float | None]) -> str:
    cells = " ".join(f"{m:6.2f}" if m is not None else "     -" for m in moved)
    return f"{label:<22} {cells}   {photon_frame(moved):>5}"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        engine = WanEngine.load(model_folder(args.model, args.steps, Path(tmp)))
        steps = engine.model.preset.pipeline.sampling.denoising_steps
        print(f"{args.model}, steps {list(steps)}: px the pressed way in frame 1..{args.frames} under the key")
        print(f"{'':<22} {' '.join(f'{i + 1:>6}' for i in range(args.frames))}   {MOTION_PX:g} px at")
        for key in DIRECTIONS:
            print(row(f"simulator, {key}", pushed_from_rest(key, args.frames)))
        by_key: dict[str, list[list[float | None]]] = {key: [] for key in DIRECTIONS}
        for seed in range(1, args.trials + 1):
            key = "right" if seed % 2 else "down"
            moved = trial(engine, seed, key, args.frames)
            by_key[key].append(moved)
            print(row(f"model, seed {seed} {key}", moved))
    for key, trials in by_key.items():
        medians: list[float | None] = []
        for i in range(args.frames):
            values = [m for t in trials if (m := t[i]) is not None]
            medians.append(statistics.median(values) if values else None)
        print(row(f"model median, {key}", medians))
    # How many trials pass MOTION_PX by the simulator's frame, and how many never within --frames:
    # a median hides the presses a player waits longest for.
    due = photon_index(pushed_from_rest("right", args.frames)) or args.frames
    for key, trials in by_key.items():
        frames = [photon_index(t) for t in trials]
        on_time = sum(1 for f in frames if f is not None and f <= due)
        never = frames.count(None)
        print(
            f"model, {key}: {MOTION_PX:g} px by frame {due} (the simulator's) in {on_time} of {len(trials)} trials, "
            f"not within {args.frames} frames in {never}"
        )


if __name__ == "__main__":
    main()
