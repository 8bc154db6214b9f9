"""What every metric backend is, and the consistency formula VBench uses for two dimensions.

A backend scores a clip of uint8 RGB frames [T, H, W, 3] with one number. The same call scores
one VDE chunk (LV-Bench) and a whole video (the VBench dimension), exactly as the reference
scripts reuse VBench's per-video functions on chunks.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

import numpy as np
import torch
import torch.nn.functional as F

MetricName = Literal["clarity", "motion", "aesthetic", "background", "subject"]
METRIC_NAMES: tuple[MetricName, ...] = get_args(MetricName)

# The VBench dimension each VDE metric is built on (LV-Bench reuses VBench's scorers per chunk).
VBENCH_DIMENSION: dict[MetricName, str] = {
    "clarity": "imaging_quality",
    "motion": "motion_smoothness",
    "aesthetic": "aesthetic_quality",
    "background": "background_consistency",
    "subject": "subject_consistency",
}


class Metric(Protocol):
    """A scorer for clips. `weight_free` backends are proxies, not the published models."""

    @property
    def name(self) -> MetricName: ...

    @property
    def backend(self) -> str: ...

    @property
    def weight_free(self) -> bool: ...

    @property
    def min_frames(self) -> int:
        """The fewest frames a clip may have."""
        ...

    def score(self, frames: np.ndarray) -> float: ...


def check_frames(frames: np.ndarray, min_frames: int, what: str) -> None:
    """Reject anything but uint8 RGB [T, H, W, 3] with enough frames, naming the metric."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"{what}: frames must be uint8 RGB [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    if frames.shape[0] < min_frames:
        raise ValueError(f"{what}: needs at least {min_frames} frames per clip, got {frames.shape[0]}")


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity; two all-zero rows are identical (1), one zero row matches nothing (0)."""
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    cos = (a * b).sum(dim=-1) / (na * nb).clamp_min(1e-12)
    both_zero = (na == 0) & (nb == 0)
    return torch.where(both_zero, torch.ones_like(cos), cos)


def vbench_consistency(features: torch.Tensor) -> float:
    """VBench subject/background consistency of per-frame features [T, D].

    mean over t = 1..T-1 of ( max(0, cos(f_{t-1}, f_t)) + max(0, cos(f_0, f_t)) ) / 2,
    and 1.0 for a single frame (as VBench's background_consistency does).
    """
    if features.ndim != 2:
        raise ValueError(f"features must be [frames, dim], got {list(features.shape)}")
    if features.shape[0] < 2:
        return 1.0
    feats = features.double()
    later = feats[1:]
    to_previous = _cosine(feats[:-1], later).clamp_min(0.0)
    to_first = _cosine(feats[:1].expand_as(later), later).clamp_min(0.0)
    return float(((to_previous + to_first) / 2).mean())


def to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> float32 [T, 3, H, W] in 0..255 (VBench's load_video layout)."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()


def resize_shorter(images: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """torchvision's Resize(size): the shorter side becomes `size`, the longer is truncated to an int."""
    h, w = images.shape[-2:]
    if h <= w:
        new_h, new_w = size, int(size * w / h)
    else:
        new_h, new_w = int(size * h / w), size
    if (new_h, new_w) == (h, w):
        return images
    return F.interpolate(images, size=(new_h, new_w), mode=mode, align_corners=False, antialias=True)


def center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision's CenterCrop(size) for images at least `size` on both sides."""
    h, w = images.shape[-2:]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return images[..., top : top + size, left : left + size]
