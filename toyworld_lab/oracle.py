"""The simulator as an oracle for the model's own rollouts (training stage 4, DAgger-style).

Over a long video the model's context is its own output, whose objects drift from where the
simulator would put them, shrink and sometimes vanish. Teacher forcing never shows that context,
and the simulator's own continuation of a clip stops matching the model's after a few blocks. So
each rollout scene keeps a `Tracker`: a simulator world that follows the objects the model drew
(positions read from its decoded pixels) with the simulator's velocities, sizes and colours. The
target of every block is that world's render: the model's own scene, continued the way the
simulator would continue it: objects kept at full size, moving and bouncing correctly, and drawn on
where the model lost them.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np

from toyworld_lab.measure import object_mask
from toyworld_lab.world import PALETTE, Body, SceneSpec, World, all_scene_specs

# A body is seen in a generated frame when at least this share of its area lies within
# `SEARCH_MARGIN` pixels of where the tracker predicts it.
SEEN_AREA_SHARE = 0.3
SEARCH_MARGIN = 6.0


@dataclass
class Tracker:
    """One rollout scene: its simulator world, steered towards the objects the model generates."""

    world: World
    prompt: str
    last_frame_bodies: list[Body]  # the bodies at the last frame of the latest target block

    @classmethod
    def create(cls, spec: SceneSpec, rng: random.Random, width: int, height: int) -> Tracker:
        return cls(World.create(spec, rng, width, height), spec.prompt(), [])

    def change_colour(self, colour: str) -> None:
        self.world.colour = colour
        self.prompt = self.world.spec.change_prompt(colour)

    def target_block(self, frames: int) -> np.ndarray:
        """uint8 [F, H, W, 3]: the world's next `frames` frames (the block's target), advancing it."""
        rendered = []
        for index in range(frames):
            rendered.append(self.world.render())
            if index == frames - 1:
                self.last_frame_bodies = copy.deepcopy(self.world.bodies)
            self.world.step()
        return np.stack(rendered)

    def observe(self, generated: np.ndarray) -> int:
        """Move the world's bodies to where the model drew them in its block (uint8 [F, H, W, 3]).

        Only positions are taken from the model; velocities, sizes and the colour stay the
        simulator's. A body the model did not draw near its predicted place keeps the simulator's
        path. Returns how many bodies were seen.
        """
        mask = object_mask(generated[-1])
        ys, xs = np.nonzero(mask)
        points = np.stack([xs + 0.5, ys + 0.5], axis=1).astype(np.float32)
        bodies = self.last_frame_bodies
        if not bodies or len(points) == 0:
            return 0
        centres = np.array([[b.x, b.y] for b in bodies], np.float32)
        distance = np.linalg.norm(points[:, None, :] - centres[None], axis=-1)  # [P, bodies]
        nearest = distance.argmin(axis=1)
        seen = 0
        for index, body in enumerate(bodies):
            mine = points[(nearest == index) & (distance[:, index] <= body.size + SEARCH_MARGIN)]
            if len(mine) < SEEN_AREA_SHARE * self.world.body_area(body):
                continue
            body.x, body.y = (float(v) for v in mine.mean(axis=0))
            seen += 1
        if seen:
            self.world.bodies = copy.deepcopy(bodies)
            self.world.step()
        return seen


def random_trackers(
    rng: random.Random, count: int, blocks: int, change_probability: float, width: int = 64, height: int = 64
) -> tuple[list[Tracker], list[dict[int, str]]]:
    """`count` random scenes, and for each the colour changes (block -> colour) of its rollout."""
    specs = all_scene_specs()
    trackers, changes = [], []
    for _ in range(count):
        spec = rng.choice(specs)
        trackers.append(Tracker.create(spec, rng, width, height))
        change: dict[int, str] = {}
        if blocks > 2 and rng.random() < change_probability:
            change[rng.randrange(2, blocks)] = rng.choice([c for c in PALETTE if c != spec.colour])
        changes.append(change)
    return trackers, changes


__all__ = ["SEARCH_MARGIN", "SEEN_AREA_SHARE", "Tracker", "random_trackers"]
