"""Matrix-Game 2.0 with TAEHV (its VAE is the Wan 2.1 VAE, so taew2_1 decodes its latents): the
sessions' frames are TAEHV's streamed decode of their latents, a restored session and a re-decode
decode alike, and the start image can be encoded by TAEHV's encoder instead of the VAE's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine.contract import to_uint8_frames
from engine.decoders.taehv import TAEHVLayout, load_taehv, random_taehv_state
from engine.families.matrixgame.conditioning import taehv_image_latents
from engine.families.matrixgame.engine import MatrixGameEngine, _pixels, fit_image
from engine.registry import load_engine
from inferix.errors import UserError
from inferix.spec.blocks import CommittedBlock
from inferix.spec.families.matrixgame import TINY_MODEL

BLOCKS = 3
SEED = 7


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("taehv") / "taew2_1.safetensors"
    save_file(random_taehv_state(TAEHVLayout(), seed=3), str(path))
    return path


@pytest.fixture(scope="module")
def engine(weights: Path) -> MatrixGameEngine:
    return MatrixGameEngine.load(TINY_MODEL, decoder=f"taehv:{weights}")


def _image() -> np.ndarray:
    return (np.random.default_rng(4).random((40, 64, 3)) * 255).astype(np.uint8)


def test_frames_are_taehvs_streamed_decode_of_the_latents(engine: MatrixGameEngine, weights: Path) -> None:
    with engine.open(_image(), num_blocks=BLOCKS, seed=SEED) as session:
        blocks = list(session)
    assert [b.frames.shape[0] for b in blocks] == [9, 12, 12]  # 1 + 4 (3 - 1), then 4 per latent frame
    taehv = load_taehv(weights)
    state = taehv.new_decode_state()
    for block in blocks:  # the sampler decodes the fp16-rounded latents, as with the VAE
        video = taehv.decode_stream(block.latents.half().float(), state) * 2 - 1
        assert np.array_equal(block.frames, to_uint8_frames(video))
    with MatrixGameEngine.load(TINY_MODEL).open(_image(), num_blocks=BLOCKS, seed=SEED) as vae_session:
        vae_blocks = list(vae_session)
    # Same latents (the decoder is not in the sampling loop), other pixels.
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(blocks, vae_blocks, strict=True))
    assert not np.array_equal(blocks[0].frames, vae_blocks[0].frames)


def test_a_restored_session_and_a_redecode_decode_with_taehv(engine: MatrixGameEngine) -> None:
    with engine.open(_image(), num_blocks=BLOCKS, seed=SEED) as session:
        whole = [session.next_block() for _ in range(BLOCKS)]
    committed: list[CommittedBlock] = [
        dataclasses.replace(b.committed(), action_keys=(), action_mouse=()) for b in whole
    ]
    with engine.open(_image(), num_blocks=BLOCKS, seed=SEED) as restored:
        assert restored.restore(committed[:2]) == [9, 12]
        assert np.array_equal(restored.next_block().frames, whole[2].frames)
        state = restored.new_redecode_state()
        assert all(np.array_equal(restored.redecode(c, state), b.frames) for b, c in zip(whole, committed, strict=True))


def test_the_start_image_can_be_encoded_by_taehv(weights: Path) -> None:
    engine = MatrixGameEngine.load(TINY_MODEL, decoder=f"taehv:{weights}", image_encoder="taehv")
    model = engine.model
    with engine.open(_image(), num_blocks=BLOCKS, seed=SEED) as session:
        cond = session.loop.conditioning.cond_concat
        first = next(iter(session))
    pixels = _pixels(fit_image(_image(), model.width, model.height))
    expected = taehv_image_latents(
        load_taehv(weights), pixels, BLOCKS * engine.pipeline.config.block.num_frame_per_block
    )
    assert torch.equal(cond[:, :, 4:], expected)  # after the 4 mask channels
    assert cond.shape[1] == expected.shape[1] == BLOCKS * 3
    with MatrixGameEngine.load(TINY_MODEL, decoder=f"taehv:{weights}").open(_image(), num_blocks=1, seed=SEED) as s:
        assert not torch.equal(s.next_block().latents, first.latents)  # the conditioning reached the DiT


def test_the_taehv_image_encoder_needs_a_taehv_decoder_file(weights: Path) -> None:
    with pytest.raises(UserError, match="image_encoder: taehv encodes with the TAEHV file"):
        MatrixGameEngine.load(TINY_MODEL, image_encoder="taehv")
    with pytest.raises(UserError, match="image_encoder: 'clip' is not one of vae, taehv"):
        MatrixGameEngine.load(TINY_MODEL, decoder=f"taehv:{weights}", image_encoder="clip")


def test_the_registry_loads_matrixgame_with_a_taehv_decoder(weights: Path) -> None:
    engine = load_engine(TINY_MODEL, decoder=f"taehv:{weights}")
    assert isinstance(engine, MatrixGameEngine) and engine.model.taehv is not None
