"""The pixel-space patch autoencoder (the toyworld model's VAE) behind the engine's decode interface."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.families.wan.autoencoders import load_vae
from engine.families.wan.patch_vae import PatchVAE
from inferix.errors import UserError
from inferix.spec.architectures import PatchVAEConfig
from inferix.spec.presets import load_preset


def test_streaming_decode_equals_one_shot_and_frames_are_not_compressed_in_time() -> None:
    torch.manual_seed(0)
    config = PatchVAEConfig(hidden=16, latent_mean=(0.5,) * 8, latent_std=(2.0,) * 8)
    vae = PatchVAE(config).eval()
    video = torch.rand(1, 5, 3, 32, 48) * 2 - 1
    latents = vae.encode(video)
    assert latents.shape == (1, 5, 8, 4, 6)
    raw = vae.encode_raw(video)
    assert torch.allclose(latents, (raw - 0.5) / 2.0, atol=1e-6)  # normalised by the config's statistics
    state = vae.new_decode_state()
    blocks = [vae.decode_block(latents[:, i : i + 2], state) for i in range(0, 5, 2)]
    assert [b.shape[1] for b in blocks] == [2, 2, 1] and state.latent_frames == 5
    # frames decode independently (equal up to the batch size's float reduction order)
    assert torch.allclose(torch.cat(blocks, dim=1), vae.decode(latents), atol=1e-6)
    assert vae.decode(latents).abs().max() <= 1.0
    with pytest.raises(ValueError, match=r"differ from the state's earlier blocks"):
        vae.decode_block(latents[:, :, :, :2], state)
    with pytest.raises(ValueError, match=r"latents must be \[B, F, 8, h, w\]"):
        vae.decode_block(latents[:, :, :4], vae.new_decode_state())


def test_loads_through_the_checkpoint_loader_and_presets_select_it(tmp_path: Path) -> None:
    config = PatchVAEConfig(hidden=16)
    state = PatchVAE(config).state_dict()
    save_file({k: v.half() for k, v in state.items()}, str(tmp_path / "vae.safetensors"))
    loaded = load_vae(tmp_path / "vae.safetensors", config, dtype=torch.float32)
    assert isinstance(loaded, PatchVAE) and all(
        loaded.state_dict()[k].equal(v.half().float()) for k, v in state.items()
    )
    with pytest.raises(Exception, match="patch autoencoder"):
        load_vae(tmp_path / "vae.safetensors", PatchVAEConfig(hidden=32))
    assert isinstance(load_preset("toyworld").vae, PatchVAEConfig)
    with pytest.raises(UserError, match=r"vae: unknown key\(s\) \['dim'\]"):
        load_preset("toyworld", {"vae": {"dim": 8}})
