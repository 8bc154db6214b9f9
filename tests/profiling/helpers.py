"""Test doubles and synthetic workloads for the profiler tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferix.profiling import Profiler, ProfileReport, Stamp, profile


class ManualClock:
    """A CPU-kind clock that only moves when the test says so, so metrics have exact values."""

    kind = "cpu"
    device = "manual"

    def __init__(self) -> None:
        self.now_ns = 0
        self.origin = Stamp(0)

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)

    def start(self) -> None:
        self.origin = self.stamp()

    def stamp(self) -> Stamp:
        return Stamp(self.now_ns)

    def is_ready(self, stamp: Stamp) -> bool:
        return True

    def seconds(self, stamp: Stamp) -> float:
        return (stamp.cpu_ns - self.origin.cpu_ns) / 1e9


class FakeGpu:
    """A device whose timeline and completion the test controls, behind the CUDA clock.

    Events behave like `torch.cuda.Event(enable_timing=True)`: `record()` enqueues them at the
    current device time, `query()` says whether the device reached them, `synchronize()` waits
    (here: completes them, and counts the wait), `elapsed_time` fails unless both completed.
    """

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.synchronizations = 0
        self.events: list[FakeEvent] = []

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def run(self, ms: float) -> None:
        """Queued work takes `ms` more device time."""
        self.now_ms += ms

    def finish(self) -> None:
        """The device catches up: every recorded event completes."""
        for event in self.events:
            event.completed = True


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self._gpu = gpu
        self.time_ms: float | None = None
        self.completed = False

    def record(self) -> None:
        self.time_ms = self._gpu.now_ms
        self._gpu.events.append(self)

    def query(self) -> bool:
        return self.completed

    def synchronize(self) -> None:
        if not self.completed:
            self._gpu.synchronizations += 1
            self.completed = True

    def elapsed_time(self, end_event: Any) -> float:
        if not (self.completed and end_event.completed):
            raise RuntimeError("elapsed_time on an event that has not completed")
        assert self.time_ms is not None and end_event.time_ms is not None
        return float(end_event.time_ms - self.time_ms)


def rank_report(
    rank: int,
    world_size: int,
    latencies: Sequence[float],
    pixel_frames: int,
    fps: float | None = 16.0,
) -> ProfileReport:
    """The report of one rank that generated `len(latencies)` blocks back to back, on a manual clock."""
    clock = ManualClock()
    profiler = Profiler(
        clock=clock, rank=rank, world_size=world_size, fps=fps, label="tiny", sample_interval_s=None, otel=False
    )
    with profiler.session():
        for index, latency in enumerate(latencies):
            with profiler.block(index) as block:
                with profile("denoise_step", step=0):
                    clock.advance(latency / 2)
                with profile("vae_decode"):
                    clock.advance(latency / 2)
                block.pixel_frames = pixel_frames
    return profiler.report()
