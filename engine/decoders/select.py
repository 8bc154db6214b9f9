"""The decoder a model's sessions use: its own VAE, or TAEHV when the preset / `--decoder` says so.

TAEHV stands in for the VAE only where it decodes the same latents: as many channels, the same
spatial and temporal factors (the Wan 2.1 VAE's 16 channels, 8x space, 4x time for `taew2_1`).
Anything else is a `UserError` naming both sides, found when the model loads, not mid-session.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.decoders.taehv import TAEHVDecoder, load_taehv
from inferix.errors import UserError
from inferix.spec.architectures import PatchVAEConfig, WanVAEConfig
from inferix.spec.decoders import DecoderChoice

__all__ = ["load_decoder"]


class _HasConfig(Protocol):
    @property
    def config(self) -> WanVAEConfig | PatchVAEConfig: ...


def load_decoder(
    choice: DecoderChoice, vae: _HasConfig, dtype: torch.dtype, device: torch.device | str
) -> TAEHVDecoder | None:
    """The TAEHV decoder `choice` names, checked against the model's `vae`; None for the VAE itself."""
    if choice.is_vae:
        return None
    assert choice.path is not None
    config = vae.config
    if not isinstance(config, WanVAEConfig):
        raise UserError(
            f"--decoder {choice}: TAEHV decodes Wan VAE latents; this model's latents are its own "
            f"({type(config).__name__}), decode them with its VAE (decoder: vae)"
        )
    model = load_taehv(choice.path, dtype=dtype, device=device)
    layout = model.layout
    ours = (layout.latent_channels, layout.spatial_factor, layout.t_upscale)
    theirs = (config.z_dim, config.spatial_factor, config.temporal_factor)
    if ours != theirs:
        raise UserError(
            f"--decoder {choice}: these TAEHV weights decode {ours[0]}-channel latents at {ours[1]}x space and "
            f"{ours[2]}x time, the model's VAE makes {theirs[0]} channels at {theirs[1]}x / {theirs[2]}x "
            "(taew2_1 is for Wan 2.1 latents, taew2_2 for Wan 2.2 5B)"
        )
    return TAEHVDecoder(model, choice.path)
