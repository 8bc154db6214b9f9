"""How well a toyworld-play model responds to its keys, measured against the simulator (`play.py`).

A trial plays one scene live: 1-2 beats under random keys (the history), then an arrow key held
for `HOLD_BEATS` beats. A beat is `BEAT_FRAMES` frames, toyworld-play's block; a model with shorter
blocks (toyworld-play-1f: one frame) makes a beat in several blocks, each under the beat's keys, so
that both are measured on the same trials. The key is the trial's preferred one (trials cycle through the four)
unless the simulator says the object has no room that way: a simulator player put where the
model drew the object, with the model's last frame-to-frame motion, must move it at least
`SIM_MIN_MOVE` px the pressed way over the held beats; else the next key in turn with room is
pressed. The trial passes when the object the model draws (`measure.py`) moves at least
`PASS_MOVE` px the pressed way from the last frame before the press to the last held frame.

`python -m toyworld_lab.play_eval` prints the share of passing trials, overall and per key;
`--track FILE` instead follows an action track (`scripts/play_demo_track.json`) block by block.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.families.wan.engine import WanEngine
from inferix.spec.actions import parse_action_track, parse_held_action
from toyworld_lab.measure import read_frame
from toyworld_lab.play import DIRECTIONS, KEYS, Player, PlaySpec, all_play_specs, key_row, random_held

BEAT_FRAMES = 3
HOLD_BEATS = 2
# From rest the simulator moves the object 11 px in two held beats; a trial needs at least this
# much room that way (an object at a wall, or coasting fast the other way, is no test of the key).
SIM_MIN_MOVE = 6.0
# The model's object must move at least this far the pressed way: half the least move the
# simulator allows, and several times the centroid jitter of a still object (below 0.5 px).
PASS_MOVE = 3.0


@dataclass(frozen=True)
class Trial:
    spec: PlaySpec
    seed: int
    history: list[list[str]]  # the keys held in each beat before the press
    preferred: str  # the key pressed, if the simulator gives the object room that way


@dataclass(frozen=True)
class TrialResult:
    trial: Trial
    key: str | None  # the key pressed; None when the model's object was not there to press for
    moved: float  # px the model's object moved the pressed way over the held beats (nan: no object)

    @property
    def passed(self) -> bool:
        return self.key is not None and self.moved >= PASS_MOVE


def make_trials(count: int, seed: int = 0) -> list[Trial]:
    """`count` trials: random scenes and histories, preferred keys cycling through `KEYS`."""
    rng = random.Random(seed)
    specs = all_play_specs()
    trials = []
    for index in range(count):
        history = [random_held(rng) for _ in range(rng.choice((1, 2)))]
        trials.append(Trial(rng.choice(specs), seed * 10_000 + index, history, KEYS[index % len(KEYS)]))
    return trials


def along(key: str, start: tuple[float, float], end: tuple[float, float]) -> float:
    """Px moved from `start` to `end` in `key`'s direction."""
    dx, dy = DIRECTIONS[key]
    return (end[0] - start[0]) * dx + (end[1] - start[1]) * dy


def simulated_move(frames: np.ndarray, key: str, frames_held: int) -> float:
    """Px the simulator moves the object of the model's latest frames ([T >= 2, H, W, 3]) `key`'s
    way in `frames_held` frames: a player at its centroid, of its area, with its last motion."""
    now, before = read_frame(frames[-1]), read_frame(frames[-2])
    if now.centroid is None or not now.present:
        return float("nan")
    velocity = (0.0, 0.0)
    if before.centroid is not None and before.present:
        velocity = (now.centroid[0] - before.centroid[0], now.centroid[1] - before.centroid[1])
    height, width = frames.shape[1:3]
    size = float(np.sqrt(now.area / np.pi))  # a ball's radius; a square of that area is a little smaller
    player = Player.create(PlaySpec("red", "ball"), random.Random(0), width, height, at=now.centroid, size=size)
    player.body.vx, player.body.vy = velocity
    start = (player.body.x, player.body.y)
    for _ in range(frames_held):
        player.step(key_row([key]))
    return along(key, start, (player.body.x, player.body.y))


def pick_key(frames: np.ndarray, preferred: str, frames_held: int) -> str | None:
    """The preferred key if the simulator gives the object room that way, else the next in turn
    that does; None when the model drew no object (or no way has room)."""
    start = KEYS.index(preferred)
    for key in KEYS[start:] + KEYS[:start]:
        if simulated_move(frames, key, frames_held) >= SIM_MIN_MOVE:
            return key
    return None


def blocks_per_beat(engine: WanEngine) -> int:
    frames = engine.model.preset.pipeline.block.num_frame_per_block
    if BEAT_FRAMES % frames:
        raise ValueError(f"{engine.model.name}: blocks of {frames} frames do not fill a beat of {BEAT_FRAMES}")
    return BEAT_FRAMES // frames


def run_trial(engine: WanEngine, trial: Trial) -> TrialResult:
    schema = engine.action_schema
    assert schema is not None, "a play model takes actions"
    per_beat = blocks_per_beat(engine)
    blocks = (len(trial.history) + HOLD_BEATS) * per_beat
    with engine.open(trial.spec.prompt(), num_blocks=blocks, seed=trial.seed) as session:
        seen = []
        for index, keys in enumerate(trial.history):
            session.hold(parse_held_action(schema, keys, [], f"history beat {index}"))
            seen += [session.next_block().frames for _ in range(per_beat)]
        before = np.concatenate(seen)
        key = pick_key(before, trial.preferred, HOLD_BEATS * BEAT_FRAMES)
        if key is None:
            return TrialResult(trial, None, float("nan"))
        session.hold(parse_held_action(schema, [key], [], "held key"))
        held = [session.next_block().frames for _ in range(HOLD_BEATS * per_beat)]
    start, end = read_frame(before[-1]).centroid, read_frame(held[-1][-1]).centroid
    moved = float("nan") if start is None or end is None else along(key, start, end)
    return TrialResult(trial, key, moved)


@dataclass(frozen=True)
class Responsiveness:
    results: list[TrialResult]

    @property
    def share(self) -> float:
        return sum(r.passed for r in self.results) / len(self.results)

    @property
    def object_share(self) -> float:
        """Share of trials in which the model still drew the object when the key was pressed."""
        return sum(r.key is not None for r in self.results) / len(self.results)

    @property
    def share_with_object(self) -> float:
        """Share of passing trials among those where the object was there to be pushed."""
        pressed = [r for r in self.results if r.key is not None]
        return sum(r.passed for r in pressed) / len(pressed) if pressed else 0.0

    def per_key(self) -> dict[str, tuple[int, int]]:
        """key -> (passed, trials) of the trials that pressed it."""
        return {
            key: (sum(r.passed for r in mine), len(mine))
            for key in KEYS
            for mine in [[r for r in self.results if r.key == key]]
        }

    def summary(self) -> str:
        passed = sum(r.passed for r in self.results)
        keys = ", ".join(f"{k} {p}/{n}" for k, (p, n) in self.per_key().items())
        missing = sum(r.key is None for r in self.results)
        moves = [r.moved for r in self.results if r.key is not None]
        return (
            f"{passed}/{len(self.results)} trials ({self.share:.0%}) moved >= {PASS_MOVE:g} px the held key's way "
            f"within {HOLD_BEATS * BEAT_FRAMES} frames ({self.share_with_object:.0%} of those with the object on "
            f"screen at the press); per key: {keys}; no object to press for: {missing}; "
            f"median move {np.nanmedian(moves) if moves else float('nan'):.1f} px"
        )


def responsiveness(engine: WanEngine, trials: list[Trial]) -> Responsiveness:
    return Responsiveness([run_trial(engine, trial) for trial in trials])


def track_keys(path: Path, blocks: int) -> list[list[str]]:
    """The keys held in each of `blocks` blocks under a block-indexed JSON track
    ([{"block": b, "keys": [...]}, ...]: each entry holds until the next)."""
    entries = sorted(json.loads(path.read_text()), key=lambda e: e["block"])
    return [
        next((list(e.get("keys", [])) for e in reversed(entries) if e["block"] <= block), []) for block in range(blocks)
    ]


def follow_track(
    engine: WanEngine, prompt: str, path: Path, blocks: int, seed: int = 0
) -> list[tuple[float, float] | None]:
    """The object's centroid at the last frame of each block of a video under the track at `path`."""
    schema = engine.action_schema
    assert schema is not None, "a play model takes actions"
    track = parse_action_track(path, schema)
    with engine.open(prompt, num_blocks=blocks, seed=seed, actions=track) as session:
        return [read_frame(session.next_block().frames[-1]).centroid for _ in range(blocks)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m toyworld_lab.play_eval",
        description="Measure how a toyworld-play model responds to held arrow keys, against the simulator.",
    )
    parser.add_argument("--model", default="toyworld-play", help="model name or folder")
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--track", type=Path, help="follow this JSON action track instead, printing the path")
    parser.add_argument("--blocks", type=int, default=16, help="blocks of the --track video")
    parser.add_argument("--prompt", default="a red ball steered by the arrow keys", help="prompt of the --track video")
    parser.add_argument("--verbose", action="store_true", help="print every trial")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = WanEngine.load(args.model)
    if args.track is not None:
        keys = track_keys(args.track, args.blocks)
        for block, centroid in enumerate(follow_track(engine, args.prompt, args.track, args.blocks, args.seed)):
            held = keys[block]
            where = "no object" if centroid is None else f"({centroid[0]:5.1f}, {centroid[1]:5.1f})"
            print(f"block {block:2d} {'+'.join(held) or '-':12s} {where}")
        return 0
    result = responsiveness(engine, make_trials(args.trials, args.seed))
    if args.verbose:
        for r in result.results:
            trial = r.trial
            print(f"seed {trial.seed} {trial.spec.prompt()!r} history {trial.history} key {r.key} moved {r.moved:.1f}")
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
