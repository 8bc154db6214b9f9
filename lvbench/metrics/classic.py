"""Weight-free backends: classic image statistics that run anywhere, in numpy and torch.

They are *proxies* for the published models (MUSIQ, AMT-S, LAION aesthetic, CLIP, DINO), chosen so
each moves in the same direction as its model on the failure it is meant to catch, and labelled
`weight_free` in every result so that nobody compares them with published numbers:

| metric     | backend             | per clip                                                          |
|------------|---------------------|-------------------------------------------------------------------|
| clarity    | laplacian-variance  | mean over frames of Var(Laplacian(luma)) (sharpness; blur lowers it) |
| motion     | linear-blend        | VBench motion smoothness with the odd frames predicted as the mean |
|            |                     | of their even neighbours instead of by AMT-S                      |
| aesthetic  | colourfulness       | mean Hasler-Suesstrunk colourfulness (a no-reference appeal cue)  |
| background | colour-histogram    | VBench consistency over sqrt 8x8x8 RGB histograms (Bhattacharyya) |
| subject    | thumbnail           | VBench consistency over centred 16x16 RGB thumbnails (layout)     |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lvbench.metrics.base import MetricName, check_frames, to_tensor, vbench_consistency

_LUMA = np.array([0.299, 0.587, 0.114])


@dataclass(frozen=True)
class LaplacianClarity:
    """Sharpness: the variance of the 4-neighbour Laplacian of the luma (0..255 scale), per frame."""

    name: MetricName = "clarity"
    backend: str = "laplacian-variance"
    weight_free: bool = True
    min_frames: int = 1

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        values = []
        for frame in frames:  # one frame at a time: float64 copies of a long video would not fit
            luma = frame @ _LUMA
            lap = luma[:-2, 1:-1] + luma[2:, 1:-1] + luma[1:-1, :-2] + luma[1:-1, 2:] - 4 * luma[1:-1, 1:-1]
            values.append(lap.var() if lap.size else 0.0)
        return float(np.mean(values))


@dataclass(frozen=True)
class LinearBlendMotion:
    """VBench motion smoothness, (255 - mean |odd frame - interpolated|) / 255, with a linear blend.

    VBench keeps the even frames, interpolates one frame between each pair (AMT-S) and compares
    the interpolations with the odd frames it dropped. Here the interpolation is the rounded
    average of the two neighbours: a static clip scores 1, and any motion lowers the score, jerky
    or not (no motion compensation) — which is why it is only a proxy.
    """

    name: MetricName = "motion"
    backend: str = "linear-blend"
    weight_free: bool = True
    min_frames: int = 3

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        evens = frames[0::2].astype(np.uint16)
        diffs = []
        for k in range(len(evens) - 1):
            predicted = (evens[k] + evens[k + 1] + 1) // 2
            diffs.append(np.abs(frames[2 * k + 1].astype(np.int16) - predicted.astype(np.int16)).mean())
        return float((255.0 - np.mean(diffs)) / 255.0)


@dataclass(frozen=True)
class ColourfulnessAesthetic:
    """Hasler & Suesstrunk (2003) colourfulness, sqrt(s_rg^2 + s_yb^2) + 0.3 sqrt(m_rg^2 + m_yb^2), per frame.

    Not an aesthetic model: a washed-out or colour-collapsed video (a common long-video failure)
    scores lower, which is the drift the aesthetic VDE is meant to expose.
    """

    name: MetricName = "aesthetic"
    backend: str = "colourfulness"
    weight_free: bool = True
    min_frames: int = 1

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        values = []
        for frame in frames:
            r, g, b = (frame[..., c].astype(np.float64) for c in range(3))
            rg, yb = r - g, 0.5 * (r + g) - b
            values.append(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean()))
        return float(np.mean(values))


@dataclass(frozen=True)
class HistogramBackground:
    """Background consistency over global colour statistics: sqrt of the normalised 8x8x8 RGB histogram."""

    name: MetricName = "background"
    backend: str = "colour-histogram"
    weight_free: bool = True
    min_frames: int = 1
    bins: int = 8

    def features(self, frames: np.ndarray) -> torch.Tensor:
        step = 256 // self.bins
        codes = frames.astype(np.int64) // step
        flat = (codes[..., 0] * self.bins + codes[..., 1]) * self.bins + codes[..., 2]
        hists = np.stack([np.bincount(f.ravel(), minlength=self.bins**3) for f in flat]).astype(np.float64)
        return torch.from_numpy(np.sqrt(hists / hists.sum(axis=1, keepdims=True)))

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        return vbench_consistency(self.features(frames))


@dataclass(frozen=True)
class ThumbnailSubject:
    """Subject consistency over layout: each frame area-averaged to 16x16 RGB, scaled to [-0.5, 0.5]."""

    name: MetricName = "subject"
    backend: str = "thumbnail"
    weight_free: bool = True
    min_frames: int = 1
    size: int = 16

    def features(self, frames: np.ndarray) -> torch.Tensor:
        thumbs = torch.cat(
            [F.adaptive_avg_pool2d(to_tensor(frames[i : i + 64]), self.size) for i in range(0, len(frames), 64)]
        )
        return (thumbs / 255.0 - 0.5).flatten(1)

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        return vbench_consistency(self.features(frames))
