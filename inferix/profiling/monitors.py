"""Monitors sampled in a background thread: the process, the GPU, and gauges the engine registers.

Sampling runs off the hot path, in one daemon thread, into a bounded buffer (`deque(maxlen=...)`)
so that an endless video session holds a fixed amount of profiling memory. Every source is
optional: NVML only when `pynvml` (PyPI `nvidia-ml-py`) imports and finds the GPU, RSS only where
`/proc/self/statm` exists. A monitor or gauge that raises is logged once and dropped, so a broken
gauge never stops the others or the generation.

Series names (values are plain numbers):
    process.cpu_percent       process CPU time / wall time since the previous sample, x100
                              (above 100 when several cores are busy)
    process.rss_bytes         resident set size (Linux)
    gpu.memory_used_bytes     NVML, the whole device (all processes)
    gpu.memory_total_bytes
    gpu.utilization_percent   NVML: share of the last sample period a kernel was running
    gpu.power_watts
    gpu.sm_clock_mhz
    gpu.memory_clock_mhz
    torch.cuda.allocated_bytes  this process's tensors (caching allocator)
    torch.cuda.reserved_bytes   this process's cached blocks
    <gauge>  or  <gauge>.<key>  a registered gauge (a number, or a mapping of numbers)

A reading that is NaN or infinite counts as no reading (None in the timeline).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Protocol

from inferix.profiling.records import Timeline

logger = logging.getLogger(__name__)

GaugeValue = float | Mapping[str, float]
"""What a gauge returns: one number, or several numbers by name (e.g. used and total pages)."""


class Monitor(Protocol):
    """A source of readings, called from the sampler thread."""

    name: str

    def sample(self) -> Mapping[str, float]: ...

    def close(self) -> None: ...


class ProcessMonitor:
    """CPU % and RSS of this process.

    CPU time comes from `time.process_time()` (user + system, every thread; portable), RSS from
    `/proc/self/statm` where it exists; elsewhere only CPU % is reported.
    """

    name = "process"

    def __init__(self) -> None:
        self._last_wall = time.perf_counter()
        self._last_cpu = time.process_time()
        self._has_statm = os.path.exists("/proc/self/statm")  # Linux
        self._page_size = os.sysconf("SC_PAGE_SIZE") if self._has_statm else 0

    def sample(self) -> Mapping[str, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        values: dict[str, float] = {}
        if wall > self._last_wall:
            values["process.cpu_percent"] = 100.0 * (cpu - self._last_cpu) / (wall - self._last_wall)
        self._last_wall, self._last_cpu = wall, cpu
        if self._has_statm:
            with open("/proc/self/statm", encoding="ascii") as statm:
                values["process.rss_bytes"] = float(int(statm.read().split()[1]) * self._page_size)
        return values

    def close(self) -> None:
        """Nothing to release."""


class NvmlMonitor:
    """Memory, utilisation, power and clocks of one GPU, through NVML."""

    name = "gpu"

    def __init__(self, nvml: ModuleType, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle

    @classmethod
    def open(cls, nvml_index: int) -> NvmlMonitor | None:
        """The monitor for NVML device `nvml_index`, or None without `pynvml`, a driver or that GPU."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        try:
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(nvml_index))
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            return None

    def sample(self) -> Mapping[str, float]:
        nvml, handle = self._nvml, self._handle
        readers: dict[str, Callable[[], float]] = {
            "gpu.memory_used_bytes": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used,
            "gpu.memory_total_bytes": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total,
            "gpu.utilization_percent": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "gpu.power_watts": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "gpu.sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "gpu.memory_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        }
        values: dict[str, float] = {}
        for series, read in readers.items():
            try:
                values[series] = float(read())
            except nvml.NVMLError:  # e.g. power readings are not supported on every board
                continue
        return values

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class TorchCudaMemoryMonitor:
    """This process's CUDA memory as torch's caching allocator sees it (no device sync)."""

    name = "torch.cuda"

    def __init__(self, torch: ModuleType, device: int) -> None:
        self._torch = torch
        self._device = device

    def sample(self) -> Mapping[str, float]:
        cuda = self._torch.cuda
        return {
            "torch.cuda.allocated_bytes": float(cuda.memory_allocated(self._device)),
            "torch.cuda.reserved_bytes": float(cuda.memory_reserved(self._device)),
        }

    def close(self) -> None:
        """Nothing to release."""


def cuda_monitors() -> list[Monitor]:
    """Monitors for the current CUDA device: torch's allocator, and NVML when available."""
    import torch

    device = torch.cuda.current_device()
    monitors: list[Monitor] = [TorchCudaMemoryMonitor(torch, device)]
    try:
        # Maps the CUDA ordinal to NVML's, honouring CUDA_VISIBLE_DEVICES (indices or UUIDs).
        nvml_index = torch.cuda._get_nvml_device_index(device)
    except (AttributeError, RuntimeError):
        nvml_index = device
    nvml = NvmlMonitor.open(nvml_index)
    if nvml is not None:
        monitors.append(nvml)
    return monitors


class Gauge:
    """A callable the engine registers (e.g. KV pool occupancy), read at every sample."""

    def __init__(self, name: str, read: Callable[[], GaugeValue]) -> None:
        self.name = name
        self._read = read

    def sample(self) -> Mapping[str, float]:
        value = self._read()
        if isinstance(value, Mapping):
            return {f"{self.name}.{key}": float(v) for key, v in value.items()}
        return {self.name: float(value)}

    def close(self) -> None:
        """Nothing to release: the engine owns what the gauge reads."""


class Sampler:
    """Samples every monitor every `interval_s` seconds in a daemon thread, into a bounded buffer.

    `now_s` gives the sample time (seconds since session start, CPU clock).
    """

    def __init__(self, monitors: list[Monitor], interval_s: float, max_samples: int, now_s: Callable[[], float]):
        if interval_s <= 0:
            raise ValueError(f"sample interval must be positive, got {interval_s}")
        self._monitors = list(monitors)
        self._interval_s = interval_s
        self._now_s = now_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=max_samples)
        self._taken = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferix-profiler-sampler", daemon=True)

    def add(self, monitor: Monitor) -> None:
        """Sample `monitor` too, from the next sample on."""
        with self._lock:
            self._monitors.append(monitor)

    def start(self) -> None:
        """Take a first sample now (short sessions get a baseline), then sample in the background."""
        self.sample_once()
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, take a last sample (so the timeline reaches the end), close monitors."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample_once()
        with self._lock:
            monitors, self._monitors = self._monitors, []
        for monitor in monitors:
            monitor.close()

    def sample_once(self) -> None:
        """Read every monitor once and append one timeline row."""
        with self._lock:
            monitors = list(self._monitors)
        values: dict[str, float] = {}
        failed: list[Monitor] = []
        for monitor in monitors:
            try:
                # NaN or infinity means "no reading" (and would not be valid JSON).
                values.update((name, v) for name, v in monitor.sample().items() if math.isfinite(v))
            except Exception:  # a broken gauge must not stop sampling or generation
                logger.warning("profiler monitor %r failed and is no longer sampled", monitor.name, exc_info=True)
                failed.append(monitor)
        t = self._now_s()
        with self._lock:
            for monitor in failed:
                self._monitors.remove(monitor)
            self._samples.append((t, values))
            self._taken += 1
        for monitor in failed:
            monitor.close()

    def timeline(self, rank: int) -> tuple[Timeline, int]:
        """The retained samples column-wise, and how many older samples were dropped."""
        with self._lock:
            rows = list(self._samples)
            dropped = self._taken - len(rows)
        names = sorted({name for _, values in rows for name in values})
        series = {name: [values.get(name) for _, values in rows] for name in names}
        return Timeline(rank=rank, t_s=[t for t, _ in rows], series=series), dropped

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self.sample_once()
