"""`decoder:` / `--decoder`: TAEHV decodes a Wan-latent model's sessions, their restore and re-decode alike."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import save_file

from engine.decoders.taehv import TAEHVDecoder, TAEHVLayout, random_taehv_state
from engine.families.wan.engine import WanEngine
from engine.families.wan.vae import WanVAE
from inferix.errors import UserError
from inferix.spec.decoders import DecoderChoice, decoder_identity, parse_decoder
from inferix.spec.presets import load_preset


@pytest.fixture(scope="module")
def taehv_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("taehv") / "taew2_1.safetensors"
    save_file(random_taehv_state(TAEHVLayout(), seed=7), str(path))
    return path


def _sha(frames: list[np.ndarray]) -> str:
    return hashlib.sha256(b"".join(f.tobytes() for f in frames)).hexdigest()


def test_spellings() -> None:
    assert parse_decoder("vae", "x") == DecoderChoice()
    assert parse_decoder("taehv:w.pth", "x", relative_to=Path("/models/m")) == DecoderChoice(
        "taehv", Path("/models/m/w.pth")
    )
    assert parse_decoder("taehv:/abs/w.pth", "x", relative_to=Path("/m")).path == Path("/abs/w.pth")
    for bad in ("taehv", "taehv:", "tae:x.pth", "wan"):
        with pytest.raises(UserError, match="unknown decoder"):
            parse_decoder(bad, "--decoder")
    preset = load_preset("tiny", {"decoder": "taehv:w.pth"})
    assert preset.decoder == "taehv:w.pth" and load_preset("tiny").decoder == "vae"


def test_a_sessions_recorded_decoder_is_the_weights_content_not_their_path(tmp_path: Path, taehv_file: Path) -> None:
    copy = tmp_path / "elsewhere.safetensors"
    copy.write_bytes(taehv_file.read_bytes())
    other = tmp_path / "other.safetensors"
    save_file(random_taehv_state(TAEHVLayout(), seed=99), str(other))
    recorded = decoder_identity(DecoderChoice("taehv", taehv_file))
    assert recorded == "taehv:sha256:" + hashlib.sha256(taehv_file.read_bytes()).hexdigest()[:16]
    assert decoder_identity(DecoderChoice("taehv", copy)) == recorded
    assert decoder_identity(DecoderChoice("taehv", other)) != recorded
    assert decoder_identity(DecoderChoice()) == "vae"


def test_a_restored_session_decodes_with_taehv_as_the_uninterrupted_one(taehv_file: Path) -> None:
    engine = WanEngine.load("tiny", decoder=f"taehv:{taehv_file}")
    assert isinstance(engine.model.decoder, TAEHVDecoder) and isinstance(engine.model.vae, WanVAE)
    with engine.open("a red ball", num_blocks=3, seed=3, session_id="a") as session:
        blocks = list(session)
    assert [b.frames.shape[0] for b in blocks] == [9, 12, 12]  # 1 + 4 (3 - 1), then 4 per latent frame
    assert blocks[0].frames.shape[1:] == (128, 128, 3)
    resumed = engine.open("a red ball", num_blocks=3, seed=3, session_id="b")
    assert resumed.restore([b.committed() for b in blocks[:2]]) == [9, 12]
    last = resumed.next_block()
    assert _sha([last.frames]) == _sha([blocks[2].frames])
    state = resumed.new_redecode_state()  # a restarted streamer's backfill
    assert _sha([resumed.redecode(b.committed(), state) for b in blocks]) == _sha([b.frames for b in blocks])
    resumed.close()
    with WanEngine.load("tiny").open("a red ball", num_blocks=1, seed=3) as vae_session:
        assert not np.array_equal(next(iter(vae_session)).frames, blocks[0].frames)  # the decoder did change


def test_latents_taehv_cannot_decode_are_refused_when_the_model_loads(tmp_path: Path, taehv_file: Path) -> None:
    with pytest.raises(UserError, match="TAEHV decodes Wan VAE latents"):
        WanEngine.load("toyworld", decoder=f"taehv:{taehv_file}")  # a patch autoencoder's 8 channels
    wide = tmp_path / "taew2_2.safetensors"
    save_file(random_taehv_state(TAEHVLayout(48, 2)), str(wide))
    with pytest.raises(UserError, match="48-channel latents at 16x space"):
        WanEngine.load("tiny", decoder=f"taehv:{wide}")
