"""The VDE formula against cases computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lvbench.vde import VDE, VDEError, chunk_slices, drift_weights, relative_drifts, video_drift_error


def test_linear_and_log_weights_match_the_definition() -> None:
    # N = 4 chunks: i = 2, 3, 4 -> N - i + 1 = 3, 2, 1
    assert drift_weights(4, "linear").tolist() == [3.0, 2.0, 1.0]
    assert np.allclose(drift_weights(4, "log"), [math.log(3), math.log(2), 0.0])
    with pytest.raises(VDEError, match="unknown weighting"):
        drift_weights(4, "quadratic")  # type: ignore[arg-type]


def test_hand_computed_case() -> None:
    scores = [2.0, 3.0, 1.0, 2.0]  # drifts |3-2|/2 = 0.5, |1-2|/2 = 0.5, |2-2|/2 = 0
    assert relative_drifts(scores).tolist() == [0.5, 0.5, 0.0]
    vde = VDE.from_scores(scores)
    assert vde.linear.published == pytest.approx(3 * 0.5 + 2 * 0.5 + 1 * 0.0)  # 2.5
    assert vde.linear.normalized == pytest.approx(2.5 / 6)
    assert vde.log.published == pytest.approx(math.log(3) * 0.5 + math.log(2) * 0.5)
    assert vde.log.normalized == pytest.approx(0.5)  # 0.5 (ln 3 + ln 2) / (ln 3 + ln 2 + 0)
    assert vde.chunk_scores == (2.0, 3.0, 1.0, 2.0) and vde.drifts == (0.5, 0.5, 0.0)


def test_early_drift_weighs_more_than_late_drift() -> None:
    early = video_drift_error([1.0, 2.0, 1.0, 1.0])  # chunk 2 drifts: weight 3
    late = video_drift_error([1.0, 1.0, 1.0, 2.0])  # chunk 4 drifts: weight 1
    assert early.published == pytest.approx(3.0) and late.published == pytest.approx(1.0)
    assert video_drift_error([1.0, 1.0, 1.0, 2.0], "log").published == 0.0  # log(1) = 0 for the last chunk


def test_sign_of_the_first_score() -> None:
    # |m_1| in the denominator: a negative metric drifts by as much as its mirror image (the reference,
    # which divides by m_1, would report -2.5 here).
    positive = VDE.from_scores([2.0, 3.0, 1.0, 2.0])
    negative = VDE.from_scores([-2.0, -3.0, -1.0, -2.0])
    assert negative.linear.published == pytest.approx(positive.linear.published) == pytest.approx(2.5)
    assert negative.log.published == pytest.approx(positive.log.published)
    assert all(d >= 0 for d in VDE.from_scores([-1.0, 1.0]).drifts)  # crossing zero: |1 - -1| / 1 = 2
    assert VDE.from_scores([-1.0, 1.0]).drifts == (2.0,)


def test_zero_first_chunk_is_a_clear_error_not_inf() -> None:
    with pytest.raises(VDEError, match="first chunk scores 0"):
        VDE.from_scores([0.0, 1.0, 2.0])
    with pytest.raises(VDEError, match="finite"):
        VDE.from_scores([1.0, float("nan"), 2.0])
    with pytest.raises(VDEError, match="at least 2 chunks"):
        VDE.from_scores([1.0])


def test_two_chunks_log_weights_are_all_zero() -> None:
    vde = VDE.from_scores([4.0, 5.0])
    assert vde.linear.published == pytest.approx(0.25) and vde.linear.normalized == pytest.approx(0.25)
    assert vde.log.published == 0.0 and vde.log.normalized is None  # undefined, not a misleading 0


def test_constant_scores_have_zero_drift() -> None:
    vde = VDE.from_scores([0.7] * 10)
    assert vde.linear.published == 0.0 and vde.log.published == 0.0 and vde.linear.normalized == 0.0


def test_chunks_are_equal_and_the_remainder_is_trimmed() -> None:
    slices = chunk_slices(23, 10)
    assert len(slices) == 10 and all(s.stop - s.start == 2 for s in slices)
    assert slices[0] == slice(0, 2) and slices[-1] == slice(18, 20)  # frames 20..22 are dropped
    assert chunk_slices(20, 10)[-1] == slice(18, 20)
    with pytest.raises(VDEError, match="cannot be split into 10 chunks"):
        chunk_slices(5, 10)
    with pytest.raises(VDEError, match="at least 2 chunks"):
        chunk_slices(100, 1)
