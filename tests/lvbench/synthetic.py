"""Synthetic videos made in the tests: uint8 RGB [T, H, W, 3] with a known kind of drift."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

FRAMES, SIZE = 40, 48


def texture(seed: int = 0, size: int = SIZE) -> np.ndarray:
    """A sharp, colourful random image: blocky noise with edges at several scales."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (size // 8, size // 8, 3)).repeat(8, 0).repeat(8, 1)
    fine = rng.integers(-60, 61, (size, size, 3))
    return np.clip(coarse + fine, 0, 255).astype(np.uint8)


def gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    if sigma <= 0:
        return image
    radius = int(3 * sigma) + 1
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    img = torch.from_numpy(image).double().permute(2, 0, 1)[:, None]  # [3, 1, H, W]
    img = F.pad(img, (radius, radius, radius, radius), mode="replicate")
    img = F.conv2d(img, kernel.view(1, 1, 1, -1))
    img = F.conv2d(img, kernel.view(1, 1, -1, 1))
    return img[:, 0].permute(1, 2, 0).round().clamp(0, 255).byte().numpy()


def static(frames: int = FRAMES) -> np.ndarray:
    return np.repeat(texture()[None], frames, axis=0)


def progressively_blurred(frames: int = FRAMES) -> np.ndarray:
    """Sharp at the start, blurrier every frame (sigma 0 -> 3)."""
    base = texture()
    return np.stack([gaussian_blur(base, 3.0 * t / (frames - 1)) for t in range(frames)])


def colour_drifting(frames: int = FRAMES) -> np.ndarray:
    """The same image with a colour cast that grows faster and faster (quadratic in time)."""
    base = texture().astype(np.float64)
    out = []
    for t in range(frames):
        k = (t / (frames - 1)) ** 2
        cast = base * (1 - 0.8 * k) + np.array([255.0, 40.0, 0.0]) * 0.8 * k
        out.append(np.clip(cast, 0, 255).astype(np.uint8))
    return np.stack(out)
