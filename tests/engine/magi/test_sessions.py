"""MAGI-1 behind the engine's front door: a released-layout folder in, chunks out, exactly as the
reference from the prompt text; restore from committed chunks; prompt changes; bad folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.contract import VideoBlock
from engine.families.magi.engine import MagiEngine, MagiSession
from engine.families.magi.pipeline import RecordedChunkNoise
from engine.registry import load_engine
from inferix.errors import UserError
from inferix.frames_digest import FramesDigest
from inferix.spec.blocks import CommittedBlock
from tests.conftest import GOLDEN_DIR
from tests.engine.magi.conftest import SECOND_PROMPT


def magi_engine(folder: Path) -> MagiEngine:
    engine = load_engine(folder)
    assert isinstance(engine, MagiEngine)
    return engine


def golden_prompt(case: str) -> str:
    return str(json.loads((GOLDEN_DIR / case / "config.json").read_text())["prompt"])


@pytest.mark.parametrize("case", ["magi1_tiny_distill", "magi1_tiny_cfg"])
def test_the_front_door_makes_the_reference_video_from_the_prompt_text(
    case: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    folder = request.getfixturevalue("magi_distill" if "distill" in case else "magi_cfg")
    engine = magi_engine(folder)
    golden = load_file(str(GOLDEN_DIR / case / "vae_decode.safetensors"))
    noise = load_file(str(GOLDEN_DIR / case / "inputs.safetensors"))["initial_noise"]
    chunks = noise.shape[2] // engine.model.preset.sampling.chunk_width
    prompt = golden_prompt(case)
    with engine.open(prompt, width=noise.shape[4] * 8, height=noise.shape[3] * 8, num_blocks=chunks) as video:
        video.loop.noise = RecordedChunkNoise(noise)  # the reference's single draw
        if case == "magi1_tiny_cfg":
            # Two of this prompt's words share a toy-tokenizer id, which no tokenizer file can express:
            # start from the reference's T5 output (the text path is checked by the distill case).
            text = load_file(str(GOLDEN_DIR / case / "text_case.safetensors"))
            video._embeds[prompt] = (text["caption_embs"][0, 0], text["emb_masks"][0])
            video._rows.clear()
        frames = np.concatenate([block.frames for block in video])
    reference = golden["video_uint8"].permute(0, 2, 3, 1).numpy()
    assert frames.shape == reference.shape
    levels = np.abs(frames.astype(np.int16) - reference.astype(np.int16))
    # Truncation to uint8: a value within ~1e-5 of an integer may land on the other side.
    assert levels.max() <= 1 and (levels > 0).mean() < 1e-3


def run_chunks(video: MagiSession, count: int) -> list[VideoBlock]:
    return [video.next_block() for _ in range(count)]


def roundtrip(block: VideoBlock) -> CommittedBlock:
    """What kvcache_svc stores and hands back."""
    return CommittedBlock.decode(block.committed().encode())


@pytest.mark.parametrize("restore_after", [1, 3, 7])
def test_a_session_restored_from_committed_chunks_continues_bit_identically(
    magi_distill: Path, restore_after: int
) -> None:
    engine = magi_engine(magi_distill)
    with engine.open("a red fox", seed=5, num_blocks=10) as video:
        made = run_chunks(video, 10)
    with engine.open("a red fox", seed=5, num_blocks=10, session_id="restored") as again:
        frames = again.restore([roundtrip(b) for b in made[:restore_after]])
        assert frames == [b.frames.shape[0] for b in made[:restore_after]]
        assert again.next_block_index == restore_after
        rest = list(again)
    assert [b.index for b in rest] == list(range(restore_after, 10))
    for ours, original in zip(rest, made[restore_after:], strict=True):
        assert torch.equal(ours.latents, original.latents)
        assert np.array_equal(ours.frames, original.frames)
        assert ours.first_frame == original.first_frame


def test_a_long_history_restored_in_pages_replays_only_the_look_back(magi_distill: Path) -> None:
    engine = magi_engine(magi_distill)
    with engine.open("a red fox", seed=9) as video:  # endless
        made = run_chunks(video, 9)
    with engine.open("a red fox", seed=9, session_id="paged") as again:
        again.restore([roundtrip(b) for b in made[:4]])
        again.restore([roundtrip(b) for b in made[4:8]], from_start=False)
        replayed = len(again._replay)
        following = again.next_block()
    assert replayed == 4 + 1  # the look-back of the released KV ranges (4 chunks), and the last chunk
    assert torch.equal(following.latents, made[8].latents)


def test_a_prompt_change_applies_from_the_next_chunk_and_survives_a_restore(magi_distill: Path) -> None:
    engine = magi_engine(magi_distill)
    with engine.open("a red fox", seed=2, num_blocks=6) as plain:
        unchanged = run_chunks(plain, 6)
    with engine.open("a red fox", seed=2, num_blocks=6) as video:
        changed = run_chunks(video, 2)
        video.set_prompt(SECOND_PROMPT)
        changed += run_chunks(video, 4)
    assert [b.prompt for b in changed] == ["a red fox"] * 2 + [SECOND_PROMPT] * 4
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(changed[:2], unchanged[:2], strict=True))
    assert not torch.equal(changed[2].latents, unchanged[2].latents)
    with engine.open("a red fox", seed=2, num_blocks=6, session_id="again") as again:
        again.restore([roundtrip(b) for b in changed[:4]])
        assert torch.equal(again.next_block().latents, changed[4].latents)


def test_generate_cli_writes_a_magi_video_with_the_sessions_frames(magi_distill: Path, tmp_path: Path) -> None:
    out = tmp_path / "magi.mp4"
    command = [sys.executable, "-m", "inferix_cli", "generate", "--model", str(magi_distill), "--prompt", "a red fox"]
    result = subprocess.run(
        [*command, "--blocks", "3", "--seed", "4", "--out", str(out), "--quiet", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    with magi_engine(magi_distill).open("a red fox", seed=4, num_blocks=3) as video:
        digest = FramesDigest()
        for block in video:
            digest.update_frames(block.frames)
    assert f"frames sha256 {digest.hexdigest()}" in result.stdout
    assert "36 frames 48x32 @ 24 fps" in result.stdout and out.stat().st_size > 0


def test_bad_folders_and_requests_get_one_line_errors(magi_distill: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(magi_distill, mixed)
    shard = mixed / "inference_weight.distill" / "model.safetensors"
    state = load_file(str(shard))
    state["patch_embedding.weight"] = torch.zeros(4, 16, 1, 2, 2)  # a Wan DiT's
    save_file(state, str(shard))
    with pytest.raises(UserError, match="holds Wan weights.*not MAGI-1"):
        load_engine(mixed)

    no_t5 = tmp_path / "no_t5"
    shutil.copytree(magi_distill, no_t5)
    shutil.rmtree(no_t5 / "t5")
    with pytest.raises(UserError, match="missing the T5 text encoder folder"):
        load_engine(no_t5)

    no_vae = tmp_path / "no_vae"
    shutil.copytree(magi_distill, no_vae)
    shutil.rmtree(no_vae / "vae")
    with pytest.raises(UserError, match="missing the VAE"):
        load_engine(no_vae)

    engine = magi_engine(magi_distill)
    with pytest.raises(UserError, match="multiples of 16"):
        engine.open("a red fox", width=40, height=32)
    with pytest.raises(UserError, match="at least 2 patches"):
        engine.open("a red fox", width=16, height=32)
    with pytest.raises(UserError, match="at least one chunk"):
        engine.open("a red fox", num_blocks=0)


def test_sharded_released_weights_load_and_broken_ones_are_named(magi_distill: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    shutil.copytree(magi_distill, sharded)
    folder = sharded / "inference_weight.distill"
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(folder / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = magi_engine(sharded).model.dit.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in names)

    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match="model-00002-of-00002.safetensors"):
        load_engine(sharded)

    missing = tmp_path / "missing"
    shutil.copytree(magi_distill, missing)
    shard = missing / "inference_weight.distill" / "model.safetensors"
    save_file({k: v for k, v in state.items() if k != "final_linear.linear.weight"}, str(shard))
    with pytest.raises(UserError, match=r"missing keys \['final_linear.linear.weight'\]"):
        load_engine(missing)

    fp8 = tmp_path / "fp8"
    shutil.copytree(magi_distill, fp8)
    (fp8 / "inference_weight.distill").rename(fp8 / "inference_weight.fp8.distill")
    (fp8 / "model.yaml").write_text("preset: magi1-tiny\nfiles: {dit: [inference_weight.fp8.distill]}\n")
    (fp8 / "magi_config.json").unlink()
    with pytest.raises(UserError, match="fp8 weights.*bf16"):
        load_engine(fp8)
