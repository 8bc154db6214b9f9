"""Loading a model's autoencoder from its checkpoint: the Wan VAE or the patch autoencoder, as the
preset's `vae` section says. Above both VAE modules and the checkpoint reader, so neither imports
the other."""

from __future__ import annotations

from pathlib import Path
from typing import overload

import torch

from engine.checkpoint import load_into, read_state_dict
from engine.families.wan.patch_vae import PatchVAE
from engine.families.wan.vae import WanVAE
from inferix.spec.architectures import PatchVAEConfig, WanVAEConfig


@overload
def load_vae(
    path: str | Path, config: WanVAEConfig, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> WanVAE: ...


@overload
def load_vae(
    path: str | Path, config: PatchVAEConfig, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> PatchVAE: ...


def load_vae(
    path: str | Path,
    config: WanVAEConfig | PatchVAEConfig,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> WanVAE | PatchVAE:
    """Load a Wan VAE from ``Wan2.1_VAE.pth`` (the reference ``WanVAE_`` state dict) or a safetensors copy,
    or a patch autoencoder (``vae.type: patch``) from its state dict."""
    if isinstance(config, PatchVAEConfig):
        patch_config = config
        return load_into(
            lambda: PatchVAE(patch_config),
            read_state_dict(path, "VAE checkpoint", "Expected the patch autoencoder's state dict."),
            path,
            dtype=dtype,
            device=device,
            what="patch autoencoder",
            hint="check the vae section of the preset / model.yaml (patch, z_dim, hidden)",
        )

    return WanVAE.from_checkpoint(path, config, dtype=dtype, device=device)
