"""Fixtures for the profiler tests: clocks the test drives, and profilers that always stop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inferix.profiling import CudaClock, Profiler
from tests.profiling.helpers import FakeGpu, ManualClock


@pytest.fixture
def make_profiler() -> Iterator[Callable[..., Profiler]]:
    """Build profilers (no sampling, no OpenTelemetry unless asked) and stop them after the test."""
    made: list[Profiler] = []

    def make(**kwargs: Any) -> Profiler:
        kwargs.setdefault("device", "cpu")
        kwargs.setdefault("sample_interval_s", None)
        kwargs.setdefault("otel", False)
        kwargs.setdefault("rank", 0)
        kwargs.setdefault("world_size", 1)
        profiler = Profiler(**kwargs)
        made.append(profiler)
        return profiler

    yield make
    for profiler in made:
        profiler.stop()


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake_gpu() -> FakeGpu:
    return FakeGpu()


@pytest.fixture
def cuda_clock(fake_gpu: FakeGpu) -> CudaClock:
    """The real CUDA clock, on the fake device."""
    return CudaClock(fake_gpu.new_event, device="fake gpu")
