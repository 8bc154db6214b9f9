"""The worker's batch pump over a real engine (toyworld): a block's steps run on the engine thread
in one visit, an engine call that waits for the lock gets it after the step in progress, not after
the block, and a block's frames are handed out before its context pass."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
from prometheus_client import REGISTRY

from engine.batching import BatchJob
from engine.contract import SessionRequest, VideoBlock
from engine.families.wan.dit import DiTCall
from engine.families.wan.pipeline import Early
from engine.registry import LoadOptions, Model, load_model
from workers.batch_pump import BatchPump
from workers.capacity import CapacityMeter
from workers.config import WorkerConfig
from workers.engine_host import EngineHost

T = TypeVar("T")


class CountingHost(EngineHost):
    """The real engine host, counting its visits to the engine thread."""

    visits = 0

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        self.visits += 1
        return await super().in_thread(fn, *args)


def forwards() -> float:
    return REGISTRY.get_sample_value("inferix_worker_forward_seconds_count") or 0.0


@pytest.fixture(scope="module")
def toyworld() -> Model:
    return load_model("toyworld", LoadOptions("fp32", "cpu"), served=True)


def test_a_blocks_steps_run_in_one_visit_to_the_engine_thread(toyworld: Model) -> None:
    host = CountingHost(toyworld, WorkerConfig("w", "", kv_pages=64))

    async def main() -> tuple[int, float]:
        pump = BatchPump(host, CapacityMeter(toyworld.fps, 0), None)
        video = await host.call(host.engine.open_session, SessionRequest(prompt="a red ball", num_blocks=3))
        visits, before = host.visits, forwards()
        for _ in range(3):
            await pump.run(video)
        return host.visits - visits, forwards() - before

    visits, steps = asyncio.run(main())
    assert steps >= 3 * 4  # toyworld: denoising steps and a context pass per block
    assert visits == 3, f"{visits} visits for 3 blocks of {steps / 3:.0f} forwards each"


def test_a_waiting_engine_call_runs_after_the_step_in_progress(toyworld: Model) -> None:
    host = EngineHost(toyworld, WorkerConfig("w", "", kv_pages=64))

    async def main() -> tuple[float, float, float, bool]:
        pump = BatchPump(host, CapacityMeter(toyworld.fps, 0), None)
        video = await host.call(host.engine.open_session, SessionRequest(prompt="a red ball", num_blocks=2))
        await pump.run(video)  # warm: the first block pays for first-call allocations
        done = asyncio.Event()

        def finished(entry: BatchJob[object]) -> None:
            done.set()

        start = forwards()
        pump.submit(video, finished)
        while forwards() < start + 1:  # the block's first forward is done: its others are to come
            await asyncio.sleep(0.0005)
        asked = forwards()
        ran = await host.call(forwards)
        block_done = done.is_set()
        await done.wait()
        return asked, ran, forwards() - start, block_done

    asked, ran, per_block, block_done = asyncio.run(main())
    assert per_block >= 4
    # The call waits for the step in progress (and one that began as it was asked), not for the block.
    assert ran - asked <= 2 and not block_done, (asked, ran, per_block)


def test_a_blocks_frames_are_handed_out_before_its_context_pass(toyworld: Model) -> None:
    engine = EngineHost(toyworld, WorkerConfig("w", "", kv_pages=64)).engine
    alone = engine.open_session(SessionRequest(prompt="a red ball", num_blocks=2, seed=3))
    solo = [alone.next_block(), alone.next_block()]
    video = engine.open_session(SessionRequest(prompt="a red ball", num_blocks=2, seed=3))
    for expected in solo:
        job, sent, kinds = video.block_job(), None, []
        early: list[object] = []
        try:
            while True:
                call = job.send(sent)
                if isinstance(call, Early):
                    early.append(call.value)
                    kinds.append("early")
                    sent = None
                    continue
                assert isinstance(call, DiTCall)
                kinds.append(call.kind)
                sent = toyworld.dit.forward_batch([call])[0]
        except StopIteration as stop:
            block = stop.value
        assert kinds[-2:] == ["early", "context_pass"] and kinds.count("early") == 1, kinds
        [handed] = early
        assert isinstance(handed, VideoBlock) and isinstance(block, VideoBlock)
        assert np.array_equal(handed.frames, block.frames) and np.array_equal(block.frames, expected.frames)
        assert block.context_s > 0 and handed.context_s == 0


def test_the_pump_hands_a_blocks_frames_out_before_it_is_done(toyworld: Model) -> None:
    host = EngineHost(toyworld, WorkerConfig("w", "", kv_pages=64))

    async def main() -> list[tuple[str, VideoBlock]]:
        pump = BatchPump(host, CapacityMeter(toyworld.fps, 0), None)
        video = await host.call(host.engine.open_session, SessionRequest(prompt="a red ball", num_blocks=2))
        seen: list[tuple[str, VideoBlock]] = []
        for _ in range(2):
            done = asyncio.Event()

            def finished(entry: BatchJob[object], done: asyncio.Event = done) -> None:
                block = entry.value()
                assert isinstance(block, VideoBlock)
                seen.append(("done", block))
                done.set()

            pump.submit(video, finished, lambda block: seen.append(("early", block)))
            await done.wait()
        return seen

    seen = asyncio.run(main())
    assert [what for what, _ in seen] == ["early", "done", "early", "done"]
    for (_, handed), (_, block) in zip(seen[::2], seen[1::2], strict=True):
        assert np.array_equal(handed.frames, block.frames) and handed.index == block.index
