"""Regions: nesting and self time, exceptions, decorators, threads and tasks, disabled mode."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import timeit
from collections.abc import Callable

import pytest

from inferix.profiling import Profiler, get_profiler, profile
from tests.profiling.helpers import ManualClock


def test_nested_regions_have_parent_depth_and_self_time(
    make_profiler: Callable[..., Profiler], manual_clock: ManualClock
) -> None:
    profiler = make_profiler(clock=manual_clock)
    with profiler.session():
        manual_clock.advance(1.0)
        with profile("outer", block=7):
            manual_clock.advance(1.0)
            with profile("a"):
                manual_clock.advance(2.0)
            with profile("b"):
                manual_clock.advance(1.0)
                with profile("c"):
                    manual_clock.advance(1.0)
                manual_clock.advance(1.0)
            manual_clock.advance(4.0)
    regions = {r.name: r for r in profiler.report().regions}

    outer, a, b, c = regions["outer"], regions["a"], regions["b"], regions["c"]
    assert (outer.depth, a.depth, b.depth, c.depth) == (0, 1, 1, 2)
    assert outer.parent_id is None and a.parent_id == outer.id and b.parent_id == outer.id and c.parent_id == b.id
    assert (outer.start_s, a.start_s, b.start_s, c.start_s) == (1.0, 2.0, 4.0, 5.0)
    assert (outer.duration_s, a.duration_s, b.duration_s, c.duration_s) == (10.0, 2.0, 3.0, 1.0)
    assert outer.self_s == 5.0 and b.self_s == 2.0 and c.self_s == 1.0
    assert outer.attrs == {"block": 7} and outer.error is None and outer.thread == threading.current_thread().name


def test_exception_closes_the_region_marks_it_and_propagates(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler()

    @profile("decorated")
    def fails() -> None:
        raise KeyError("missing")

    with profiler.session():
        with pytest.raises(ValueError, match="boom"), profile("outer"), profile("inner"):
            raise ValueError("boom")
        with pytest.raises(KeyError):
            fails()
        with profile("after"):
            pass
    regions = {r.name: r for r in profiler.report().regions}

    assert regions["inner"].error == "ValueError: boom"
    assert regions["outer"].error == "ValueError: boom"
    assert regions["decorated"].error == "KeyError: 'missing'"
    # The stack unwound: the next region is a root again.
    assert regions["after"].depth == 0 and regions["after"].parent_id is None and regions["after"].error is None
    assert {s.name: s.errors for s in profiler.report().region_stats}["outer"] == 1


def test_functions_decorated_before_the_profiler_starts_are_timed_while_it_runs(
    make_profiler: Callable[..., Profiler],
) -> None:
    @profile("sync_work", kind="sync")
    def sync_work(x: int) -> int:
        return x + 1

    @profile("async_work")
    async def async_work(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    assert sync_work(1) == 2  # no profiler yet: runs, records nowhere
    profiler = make_profiler()
    with profiler.session():
        assert sync_work(2) == 3
        assert asyncio.run(async_work(3)) == 6
    assert sync_work.__name__ == "sync_work"
    regions = profiler.report().regions
    assert [(r.name, r.attrs) for r in regions] == [("sync_work", {"kind": "sync"}), ("async_work", {})]


def test_threads_record_concurrently_each_with_its_own_stack(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler()
    threads, iterations = 6, 150
    barrier = threading.Barrier(threads)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(iterations):
            with profile("outer", worker=n, i=i), profile("inner", worker=n):
                profiler.record("work", i, worker=n)

    with profiler.session():
        pool = [threading.Thread(target=worker, args=(n,), name=f"worker-{n}") for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    report = profiler.report()

    by_id = {r.id: r for r in report.regions}
    assert len(by_id) == len(report.regions) == 2 * threads * iterations
    for region in report.regions:
        if region.name == "inner":
            parent = by_id[region.parent_id] if region.parent_id is not None else None
            assert parent is not None and parent.name == "outer" and region.depth == 1
            assert parent.thread == region.thread and parent.attrs["worker"] == region.attrs["worker"]
            assert region.start_s >= parent.start_s and region.duration_s <= parent.duration_s
        else:
            assert region.depth == 0 and region.parent_id is None
            assert region.thread == f"worker-{region.attrs['worker']}"
    assert len(report.metrics) == threads * iterations
    assert {m.thread for m in report.metrics} == {f"worker-{n}" for n in range(threads)}


def test_asyncio_tasks_interleaving_on_one_thread_keep_their_own_stacks(
    make_profiler: Callable[..., Profiler],
) -> None:
    profiler = make_profiler()

    async def task(name: str) -> None:
        with profile("task", task=name):
            for _ in range(3):
                with profile("step", task=name):
                    await asyncio.sleep(0)  # lets the other task open its regions in between

    async def both() -> None:
        await asyncio.gather(task("a"), task("b"))

    with profiler.session():
        asyncio.run(both())
    regions = profiler.report().regions
    by_id = {r.id: r for r in regions}
    steps = [r for r in regions if r.name == "step"]
    assert len(steps) == 6
    for step in steps:
        assert step.parent_id is not None and by_id[step.parent_id].attrs["task"] == step.attrs["task"]


def test_disabled_profiler_records_nothing_and_calls_no_hook(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler(enabled=False, sample_interval_s=0.01, otel=True)
    calls: list[object] = []
    profiler.on("block_done", lambda **payload: calls.append(payload))
    profiler.on("step_done", lambda **payload: calls.append(payload))

    def gauge() -> float:
        calls.append("gauge")
        return 1.0

    profiler.add_gauge("kv_pool", gauge)
    with profiler.session():
        assert get_profiler() is not profiler and not get_profiler().enabled
        with profile("region", step=1), profiler.region("explicit"), profiler.block(0) as block:
            block.pixel_frames = 9
        profiler.mark_block_start(1)
        profiler.mark_frames(4)
        profiler.mark_block_done(1, 12)
        profiler.record("kv_pages", 3)
        profiler.emit("step_done", step=1)
    report = profiler.report()

    assert calls == []
    assert report.regions == [] and report.blocks == [] and report.metrics == []
    assert report.timelines[0].t_s == [] and report.summary.blocks == 0 and report.ranks[0].clock == "off"


def test_inactive_profile_is_a_flag_check_that_keeps_no_memory() -> None:
    assert get_profiler().enabled is False
    assert profile("same") is profile("same")  # bare regions are shared: nothing is built

    def inactive() -> None:
        with profile("denoise_step"):
            pass

    def with_attrs() -> None:
        with profile("denoise_step", step=1):
            pass

    def baseline() -> None:
        with contextlib.nullcontext():
            pass

    before = sys.getallocatedblocks()
    for _ in range(20_000):
        inactive()
        with_attrs()
        get_profiler().record("kv_pages", 1)
    assert sys.getallocatedblocks() - before < 100

    cost = min(timeit.repeat(inactive, number=5_000, repeat=5)) / 5_000
    reference = min(timeit.repeat(baseline, number=5_000, repeat=5)) / 5_000
    assert cost < 4 * reference + 1e-6, (
        f"inactive profile() costs {cost * 1e9:.0f} ns, nullcontext {reference * 1e9:.0f} ns"
    )


def test_one_session_per_profiler_and_one_running_profiler_per_process(
    make_profiler: Callable[..., Profiler],
) -> None:
    first, second = make_profiler(), make_profiler()
    with first.session():
        with pytest.raises(RuntimeError, match="another Profiler is running"):
            second.start()
        assert get_profiler() is first
    assert get_profiler() is not first
    with pytest.raises(RuntimeError, match="already recorded a session"):
        first.start()
    with second.session():
        assert get_profiler() is second


def test_a_block_scope_closed_in_another_context_is_recorded(make_profiler: Callable[..., Profiler]) -> None:
    # The worker opens a block's scope when the block is admitted and closes it in the batch pump's
    # callback, another context: closing it there must record the block, not raise (it hung the block).
    profiler = make_profiler()
    with profiler.session():
        scope = profiler.block(0, session="s")
        contextvars.copy_context().run(scope.__enter__)
        scope.pixel_frames = 3
        contextvars.copy_context().run(scope.__exit__, None, None, None)
        with profile("after"):
            pass
    report = profiler.report()
    assert report.summary.blocks == 1
    assert {r.name for r in report.regions} >= {"block", "after"}
