"""Training the toyworld model: seeded, in stages, and the result is an ordinary model folder."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import load_file

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model, resolve_model_dir
from toyworld_lab.evaluate import generate_blocks, video_stats
from toyworld_lab.train import TrainConfig, train

WEIGHT_FILES = ("toyworld_dit.safetensors", "toyworld_vae.safetensors", "toyworld_text_encoder.safetensors")
TINY_RUN = TrainConfig(
    threads=1,
    vae_steps=3,
    vae_batch=2,
    dit_clips=8,
    dit_steps=3,
    dit_batch=2,
    warmup_steps=2,
    recovery_steps=2,
    oracle_steps=2,
    oracle_rounds=2,
    oracle_scenes=2,
    oracle_blocks=5,
)


def weights(folder: Path) -> dict[str, dict]:
    return {name: load_file(str(folder / name)) for name in WEIGHT_FILES}


def same(a: dict[str, dict], b: dict[str, dict]) -> bool:
    return all(a[n].keys() == b[n].keys() and all(a[n][k].equal(b[n][k]) for k in a[n]) for n in a)


@pytest.mark.slow  # four tiny training runs
def test_training_is_seeded_and_two_stages_equal_one_run(tmp_path: Path) -> None:
    train(tmp_path / "one", TINY_RUN)
    train(tmp_path / "again", TINY_RUN)
    assert same(weights(tmp_path / "one"), weights(tmp_path / "again"))
    train(tmp_path / "staged", TINY_RUN, vae_only=True)
    assert [p.name for p in (tmp_path / "staged").iterdir()] == ["toyworld_vae.safetensors"]
    first_two = replace(TINY_RUN, recovery_steps=0, oracle_steps=0)
    train(tmp_path / "staged", first_two, reuse_vae=tmp_path / "staged")
    assert not same(weights(tmp_path / "one"), weights(tmp_path / "staged"))  # the later stages changed the DiT
    train(tmp_path / "resumed", TINY_RUN, reuse_dit=tmp_path / "staged")
    assert same(weights(tmp_path / "one"), weights(tmp_path / "resumed"))
    train(tmp_path / "staged", TINY_RUN, reuse_dit=tmp_path / "staged")  # in place
    assert same(weights(tmp_path / "one"), weights(tmp_path / "staged"))
    train(tmp_path / "other", replace(TINY_RUN, seed=1))
    assert not same(weights(tmp_path / "one"), weights(tmp_path / "other"))


@pytest.mark.slow  # a tiny training run first
def test_a_trained_folder_loads_like_any_model_and_generates(tmp_path: Path) -> None:
    train(tmp_path / "model", TINY_RUN)
    folder = resolve_model_dir(tmp_path / "model")
    assert folder.preset.name == "toyworld" and folder.dit.name == "toyworld_dit.safetensors"
    size = sum(p.stat().st_size for p in (tmp_path / "model").rglob("*") if p.is_file())
    assert size < 5 * 2**20  # fp16 weights: a few MB
    model = load_wan_model(tmp_path / "model")
    assert model.vae.config.latent_std == folder.preset.vae.latent_std != (1.0,) * 8  # measured stats
    generator = WanEngine(model)
    blocks = generate_blocks(generator, "a red ball falling", 2, seed=0, changes={1: "the ball turns green"})
    assert [b.shape for b in blocks] == [(3, 64, 64, 3)] * 2  # 3 frames per block: no time compression
    stats = video_stats(blocks, ["red", "green"])
    assert [s.first_frame for s in stats] == [0, 3]


def test_train_command_line_help_and_bad_arguments(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "toyworld_lab.train"]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True)
    assert "--out" in shown.stdout and "--vae-only" in shown.stdout and "--reuse-vae" in shown.stdout
    missing = subprocess.run(run, capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "--out" in missing.stderr
    no_vae = subprocess.run(
        [*run, "--out", str(tmp_path), "--reuse-vae", str(tmp_path)], capture_output=True, text=True
    )
    assert no_vae.returncode == 2 and "no toyworld_vae.safetensors" in no_vae.stderr
