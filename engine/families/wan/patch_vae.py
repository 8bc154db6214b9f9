"""A pixel-space patch autoencoder: the small VAE of the toyworld model.

Each frame is cut into `patch` x `patch` pixel patches; a patch becomes `z_dim` latent channels
(one latent pixel) and back. The decoder also looks at each latent pixel's 3x3 neighbours, so
edges that cross patch borders come out clean. Frames are independent (no time compression), so
a block of F latent frames decodes to F video frames and streaming needs no state beyond a
frame count. Same interface as `WanVAE` where the engine uses it: `config.z_dim`,
`config.spatial_factor`, `config.temporal_factor`, `encode`, `new_decode_state`, `decode_block`,
`decode`, latents normalised by per-channel `latent_mean` / `latent_std`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from inferix.spec.architectures import PatchVAEConfig


@dataclass
class PatchDecodeState:
    """Streaming state of one video: frames are independent, so only bookkeeping."""

    latent_frames: int = 0
    batch_hw: tuple[int, int, int] | None = None


class PatchVAE(nn.Module):
    def __init__(self, config: PatchVAEConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = config or PatchVAEConfig()
        pixels = 3 * cfg.patch * cfg.patch
        self.encoder = nn.Sequential(
            nn.Conv2d(3, cfg.hidden, cfg.patch, stride=cfg.patch),
            nn.SiLU(),
            nn.Conv2d(cfg.hidden, cfg.hidden, 1),
            nn.SiLU(),
            nn.Conv2d(cfg.hidden, cfg.z_dim, 1),
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(cfg.z_dim, cfg.hidden, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(cfg.hidden, cfg.hidden, 1),
            nn.SiLU(),
            nn.Conv2d(cfg.hidden, pixels, 1),
            nn.PixelShuffle(cfg.patch),
        )

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    # ---- raw (unnormalised) latents, with autograd: training ----------------------------------
    def encode_raw(self, video: Tensor) -> Tensor:
        """[B, T, 3, H, W] in [-1, 1] -> [B, T, z_dim, H/p, W/p]."""
        b, t = video.shape[:2]
        z = self.encoder(video.flatten(0, 1).to(self.dtype))
        return z.unflatten(0, (b, t))

    def decode_raw(self, latents: Tensor) -> Tensor:
        """[B, T, z_dim, h, w] -> [B, T, 3, h*p, w*p] (not clamped)."""
        b, t = latents.shape[:2]
        x = self.decoder(latents.flatten(0, 1).to(self.dtype))
        return x.unflatten(0, (b, t))

    # ---- the engine's interface ---------------------------------------------------------------
    @torch.no_grad()
    def encode(self, video: Tensor) -> Tensor:
        """Normalised latents [B, T, z_dim, h, w] of pixels [B, T, 3, H, W] in [-1, 1]."""
        sf = self.config.spatial_factor
        if video.ndim != 5 or video.shape[2] != 3 or video.shape[3] % sf or video.shape[4] % sf:
            raise ValueError(f"video must be [B, T, 3, H, W] with H and W multiples of {sf}, got {tuple(video.shape)}")
        mean, std = self._scale(video.device)
        return (self.encode_raw(video).float() - mean) / std

    def new_decode_state(self) -> PatchDecodeState:
        return PatchDecodeState()

    @torch.no_grad()
    def decode_block(self, latents_block: Tensor, state: PatchDecodeState) -> Tensor:
        """Pixels [B, F, 3, H, W] in [-1, 1] of normalised latents [B, F, z_dim, h, w]."""
        if latents_block.ndim != 5 or latents_block.shape[2] != self.config.z_dim:
            raise ValueError(
                f"latents must be [B, F, {self.config.z_dim}, h, w], got shape {tuple(latents_block.shape)}"
            )
        b, f, _, h, w = latents_block.shape
        if state.batch_hw is None:
            state.batch_hw = (b, h, w)
        elif state.batch_hw != (b, h, w):
            raise ValueError(f"latents (B, h, w) = {(b, h, w)} differ from the state's earlier blocks {state.batch_hw}")
        mean, std = self._scale(latents_block.device)
        video = self.decode_raw(latents_block.float() * std + mean).float().clamp(-1.0, 1.0)
        state.latent_frames += f
        return video

    def decode(self, latents: Tensor) -> Tensor:
        return self.decode_block(latents, self.new_decode_state())

    def _scale(self, device: torch.device) -> tuple[Tensor, Tensor]:
        mean = torch.tensor(self.config.latent_mean, dtype=torch.float32, device=device).view(1, 1, -1, 1, 1)
        std = torch.tensor(self.config.latent_std, dtype=torch.float32, device=device).view(1, 1, -1, 1, 1)
        return mean, std


def reconstruction_loss(recon: Tensor, video: Tensor, background: Tensor, object_weight: float) -> Tensor:
    """MSE + L1, pixels away from `background` ([3] in [-1, 1]) weighted up by `object_weight`."""
    is_object = (video - background.view(1, 1, 3, 1, 1)).abs().amax(dim=2, keepdim=True) > 0.1
    weight = 1.0 + object_weight * is_object.float()
    error = recon - video
    return ((error.pow(2) + 0.5 * error.abs()) * weight).mean() / weight.mean()


__all__ = ["PatchDecodeState", "PatchVAE", "PatchVAEConfig", "reconstruction_loss"]
