"""The worker's engine: built once for the loaded model, called from one thread, one call at a time.

Every engine call (opening a session with its text encoding, a prompt change, a batcher step, a
restore, a close, an offload, a prefetch, a re-decode) runs on the engine thread under `lock`: never
on the event loop, so that health checks, heartbeats, frame publishing and commits go on while a
block runs, and never two at once. One dedicated thread rather than asyncio's shared pool: no other
blocking call of the event loop (a snapshot's serialisation) queues behind a batcher step, nor a
batcher step behind it. On rank 0 of a worker pod (`driver` given, see
`workers/pod.py`) the same calls become pod commands that every rank executes.

The engine thread is also the only thread with several torch CPU threads (`config.threads`); every
other thread of the worker runs torch single-threaded. libgomp, the OpenMP runtime of torch's CPU
wheels, throttles its threads' spinning to almost nothing once the process holds more OpenMP threads
than there are cores, and each thread that runs a parallel region keeps a team of its own: a model
loaded on the main thread at 2 threads left the engine thread's toyworld blocks 3x slower than with
the main thread at one (`python -P bench/openmp_wait.py`, bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from engine.capabilities import EngineRequest, check
from engine.contract import Engine
from engine.kv.pool import KVPool
from engine.parallel.pod_driver import PodDriver
from engine.registry import Model, engine_for
from workers.config import WorkerConfig

log = logging.getLogger("inferix.worker")
T = TypeVar("T")


class EngineLock:
    """The engine's lock (an `asyncio.Lock`, entered with `async with`) that also counts the calls
    waiting for it, so that the batch pump, which keeps the engine thread stepping while nobody
    waits, hands it over after the current step when somebody does."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.waiting = 0  # read from the engine thread: an int's read is atomic

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


class EngineHost:
    """The engine of one loaded model, its KV pool, and the one thread that calls it."""

    def __init__(self, model: Model, config: WorkerConfig, driver: PodDriver | None = None) -> None:
        self.engine: Engine = engine_for(model, config.kv_pages, config.kv_dtype, driver)
        request = EngineRequest(
            kv_dtype=config.kv_dtype,
            pod=driver is not None,
            compile=config.compile,
            cuda_graphs=config.cuda_graphs,
            snapshots=bool(config.snapshot_every),
        )
        check(self.engine.capabilities, request)
        if config.compile:
            warm = self.engine.compile()  # before the capacity probe, which then measures compiled blocks
            log.info("compiled the DiT step: %d graph(s) in %.1f s", warm.graphs, warm.seconds)
        if config.cuda_graphs:
            warm = self.engine.use_cuda_graphs()
            log.info("captured the DiT step's CUDA graphs in %.1f s", warm.seconds)
        pool = self.engine.pool
        assert pool is not None
        self.pool: KVPool = pool
        # One engine call at a time; a drain also takes it to wait for the call in progress.
        self.lock = EngineLock()
        self.threads = config.threads or torch.get_num_threads()
        self._thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="engine", initializer=_engine_thread_torch, initargs=(self.threads,)
        )
        self._thread.submit(int).result()  # the engine thread takes its torch threads now, ...
        torch.set_num_threads(1)  # ... and every thread started later (and this one) runs torch on one

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the engine thread, under the lock."""
        async with self.lock:
            return await self.in_thread(fn, *args)

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the engine thread; the caller holds `lock`."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)


def _engine_thread_torch(threads: int) -> None:
    """The engine thread's torch CPU threads, taken at once: a thread reads torch's process-wide count when
    it first runs torch, and the worker sets that count to one right after."""
    torch.set_num_threads(threads)
    torch.get_num_threads()
