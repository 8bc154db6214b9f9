"""The oracle of the rollout stage: a simulator world that follows what the model draws."""

from __future__ import annotations

import copy
import random

import numpy as np

from toyworld_lab.measure import read_frame
from toyworld_lab.oracle import Tracker, random_trackers
from toyworld_lab.world import PALETTE, SceneSpec

SPEC = SceneSpec("red", "ball", 1, "bouncing around")


def tracker(seed: int = 0, spec: SceneSpec = SPEC) -> Tracker:
    return Tracker.create(spec, random.Random(seed), 64, 64)


def test_the_simulators_own_frames_keep_the_tracker_on_the_simulators_path() -> None:
    oracle = tracker()
    reference = copy.deepcopy(oracle.world)
    for _ in range(12):
        block = oracle.target_block(3)
        for frame in block:
            ours, truth = read_frame(frame), read_frame(reference.render())
            reference.step()
            assert abs(ours.area - truth.area) <= 0.05 * truth.area
            assert ours.centroid is not None and truth.centroid is not None
            # Positions are read back from thresholded pixels: a sub-pixel error per block.
            assert np.allclose(ours.centroid, truth.centroid, atol=0.5)
        assert oracle.observe(block) == 1


def drawn(oracle: Tracker, dx: float, dy: float) -> np.ndarray:
    """A block whose last frame shows the tracker's bodies moved by (dx, dy): the model drawing them elsewhere."""
    world = copy.deepcopy(oracle.world)
    world.bodies = copy.deepcopy(oracle.last_frame_bodies)
    for body in world.bodies:
        body.x, body.y = body.x + dx, body.y + dy
    return np.stack([world.render()] * 3)


def test_an_object_drawn_elsewhere_moves_the_targets_with_it() -> None:
    oracle = tracker(seed=1)
    oracle.target_block(3)
    predicted = read_frame(oracle.target_block(3)[0]).centroid  # where the next block would start
    oracle = tracker(seed=1)
    oracle.target_block(3)
    dx = 4.0 if oracle.last_frame_bodies[0].x < 32 else -4.0  # away from the nearer wall: no bounce
    assert oracle.observe(drawn(oracle, dx, 0.0)) == 1
    moved = read_frame(oracle.target_block(3)[0]).centroid
    assert moved is not None and predicted is not None
    assert abs(moved[0] - predicted[0] - dx) < 0.5 and abs(moved[1] - predicted[1]) < 0.5
    # Still the simulator's object: its size and colour, not the model's.
    assert read_frame(oracle.target_block(3)[0]).colour == "red"


def test_an_object_the_model_lost_is_drawn_on_where_the_simulator_puts_it() -> None:
    oracle = tracker(seed=2)
    reference = copy.deepcopy(oracle.world)
    oracle.target_block(3)
    empty = np.zeros((3, 64, 64, 3), np.uint8) + np.array([18, 18, 28], np.uint8)
    assert oracle.observe(empty) == 0
    for _ in range(3):
        reference.step()
    continued = oracle.target_block(3)
    assert np.array_equal(continued[0], reference.render())
    area = read_frame(continued[0]).area
    assert abs(area - reference.object_area()) < 0.15 * reference.object_area()


def test_two_objects_are_followed_separately() -> None:
    oracle = tracker(seed=3, spec=SceneSpec("blue", "square", 2, "bouncing to the right"))
    oracle.target_block(3)
    before = [(b.x, b.y) for b in oracle.last_frame_bodies]
    # Only the left object is drawn two pixels lower: the right one must stay where it was.
    left = int(np.argmin([x for x, _ in before]))
    world = copy.deepcopy(oracle.world)
    world.bodies = copy.deepcopy(oracle.last_frame_bodies)
    world.bodies[left].y += 2
    assert oracle.observe(np.stack([world.render()] * 3)) == 2
    after = [(b.x, b.y) for b in oracle.last_frame_bodies]
    assert abs(after[left][1] - before[left][1] - 2) < 0.5 and abs(after[left][0] - before[left][0]) < 0.5
    assert np.allclose(after[1 - left], before[1 - left], atol=0.5)


def test_random_trackers_are_seeded_and_change_colour_after_the_first_blocks() -> None:
    trackers, changes = random_trackers(random.Random(5), 40, blocks=8, change_probability=0.5)
    again, changes_again = random_trackers(random.Random(5), 40, blocks=8, change_probability=0.5)
    assert [t.prompt for t in trackers] == [t.prompt for t in again] and changes == changes_again
    assert 5 < sum(bool(c) for c in changes) < 35
    for oracle, change in zip(trackers, changes, strict=True):
        for block, colour in change.items():
            assert 2 <= block < 8 and colour in PALETTE and colour != oracle.world.colour
            oracle.change_colour(colour)
            assert oracle.world.colour == colour and colour in oracle.prompt
