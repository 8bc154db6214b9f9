"""Clocks that timestamp profiler events on the timeline where the work really happens.

On CPU the work happens when the Python code runs, so a stamp is `time.perf_counter_ns()`.
On CUDA, kernels run later than the Python code that launches them: a CPU timestamp around a
region would measure the launch, not the work. There a stamp is a CUDA event recorded on the
current stream, and its time is read from the GPU timeline (`origin.elapsed_time(event)`).

Reading an event's time needs the event to have completed. The hot path never waits for that:
the profiler keeps stamps pending, asks `is_ready()` (a non-blocking `event.query()`) when it
gets the chance, and only `seconds()` at report time may wait (`event.synchronize()`, which
waits for that one event, not for the whole device).
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from inferix.errors import UserError


class TimingEvent(Protocol):
    """The part of `torch.cuda.Event` the CUDA clock uses (created with `enable_timing=True`)."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...


@dataclass(slots=True)
class Stamp:
    """One point in time: the CPU time it was taken at, plus the CUDA event on a CUDA clock.

    The CPU time is kept on CUDA too, because CPU-side duration next to GPU-side duration
    shows whether a region is launch-bound.
    """

    cpu_ns: int
    event: TimingEvent | None = None


class Clock(Protocol):
    """Timestamps events; every time is in seconds since the clock's origin (session start)."""

    kind: str
    device: str
    origin: Stamp

    def start(self) -> None:
        """Set the origin (t = 0) now; called once, when the profiling session starts."""
        ...

    def stamp(self) -> Stamp:
        """Take a stamp now; never waits for the device."""
        ...

    def is_ready(self, stamp: Stamp) -> bool:
        """Whether `seconds(stamp)` can answer without waiting."""
        ...

    def seconds(self, stamp: Stamp) -> float:
        """Seconds from the origin to `stamp`; may wait for the device (report time only)."""
        ...


class CpuClock:
    """`time.perf_counter_ns`: monotonic, nanosecond resolution, the same for every thread."""

    kind = "cpu"
    device = platform.machine()

    def __init__(self) -> None:
        self.origin = Stamp(0)

    def start(self) -> None:
        self.origin = self.stamp()

    def stamp(self) -> Stamp:
        return Stamp(time.perf_counter_ns())

    def is_ready(self, stamp: Stamp) -> bool:
        return True

    def seconds(self, stamp: Stamp) -> float:
        return (stamp.cpu_ns - self.origin.cpu_ns) / 1e9


class CudaClock:
    """CUDA events on the current stream of the calling thread, read on the GPU timeline.

    `new_event` makes one timing event; the default is `torch.cuda.Event(enable_timing=True)`.
    """

    kind = "cuda"

    def __init__(self, new_event: Callable[[], TimingEvent], device: str) -> None:
        self._new_event = new_event
        self.device = device
        self.origin = Stamp(0)

    def start(self) -> None:
        self.origin = self.stamp()

    def stamp(self) -> Stamp:
        event = self._new_event()
        event.record()
        return Stamp(time.perf_counter_ns(), event)

    def is_ready(self, stamp: Stamp) -> bool:
        assert stamp.event is not None
        return stamp.event.query()

    def seconds(self, stamp: Stamp) -> float:
        assert stamp.event is not None and self.origin.event is not None
        stamp.event.synchronize()
        # elapsed_time needs both events complete; the origin precedes every other stamp.
        return self.origin.event.elapsed_time(stamp.event) / 1e3


def select_clock(device: str) -> Clock:
    """The clock for `device`: "cpu", "cuda", or "auto".

    "auto" picks CUDA only when torch is already imported and CUDA is available: if nothing
    imported torch, no CUDA work can be queued, and importing it here would cost seconds.
    """
    if device == "cpu":
        return CpuClock()
    if device == "auto":
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return CpuClock()
        return _torch_cuda_clock()
    if device == "cuda":
        return _torch_cuda_clock()
    raise UserError(f"profiler device must be 'auto', 'cpu' or 'cuda', not {device!r}")


def _torch_cuda_clock() -> CudaClock:
    import torch

    if not torch.cuda.is_available():
        raise UserError("profiler device 'cuda' needs a CUDA GPU and a CUDA build of torch; use 'auto' or 'cpu'")
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    return CudaClock(lambda: torch.cuda.Event(enable_timing=True), device=name)
