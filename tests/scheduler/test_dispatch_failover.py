"""Placement and dispatch failover, in one process (`tests/scheduler/inprocess.py`): the real
scheduler classes, kvcache_svc's real registry and block store, workers running the real toyworld
engine; only the transport is direct calls instead of gRPC. The same paths with real processes and
SIGKILL are in tests/mesh/test_recovery.py; these run in seconds, in `make test-fast`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from inferix.api.v1 import common_pb2
from scheduler import metrics
from tests.scheduler.inprocess import InProcessMesh, announced, solo_frames, with_config

BLOCKS = 6


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def _view(mesh: InProcessMesh) -> dict[str, tuple[bool, bool, dict[str, int]]]:
    return {r.worker_id: (mesh.registry.alive(r), r.suspect, r.reservations) for r in await mesh.registry.workers()}


def _assert_every_block_once(events: list[common_pb2.BlockEvent], blocks: int) -> None:
    assert [e.block_index for e in events] == list(range(blocks))
    first = [e.first_frame for e in events]
    assert first == sorted(first) and first[0] == 0
    assert all(a.first_frame + a.num_frames == b.first_frame for a, b in zip(events, events[1:], strict=False))


@in_loop
async def test_a_session_moves_off_a_worker_that_dies_mid_block_with_every_block_once_and_the_same_frames() -> None:
    mesh = InProcessMesh(["w-a", "w-b"])
    await mesh.register()
    recoveries = metrics.RECOVERIES._value.get()
    mesh.workers["w-a"].die_at(3)  # w-a (first by id, both idle) takes the session and dies making block 3
    record = await mesh.finished(await mesh.create(BLOCKS))

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    events = announced(record)
    _assert_every_block_once(events, BLOCKS)
    assert [e.worker_id for e in events] == ["w-a"] * 3 + ["w-b"] * 3
    assert record.worker_id == "w-b"
    np.testing.assert_array_equal(mesh.frames(record), solo_frames(record))
    # kvcache_svc was told: no admission on w-a until it heartbeats again; the finished session holds no room.
    view = await _view(mesh)
    assert view["w-a"][:2] == (False, True) and view["w-b"][:2] == (True, False)
    assert not view["w-a"][2] and not view["w-b"][2]
    assert metrics.RECOVERIES._value.get() == recoveries + 1
    reasons = [e.state.reason for e in record.events if e.WhichOneof("event") == "state"]
    assert "worker w-a failed; recovering" in reasons


@in_loop
async def test_a_hung_worker_is_found_by_missed_health_probes_and_its_session_moves() -> None:
    mesh = InProcessMesh(["w-a", "w-b"])
    await mesh.register()
    mesh.workers["w-a"].hang_at(2)  # accepts the call, never answers, fails its health checks
    record = await mesh.finished(await mesh.create(BLOCKS))

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    events = announced(record)
    _assert_every_block_once(events, BLOCKS)
    assert [e.worker_id for e in events] == ["w-a"] * 2 + ["w-b"] * 4
    np.testing.assert_array_equal(mesh.frames(record), solo_frames(record))


@in_loop
async def test_placement_skips_and_reports_a_registered_worker_that_cannot_be_reached() -> None:
    mesh = InProcessMesh(["w-a", "w-b"])
    await mesh.register()
    mesh.workers["w-a"].kill()  # still registered and fresh in kvcache_svc, but gone
    record = await mesh.create(BLOCKS)

    assert record.worker_id == "w-b"
    view = await _view(mesh)
    assert view["w-a"] == (False, True, {})  # reported: the next session is not admitted there either
    assert view["w-b"][2] == {record.session_id: record.valid.shape.pages}
    second = await mesh.create(BLOCKS, seed=8)
    assert second.worker_id == "w-b"
    for done in (await mesh.finished(record), await mesh.finished(second)):
        assert done.state == common_pb2.SESSION_STATE_COMPLETED, done.error
        assert {e.worker_id for e in announced(done)} == {"w-b"}


@in_loop
async def test_a_session_whose_only_worker_dies_fails_with_the_reason_and_frees_its_room() -> None:
    mesh = InProcessMesh(["w-a"], with_config(block_deadline_s=0.5))
    await mesh.register()
    mesh.workers["w-a"].die_at(2)
    record = await mesh.finished(await mesh.create(BLOCKS))

    assert record.state == common_pb2.SESSION_STATE_FAILED
    assert "no worker could take over session" in record.error and "w-a failed" in record.error
    assert [e.block_index for e in announced(record)] == [0, 1]  # what was made stays announced
    errors = [e.error.message for e in record.events if e.WhichOneof("event") == "error"]
    assert errors and "no worker could take over" in errors[-1]
    assert (await _view(mesh))["w-a"][2] == {}  # its reservation is released
    committed = await mesh.blocks.listing(record.session_id)
    assert committed is not None and [i for i, _ in committed] == [0, 1]  # kept for a later retry


@pytest.mark.parametrize("max_recoveries", [1])
@in_loop
async def test_recoveries_beyond_max_recoveries_end_the_session_as_failed(max_recoveries: int) -> None:
    mesh = InProcessMesh(["w-a", "w-b", "w-c"], with_config(max_recoveries=max_recoveries))
    await mesh.register()
    mesh.workers["w-a"].die_at(1)
    mesh.workers["w-b"].die_at(3)  # the second failure: one more than allowed
    record = await mesh.finished(await mesh.create(BLOCKS))

    assert record.state == common_pb2.SESSION_STATE_FAILED
    assert "WorkerDown" in record.error and "w-b died during block 3" in record.error
    assert [(e.block_index, e.worker_id) for e in announced(record)] == [(0, "w-a"), (1, "w-b"), (2, "w-b")]
    assert all(not reservations for _, _, reservations in (await _view(mesh)).values())
