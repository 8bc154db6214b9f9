"""MAGI-1 ViT VAE decoder: parity with the reference decode (golden magi1_* folders), tiling, loading errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from engine.families.magi.vae import (
    MagiVAEDecoder,
    ViTVAEConfig,
    load_magi_vae,
    to_uint8_frames,
)
from inferix.errors import CheckpointError, UserError
from tests.conftest import GOLDEN_DIR

CASES = ["magi1_tiny_distill", "magi1_tiny_cfg"]

# Measured fp32 max abs diffs vs. the reference (CPU sgemm rounding, ~1 ulp): 3.6e-7 (chunk 0, both cases),
# 4.8e-7 (tiled case); per-frame channel sums 8.0e-6 (distill) / 3.4e-6 (cfg). Limits leave ~4x headroom.
RAW_ATOL = 2e-6
FRAME_SUM_ATOL = 5e-5
# uint8 frames: 0 (distill) and 1 pixel (cfg) off by one, where a value sits on an integer boundary.
MAX_PIXELS_OFF = 8
# bf16 weights vs. the fp32 golden, chunk 0: measured 0.018 (distill) / 0.013 (cfg).
BF16_ATOL = 0.08


def case_dir(case: str) -> Path:
    folder = GOLDEN_DIR / case
    if not (folder / "vae_decode.safetensors").is_file():
        pytest.skip(f"golden folder {case} is not present")
    return folder


def golden(case: str) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, Tensor]]:
    """(config.json, vae_decode.safetensors, pipeline.safetensors) of one golden folder."""
    folder = case_dir(case)
    config = json.loads((folder / "config.json").read_text())
    return config, load_file(str(folder / "vae_decode.safetensors")), load_file(str(folder / "pipeline.safetensors"))


def vae_config(config: dict[str, Any]) -> ViTVAEConfig:
    runtime = config["magi_config"]["runtime_config"]
    return ViTVAEConfig.from_ddconfig(config["vae_config"], scale_factor=runtime["scale_factor"], fps=runtime["fps"])


def load_case(case: str) -> tuple[MagiVAEDecoder, dict[str, Any], dict[str, Tensor], dict[str, Tensor]]:
    config, decoded, pipeline = golden(case)
    model = load_magi_vae(case_dir(case) / "vae.safetensors", vae_config(config))
    return model, config, decoded, pipeline


def max_diff(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item()


def pixels_off(ours: np.ndarray, reference: Tensor) -> np.ndarray:
    """|ours - reference| per value; ``reference`` is the golden ``[F, 3, H, W]`` uint8 video."""
    theirs = reference.permute(0, 2, 3, 1).numpy()
    assert ours.shape == theirs.shape and ours.dtype == np.uint8
    return np.abs(ours.astype(np.int16) - theirs.astype(np.int16))


# ---- config -------------------------------------------------------------------------------------------------
def test_config_from_golden_ddconfig() -> None:
    config, _, _ = golden("magi1_tiny_distill")
    cfg = vae_config(config)
    assert (cfg.z_chans, cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.unpatch_channels) == (16, 256, 1, 4, 1)
    assert cfg.pos_grid == (2, 4, 4)
    assert cfg.scale_factor == 0.18215
    # fps 24 -> 12-frame (3-latent) time tiles; 256 px tiles at stride 24 latents, 64 px blend, 192 px kept
    assert (cfg.tile_latent_frames, cfg.tile_latent_size, cfg.tile_stride) == (3, 32, 24)
    assert (cfg.blend_pixels, cfg.crop_pixels) == (64, 192)
    assert ViTVAEConfig.from_ddconfig(config["vae_config"]["ddconfig"], fps=32).tile_latent_frames == 4


def test_pixel_frames_per_chunk_width() -> None:
    config, _, _ = golden("magi1_tiny_distill")
    cfg = vae_config(config)
    assert [cfg.pixel_frames(n) for n in (1, 2, 3, 4, 5, 6)] == [1, 8, 12, 13, 20, 24]


@pytest.mark.parametrize(
    ("flag", "value"), [("use_rope", True), ("use_final_proj", True), ("ln_in_attn", False), ("with_cls_token", False)]
)
def test_unsupported_ddconfig_is_a_user_error(flag: str, value: bool) -> None:
    config, _, _ = golden("magi1_tiny_distill")
    ddconfig = {**config["vae_config"]["ddconfig"], flag: value}
    with pytest.raises(UserError, match=flag):
        ViTVAEConfig.from_ddconfig(ddconfig)


# ---- golden parity ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_state_dict_names_equal_the_reference(case: str) -> None:
    model, _, _, _ = load_case(case)
    reference = load_file(str(case_dir(case) / "vae.safetensors"))
    ours = model.state_dict()
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in reference)


@pytest.mark.parametrize("case", CASES)
def test_chunk0_decode(case: str) -> None:
    model, config, decoded, pipeline = load_case(case)
    z = pipeline["clean_chunk0"] / config["magi_config"]["runtime_config"]["scale_factor"]
    assert torch.equal(z, decoded["vae_in_chunk0"])  # the input really is chunk 0 / scale_factor
    # chunk 0 fits in one tile: the tiled decode is the plain decode
    assert max_diff(model.tiled_decode(z), decoded["video_raw_chunk0"]) <= RAW_ATOL
    assert max_diff(model.decode_tile(z), decoded["video_raw_chunk0"]) <= RAW_ATOL


@pytest.mark.parametrize("case", CASES)
def test_whole_video_chunk_by_chunk(case: str) -> None:
    model, config, decoded, pipeline = load_case(case)
    latents, cw = pipeline["latents"], config["magi_config"]["runtime_config"]["chunk_width"]
    chunks = [latents[:, :, s : s + cw] for s in range(0, latents.shape[2], cw)]

    frames = [model.decode_chunk(chunk) for chunk in chunks]
    assert [len(f) for f in frames] == config["video"]["frames_per_chunk"]
    assert all(len(f) == model.config.pixel_frames(cw) for f in frames)
    off = pixels_off(np.concatenate(frames), decoded["video_uint8"])
    assert off.max() <= 1 and np.count_nonzero(off) <= MAX_PIXELS_OFF

    raw = torch.cat([model.tiled_decode(chunk / model.config.scale_factor) for chunk in chunks], dim=2)
    sums = raw[0].double().sum(dim=(2, 3)).T  # [F, 3]
    assert max_diff(sums, decoded["video_raw_frame_channel_sum"]) <= FRAME_SUM_ATOL


def test_spatial_and_temporal_tiling() -> None:
    model, _, decoded, _ = load_case("magi1_tiny_cfg")
    z = decoded["vae_tiled_in"]  # [1, 16, 4, 33, 1]: time tiles 3 + 1, row tiles at 0 and 24 (blended over 64 px)
    raw = model.tiled_decode(z)
    assert max_diff(raw, decoded["vae_tiled_raw"]) <= RAW_ATOL
    off = pixels_off(to_uint8_frames(raw), decoded["vae_tiled_uint8"])
    assert off.max() <= 1 and np.count_nonzero(off) <= MAX_PIXELS_OFF
    # the tiles are not decoded as one piece: that would be a different (untiled) result
    assert max_diff(model.decode_tile(z[:, :, :3]), raw[:, :, :12]) > 0.1  # measured 0.55


def test_bf16_weights_decode_close_to_fp32() -> None:
    config, decoded, _ = golden("magi1_tiny_distill")
    model = load_magi_vae(case_dir("magi1_tiny_distill") / "vae.safetensors", vae_config(config), torch.bfloat16)
    assert model.decoder.proj_in.weight.dtype == torch.bfloat16
    raw = model.tiled_decode(decoded["vae_in_chunk0"])
    assert raw.dtype == torch.float32
    assert max_diff(raw, decoded["video_raw_chunk0"]) <= BF16_ATOL


# ---- loading ------------------------------------------------------------------------------------------------
def write_vae_folder(folder: Path, case: str, state: dict[str, Tensor]) -> Path:
    """The released ckpt/vae layout: config.json (ViTVAE config) + diffusion_pytorch_model.safetensors."""
    config, _, _ = golden(case)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config["vae_config"]))
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    return folder


def test_released_folder_layout_ignores_encoder_weights(tmp_path: Path) -> None:
    reference = load_file(str(case_dir("magi1_tiny_cfg") / "vae.safetensors"))
    encoder = {"encoder.proj_in.weight": torch.zeros(4, 4), "encoder.blocks.0.attn.qkv.bias": torch.zeros(3)}
    folder = write_vae_folder(tmp_path / "vae", "magi1_tiny_cfg", {**reference, **encoder})
    model = load_magi_vae(folder)
    assert model.config.tile_latent_frames == 3
    assert model.state_dict().keys() == reference.keys()
    _, decoded, _ = golden("magi1_tiny_cfg")
    assert max_diff(model.tiled_decode(decoded["vae_in_chunk0"]), decoded["video_raw_chunk0"]) <= RAW_ATOL


def test_missing_key_names_the_file_and_the_key(tmp_path: Path) -> None:
    state = load_file(str(case_dir("magi1_tiny_distill") / "vae.safetensors"))
    del state["decoder.last_layer.bias"]
    path = tmp_path / "vae.safetensors"
    save_file(state, str(path))
    config, _, _ = golden("magi1_tiny_distill")
    with pytest.raises(UserError, match="1 missing keys") as error:
        load_magi_vae(path, vae_config(config))
    assert str(path) in str(error.value) and "decoder.last_layer.bias" in str(error.value)
    assert isinstance(error.value, CheckpointError)


def test_unexpected_key_is_an_error(tmp_path: Path) -> None:
    state = load_file(str(case_dir("magi1_tiny_distill") / "vae.safetensors"))
    state["decoder.final_proj.weight"] = torch.zeros(2, 2)
    folder = write_vae_folder(tmp_path / "vae", "magi1_tiny_distill", state)
    with pytest.raises(UserError, match=r"1 unexpected keys \[decoder\.final_proj\.weight\]"):
        load_magi_vae(folder)


def test_single_file_needs_a_config(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="ViTVAEConfig"):
        load_magi_vae(case_dir("magi1_tiny_distill") / "vae.safetensors")


def test_folder_without_weights_names_the_file(tmp_path: Path) -> None:
    config, _, _ = golden("magi1_tiny_distill")
    folder = tmp_path / "vae"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config["vae_config"]))
    with pytest.raises(UserError, match="diffusion_pytorch_model.safetensors"):
        load_magi_vae(folder)
