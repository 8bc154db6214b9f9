"""The scheduler's memory per session stays bounded: a client that never reads its events has its
stream ended once it leaves MAX_UNREAD_EVENTS unread (a client that reads keeps getting every event),
and a session's history keeps its latest HISTORY_EVENTS, however long it runs."""

from __future__ import annotations

import asyncio

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.spec.presets import load_preset
from scheduler.sessions import HISTORY_EVENTS, MAX_UNREAD_EVENTS, SessionRecord
from scheduler.validation import validate_spec


def toyworld_session(session_id: str, num_blocks: int) -> SessionRecord:
    prompts = [common_pb2.PromptChange(at_block=0, text="a ball")]
    valid = validate_spec(
        common_pb2.SessionSpec(model="toyworld", num_blocks=num_blocks, prompts=prompts),
        {"toyworld": load_preset("toyworld")},
        2,
    )
    return SessionRecord(session_id, "alice", valid, common_pb2.PlaybackUrls())


def test_a_client_that_does_not_read_is_cut_off_and_a_reader_is_not() -> None:
    async def scenario() -> None:
        record = toyworld_session("s1", 4)
        idle, reader = record.subscribe(0), record.subscribe(0)
        backlog = idle.qsize()
        read = 0
        for i in range(MAX_UNREAD_EVENTS + 10):
            record.publish(scheduler_pb2.InteractResponse(error=scheduler_pb2.ErrorEvent(code=0, message=str(i))))
            while not reader.empty():
                reader.get_nowait()
                read += 1
        assert idle.overflowed and idle.qsize() == backlog + MAX_UNREAD_EVENTS + 1
        items = [idle.get_nowait() for _ in range(idle.qsize())]
        assert items[-1] is None  # its stream ends here
        assert not reader.overflowed and read == backlog + MAX_UNREAD_EVENTS + 10

    asyncio.run(scenario())


def test_an_hour_long_session_keeps_only_its_latest_events_for_clients_that_attach_later() -> None:
    async def scenario() -> None:
        record = toyworld_session("s1", 0)
        blocks = 3 * HISTORY_EVENTS  # about 19,000 at an hour of toyworld: the memory is the same
        for i in range(blocks):
            record.announce(common_pb2.BlockEvent(block_index=i, first_frame=3 * i, num_frames=3))
        assert len(record.events) == HISTORY_EVENTS
        late = record.subscribe(0)  # from the first block: it gets the latest kept, in order
        got = [late.get_nowait() for _ in range(late.qsize())]
        assert [e.block.block_index for e in got] == list(range(blocks - HISTORY_EVENTS, blocks))
        again = record.subscribe(blocks - 5)  # re-attaching after block blocks - 6: no event twice
        assert [again.get_nowait().block.block_index for _ in range(again.qsize())] == list(range(blocks - 5, blocks))
        # A restarted scheduler puts the worker's blocks before its own events; the oldest drop out.
        resumed = toyworld_session("s2", 0)
        resumed.announced_blocks = blocks
        resumed.set_state(common_pb2.SESSION_STATE_RUNNING, "resumed by a restarted scheduler")
        resumed.restore_history([common_pb2.BlockEvent(block_index=i) for i in range(blocks)])
        kept = list(resumed.events)
        assert len(kept) == HISTORY_EVENTS and kept[-1].WhichOneof("event") == "state"
        assert kept[0].block.block_index == blocks - HISTORY_EVENTS + 1

    asyncio.run(scenario())
