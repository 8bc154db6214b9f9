"""A session record's event history across a scheduler restart: a client that re-attaches sees every
block once and always sees that the session was resumed."""

from __future__ import annotations

import asyncio

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.spec.presets import load_preset
from scheduler.sessions import SessionRecord
from scheduler.validation import ValidSpec, validate_spec

PRESETS = {"tiny": load_preset("tiny")}
SPEC = common_pb2.SessionSpec(model="tiny", num_blocks=8, prompts=[common_pb2.PromptChange(at_block=0, text="a ball")])


def revalidate(spec: common_pb2.SessionSpec) -> ValidSpec:
    return validate_spec(spec, PRESETS, 2)


def resumed_record(announced: int) -> SessionRecord:
    """What a restarted scheduler loads: the stored record says `announced` blocks were announced."""
    stored = SessionRecord("s1", "alice", revalidate(SPEC), common_pb2.PlaybackUrls())
    stored.announced_blocks = stored.next_block = announced
    stored.state = common_pb2.SESSION_STATE_RUNNING
    record = SessionRecord.from_json(stored.to_json(), revalidate)
    assert record.history_missing
    resumed = scheduler_pb2.StateChange(state=record.state, reason="resumed by a restarted scheduler")  # type: ignore[arg-type]
    record.publish(scheduler_pb2.InteractResponse(state=resumed))
    return record


def drain(queue: asyncio.Queue[scheduler_pb2.InteractResponse | None]) -> list[str]:
    seen = []
    while not queue.empty():
        event = queue.get_nowait()
        assert event is not None
        kind = event.WhichOneof("event")
        seen.append(f"block {event.block.block_index}" if kind == "block" else event.state.reason)
    return seen


def blocks(*indices: int) -> list[common_pb2.BlockEvent]:
    return [common_pb2.BlockEvent(block_index=i) for i in indices]


def test_a_block_announced_but_not_persisted_before_the_crash_precedes_the_resume() -> None:
    # The old scheduler announced block 4, then died before persisting announced_blocks=5.
    record = resumed_record(announced=4)
    record.restore_history(blocks(0, 1, 2, 3, 4))
    assert record.announced_blocks == 5
    # The client saw block 4 from the old scheduler and re-attaches after it.
    assert drain(record.subscribe(from_block=5)) == ["resumed by a restarted scheduler"]
    assert drain(record.subscribe(from_block=3)) == ["block 3", "block 4", "resumed by a restarted scheduler"]


def test_a_client_attached_before_the_history_is_back_gets_the_unannounced_blocks_once() -> None:
    record = resumed_record(announced=4)
    early = record.subscribe(from_block=4)
    record.restore_history(blocks(0, 1, 2, 3, 4))
    assert drain(early) == ["resumed by a restarted scheduler", "block 4"]
    record.publish(scheduler_pb2.InteractResponse(block=common_pb2.BlockEvent(block_index=5)))
    assert drain(early) == ["block 5"]
    assert drain(record.subscribe(from_block=0)) == [
        *(f"block {i}" for i in range(5)),
        "resumed by a restarted scheduler",
        "block 5",
    ]
