"""Image-to-world conditioning (README section 3): the first frame as VAE latents plus a mask
(`cond_concat`, the DiT's 20 extra input channels) and as CLIP tokens (`visual_context`).

The image latents come from the Wan VAE's encoder (the reference) or, as an option, from TAEHV's
(`taehv_image_latents`): a cheaper encoder of the same latent space, not the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.decoders.taehv import TAEHV
from engine.families.matrixgame.clip import CLIPVisionEncoder
from engine.families.matrixgame.config import MASK_CHANNELS
from engine.families.wan.vae import WanVAE


@dataclass
class WorldConditioning:
    """cond_concat [1, F, 4 + z_dim, h, w] (mask | image latents per latent frame); visual_context
    [1, L, clip_dim] (CLIP tokens)."""

    cond_concat: Tensor
    visual_context: Tensor

    @property
    def num_frames(self) -> int:
        return self.cond_concat.shape[1]


def image_latents(vae: WanVAE, image: Tensor, num_frames: int) -> Tensor:
    """Latents [1, F, z_dim, h, w] of the image followed by 4(F-1) black frames: frames >= 1 encode
    black but still depend on the image through the causal encoder. (The reference encodes in
    tiles of 44x80 latents; up to that size, the released 352x640, a tile is the whole image.)"""
    step = vae.config.temporal_factor
    video = image.unsqueeze(1)
    black = video.new_zeros(video.shape[0], step * (num_frames - 1), *video.shape[2:])
    return vae.encode(torch.cat([video, black], dim=1))


def taehv_image_latents(taehv: TAEHV, image: Tensor, num_frames: int) -> Tensor:
    """`image_latents` by TAEHV's encoder: the same video (the image, then 4(F-1) frames of the
    reference's zeros in [-1, 1], i.e. mid-grey) mapped to TAEHV's [0, 1], with the image repeated to
    fill latent frame 0. TAEHV folds every 4 frames into one latent where the Wan VAE's first latent
    frame is one pixel frame; its decoder likewise makes 4 frames of latent 0 and keeps the last, so
    4 copies of the image are what latent 0 stands for."""
    step = taehv.layout.t_downscale
    first = ((image.float() + 1) / 2).unsqueeze(1).expand(-1, step, -1, -1, -1)
    grey = first.new_full((first.shape[0], step * (num_frames - 1), *first.shape[2:]), 0.5)
    return taehv.encode_video(torch.cat([first, grey], dim=1)).float()


def cond_concat(latents: Tensor) -> Tensor:
    """The mask (1 on latent frame 0, 0 elsewhere; 4 channels) joined before the image latents."""
    mask = torch.zeros_like(latents[:, :, :MASK_CHANNELS])
    mask[:, 0] = 1
    return torch.cat([mask, latents], dim=2)


def condition_on_image(
    vae: WanVAE, clip: CLIPVisionEncoder, image: Tensor, num_frames: int, taehv: TAEHV | None = None
) -> WorldConditioning:
    """The conditioning of a `num_frames`-latent-frame video starting from `image` [1, 3, H, W] in [-1, 1];
    with `taehv`, its encoder makes the image latents instead of the VAE's."""
    if image.dim() != 4 or image.shape[:2] != (1, 3):
        raise ValueError(f"image must be [1, 3, H, W] in [-1, 1], got {list(image.shape)}")
    with torch.no_grad():
        latents = (
            image_latents(vae, image, num_frames) if taehv is None else taehv_image_latents(taehv, image, num_frames)
        )
        return WorldConditioning(cond_concat(latents.to(image.device)), clip.encode(image))
