"""Toyworld's player: one object that the arrow keys push, the world of the `toyworld-play` model.

A play scene holds one ball or square of one palette colour, at rest at a random place on the
dark background. Every frame, each held arrow key accelerates it by `ACCELERATION` px/frame² in
its direction (a diagonal pair pushes along both axes), friction keeps `FRICTION` of its velocity,
and a wall stops it (the position is clamped, that velocity component zeroed). A frame's keys act
before it is rendered, so a key held in a frame already shows in it. From rest a held key moves
the object ~4 px in one block of 3 frames and ~11 px in two (top speed 2.8 px/frame); after a
release it coasts ~6 px and is nearly still a block later.

Prompts name the object: "a red ball steered by the arrow keys"; "the ball turns green" recolours
it at a block boundary, as in `world.py`, whose `World` renders the frames.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from toyworld_lab.world import MOTIONS, PALETTE, SHAPES, Body, SceneSpec, World, frames_in_blocks

# The arrow keys in the order of the toyworld-play preset's action schema (its key rows' columns).
KEYS = ("up", "down", "left", "right")
DIRECTIONS: dict[str, tuple[int, int]] = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
ACCELERATION = 1.2  # px / frame² while a key is held
FRICTION = 0.7  # share of its velocity the object keeps each frame
PLAY_MOTION = "steered by the arrow keys"


@dataclass(frozen=True)
class PlaySpec:
    """What a play prompt says: the player object's colour and shape."""

    colour: str
    shape: str

    def __post_init__(self) -> None:
        if self.colour not in PALETTE:
            raise ValueError(f"colour {self.colour!r} is not one of {', '.join(PALETTE)}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} is not one of {', '.join(SHAPES)}")

    def prompt(self) -> str:
        return f"a {self.colour} {self.shape} {PLAY_MOTION}"

    def change_prompt(self, colour: str) -> str:
        return f"the {self.shape} turns {colour}"


def all_play_specs() -> list[PlaySpec]:
    return [PlaySpec(colour, shape) for colour in PALETTE for shape in SHAPES]


def parse_play_prompt(text: str) -> PlaySpec | None:
    """The play scene a full prompt describes, or None if it is not one of the play prompts."""
    words = text.strip().lower().split()
    if len(words) < 4 or words[0] != "a" or " ".join(words[3:]) != PLAY_MOTION:
        return None
    try:
        return PlaySpec(words[1], words[2])
    except ValueError:
        return None


def key_row(keys: list[str] | tuple[str, ...]) -> np.ndarray:
    """float32 [len(KEYS)]: 1 for each held key."""
    unknown = [k for k in keys if k not in KEYS]
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}: the keys are {', '.join(KEYS)}")
    return np.array([float(k in keys) for k in KEYS], np.float32)


def held_keys(row: np.ndarray) -> list[str]:
    """The names of the keys a key row holds."""
    return [k for k, v in zip(KEYS, row, strict=True) if v > 0.5]


@dataclass
class Player:
    """The simulator state of one play video. Its `World` only renders: `step` moves the body."""

    world: World

    @classmethod
    def create(
        cls,
        spec: PlaySpec,
        rng: random.Random,
        width: int = 64,
        height: int = 64,
        *,
        at: tuple[float, float] | None = None,
        size: float | None = None,
    ) -> Player:
        """At rest at `at` (default: a random place), of `size` (default: random, like `World.create`'s)."""
        size = rng.uniform(5.0, 7.5) if size is None else size
        if at is None:
            at = (rng.uniform(size + 1, width - size - 1), rng.uniform(size + 1, height - size - 1))
        # World.step is never called, so the scene's motion word is only there to make a valid spec.
        world = World(SceneSpec(spec.colour, spec.shape, 1, MOTIONS[0]), width, height, colour=spec.colour)
        world.bodies.append(Body(at[0], at[1], 0.0, 0.0, size))
        player = cls(world)
        player._clamp()
        return player

    @property
    def body(self) -> Body:
        return self.world.bodies[0]

    def step(self, keys: np.ndarray) -> None:
        """Advance one frame with the keys held in it ([len(KEYS)] of 0/1)."""
        body = self.body
        ax = ACCELERATION * (float(keys[KEYS.index("right")]) - float(keys[KEYS.index("left")]))
        ay = ACCELERATION * (float(keys[KEYS.index("down")]) - float(keys[KEYS.index("up")]))
        body.vx = (body.vx + ax) * FRICTION
        body.vy = (body.vy + ay) * FRICTION
        body.x += body.vx
        body.y += body.vy
        self._clamp()

    def _clamp(self) -> None:
        body = self.body
        lo, hi_x, hi_y = body.size, self.world.width - body.size, self.world.height - body.size
        if not lo <= body.x <= hi_x:
            body.x, body.vx = min(max(body.x, lo), hi_x), 0.0
        if not lo <= body.y <= hi_y:
            body.y, body.vy = min(max(body.y, lo), hi_y), 0.0

    def frame(self, keys: np.ndarray) -> np.ndarray:
        """uint8 [H, W, 3]: the next frame, its keys applied first."""
        self.step(keys)
        return self.world.render()


def pushed_from_rest(key: str, frames: int) -> list[float]:
    """How far a resting object (away from the walls) has moved the `key` way after each of the first
    `frames` frames the key is held, in px: the answer a play model learns to give."""
    player = Player.create(all_play_specs()[0], random.Random(0), at=(32.0, 32.0), size=5.0)
    (x0, y0), (dx, dy) = (player.body.x, player.body.y), DIRECTIONS[key]
    moved = []
    for _ in range(frames):
        player.step(key_row([key]))
        moved.append((player.body.x - x0) * dx + (player.body.y - y0) * dy)
    return moved


@dataclass(frozen=True)
class PlayClip:
    """Rendered frames of one play video, the keys held in each frame, the prompt of every block."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    keys: np.ndarray  # float32 [T, len(KEYS)] of 0/1
    block_frames: list[int]
    block_prompts: list[str]
    spec: PlaySpec


def play(
    spec: PlaySpec,
    keys: np.ndarray,
    rng: random.Random,
    *,
    frames_per_block: int = 3,
    width: int = 64,
    height: int = 64,
    changes: dict[int, str] | None = None,
) -> PlayClip:
    """Render a play scene under key rows [T, len(KEYS)] (T a whole number of blocks); `changes`
    maps block -> new colour, applied from the block's first frame with its change prompt."""
    blocks = len(keys) // frames_per_block
    counts = frames_in_blocks(blocks, frames_per_block)
    if sum(counts) != len(keys):
        raise ValueError(f"{len(keys)} key rows are not whole blocks of {frames_per_block} frames")
    player = Player.create(spec, rng, width, height)
    frames: list[np.ndarray] = []
    prompts: list[str] = []
    prompt = spec.prompt()
    for block, count in enumerate(counts):
        new = (changes or {}).get(block)
        if new is not None and new != player.world.colour:
            player.world.colour = new
            prompt = spec.change_prompt(new)
        prompts.append(prompt)
        first = sum(counts[:block])
        frames.extend(player.frame(keys[first + i]) for i in range(count))
    return PlayClip(np.stack(frames), keys.astype(np.float32), counts, prompts, spec)


def random_held(rng: random.Random) -> list[str]:
    """No key (a quarter), one key (half), or a diagonal pair (a quarter)."""
    draw = rng.random()
    if draw < 0.25:
        return []
    if draw < 0.75:
        return [rng.choice(KEYS)]
    return [rng.choice(("up", "down")), rng.choice(("left", "right"))]


def random_key_rows(
    rng: random.Random, blocks: int, frames_per_block: int = 3, keep: float = 0.4, mid_block: float = 0.15
) -> np.ndarray:
    """float32 [blocks * frames_per_block, len(KEYS)]: a random action track. The held keys change
    at block boundaries (kept for the next block with probability `keep`), and within a block at a
    random frame with probability `mid_block`, as a player would press them."""
    rows: list[np.ndarray] = []
    held = random_held(rng)
    for block in range(blocks):
        if block > 0 and rng.random() >= keep:
            held = random_held(rng)
        switch = rng.randrange(1, frames_per_block) if rng.random() < mid_block else frames_per_block
        for frame in range(frames_per_block):
            if frame == switch:
                held = random_held(rng)
            rows.append(key_row(held))
    return np.stack(rows)


def random_play_clip(
    rng: random.Random, blocks: int, change_probability: float = 0.2, frames_per_block: int = 3
) -> PlayClip:
    """A random play scene under a random action track, recoloured at a random block boundary with
    `change_probability`."""
    spec = rng.choice(all_play_specs())
    changes = None
    if blocks > 1 and rng.random() < change_probability:
        changes = {rng.randrange(1, blocks): rng.choice([c for c in PALETTE if c != spec.colour])}
    keys = random_key_rows(rng, blocks, frames_per_block)
    return play(spec, keys, rng, frames_per_block=frames_per_block, changes=changes)


__all__ = [
    "ACCELERATION",
    "DIRECTIONS",
    "FRICTION",
    "KEYS",
    "PLAY_MOTION",
    "PlayClip",
    "PlaySpec",
    "Player",
    "all_play_specs",
    "held_keys",
    "key_row",
    "parse_play_prompt",
    "play",
    "pushed_from_rest",
    "random_held",
    "random_key_rows",
    "random_play_clip",
]
