"""The batch pump: every session's block job advanced together, one batched DiT forward per step.

Blocks of all sessions run through one `BlockBatcher` (continuous batching): `submit` adds a
session's block job, and a pump steps the batcher on the engine thread -- one batched forward for
every session with a block in progress -- until no job is left. Sessions join and leave at block
boundaries; a block's numbers do not depend on its batch (see `engine.batching`).

The pump only computes. When a job finishes, its `on_done` runs on the event loop right after the
step and before the next one starts, so a session whose next block is already queued at the worker
(`workers.blocks`) joins the very next forward; everything after the compute (frame publishing,
the commit, the RPC reply) runs on the event loop while the next step computes. Every finished
block's latency, with the mean batch it ran in, feeds the worker's real-time capacity
(`workers.capacity`).

A block's frames leave before its context pass: its job hands them out (`Early`) as soon as they
are decoded, and the pump passes them to the block's `on_early` on the event loop while the engine
thread goes on with the context pass.

Until a job finishes, the engine thread goes on to the next step by itself (a job submitted
meanwhile joins it there) instead of returning to the event loop after every forward: each return
costs a thread hop, about a millisecond on a busy small CPU, five times per block of one-frame
blocks (four denoising steps and the context pass). Another engine call that waits for the engine
lock (a prompt change, an open, a restore) still gets it after the current step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from engine.batching import BatchJob, ForwardStats
from engine.contract import Session, VideoBlock
from workers import metrics
from workers.capacity import CapacityMeter
from workers.engine_host import EngineHost

log = logging.getLogger("inferix.worker")
Done = Callable[[BatchJob[object]], None]
EarlyOutput = Callable[[VideoBlock], None]


class BatchPump:
    """Runs block jobs batched on the engine thread; tells each job's `on_done` as soon as it is done."""

    def __init__(self, host: EngineHost, capacity: CapacityMeter, max_tokens: int | None) -> None:
        self.host = host
        self.capacity = capacity
        self.batcher = host.engine.batcher(max_tokens, on_forward=self._observe_forward)
        self._waiters: dict[BatchJob[object], tuple[Session, Done, EarlyOutput | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._forward_s = 0.0  # forward seconds in the current step

    def submit(self, video: Session, on_done: Done, on_early: EarlyOutput | None = None) -> None:
        """Start the session's next block at the next step; `on_early(block)` with its frames as soon
        as they are decoded (a family whose jobs hand them out early; never after `on_done`), then
        `on_done(entry)` once it is done (or failed)."""
        entry = self.batcher.add(video.block_job())
        self._waiters[entry] = (video, on_done, on_early)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._pump())

    async def run(self, video: Session) -> VideoBlock:
        """The session's next block, made in the batch of every block in progress on this worker."""
        done: asyncio.Future[VideoBlock] = asyncio.get_running_loop().create_future()

        def finished(entry: BatchJob[object]) -> None:
            if entry.error is not None:
                done.set_exception(entry.error)
            else:
                done.set_result(entry.value())  # type: ignore[arg-type]

        self.submit(video, finished)
        return await done

    def _observe_forward(self, stats: ForwardStats) -> None:
        """The batcher's report of one forward (on the engine thread)."""
        self._forward_s += stats.seconds
        metrics.observe_forward(stats)

    def _steps(self, loop: asyncio.AbstractEventLoop) -> list[BatchJob[object]]:
        """Batcher steps on the engine thread until a job finishes, none is left, or another engine
        call waits for the lock; the jobs finished. Early outputs go to `loop` as they come."""
        while True:
            finished = self.batcher.step()
            for entry, value in self.batcher.take_early():
                loop.call_soon_threadsafe(self._hand_out, entry, value)
            if finished or not self.batcher.busy or self.host.lock.waiting:
                return finished

    def _hand_out(self, entry: BatchJob[object], value: object) -> None:
        """An early output, on the event loop (before its job's `on_done`, which is scheduled later)."""
        waiter = self._waiters.get(entry)
        if waiter is not None and waiter[2] is not None:
            assert isinstance(value, VideoBlock)
            waiter[2](value)

    async def _pump(self) -> None:
        """Step the batcher while it has jobs; the engine lock is free between runs of steps (`_steps`)."""
        engine = metrics.ENGINE_SECONDS
        stepped: float | None = None
        while self.batcher.busy:
            self._forward_s = 0.0
            try:
                async with self.host.lock:
                    began = time.perf_counter()
                    if stepped is not None:
                        engine.labels("gap").inc(began - stepped)
                    finished = await self.host.in_thread(self._steps, asyncio.get_running_loop())
            except Exception as exc:  # a failure outside any one job: every block in progress fails with it
                log.exception("batcher step failed")
                finished = self.batcher.fail_all(exc)
            stepped = time.perf_counter()
            decode_s = sum(e.result.decode_s for e in finished if isinstance(e.result, VideoBlock))
            engine.labels("forward").inc(self._forward_s)
            engine.labels("decode").inc(decode_s)
            engine.labels("step").inc(max(stepped - began - self._forward_s - decode_s, 0.0))
            for entry in finished:
                video, on_done, _ = self._waiters.pop(entry)
                if entry.error is None:
                    block = entry.value()
                    assert isinstance(block, VideoBlock)
                    self.capacity.record(
                        video.width, video.height, entry.mean_batch, entry.seconds, block.frames.shape[0]
                    )
                on_done(entry)
            metrics.BATCH_RUNNING.set(self.batcher.running)
