"""How many real-time streams a worker holds, per resolution, from its measured block latencies.

With continuous batching, N sessions of one resolution each get a block every L(N) seconds, where
L(N) is the block latency when N sessions run together; they all play in real time while
L(N) <= the block's budget (its frames / fps). The meter keeps a moving average of L per batch
size N (the mean number of sessions in the forwards a block took part in), fits L(N) = a + b*N
through the sizes it has seen (a startup probe and every block served), and reports the largest N
whose latency stays within `HEADROOM` of the budget, but never more than one session past the
largest size measured (`measured_up_to`): the line beyond it is an extrapolation from blocks that
may not carry what served blocks do (a probe block is not published nor committed), and a worker
that claimed 24 streams from 8 probe sessions served 8 (bench/RESULTS.md, issue 38). One past lets
the claim grow as the worker serves more sessions at once, a session at a time. The headroom is
there because a probe block is faster than a served one (the worker's event loop, busy with the
block's RPCs, holds the GIL that the engine thread needs between operators: served blocks took
1.1-1.2x the engine's own at 8 sessions at one torch thread, bench/RESULTS.md, issue 38), and
because a stream whose blocks take its whole budget has no slack for one slow block. With a single
size measured it assumes no further batching gain (L grows in proportion to N), which errs on the
safe side. An operator may pin the streams instead (`pinned_streams`, e.g. to leave more headroom);
latencies are still measured and reported.
"""

from __future__ import annotations

import collections
import threading

from inferix.spec.capacity import Resolution, StreamCapacity

MAX_STREAMS = 256  # no worker claims more streams of one resolution than this
EMA_WEIGHT = 0.3  # weight of a new latency sample in the moving average of its batch size
HEADROOM = 0.9  # a claimed stream's blocks take at most this share of their real-time budget


class CapacityMeter:
    """Block latencies per (resolution, batch size) -> real-time streams per resolution. Thread-safe."""

    def __init__(self, fps: float, pinned_streams: int = 0) -> None:
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        if pinned_streams < 0:
            raise ValueError(f"pinned_streams must be >= 0 (0: measured), got {pinned_streams}")
        self.fps = fps
        self.pinned_streams = pinned_streams
        self._latency: dict[tuple[int, int], dict[int, float]] = {}
        self._budget: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def record(self, width: int, height: int, batch: float, block_s: float, frames: int) -> None:
        """A block of `frames` pixel frames took `block_s` while `batch` sessions ran (on average)."""
        size = max(1, round(batch))
        key = (width, height)
        with self._lock:
            self._budget[key] = frames / self.fps
            samples = self._latency.setdefault(key, {})
            previous = samples.get(size)
            samples[size] = block_s if previous is None else (1 - EMA_WEIGHT) * previous + EMA_WEIGHT * block_s

    def clear(self) -> None:
        """Forget every latency recorded so far (a warm-up's, which first calls make slow)."""
        with self._lock:
            self._latency.clear()
            self._budget.clear()

    def at(self, width: int, height: int) -> StreamCapacity | None:
        """The capacity at this resolution (None: nothing measured at it)."""
        with self._lock:
            return self._capacity((width, height)) if (width, height) in self._latency else None

    def capacities(self) -> list[StreamCapacity]:
        with self._lock:
            return [self._capacity(key) for key in sorted(self._latency)]

    def _capacity(self, key: tuple[int, int]) -> StreamCapacity:
        latency = _LatencyCurve(self._latency[key])
        budget = self._budget[key]
        streams = self.pinned_streams
        if not streams:
            limit = min(MAX_STREAMS, max(latency.samples) + 1)  # one past what was measured, at most
            while streams < limit and latency(streams + 1) <= HEADROOM * budget:
                streams += 1
        return StreamCapacity(
            resolution=Resolution(*key),
            streams=streams,
            block_ms=1e3 * latency(max(streams, 1)),
            budget_ms=1e3 * budget,
            measured_up_to=max(latency.samples),
        )


class _LatencyCurve:
    """Block latency L(n) at n sessions: measured where it was, else the line fitted through the
    measured sizes (never below the largest smaller size's), or with one size L(n0) * n / n0."""

    def __init__(self, samples: dict[int, float]) -> None:
        self.samples = dict(samples)
        self.sizes = sorted(samples)
        if len(self.sizes) > 1:
            self.mean_n = sum(self.sizes) / len(self.sizes)
            self.mean_l = sum(samples.values()) / len(self.sizes)
            spread = sum((s - self.mean_n) ** 2 for s in self.sizes)
            slope = sum((s - self.mean_n) * (samples[s] - self.mean_l) for s in self.sizes) / spread
            self.slope = max(slope, 0.0)

    def __call__(self, n: int) -> float:
        if n in self.samples:
            return self.samples[n]
        if len(self.sizes) == 1:
            only = self.sizes[0]
            return self.samples[only] * max(n, only) / only
        fitted = self.mean_l + self.slope * (n - self.mean_n)
        below = [s for s in self.sizes if s < n]
        return max(fitted, self.samples[below[-1]]) if below else fitted


class RecentSpeed:
    """The real-time factor of a worker's recent blocks: video seconds made per second of block time
    over the last `window` blocks (what `inferix cluster status` and the InferixWorkerBelowRealtime
    alert read; >= 1: each stream keeps up). 0 before the first block."""

    def __init__(self, window: int = 32) -> None:
        self._blocks: collections.deque[tuple[float, float]] = collections.deque(maxlen=window)

    def record(self, video_s: float, block_s: float) -> None:
        self._blocks.append((video_s, block_s))

    @property
    def realtime_factor(self) -> float:
        spent = sum(block_s for _, block_s in self._blocks)
        return sum(video_s for video_s, _ in self._blocks) / spent if spent > 0 else 0.0
