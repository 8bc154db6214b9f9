"""Toyworld: a procedural 2-D world of coloured shapes, the training data and ground truth of the
built-in model.

A scene holds one or two objects of one shape (ball or square) and one colour on a dark
background. Objects move with simple physics at the video frame rate: constant velocity with
elastic bounces off the walls ("bouncing ..."), or gravity with lossy bounces on the floor
("falling"). Every scene is described by a prompt ("a red ball bouncing to the right", "two
blue squares falling"); a prompt change at a block boundary ("the ball turns green") recolours
the objects from that frame on. Because the simulator knows what every frame should show, it
measures a generated video's drift exactly (see `measure.py`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import numpy as np

# RGB of each colour word, and of the background. Far apart so that a pixel's colour names one word.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (225, 45, 45),
    "green": (50, 205, 60),
    "blue": (55, 95, 235),
    "yellow": (235, 220, 50),
    "magenta": (215, 55, 210),
    "cyan": (50, 215, 225),
}
BACKGROUND = (18, 18, 28)
SHAPES = ("ball", "square")
MOTIONS = ("bouncing to the right", "bouncing to the left", "bouncing around", "falling")
GRAVITY = 0.22  # px / frame^2 of "falling" scenes
RESTITUTION = 0.9  # share of the speed a falling object keeps when it hits the floor
# Video frames per latent frame of the toyworld model's VAE (it compresses space, not time).
TEMPORAL_FACTOR = 1


@dataclass(frozen=True)
class SceneSpec:
    """What a prompt says: colour, shape, how many, how they move."""

    colour: str
    shape: str
    count: int
    motion: str

    def __post_init__(self) -> None:
        if self.colour not in PALETTE:
            raise ValueError(f"colour {self.colour!r} is not one of {', '.join(PALETTE)}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} is not one of {', '.join(SHAPES)}")
        if self.count not in (1, 2):
            raise ValueError(f"count must be 1 or 2, got {self.count}")
        if self.motion not in MOTIONS:
            raise ValueError(f"motion {self.motion!r} is not one of {', '.join(MOTIONS)}")

    @property
    def noun(self) -> str:
        return self.shape if self.count == 1 else f"{self.shape}s"

    def prompt(self) -> str:
        article = "a" if self.count == 1 else "two"
        return f"{article} {self.colour} {self.noun} {self.motion}"

    def change_prompt(self, colour: str) -> str:
        """The prompt that recolours this scene mid-video: "the ball turns green"."""
        verb = "turns" if self.count == 1 else "turn"
        return f"the {self.noun} {verb} {colour}"


def all_scene_specs() -> list[SceneSpec]:
    return [
        SceneSpec(colour, shape, count, motion)
        for colour in PALETTE
        for shape in SHAPES
        for count in (1, 2)
        for motion in MOTIONS
    ]


def parse_prompt(text: str) -> SceneSpec | None:
    """The scene a full prompt describes, or None if it is not one of the world's prompts."""
    words = text.strip().lower().split()
    if len(words) < 4 or words[0] not in ("a", "two"):
        return None
    count = 1 if words[0] == "a" else 2
    colour, noun, motion = words[1], words[2], " ".join(words[3:])
    shape = noun[:-1] if count == 2 and noun.endswith("s") else noun
    try:
        return SceneSpec(colour, shape, count, motion)
    except ValueError:
        return None


def colour_word(text: str) -> str | None:
    """The colour a prompt (full or a change) asks for: its one palette word, else None."""
    found = [w for w in text.lower().replace(",", " ").split() if w in PALETTE]
    return found[-1] if len(found) == 1 else None


@dataclass
class Body:
    x: float
    y: float
    vx: float
    vy: float
    size: float  # radius of a ball, half the side of a square


@dataclass
class World:
    """The simulator state of one video: the scene, its bodies, the current colour."""

    spec: SceneSpec
    width: int
    height: int
    bodies: list[Body] = field(default_factory=list)
    colour: str = ""

    @classmethod
    def create(cls, spec: SceneSpec, rng: random.Random, width: int = 64, height: int = 64) -> World:
        world = cls(spec, width, height, colour=spec.colour)
        for i in range(spec.count):
            size = rng.uniform(5.0, 7.5)
            x = rng.uniform(size + 1, width - size - 1)
            if spec.count == 2:  # one per half, so they start apart
                half = width / 2
                x = rng.uniform(size + 1, half - size) + i * half
            y = rng.uniform(size + 1, height - size - 1)
            speed = rng.uniform(1.0, 2.2)
            if spec.motion == "falling":
                y = rng.uniform(size + 1, height * 0.4)
                vx, vy = rng.uniform(-0.4, 0.4), rng.uniform(0.0, 0.5)
            elif spec.motion == "bouncing around":
                angle = rng.uniform(0, 2 * math.pi)
                vx, vy = speed * math.cos(angle), speed * math.sin(angle)
            else:
                sign = 1.0 if spec.motion.endswith("right") else -1.0
                vx, vy = sign * speed, rng.uniform(-0.8, 0.8)
            world.bodies.append(Body(x, y, vx, vy, size))
        return world

    def step(self) -> None:
        """Advance one frame (1/fps seconds)."""
        for body in self.bodies:
            if self.spec.motion == "falling":
                body.vy += GRAVITY
            body.x += body.vx
            body.y += body.vy
            lo, hi_x, hi_y = body.size, self.width - body.size, self.height - body.size
            if body.x < lo or body.x > hi_x:
                body.x = 2 * (lo if body.x < lo else hi_x) - body.x
                body.vx = -body.vx
            if body.y < lo:
                body.y, body.vy = 2 * lo - body.y, -body.vy
            elif body.y > hi_y:
                body.y = 2 * hi_y - body.y
                body.vy = -body.vy * (RESTITUTION if self.spec.motion == "falling" else 1.0)

    def render(self) -> np.ndarray:
        """uint8 [H, W, 3]: anti-aliased shapes (coverage of each pixel) over the background."""
        ys, xs = np.mgrid[0 : self.height, 0 : self.width].astype(np.float32) + 0.5
        cover = np.zeros((self.height, self.width), np.float32)
        for body in self.bodies:
            if self.spec.shape == "ball":
                d = np.hypot(xs - body.x, ys - body.y)
                c = np.clip(body.size + 0.5 - d, 0.0, 1.0)
            else:
                cx = np.clip(body.size + 0.5 - np.abs(xs - body.x), 0.0, 1.0)
                cy = np.clip(body.size + 0.5 - np.abs(ys - body.y), 0.0, 1.0)
                c = cx * cy
            cover = np.maximum(cover, c)
        colour = np.array(PALETTE[self.colour], np.float32)
        background = np.array(BACKGROUND, np.float32)
        image = background + cover[..., None] * (colour - background)
        return np.round(image).astype(np.uint8)

    def object_area(self) -> float:
        """Pixels the objects cover (overlaps counted twice): the truth drift is measured against."""
        return sum(self.body_area(b) for b in self.bodies)

    def body_area(self, body: Body) -> float:
        """Pixels one body covers."""
        return math.pi * body.size**2 if self.spec.shape == "ball" else 4 * body.size**2


@dataclass(frozen=True)
class Clip:
    """Rendered frames of one simulated video, with the prompt of every latent block."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    block_frames: list[int]  # frames of each block
    block_prompts: list[str]
    block_colours: list[str]
    spec: SceneSpec


def frames_in_blocks(blocks: int, frames_per_block: int, temporal_factor: int = TEMPORAL_FACTOR) -> list[int]:
    """Pixel frames of each block under the Wan VAE's first-frame rule (1 + t(F-1), then tF)."""
    first = 1 + temporal_factor * (frames_per_block - 1)
    return [first if b == 0 else temporal_factor * frames_per_block for b in range(blocks)]


def simulate(
    spec: SceneSpec,
    blocks: int,
    rng: random.Random,
    *,
    frames_per_block: int = 3,
    width: int = 64,
    height: int = 64,
    changes: dict[int, str] | None = None,
    full_change_prompts: bool = False,
) -> Clip:
    """Render `blocks` latent blocks of a scene; `changes` maps block -> new colour.

    A change recolours the objects from the first frame of its block; that block's prompt is the
    change prompt ("the ball turns green"), or, with `full_change_prompts`, the full scene prompt
    with the new colour.
    """
    world = World.create(spec, rng, width, height)
    frames: list[np.ndarray] = []
    prompts: list[str] = []
    colours: list[str] = []
    prompt = spec.prompt()
    counts = frames_in_blocks(blocks, frames_per_block)
    for block, count in enumerate(counts):
        new = (changes or {}).get(block)
        if new is not None and new != world.colour:
            world.colour = new
            prompt = replace(spec, colour=new).prompt() if full_change_prompts else spec.change_prompt(new)
        prompts.append(prompt)
        colours.append(world.colour)
        for _ in range(count):
            frames.append(world.render())
            world.step()
    return Clip(np.stack(frames), counts, prompts, colours, spec)


def random_clip(rng: random.Random, blocks: int, change_probability: float = 0.4, frames_per_block: int = 3) -> Clip:
    """A random scene, with a colour change at a random block boundary with `change_probability`."""
    spec = rng.choice(all_scene_specs())
    changes = None
    if blocks > 1 and rng.random() < change_probability:
        colour = rng.choice([c for c in PALETTE if c != spec.colour])
        changes = {rng.randrange(1, blocks): colour}
    full = rng.random() < 0.3
    return simulate(spec, blocks, rng, frames_per_block=frames_per_block, changes=changes, full_change_prompts=full)
