"""The weight-free backends on synthetic videos whose drift is known, and the shared formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lvbench.metrics import DeepWeights, Metric, build_suite, vbench_consistency
from lvbench.metrics.base import center_crop, resize_shorter
from lvbench.metrics.classic import LinearBlendMotion
from lvbench.vde import VDE, chunk_slices
from tests.lvbench import synthetic


@pytest.fixture(scope="module")
def suite() -> dict[str, Metric]:
    return {str(name): metric for name, metric in build_suite(DeepWeights()).items()}


def vde_of(metric: Metric, frames: np.ndarray, chunks: int = 10) -> VDE:
    return VDE.from_scores([metric.score(frames[s]) for s in chunk_slices(len(frames), chunks)])


def test_every_metric_defaults_to_a_weight_free_backend(suite: dict[str, Metric]) -> None:
    assert sorted(suite) == ["aesthetic", "background", "clarity", "motion", "subject"]
    assert all(m.weight_free for m in suite.values())
    assert {m.name: m.backend for m in suite.values()} == {
        "clarity": "laplacian-variance",
        "motion": "linear-blend",
        "aesthetic": "colourfulness",
        "background": "colour-histogram",
        "subject": "thumbnail",
    }


def test_progressive_blur_gives_increasing_clarity_drift(suite: dict[str, Metric]) -> None:
    vde = vde_of(suite["clarity"], synthetic.progressively_blurred())
    scores, drifts = np.array(vde.chunk_scores), np.array(vde.drifts)
    assert np.all(np.diff(scores) < 0)  # every chunk blurrier than the one before
    assert np.all(np.diff(drifts) > 0)  # so every chunk drifts further from the first
    assert vde.linear.published > 5 and vde.linear.normalized is not None and vde.linear.normalized > 0.5
    assert vde_of(suite["clarity"], synthetic.static()).linear.published == 0.0


def test_static_video_has_no_motion_drift_and_perfect_consistency(suite: dict[str, Metric]) -> None:
    video = synthetic.static()
    assert suite["motion"].score(video) == 1.0
    assert vde_of(suite["motion"], video).linear.published == pytest.approx(0.0, abs=1e-12)
    for name in ("background", "subject"):
        assert suite[name].score(video) == pytest.approx(1.0, abs=1e-9)
        assert vde_of(suite[name], video).linear.published == pytest.approx(0.0, abs=1e-9)


def test_colour_drift_lowers_consistency_and_drifts_more_than_a_constant_video(suite: dict[str, Metric]) -> None:
    drifting, constant = synthetic.colour_drifting(), synthetic.static()
    for name in ("background", "subject"):
        metric = suite[name]
        assert metric.score(drifting) < metric.score(constant) - 0.05, name  # the VBench dimension
        assert vde_of(metric, drifting).linear.published > vde_of(metric, constant).linear.published + 0.05, name


def test_motion_is_the_vbench_formula_with_a_linear_blend() -> None:
    frames = np.zeros((3, 4, 4, 3), np.uint8)
    frames[1] = 100  # the odd frame; its neighbours average to 0
    assert LinearBlendMotion().score(frames) == pytest.approx((255 - 100) / 255)
    frames[2] = 200  # now the blend predicts 100 exactly
    assert LinearBlendMotion().score(frames) == 1.0


def test_metrics_reject_bad_frames_with_the_metric_name(suite: dict[str, Metric]) -> None:
    with pytest.raises(ValueError, match=r"clarity: frames must be uint8 RGB \[T, H, W, 3\]"):
        suite["clarity"].score(np.zeros((4, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="motion: needs at least 3 frames per clip, got 2"):
        suite["motion"].score(np.zeros((2, 8, 8, 3), np.uint8))


def test_vbench_consistency_formula() -> None:
    # t=1: cos to previous 1, to first 1 -> 1; t=2: both 0 -> 0; mean 0.5
    assert vbench_consistency(torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])) == pytest.approx(0.5)
    assert vbench_consistency(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == 0.0  # negative cosines clamp to 0
    assert vbench_consistency(torch.tensor([[1.0, 2.0]])) == 1.0  # one frame
    assert vbench_consistency(torch.zeros(3, 4)) == 1.0  # identical (all-zero) features
    with pytest.raises(ValueError, match=r"\[frames, dim\]"):
        vbench_consistency(torch.zeros(3))


def test_resize_and_crop_follow_torchvision_conventions() -> None:
    images = torch.rand(2, 3, 480, 832)
    resized = resize_shorter(images, 224, "bicubic")
    assert resized.shape == (2, 3, 224, 388)  # int(224 * 832 / 480) = 388
    assert center_crop(resized, 224).shape == (2, 3, 224, 224)
    assert resize_shorter(torch.rand(1, 3, 900, 300), 224, "bilinear").shape == (1, 3, 672, 224)
