"""The toyworld simulator and the pixel measurements that read its videos back."""

from __future__ import annotations

import random

import numpy as np
import pytest

from toyworld_lab.measure import dominant_colour, read_frame
from toyworld_lab.world import (
    PALETTE,
    SceneSpec,
    World,
    all_scene_specs,
    colour_word,
    frames_in_blocks,
    parse_prompt,
    simulate,
)


def test_every_scene_has_a_prompt_that_parses_back_to_it() -> None:
    specs = all_scene_specs()
    assert len(specs) == len(PALETTE) * 2 * 2 * 4
    for spec in specs:
        assert parse_prompt(spec.prompt()) == spec
        assert colour_word(spec.prompt()) == spec.colour
        assert colour_word(spec.change_prompt("green")) == "green"
    assert parse_prompt("two blue squares falling") == SceneSpec("blue", "square", 2, "falling")
    assert parse_prompt("a purple ball bouncing around") is None  # not a palette colour
    assert colour_word("a red and blue ball") is None  # ambiguous


def test_bodies_stay_inside_the_frame_for_a_minute() -> None:
    rng = random.Random(3)
    for spec in all_scene_specs()[::5]:
        world = World.create(spec, rng)
        for _ in range(16 * 60):
            world.step()
            for body in world.bodies:
                assert body.size - 1e-6 <= body.x <= world.width - body.size + 1e-6
                assert body.size - 1e-6 <= body.y <= world.height - body.size + 1e-6


def test_falling_objects_accelerate_down_and_bouncing_ones_keep_their_direction() -> None:
    rng = random.Random(0)
    falling = World.create(SceneSpec("red", "ball", 1, "falling"), rng)
    y0 = falling.bodies[0].y
    for _ in range(5):
        falling.step()
    assert falling.bodies[0].y > y0 and falling.bodies[0].vy > 0
    right = World.create(SceneSpec("red", "ball", 1, "bouncing to the right"), rng)
    x0 = right.bodies[0].x
    right.step()
    assert right.bodies[0].x > x0


def test_a_rendered_frame_reads_back_as_its_colour_position_and_area() -> None:
    rng = random.Random(1)
    for colour in PALETTE:
        world = World.create(SceneSpec(colour, "ball", 1, "bouncing around"), rng)
        reading = read_frame(world.render())
        body = world.bodies[0]
        assert reading.colour == colour and reading.present
        assert reading.centroid is not None
        assert abs(reading.centroid[0] - body.x) < 0.6 and abs(reading.centroid[1] - body.y) < 0.6
        assert abs(reading.area - world.object_area()) < 0.25 * world.object_area()
    empty = np.full((64, 64, 3), 18, np.uint8)
    assert not read_frame(empty).present and dominant_colour(empty[None]) is None


def test_a_colour_change_applies_from_the_first_frame_of_its_block() -> None:
    spec = SceneSpec("red", "square", 2, "falling")
    clip = simulate(spec, 4, random.Random(2), changes={2: "cyan"})
    counts = frames_in_blocks(4, 3)
    assert counts == [3, 3, 3, 3] and clip.frames.shape == (12, 64, 64, 3)  # the model's VAE: 1 frame per latent
    assert frames_in_blocks(4, 3, temporal_factor=4) == [9, 12, 12, 12]  # Wan2.1's first-frame rule
    assert clip.block_prompts == [spec.prompt()] * 2 + ["the squares turn cyan"] * 2
    assert clip.block_colours == ["red", "red", "cyan", "cyan"]
    first_changed = sum(counts[:2])
    assert dominant_colour(clip.frames[:first_changed]) == "red"
    assert dominant_colour(clip.frames[first_changed:]) == "cyan"


def test_simulation_is_seeded() -> None:
    spec = SceneSpec("blue", "ball", 2, "bouncing around")
    a = simulate(spec, 3, random.Random(9))
    b = simulate(spec, 3, random.Random(9))
    c = simulate(spec, 3, random.Random(10))
    assert np.array_equal(a.frames, b.frames)
    assert not np.array_equal(a.frames, c.frames)


def test_invalid_scenes_are_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="not one of red"):
        SceneSpec("purple", "ball", 1, "falling")
    with pytest.raises(ValueError, match="count must be 1 or 2"):
        SceneSpec("red", "ball", 3, "falling")
