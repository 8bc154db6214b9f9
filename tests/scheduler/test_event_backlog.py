"""A client that never reads its events: its stream ends once it leaves MAX_UNREAD_EVENTS unread, so
the scheduler's memory stays bounded, while a client that reads keeps getting every event."""

from __future__ import annotations

import asyncio

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.spec.presets import load_preset
from scheduler.sessions import MAX_UNREAD_EVENTS, SessionRecord
from scheduler.validation import validate_spec


def test_a_client_that_does_not_read_is_cut_off_and_a_reader_is_not() -> None:
    async def scenario() -> None:
        prompts = [common_pb2.PromptChange(at_block=0, text="a ball")]
        valid = validate_spec(
            common_pb2.SessionSpec(model="toyworld", num_blocks=4, prompts=prompts),
            {"toyworld": load_preset("toyworld")},
            2,
        )
        record = SessionRecord("s1", "alice", valid, common_pb2.PlaybackUrls())
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
