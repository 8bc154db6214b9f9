"""The five LV-Bench metrics, each with a weight-free backend and (except motion) a deep one.

`build_suite` picks the deep backend of a metric exactly when its weights are given, so a run
without any weights works anywhere and says in every result which backend produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferix.errors import UserError
from lvbench.metrics.base import METRIC_NAMES, VBENCH_DIMENSION, Metric, MetricName, vbench_consistency
from lvbench.metrics.classic import (
    ColourfulnessAesthetic,
    HistogramBackground,
    LaplacianClarity,
    LinearBlendMotion,
    ThumbnailSubject,
)

__all__ = [
    "METRIC_NAMES",
    "VBENCH_DIMENSION",
    "DeepWeights",
    "Metric",
    "MetricName",
    "build_suite",
    "vbench_consistency",
]


@dataclass(frozen=True)
class DeepWeights:
    """Local weight paths; a metric whose weights are all given uses its deep backend."""

    musiq: Path | None = None  # clarity: musiq_spaq_ckpt-358bb6af.pth (needs pyiqa)
    clip_b32: Path | None = None  # background: openai/clip-vit-base-patch32 folder
    clip_l14: Path | None = None  # aesthetic: openai/clip-vit-large-patch14 folder ...
    aesthetic_head: Path | None = None  # ... and sa_0_4_vit_l_14_linear.pth
    dino: Path | None = None  # subject: facebook/dino-vitb16 folder


def build_suite(weights: DeepWeights, device: str = "cpu", batch_size: int = 16) -> dict[MetricName, Metric]:
    """One backend per metric, loaded once (deep models are reused across videos and chunks)."""
    if (weights.clip_l14 is None) != (weights.aesthetic_head is None):
        raise UserError("the LAION aesthetic backend needs both --clip-l14 and --aesthetic-head")
    suite: dict[MetricName, Metric] = {
        "clarity": LaplacianClarity(),
        "motion": LinearBlendMotion(),
        "aesthetic": ColourfulnessAesthetic(),
        "background": HistogramBackground(),
        "subject": ThumbnailSubject(),
    }
    if weights.musiq or weights.clip_b32 or weights.clip_l14 or weights.dino:
        from lvbench.metrics import deep

        if weights.musiq is not None:
            suite["clarity"] = deep.MusiqClarity.from_pretrained(weights.musiq, device)
        if weights.clip_b32 is not None:
            encoder = deep.ClipImageEncoder.from_pretrained(
                weights.clip_b32, "--clip-b32", "openai/clip-vit-base-patch32", device, batch_size
            )
            suite["background"] = deep.ClipBackground(encoder)
        if weights.clip_l14 is not None and weights.aesthetic_head is not None:
            encoder = deep.ClipImageEncoder.from_pretrained(
                weights.clip_l14, "--clip-l14", "openai/clip-vit-large-patch14", device, batch_size
            )
            head = deep.load_aesthetic_head(weights.aesthetic_head, encoder.dim)  # on the CPU, like the features
            suite["aesthetic"] = deep.LaionAesthetic(encoder, head)
        if weights.dino is not None:
            suite["subject"] = deep.DinoSubject(deep.DinoEncoder.from_pretrained(weights.dino, device, batch_size))
    return suite
