"""How well a model plays the toyworld: colour fidelity, prompt changes, drift over long videos.

Every number compares pixels of a generated video with what the simulator says the scene holds
(`measure.py` reads both the same way): is the object there and on screen, is its colour the
prompt's, is its area the simulator's. Used by the tests and by `bench/toyworld.py`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from engine.families.wan.engine import WanEngine
from toyworld_lab.measure import dominant_colour, read_frame
from toyworld_lab.world import PALETTE, SceneSpec, simulate

# The object's centroid must stay this many pixels inside the frame to count as on screen.
ON_SCREEN_MARGIN = 2.0


@dataclass(frozen=True)
class BlockStats:
    """One block of a video, read from its pixels."""

    index: int
    first_frame: int
    present: float  # share of frames with an object
    on_screen: float  # share of frames with an object whose centroid is inside the frame
    colour_match: float  # share of frames whose object colour is the expected one
    area: float  # mean object area (pixels) over the frames with an object


def block_stats(index: int, first_frame: int, frames: np.ndarray, colour: str) -> BlockStats:
    readings = [read_frame(f) for f in frames]
    height, width = frames.shape[1:3]
    present = [r for r in readings if r.present]

    def inside(x: float, y: float) -> bool:
        m = ON_SCREEN_MARGIN
        return m <= x <= width - m and m <= y <= height - m

    on_screen = [r for r in present if r.centroid is not None and inside(*r.centroid)]
    n = len(readings)
    return BlockStats(
        index=index,
        first_frame=first_frame,
        present=len(present) / n,
        on_screen=len(on_screen) / n,
        colour_match=sum(r.colour == colour for r in present) / n,
        area=float(np.mean([r.area for r in present])) if present else 0.0,
    )


def generate_blocks(
    generator: WanEngine,
    prompt: str,
    blocks: int,
    seed: int,
    changes: dict[int, str] | None = None,
) -> list[np.ndarray]:
    """uint8 frames [T, H, W, 3] of each block; `changes` maps block -> prompt applied from it."""
    out = []
    with generator.open(prompt, seed=seed, num_blocks=blocks) as video:
        for index in range(blocks):
            if changes and index in changes:
                video.set_prompt(changes[index])
            out.append(video.next_block().frames)
    return out


def video_stats(frame_blocks: list[np.ndarray], colours: list[str]) -> list[BlockStats]:
    stats, first = [], 0
    for index, (frames, colour) in enumerate(zip(frame_blocks, colours, strict=True)):
        stats.append(block_stats(index, first, frames, colour))
        first += frames.shape[0]
    return stats


def simulator_stats(spec: SceneSpec, blocks: int, seed: int) -> list[BlockStats]:
    """The same measurements on the simulator's own rollout of the scene: the reference curves."""
    clip = simulate(spec, blocks, random.Random(seed))
    bounds = np.cumsum([0, *clip.block_frames])
    return video_stats([clip.frames[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], clip.block_colours)


@dataclass(frozen=True)
class Drift:
    """A generated video against the simulator's rollout of its scene, over the whole video."""

    on_screen: float  # share of frames with an object whose centroid is on screen
    on_screen_last_quarter: float
    colour_match: float  # share of frames whose object has the prompt's colour
    area_ratio: float  # mean object area of the frames with one / the simulator's mean object area


def drift(generator: WanEngine, spec: SceneSpec, blocks: int, seed: int) -> Drift:
    """Generate `blocks` blocks of the scene's prompt and measure them against the simulator."""
    stats = video_stats(generate_blocks(generator, spec.prompt(), blocks, seed=seed), [spec.colour] * blocks)
    truth = simulator_stats(spec, blocks, seed)
    drawn = [s.area for s in stats if s.present > 0]
    return Drift(
        on_screen=float(np.mean([s.on_screen for s in stats])),
        on_screen_last_quarter=float(np.mean([s.on_screen for s in stats[blocks * 3 // 4 :]])),
        colour_match=float(np.mean([s.colour_match for s in stats])),
        area_ratio=float(np.mean(drawn) / np.mean([s.area for s in truth])) if drawn else 0.0,
    )


def colour_of_blocks(frame_blocks: list[np.ndarray]) -> list[str | None]:
    return [dominant_colour(frames) for frames in frame_blocks]


# Every colour with both shapes (one ball / two squares alternating), then the other cases.
PROMPT_SET = [
    SceneSpec(colour, shape, 1 + (i % 2), motion)
    for i, (colour, shape, motion) in enumerate(
        (c, s, m) for c in PALETTE for s, m in (("ball", "bouncing to the right"), ("square", "falling"))
    )
] + [
    SceneSpec("red", "square", 1, "bouncing around"),
    SceneSpec("cyan", "ball", 2, "bouncing to the left"),
    SceneSpec("yellow", "ball", 1, "falling"),
    SceneSpec("blue", "square", 2, "bouncing around"),
]
CHANGE_AT, CHANGE_BLOCKS = 4, 8


@dataclass(frozen=True)
class PromptFollowing:
    colour_right: list[bool]  # per prompt of PROMPT_SET: its 4 blocks show its colour
    change_took: list[bool]  # per change: the new colour within two blocks, and still at the end
    colours: list[list[str | None]]  # per change: the colour of each block


def prompt_following(generator: WanEngine) -> PromptFollowing:
    """Colour fidelity over PROMPT_SET, and colour changes at block 4 of 8 for its first 8 prompts."""
    right = []
    for seed, spec in enumerate(PROMPT_SET):
        frames = np.concatenate(generate_blocks(generator, spec.prompt(), 4, seed=seed))
        right.append(colour_of_blocks([frames])[0] == spec.colour)
    took, seen = [], []
    for seed, spec in enumerate(PROMPT_SET[:8]):
        new = [c for c in PALETTE if c != spec.colour][seed % (len(PALETTE) - 1)]
        change = {CHANGE_AT: spec.change_prompt(new)}
        colours = colour_of_blocks(generate_blocks(generator, spec.prompt(), CHANGE_BLOCKS, seed=seed, changes=change))
        took.append(new in colours[CHANGE_AT : CHANGE_AT + 2] and colours[-1] == new)
        seen.append(colours)
    return PromptFollowing(right, took, seen)


__all__ = [
    "CHANGE_AT",
    "CHANGE_BLOCKS",
    "ON_SCREEN_MARGIN",
    "PROMPT_SET",
    "BlockStats",
    "Drift",
    "PromptFollowing",
    "block_stats",
    "colour_of_blocks",
    "drift",
    "generate_blocks",
    "prompt_following",
    "simulator_stats",
    "video_stats",
]
