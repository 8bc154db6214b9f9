"""Score a folder of videos: VDE per metric (per-chunk curve, both weightings) and the VBench dimension.

Each (video, metric) pair is computed on its own: a video that cannot be decoded, is too short
for the chunks, or trips a metric is recorded with its error and the rest goes on, so one bad
video never costs a metric its other results.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lvbench.metrics import METRIC_NAMES, VBENCH_DIMENSION, Metric, MetricName
from lvbench.vde import DEFAULT_CHUNKS, VDE, chunk_slices
from lvbench.video import read_video

RESULTS = "results.json"


@dataclass
class MetricResult:
    metric: MetricName
    backend: str
    weight_free: bool
    vbench_dimension: str
    vbench_score: float | None = None  # the metric on the whole video
    chunk_scores: list[float] = field(default_factory=list)
    drifts: list[float] = field(default_factory=list)  # chunks 2..N
    vde_linear: float | None = None  # published (un-normalised) VDE, linear weights
    vde_linear_normalized: float | None = None
    vde_log: float | None = None
    vde_log_normalized: float | None = None  # None when every log weight is 0 (2 chunks)
    errors: list[str] = field(default_factory=list)

    @property
    def has_vde(self) -> bool:
        return self.vde_linear is not None


@dataclass
class VideoResult:
    video: str
    frames: int = 0
    fps: float = 0.0
    width: int = 0
    height: int = 0
    metrics: dict[str, MetricResult] = field(default_factory=dict)
    error: str | None = None  # the video could not be read at all


def _finite(value: float) -> float:
    """JSON has no NaN or inf; a metric that produces one has failed."""
    if not math.isfinite(value):
        raise ValueError(f"the score is {value}")
    return value


def _score_metric(metric: Metric, frames: np.ndarray, num_chunks: int) -> MetricResult:
    result = MetricResult(metric.name, metric.backend, metric.weight_free, VBENCH_DIMENSION[metric.name])
    try:
        result.vbench_score = _finite(metric.score(frames))
    except Exception as exc:  # recorded per video and metric, never fatal (see module doc)
        result.errors.append(f"{VBENCH_DIMENSION[metric.name]}: {type(exc).__name__}: {exc}")
    try:
        vde = VDE.from_scores([_finite(metric.score(frames[s])) for s in chunk_slices(len(frames), num_chunks)])
    except Exception as exc:
        result.errors.append(f"VDE: {type(exc).__name__}: {exc}")
        return result
    result.chunk_scores, result.drifts = list(vde.chunk_scores), list(vde.drifts)
    result.vde_linear, result.vde_linear_normalized = vde.linear.published, vde.linear.normalized
    result.vde_log, result.vde_log_normalized = vde.log.published, vde.log.normalized
    return result


def evaluate_video(path: Path, suite: dict[MetricName, Metric], num_chunks: int = DEFAULT_CHUNKS) -> VideoResult:
    result = VideoResult(path.name)
    try:
        video = read_video(path)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.frames, result.fps = video.num_frames, video.fps
    result.height, result.width = int(video.frames.shape[1]), int(video.frames.shape[2])
    for name, metric in suite.items():
        result.metrics[name] = _score_metric(metric, video.frames, num_chunks)
    return result


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def summarize(results: list[VideoResult], suite: dict[MetricName, Metric]) -> dict[str, dict[str, object]]:
    """Per metric: how many videos it scored and the means over them."""
    summary: dict[str, dict[str, object]] = {}
    for name in METRIC_NAMES:
        if name not in suite:
            continue
        rows = [r.metrics[name] for r in results if name in r.metrics]
        scored = [m for m in rows if m.has_vde]
        summary[name] = {
            "backend": suite[name].backend,
            "weight_free": suite[name].weight_free,
            "vbench_dimension": VBENCH_DIMENSION[name],
            "videos_scored": len(scored),
            "videos_failed": len(results) - len(scored),
            "vde_linear": _mean([m.vde_linear for m in scored]),
            "vde_linear_normalized": _mean([m.vde_linear_normalized for m in scored]),
            "vde_log": _mean([m.vde_log for m in scored]),
            "vde_log_normalized": _mean([m.vde_log_normalized for m in scored]),
            "vbench_score": _mean([m.vbench_score for m in rows]),
        }
    return summary


@dataclass
class Evaluation:
    num_chunks: int
    videos: list[VideoResult]
    summary: dict[str, dict[str, object]]

    @property
    def failures(self) -> int:
        """(video, metric) pairs with an error, plus videos that could not be read."""
        return sum(1 if v.error else sum(bool(m.errors) for m in v.metrics.values()) for v in self.videos)

    def write_json(self, out: Path, weights: dict[str, str | None]) -> Path:
        data = {
            "num_chunks": self.num_chunks,
            "weights": weights,
            "summary": self.summary,
            "videos": [asdict(v) for v in self.videos],
        }
        path = out / RESULTS
        path.write_text(json.dumps(data, indent=2))
        return path


def evaluate_videos(
    paths: list[Path], suite: dict[MetricName, Metric], num_chunks: int = DEFAULT_CHUNKS, progress: bool = True
) -> Evaluation:
    results = [
        evaluate_video(path, suite, num_chunks)
        for path in tqdm(paths, desc="evaluating", unit="video", disable=not progress, file=sys.stderr)
    ]
    return Evaluation(num_chunks, results, summarize(results, suite))
