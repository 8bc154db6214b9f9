"""The start-up capacity probe: block latency at the native resolution with 1, 2, 4, ... sessions.

Probe blocks run through the same batch pump as served blocks, and the capacity meter learns from
every block served afterwards as well, so what the worker claims follows what it serves.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from engine.contract import SessionRequest
from engine.registry import Model
from workers.batch_pump import BatchPump
from workers.capacity import CapacityMeter
from workers.engine_host import EngineHost

log = logging.getLogger("inferix.worker")


class CapacityProbe:
    def __init__(self, host: EngineHost, pump: BatchPump, capacity: CapacityMeter, model: Model) -> None:
        self.host = host
        self.pump = pump
        self.capacity = capacity
        self.model = model

    async def run(self, streams: int, pinned: bool) -> None:
        """Measure with up to `streams` probe sessions; each size runs two blocks per probe session (the
        second, with a fuller window, counts); it stops once a block misses its real-time budget, the KV
        pool is full, or at `streams` sessions. `pinned`: the streams are claimed, not measured (one
        probe session still measures the block latency and budget that are reported)."""
        limit = min(streams, 1 if pinned else 1 << 30)
        if not self.host.engine.capabilities.batching:  # blocks run whole, one at a time: no batch sizes
            limit = min(limit, 1)
        began = time.perf_counter()
        if limit > 0:
            # Unmeasured: a worker's first block is slow (allocations, kernel choices, lazy start-up), and
            # a meter that kept it fitted a flat latency curve from 1 to 8 sessions and claimed every stream.
            await self._probe(1)
            self.capacity.clear()
        n = 1
        while 0 < n <= limit and await self._probe(n):
            n = limit + 1 if n == limit else min(2 * n, limit)
        for c in self.capacity.capacities():
            log.info("capacity: %d real-time streams at %s (block %.0f ms of a %.0f ms budget; probed in %.1fs)",
                     c.streams, c.resolution, c.block_ms, c.budget_ms, time.perf_counter() - began)  # fmt: skip

    def _request(self, index: int) -> SessionRequest:
        """A two-block probe session: a prompt, or a mid-gray start image at the native size."""
        if self.host.engine.capabilities.starts_from == "image":
            gray = np.full((self.model.height, self.model.width, 3), 128, dtype=np.uint8)
            return SessionRequest(image=gray, num_blocks=2, session_id=f"probe-{index}")
        return SessionRequest(prompt="capacity probe", num_blocks=2, session_id=f"probe-{index}")

    async def _probe(self, n: int) -> bool:
        """Two blocks of `n` probe sessions batched; whether all `n` kept real time."""
        async with self.host.lock:
            videos = [await self.host.in_thread(self.host.engine.open_session, self._request(i)) for i in range(n)]
        try:
            for _ in range(2):
                results = await asyncio.gather(*(self.pump.run(v) for v in videos), return_exceptions=True)
                failed = [r for r in results if isinstance(r, BaseException)]
                if failed:
                    log.info("capacity probe stopped at %d sessions: %s", n, failed[0])
                    return False
        finally:
            async with self.host.lock:
                for video in videos:
                    await self.host.in_thread(video.close)
        measured = self.capacity.at(self.model.width, self.model.height)
        return measured is not None and measured.streams >= n
