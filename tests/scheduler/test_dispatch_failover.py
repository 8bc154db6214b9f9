"""Placement and dispatch failover in one process (`tests/scheduler/inprocess.py`): the scheduler's
real classes, kvcache_svc's real servicer and registry, real workers on the toyworld engine and the
real streamer, on a simulated network. The same paths with real processes and SIGKILL are in
tests/mesh/test_recovery.py; these run in seconds, in `make test-fast`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from inferix.api.v1 import common_pb2
from scheduler import metrics
from scheduler.config import SchedulerConfig
from scheduler.sessions import SessionRecord
from tests.scheduler.inprocess import FAST, SCHEDULER, STREAMER, InProcessMesh, announced, solo, with_config

BLOCKS = 6
SEED, PROMPT = 7, "a red ball rolls"


def in_mesh(
    workers: list[str], config: SchedulerConfig = FAST, **worker: object
) -> Callable[[Callable[[InProcessMesh], Awaitable[None]]], Callable[[Path], None]]:
    """Run the test's body in a fresh event loop, with a mesh of these workers started (`worker`:
    their `WorkerConfig` fields)."""

    def wrap(body: Callable[[InProcessMesh], Awaitable[None]]) -> Callable[[Path], None]:
        def test(tmp_path: Path) -> None:
            async def scenario() -> None:
                mesh = InProcessMesh(tmp_path, config, **worker)
                with mesh.installed():
                    await mesh.start(workers)
                    try:
                        await body(mesh)
                    finally:
                        await mesh.close()

            asyncio.run(scenario())

        test.__name__, test.__doc__ = body.__name__, body.__doc__  # not functools.wraps: pytest would ask for `mesh`
        return test

    return wrap


async def _view(mesh: InProcessMesh) -> dict[str, tuple[bool, bool, dict[str, int]]]:
    """Worker id -> (alive, suspect, reservations), as kvcache_svc's registry holds them now."""
    registry = mesh.kvcache.registry
    return {r.worker_id: (registry.alive(r), r.suspect, r.reservations) for r in await registry.workers()}


async def _assert_made_once_as_alone(mesh: InProcessMesh, record: SessionRecord) -> list[common_pb2.BlockEvent]:
    """Every block announced once, in order, and the streamer's frames those of the session made alone."""
    events = announced(record)
    assert [e.block_index for e in events] == list(range(BLOCKS))
    assert events[0].first_frame == 0
    assert all(a.first_frame + a.num_frames == b.first_frame for a, b in zip(events, events[1:], strict=False))
    info = await mesh.stream_info(record)
    assert (info.frames, info.frames_sha256) == solo(BLOCKS, SEED, PROMPT)
    return events


def _of(events: list[common_pb2.BlockEvent], worker_id: str) -> list[common_pb2.BlockEvent]:
    return [e for e in events if e.worker_id == worker_id]


def _answered(events: list[common_pb2.BlockEvent], worker_id: str, killed_during: int) -> int:
    """How many blocks the worker had answered when it was killed while computing block `killed_during`:
    the block before it may have been computed but not answered (its frames and commit go on while the
    next block computes), so `killed_during - 1` or `killed_during`; returns the index after its last."""
    made = [e.block_index for e in _of(events, worker_id)]
    end = made[-1] + 1 if made else 0
    assert end in (killed_during - 1, killed_during), (
        f"{worker_id} answered blocks {made}, killed during {killed_during}"
    )
    return end


@in_mesh(["w-a", "w-b"])
async def test_a_session_moves_off_a_worker_killed_mid_block_with_every_block_once_and_the_same_frames(
    mesh: InProcessMesh,
) -> None:
    recoveries = metrics.RECOVERIES._value.get()
    record = await mesh.create(BLOCKS, SEED, PROMPT)
    assert record.worker_id == "w-a"  # both idle: the first by id
    await mesh.during_block("w-a", record, 3)
    mesh.network.kill("w-a")
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    events = await _assert_made_once_as_alone(mesh, record)
    assert [e.worker_id for e in events] == ["w-a"] * _answered(events, "w-a", 3) + ["w-b"] * (
        BLOCKS - len(_of(events, "w-a"))
    )
    assert record.worker_id == "w-b"
    # kvcache_svc was told: no admission on w-a (until it heartbeats again); the finished session holds no room.
    view = await _view(mesh)
    assert view["w-a"][:2] == (False, True) and view["w-b"][:2] == (True, False)
    assert not view["w-a"][2] and not view["w-b"][2]
    assert metrics.RECOVERIES._value.get() == recoveries + 1
    reasons = [e.state.reason for e in record.events if e.WhichOneof("event") == "state"]
    assert "worker w-a failed; recovering" in reasons


@in_mesh(["w-a", "w-b"], with_config(block_deadline_s=600.0))  # found by its probes, long before the deadline
async def test_a_frozen_worker_is_found_by_missed_health_probes_and_its_session_moves(mesh: InProcessMesh) -> None:
    record = await mesh.create(BLOCKS, SEED, PROMPT)
    await mesh.during_block("w-a", record, 2)
    mesh.network.stop("w-a")  # SIGSTOP: the call in flight never answers, nor do health checks
    await mesh.finished(record, timeout_s=30)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    events = await _assert_made_once_as_alone(mesh, record)
    assert [e.worker_id for e in events] == ["w-a"] * _answered(events, "w-a", 2) + ["w-b"] * (
        BLOCKS - len(_of(events, "w-a"))
    )


@in_mesh(["w-a", "w-b"])
async def test_placement_skips_and_reports_a_registered_worker_that_cannot_be_reached(mesh: InProcessMesh) -> None:
    mesh.network.kill("w-a")  # still registered and fresh in kvcache_svc, but gone
    record = await mesh.create(BLOCKS, SEED, PROMPT)

    assert record.worker_id == "w-b"
    view = await _view(mesh)
    assert view["w-a"] == (False, True, {})  # reported: the next session is not admitted there either
    assert view["w-b"][2] == {record.session_id: record.valid.shape.pages}
    second = await mesh.create(BLOCKS, SEED + 1, PROMPT)
    assert second.worker_id == "w-b"
    await mesh.finished(record)
    await mesh.finished(second)
    assert record.state == second.state == common_pb2.SESSION_STATE_COMPLETED, (record.error, second.error)
    await _assert_made_once_as_alone(mesh, record)
    assert {e.worker_id for e in announced(second)} == {"w-b"}


@in_mesh(["w-a"], with_config(block_deadline_s=0.5))
async def test_a_session_whose_only_worker_dies_fails_with_the_reason_and_frees_its_room(mesh: InProcessMesh) -> None:
    record = await mesh.create(BLOCKS, SEED, PROMPT)
    await mesh.during_block("w-a", record, 2)
    mesh.network.kill("w-a")
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_FAILED
    assert "no worker could take over session" in record.error and "w-a failed" in record.error
    made = _answered(announced(record), "w-a", 2)  # what was made stays announced
    errors = [e.error.message for e in record.events if e.WhichOneof("event") == "error"]
    assert errors and "no worker could take over" in errors[-1]
    assert (await _view(mesh))["w-a"][2] == {}  # its reservation is released
    committed = await mesh.kvcache.blocks.listing(record.session_id)
    assert committed is not None and [i for i, _ in committed][:made] == list(range(made))  # kept: nothing made is lost


@in_mesh(["w-a", "w-b", "w-c"], with_config(max_recoveries=1))
async def test_a_failure_in_a_row_beyond_max_recoveries_ends_the_session_as_failed(mesh: InProcessMesh) -> None:
    record = await mesh.create(BLOCKS, SEED, PROMPT)
    await mesh.during_block("w-a", record, 2)
    mesh.network.kill("w-a")
    await mesh.during_block("w-b", record, None)  # its first block after the take-over
    mesh.network.kill("w-b")  # the second failure with no block made since the first: one more than allowed
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_FAILED
    assert "UNAVAILABLE" in record.error
    # What w-a made stays announced once, in order: the blocks it answered, and the one it committed
    # but did not answer before it died (announced at the take-over); nothing of w-b's.
    assert [e.block_index for e in announced(record)] in ([0], [0, 1])
    assert all(not reservations for _, _, reservations in (await _view(mesh)).values())


@in_mesh(["w-a", "w-b", "w-c"], with_config(max_recoveries=1))
async def test_failures_with_blocks_made_between_them_do_not_add_up(mesh: InProcessMesh) -> None:
    """An hours-long session outlives any number of failures, as long as each is recovered."""
    record = await mesh.create(BLOCKS, SEED, PROMPT)
    await mesh.during_block("w-a", record, 1)
    mesh.network.kill("w-a")
    await mesh.during_block("w-b", record, 3)
    mesh.network.kill("w-b")  # the second failure, after w-b made blocks: recovered again
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    events = await _assert_made_once_as_alone(mesh, record)
    on_a = _answered(events, "w-a", 1)
    on_b = _answered(events, "w-b", 3) - on_a
    assert on_b > 0
    assert [e.worker_id for e in events] == ["w-a"] * on_a + ["w-b"] * on_b + ["w-c"] * (BLOCKS - on_a - on_b)


@in_mesh(["w-a", "w-b"], snapshot_every=4, snapshot_piece_bytes=64 * 1024)
async def test_a_snapshot_shipped_in_pieces_is_what_the_successor_loads_and_the_frames_stay_the_same(
    mesh: InProcessMesh,
) -> None:
    blocks = 14
    record = await mesh.create(blocks, SEED, PROMPT)
    await mesh.during_block("w-a", record, 11)  # snapshots were taken after blocks 4 and 8 (about 400 KB each)
    mesh.network.kill("w-a")
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    info = await mesh.stream_info(record)
    assert (info.frames, info.frames_sha256) == solo(blocks, SEED, PROMPT)
    loaded = [line for line in mesh.logs.lines if "loaded its snapshot at block 8" in line]
    assert len(loaded) == 1, mesh.logs.lines
    pieces = int(loaded[0].split(" in ")[1].split(" piece")[0])
    assert pieces > 1, loaded  # several pieces of 64 KiB
    latest = await mesh.kvcache.snapshots.get(record.session_id)
    assert latest is not None and latest.next_block >= 8 and latest.pieces > 1 and not latest.state


@in_mesh(["w-a"])
async def test_a_streamer_restarted_after_the_last_frame_still_gets_the_recording_finished(mesh: InProcessMesh) -> None:
    record = await mesh.create(BLOCKS, SEED, PROMPT)
    await mesh.during_block("w-a", record, BLOCKS - 1)
    mesh.network.stop(SCHEDULER)  # its call that closes the session (and finishes the recording) waits
    frames, digest = solo(BLOCKS, SEED, PROMPT)
    async with asyncio.timeout(30):  # every frame pushed, the recording not finished yet
        while (info := await mesh.stream_info(record)).frames < frames:
            await asyncio.sleep(0.01)
    assert not info.finished
    mesh.restart_streamer()  # the new streamer has only the unfinished file on disk: it does not hold the session
    mesh.network.resume(SCHEDULER)
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    info = await mesh.stream_info(record)  # the worker sent the video again before finishing it
    assert info.finished and (info.frames, info.frames_sha256) == (frames, digest)
    assert (mesh.data_dir / f"{record.session_id}.mp4").stat().st_size > 0


@in_mesh(["w-a"])
async def test_a_session_rides_out_a_streamer_that_drains_and_restarts_mid_session(mesh: InProcessMesh) -> None:
    blocks = 10
    record = await mesh.create(blocks, SEED, PROMPT)
    await mesh.during_block("w-a", record, 3)
    await mesh.streamer.drain()  # SIGTERM: the open recording is closed unfinished
    await asyncio.sleep(0.5)  # the worker's next frames meet the draining streamer meanwhile
    mesh.restart_streamer()
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    info = await mesh.stream_info(record)  # the new streamer got the video from frame 0 (backfill), then the rest
    assert info.finished and (info.frames, info.frames_sha256) == solo(blocks, SEED, PROMPT)


@in_mesh(["w-a"])
async def test_frames_a_stopping_streamer_cancels_are_sent_again_to_the_next_one(mesh: InProcessMesh) -> None:
    """A streamer stopping after its drain's grace cancels the pushes it still holds, which reach the
    worker as CANCELLED (found by the 10-minute chaos run, which failed a session on it): the worker
    takes that as the streamer going away, like UNAVAILABLE, and its next streamer gets the video."""
    blocks = 8
    record = await mesh.create(blocks, SEED, PROMPT)
    await mesh.during_block("w-a", record, 3)
    mesh.network.stop(STREAMER)  # draining: what is pushed now waits, unanswered
    push = "/inferix.v1.StreamerService/PushBlock"
    async with asyncio.timeout(30):
        while not mesh.network.calls_in_flight(STREAMER, push):
            await asyncio.sleep(0.001)
    mesh.network.cancel_calls(STREAMER)  # its grace is over: grpc.aio cancels the calls in flight
    mesh.restart_streamer()
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    assert [e.block_index for e in announced(record)] == list(range(blocks))
    info = await mesh.stream_info(record)
    assert info.finished and (info.frames, info.frames_sha256) == solo(blocks, SEED, PROMPT)


@in_mesh(["w-a"])
async def test_frames_reach_a_streamer_of_a_release_before_push_block(mesh: InProcessMesh) -> None:
    """During a rolling upgrade a worker may push to a streamer of an older release, which has no
    PushBlock (UNIMPLEMENTED): the worker pushes there frame by frame (PushFrames), and the recording
    is the session made alone."""
    blocks = 8
    record = await mesh.create(blocks, SEED, PROMPT)
    await mesh.during_block("w-a", record, 3)
    mesh.restart_streamer(left_out=("PushBlock",))
    await mesh.finished(record)

    assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
    assert any("has no PushBlock" in line for line in mesh.logs.lines)
    info = await mesh.stream_info(record)
    assert info.finished and (info.frames, info.frames_sha256) == solo(blocks, SEED, PROMPT)
