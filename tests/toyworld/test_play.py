"""Toyworld's player (`play.py`: arrow keys push one object) and the shipped toyworld-play model,
which must move the object the way a held key says within two blocks, read back from its pixels; and
its one-frame-block variant toyworld-play-1f, which runs the same weights."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import TOYWORLD_PLAY_WEIGHTS, TOYWORLD_WEIGHTS, load_wan_model, resolve_model_dir
from toyworld_lab.measure import read_frame
from toyworld_lab.play import (
    ACCELERATION,
    DIRECTIONS,
    FRICTION,
    KEYS,
    Player,
    PlaySpec,
    all_play_specs,
    held_keys,
    key_row,
    parse_play_prompt,
    play,
    pushed_from_rest,
    random_key_rows,
    random_play_clip,
)
from toyworld_lab.play_eval import BEAT_FRAMES, HOLD_BEATS, blocks_per_beat, make_trials, responsiveness
from toyworld_lab.train_play import PLAY_DIT_FILE

SPEC = PlaySpec("red", "ball")


def player_at(x: float = 32.0, y: float = 32.0) -> Player:
    return Player.create(SPEC, random.Random(0), at=(x, y), size=6.0)


@pytest.mark.parametrize("key", KEYS)
def test_a_held_key_accelerates_the_object_its_way(key: str) -> None:
    player = player_at()
    dx, dy = DIRECTIONS[key]
    moves = []
    for _ in range(3):
        before = (player.body.x, player.body.y)
        player.step(key_row([key]))
        moves.append((player.body.x - before[0]) * dx + (player.body.y - before[1]) * dy)
    assert moves[0] > 0 and moves[0] < moves[1] < moves[2]  # faster every frame
    assert sum(moves) > 3  # clearly moved within one block of 3 frames
    assert (player.body.x - 32) * dy == 0 and (player.body.y - 32) * dx == 0  # and only its way


@pytest.mark.parametrize("key", KEYS)
def test_pushed_from_rest_is_the_held_keys_acceleration_with_friction(key: str) -> None:
    expected, position, speed = [], 0.0, 0.0
    for _ in range(4):
        speed = (speed + ACCELERATION) * FRICTION
        position += speed
        expected.append(position)
    assert pushed_from_rest(key, 4) == pytest.approx(expected)
    assert pushed_from_rest(key, 3)[1] < 3.0 <= pushed_from_rest(key, 3)[2]  # 3 px in the third frame


def test_a_diagonal_pair_pushes_along_both_axes_and_opposite_keys_cancel() -> None:
    player = player_at()
    player.step(key_row(["up", "left"]))
    assert player.body.x < 32 and player.body.y < 32
    still = player_at()
    still.step(key_row(["left", "right"]))
    assert (still.body.x, still.body.y) == (32, 32)


def test_friction_stops_the_object_after_release() -> None:
    player = player_at(10.0)
    for _ in range(6):
        player.step(key_row(["right"]))
    fast = player.body.vx
    for _ in range(3):
        player.step(key_row([]))
    assert player.body.vx < 0.4 * fast  # a block after the release: a third of its speed
    for _ in range(12):
        player.step(key_row([]))
    assert abs(player.body.vx) < 0.05  # five blocks after: still


def test_walls_stop_the_object() -> None:
    player = player_at()
    for _ in range(60):
        player.step(key_row(["right", "down"]))
        assert player.body.x <= 64 - 6 and player.body.y <= 64 - 6
    assert (player.body.x, player.body.y, player.body.vx, player.body.vy) == (58, 58, 0, 0)
    player.step(key_row(["left"]))
    assert player.body.x < 58  # and it leaves the wall when pushed away


def test_a_frame_shows_the_key_held_in_it() -> None:
    keys = np.stack([key_row([])] * 3 + [key_row(["left"])] * 3)
    clip = play(SPEC, keys, random.Random(1))
    xs = [read_frame(f).centroid[0] for f in clip.frames]  # type: ignore[index]
    assert xs[0] == xs[1] == xs[2] > xs[3] > xs[4] > xs[5]  # at rest, then moving left from frame 3 on


def test_every_play_prompt_parses_back_to_its_scene() -> None:
    for spec in all_play_specs():
        assert parse_play_prompt(spec.prompt()) == spec
    assert parse_play_prompt("A Blue Square steered by the arrow keys") == PlaySpec("blue", "square")
    assert parse_play_prompt("a purple ball steered by the arrow keys") is None
    assert parse_play_prompt("two red balls steered by the arrow keys") is None
    assert parse_play_prompt("a red ball bouncing around") is None
    assert SPEC.change_prompt("green") == "the ball turns green"


def test_random_tracks_hold_no_key_single_keys_and_diagonal_pairs() -> None:
    rng = random.Random(0)
    rows = np.concatenate([random_key_rows(rng, 6) for _ in range(100)])
    assert rows.shape == (1800, len(KEYS)) and set(np.unique(rows)) == {0.0, 1.0}
    held = {len(held_keys(r)) for r in rows}
    assert held == {0, 1, 2}
    assert not any({"up", "down"} <= set(held_keys(r)) or {"left", "right"} <= set(held_keys(r)) for r in rows)
    clip = random_play_clip(random.Random(3), 6)
    assert clip.frames.shape == (18, 64, 64, 3) and clip.keys.shape == (18, 4) and len(clip.block_prompts) == 6


def test_shipped_play_weights_are_a_model_folder_of_a_few_megabytes() -> None:
    assert load_wan_model("toyworld-play").source == TOYWORLD_PLAY_WEIGHTS
    folder = resolve_model_dir(TOYWORLD_PLAY_WEIGHTS)
    assert folder.preset.name == "toyworld-play" and folder.dit.name == PLAY_DIT_FILE
    # Toyworld's VAE and its latent statistics: the fine-tune keeps them.
    assert folder.preset.vae.latent_std == resolve_model_dir(TOYWORLD_WEIGHTS).preset.vae.latent_std
    size = sum(p.stat().st_size for p in TOYWORLD_PLAY_WEIGHTS.rglob("*") if p.is_file())
    assert size < 5 * 2**20, f"{size / 2**20:.1f} MiB"


@pytest.mark.slow  # 48 trials of the trained model
@pytest.mark.parametrize(("model", "frames_per_block"), [("toyworld-play", 3), ("toyworld-play-1f", 1)])
def test_a_held_key_moves_the_object_its_way_within_six_frames(model: str, frames_per_block: int) -> None:
    """Issue 25: the object moves the held key's way in at least 90% of the trials. Before the
    first-block rollout stage (`toyworld_lab/first_block.py`) the model lost the object before the
    press in one trial in six, mostly in its first block, and passed 79%; the shipped model draws it
    in every trial of this set (README, *The toyworld-play model*). Issue 40: so does its one-frame
    variant, whose key applies from the very next frame, on the same trials."""
    engine = WanEngine(load_wan_model(model))
    assert blocks_per_beat(engine) * frames_per_block == BEAT_FRAMES and HOLD_BEATS == 2
    result = responsiveness(engine, make_trials(48, seed=0))
    assert result.share >= 0.9, result.summary()
    assert all(n >= 6 for _, n in result.per_key().values()), result.summary()  # every key is tested


def test_train_play_command_line_help() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "toyworld_lab.train_play", "--help"], capture_output=True, text=True, check=True
    )
    assert "--out" in shown.stdout and "--quick" in shown.stdout and "--branch-lr" in shown.stdout
    assert "--resume" in shown.stdout and "--first-block-steps" in shown.stdout
