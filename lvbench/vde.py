"""Video Drift Error (VDE): how far a per-chunk quality score wanders from the first chunk.

LV-Bench (BlockVid, arXiv 2511.22973) splits a video into N equal chunks (10 by default; the
remainder frames at the end are trimmed so every chunk has the same length), scores each chunk
with a metric m, and sums the relative drift of every later chunk from the first one:

    drift_i = |m_i - m_1| / |m_1|                      i = 2..N
    VDE     = sum_i w_i * drift_i                      (the published, un-normalised value)
    VDE_n   = sum_i w_i * drift_i / sum_i w_i          (a weighted mean, comparable across N)

with w_i = N - i + 1 (linear) or log(N - i + 1) (log). The weights favour the early chunks: a
model that drifts right after the start is punished more than one that drifts only at the end.

Two choices differ from the reference script on purpose and say so in their error messages:

* the reference divides by m_1, not |m_1|; every published metric is positive, where both agree,
  and |m_1| keeps the drift non-negative for a metric that can be negative;
* the reference returns inf when m_1 == 0; here that is a `VDEError`, since no relative drift
  exists then and an inf would silently poison averages.

Log weighting gives w_N = log(1) = 0, so for N = 2 every weight is 0: the published sum is 0 and
the normalised value is undefined (`None`, shown as "n/a") rather than a misleading 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

Weighting = Literal["linear", "log"]
WEIGHTINGS: tuple[Weighting, ...] = get_args(Weighting)
DEFAULT_CHUNKS = 10


class VDEError(ValueError):
    """The scores do not admit a drift error (too few chunks, a zero or non-finite first score)."""


def chunk_slices(num_frames: int, num_chunks: int = DEFAULT_CHUNKS) -> list[slice]:
    """`num_chunks` equal, consecutive frame ranges; the last `num_frames % num_chunks` frames are dropped."""
    if num_chunks < 2:
        raise VDEError(f"a drift needs at least 2 chunks, got {num_chunks}")
    per_chunk = num_frames // num_chunks
    if per_chunk < 1:
        raise VDEError(f"{num_frames} frames cannot be split into {num_chunks} chunks; use fewer chunks")
    return [slice(i * per_chunk, (i + 1) * per_chunk) for i in range(num_chunks)]


def drift_weights(num_chunks: int, weighting: Weighting) -> np.ndarray:
    """w_i for i = 2..N (the first chunk is the reference and has no weight)."""
    if weighting not in WEIGHTINGS:
        raise VDEError(f"unknown weighting {weighting!r}; use one of {list(WEIGHTINGS)}")
    remaining = num_chunks - np.arange(2, num_chunks + 1, dtype=np.float64) + 1  # N - i + 1
    return remaining if weighting == "linear" else np.log(remaining)


def relative_drifts(scores: Sequence[float]) -> np.ndarray:
    """drift_i = |m_i - m_1| / |m_1| for i = 2..N."""
    values = np.asarray(scores, dtype=np.float64)
    if values.ndim != 1 or values.size < 2:
        raise VDEError(f"a drift needs the scores of at least 2 chunks, got {values.size}")
    if not np.all(np.isfinite(values)):
        raise VDEError(f"chunk scores must be finite, got {values.tolist()}")
    first = values[0]
    if first == 0:
        raise VDEError("the first chunk scores 0, so the drift relative to it is undefined (the reference gives inf)")
    return np.abs(values[1:] - first) / abs(first)


@dataclass(frozen=True)
class DriftError:
    """One weighting's VDE: the published sum and the weighted mean (None when all weights are 0)."""

    weighting: Weighting
    published: float
    normalized: float | None


def video_drift_error(scores: Sequence[float], weighting: Weighting = "linear") -> DriftError:
    drifts = relative_drifts(scores)
    weights = drift_weights(len(drifts) + 1, weighting)
    total = float(np.sum(weights * drifts))
    weight_sum = float(np.sum(weights))
    return DriftError(weighting, total, total / weight_sum if weight_sum > 0 else None)


@dataclass(frozen=True)
class VDE:
    """Everything VDE says about one metric on one video: the curve and both weightings."""

    chunk_scores: tuple[float, ...]
    drifts: tuple[float, ...]  # drift of chunks 2..N
    linear: DriftError
    log: DriftError

    @classmethod
    def from_scores(cls, scores: Sequence[float]) -> VDE:
        drifts = relative_drifts(scores)
        return cls(
            chunk_scores=tuple(float(s) for s in scores),
            drifts=tuple(float(d) for d in drifts),
            linear=video_drift_error(scores, "linear"),
            log=video_drift_error(scores, "log"),
        )
