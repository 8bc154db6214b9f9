"""Wan2.1 VAE: golden parity with the reference decode, exact streaming, encoder sanity, input errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from engine.families.wan.autoencoders import load_vae
from engine.families.wan.vae import WanVAE, to_unit_range
from inferix.errors import CheckpointError
from inferix.spec.architectures import WanVAEConfig
from tests.conftest import GOLDEN_CASES, GOLDEN_DIR

TINY = WanVAEConfig(dim=4, num_res_blocks=1)


def test_every_wan_golden_case_is_present() -> None:
    assert GOLDEN_CASES == ["causvid_tiny", "longlive_tiny", "selfforcing_tiny_global", "selfforcing_tiny_rolling"]


def read_golden(case: str) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config.json, outputs.safetensors) of one golden folder."""
    folder = GOLDEN_DIR / case
    config = json.loads((folder / "config.json").read_text())
    return config, load_file(str(folder / "outputs.safetensors"))


def tiny_model(seed: int = 0, config: WanVAEConfig = TINY) -> WanVAE:
    """Random tiny VAE; norm gammas and biases are re-drawn so their defaults (1, 0) hide no bug."""
    torch.manual_seed(seed)
    model = WanVAE(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_decode_one_shot_and_streaming(case: str) -> None:
    config, outputs = read_golden(case)
    model = load_vae(GOLDEN_DIR / case / "vae.safetensors", WanVAEConfig.from_dict(config["vae"]))
    latents = outputs["latents"]
    block = config["pipeline"]["num_frame_per_block"]

    one_shot = model.decode(latents)
    state = model.new_decode_state()
    chunks = [model.decode_block(latents[:, s : s + block], state) for s in range(0, latents.shape[1], block)]
    streamed = torch.cat(chunks, dim=1)

    assert [c.shape[1] for c in chunks] == config["video"]["stream_frames_per_block"]
    assert torch.equal(streamed, one_shot)
    vae_cfg = config["vae"]
    assert one_shot.shape == (1, vae_cfg["pixel_frames"], 3, vae_cfg["pixel_h"], vae_cfg["pixel_w"])

    video = to_unit_range(one_shot)
    first_block, last_frames = outputs["video_first_block"], outputs["video_last_latent_frame"]
    assert (video[:, : first_block.shape[1]] - first_block).abs().max().item() <= 1e-5
    assert (video[:, -last_frames.shape[1] :] - last_frames).abs().max().item() <= 1e-5
    sums = video[0].double().sum(dim=(-2, -1))
    assert (sums - outputs["video_frame_channel_sum"]).abs().max().item() <= 1e-3


def test_streaming_is_exact_for_any_block_split() -> None:
    model = tiny_model()
    latents = torch.randn(2, 7, 16, 3, 5)
    state = model.new_decode_state()
    chunks = [model.decode_block(latents[:, a:b], state) for a, b in ((0, 2), (2, 3), (3, 7))]
    assert [c.shape[1] for c in chunks] == [5, 4, 16]
    assert state.latent_frames == 7
    assert torch.equal(torch.cat(chunks, dim=1), model.decode(latents))


def test_first_latent_frame_decodes_alone() -> None:
    """First-frame rule: frame 0's pixels never depend on later latent frames."""
    model = tiny_model()
    latents = torch.randn(1, 3, 16, 2, 2)
    assert torch.equal(model.decode(latents[:, :1]), model.decode(latents)[:, :1])


def test_encode_shapes_causality_and_round_trip() -> None:
    model = tiny_model()
    video = torch.rand(1, 5, 3, 16, 24) * 2 - 1
    latents = model.encode(video)
    assert latents.shape == (1, 2, 16, 2, 3)
    assert torch.isfinite(latents).all()
    # Causal encoder: a prefix of the video encodes to a prefix of the latents.
    torch.testing.assert_close(model.encode(video[:, :1]), latents[:, :1], rtol=0, atol=1e-6)
    decoded = model.decode(latents)
    assert decoded.shape == video.shape
    assert decoded.abs().max() <= 1.0


def test_config_from_dict_ignores_descriptive_keys() -> None:
    config, _ = read_golden("causvid_tiny")
    cfg = WanVAEConfig.from_dict(config["vae"])
    assert (cfg.dim, cfg.num_res_blocks, cfg.dim_mult) == (4, 1, (1, 2, 4, 4))
    assert cfg.latent_mean == WanVAEConfig().latent_mean
    assert (cfg.temporal_factor, cfg.spatial_factor) == (4, 8)


def test_default_config_has_the_wan21_checkpoint_layout() -> None:
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in WanVAE().state_dict().items()}
    assert shapes["decoder.conv1.weight"] == (384, 16, 3, 3, 3)
    assert shapes["decoder.upsamples.3.time_conv.weight"] == (768, 384, 3, 1, 1)
    assert shapes["decoder.upsamples.3.resample.1.weight"] == (192, 384, 3, 3)
    assert shapes["decoder.upsamples.4.shortcut.weight"] == (384, 192, 1, 1, 1)
    assert shapes["decoder.head.2.weight"] == (3, 96, 3, 3, 3)
    assert shapes["encoder.downsamples.5.time_conv.weight"] == (192, 192, 3, 1, 1)
    assert shapes["encoder.head.2.weight"] == (32, 384, 3, 3, 3)
    assert shapes["conv1.weight"] == (32, 32, 1, 1, 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"latent_mean": (0.0,) * 3}, "latent_mean"),
        ({"temperal_downsample": (True,)}, "temperal_downsample"),
        ({"dim": 0}, "dim"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"WanVAEConfig.{field}"):
        WanVAEConfig(**kwargs)


def test_bad_decode_inputs_name_the_parameter() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="latents must be .*5 dims"):
        model.decode(torch.zeros(1, 16, 2, 2))
    with pytest.raises(ValueError, match="z_dim=16 channels"):
        model.decode(torch.zeros(1, 16, 3, 2, 2))  # [B, C, F, h, w] by mistake
    with pytest.raises(ValueError, match="non-empty float"):
        model.decode(torch.zeros(1, 2, 16, 2, 2, dtype=torch.int64))
    state = model.new_decode_state()
    model.decode_block(torch.zeros(1, 1, 16, 2, 2), state)
    with pytest.raises(ValueError, match="new_decode_state"):
        model.decode_block(torch.zeros(1, 1, 16, 2, 3), state)
    with pytest.raises(ValueError, match="another config"):
        model.decode_block(torch.zeros(1, 1, 16, 2, 2), WanVAE(WanVAEConfig(dim=4)).new_decode_state())


def test_bad_encode_inputs_name_the_parameter() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="video must be"):
        model.encode(torch.zeros(1, 5, 4, 16, 16))
    with pytest.raises(ValueError, match="1 \\+ 4k frames"):
        model.encode(torch.zeros(1, 6, 3, 16, 16))
    with pytest.raises(ValueError, match="multiples of 8"):
        model.encode(torch.zeros(1, 5, 3, 12, 16))


def test_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_vae(tmp_path / "missing.pth", WanVAEConfig())
    with pytest.raises(CheckpointError, match="missing keys"):
        load_vae(GOLDEN_DIR / "causvid_tiny" / "vae.safetensors", WanVAEConfig(dim=4))
