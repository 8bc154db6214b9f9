"""toyworld-play's first-block rollouts (`first_block.py`): targets put the object where the model's
sampler drew it or leaned, and the stage joins `train_play`'s seeded, resumable run."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.families.wan.loader import TOYWORLD_WEIGHTS, byte_level_tokenizer
from inferix.spec.presets import load_preset
from toyworld_lab.first_block import FirstBlockRollouts
from toyworld_lab.measure import read_frame
from toyworld_lab.play import Player, PlaySpec, key_row
from toyworld_lab.train import BlockSampler, LatentClips, LatentCodec, load_trained_vae
from toyworld_lab.train_play import PLAY_DIT_FILE, PlayConfig, base_latent_stats, train
from toyworld_lab.world import BACKGROUND

SPEC = PlaySpec("green", "square")
FRAMES = 3


@pytest.fixture(scope="module")
def rollouts() -> FirstBlockRollouts:
    """The first-block loss over one clip of SPEC, with toyworld's VAE (as the play trainer has it)."""
    preset = load_preset("toyworld-play")
    codec = LatentCodec.of(
        load_trained_vae(TOYWORLD_WEIGHTS, load_preset("toyworld")), *base_latent_stats(TOYWORLD_WEIGHTS)
    )
    empty = codec.encode(np.full((1, 1, 64, 64, 3), BACKGROUND, np.uint8))
    data = LatentClips(
        empty.expand(1, FRAMES, -1, -1, -1),
        [[SPEC.prompt()]],
        empty[0, 0].mean(dim=(1, 2), keepdim=True),
        key_rows=torch.zeros(1, FRAMES, 4),
    )
    tokenizer = byte_level_tokenizer(preset.text_encoder.text_len)
    return FirstBlockRollouts(data, BlockSampler.of(preset), codec, tokenizer, 1, 5.0, 1.0)


def block_at(x: float, y: float, keys: list[str]) -> np.ndarray:
    """uint8 [FRAMES, 64, 64, 3]: the simulator's block of SPEC from rest at (x, y) under `keys`."""
    player = Player.create(SPEC, random.Random(0), at=(x, y), size=6.0)
    return np.stack([player.frame(key_row(keys)) for _ in range(FRAMES)])


def centroids(rollouts: FirstBlockRollouts, target: torch.Tensor) -> list[tuple[float, float]]:
    frames = rollouts.codec.decode(target)[0]
    found = [read_frame(f).centroid for f in frames]
    assert all(c is not None for c in found)
    return [c for c in found if c is not None]


def rows(keys: list[str]) -> torch.Tensor:
    return torch.from_numpy(np.stack([key_row(keys)] * FRAMES))[None]


def test_the_target_starts_where_the_model_drew_the_object_and_follows_the_keys(rollouts: FirstBlockRollouts) -> None:
    drawn = rollouts.codec.encode(block_at(20.0, 40.0, [])[None])
    target = rollouts.targets(drawn, drawn[None], [SPEC.prompt()], rows(["right"]), seed=0)
    path = centroids(rollouts, target)
    assert abs(path[0][0] - 20.0) < 2.0 and abs(path[0][1] - 40.0) < 1.0  # a key's first frame: under 1.2 px
    assert path[0][0] < path[1][0] < path[2][0]  # pushed right, as the simulator does
    assert read_frame(rollouts.codec.decode(target)[0, 0]).colour == "green"


def test_an_empty_block_gets_its_object_where_the_path_leaned(rollouts: FirstBlockRollouts) -> None:
    empty = rollouts.codec.encode(np.full((1, FRAMES, 64, 64, 3), BACKGROUND, np.uint8))
    # The path's predictions held a faint object at (44, 12) that the last step lost.
    faint = rollouts.data.background + 0.3 * (
        rollouts.codec.encode(block_at(44.0, 12.0, [])[None]) - rollouts.data.background
    )
    target = rollouts.targets(empty, torch.stack([faint, faint, empty]), [SPEC.prompt()], rows([]), seed=0)
    for x, y in centroids(rollouts, target):
        assert abs(x - 44.0) <= 4.0 and abs(y - 12.0) <= 4.0  # the centre of the token it leaned to most


@pytest.mark.slow  # tiny training runs of the play trainer, three times
def test_the_first_block_stage_is_seeded_and_resumes_from_a_recovered_folder(tmp_path: Path) -> None:
    tiny = replace(
        PlayConfig(),
        clips=8,
        steps=2,
        batch=2,
        warmup_steps=2,
        recovery_steps=2,
        first_block_steps=2,
        first_block_rollouts=2,
    )
    train(tmp_path / "one", tiny)
    train(tmp_path / "recovered", replace(tiny, first_block_steps=0))
    train(tmp_path / "resumed", tiny, reuse_dit=tmp_path / "recovered", resume="first-block")
    one, recovered, resumed = (load_file(str(tmp_path / n / PLAY_DIT_FILE)) for n in ("one", "recovered", "resumed"))
    assert all(one[k].equal(resumed[k]) for k in one)
    assert not all(one[k].equal(recovered[k]) for k in one)  # the stage changed the DiT
