"""An interactive session's playback clock (issue 40): it never runs more than a block ahead of the
frames made, so a session that fell behind does not race to catch up a clock nobody watched."""

from __future__ import annotations

import time

from inferix.api.v1 import common_pb2
from inferix.spec.presets import load_preset
from scheduler.sessions import SessionRecord
from scheduler.validation import validate_spec


def record() -> SessionRecord:
    spec = common_pb2.SessionSpec(
        model="toyworld",
        num_blocks=0,
        prompts=[common_pb2.PromptChange(at_block=0, text="a red ball")],
        latency=common_pb2.LATENCY_MODE_INTERACTIVE,
    )
    valid = validate_spec(spec, {"toyworld": load_preset("toyworld")}, 2)
    return SessionRecord("s", "owner", valid, common_pb2.PlaybackUrls())


def test_the_clock_waits_for_a_session_that_fell_behind() -> None:
    session = record()
    session.keep_up(16.0, made=3, frames=3)  # no block yet: no clock to hold
    assert session.first_block_at is None
    session.first_block_at = time.monotonic() - 2.0  # 32 frames watched, 6 made: 26 behind
    before = time.monotonic()
    session.keep_up(16.0, made=6, frames=3)
    after = time.monotonic()
    # held at a block past the frames made: frame 9 was due when keep_up looked at the clock (bounded by
    # the times read around it, not by how soon a loaded machine runs the next line)
    held_at = session.first_block_at + 9.0 / 16.0
    assert before - 1e-9 <= held_at <= after + 1e-9, (before, held_at, after)
    started = session.first_block_at
    session.keep_up(16.0, made=9, frames=3)  # on time again: the clock runs on
    assert session.first_block_at == started
