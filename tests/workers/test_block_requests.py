"""`workers.publish.block_requests`: a block's frames in as few PushBlock calls as a message allows."""

from __future__ import annotations

from inferix.api.v1 import streamer_pb2
from inferix.server import MAX_MESSAGE_BYTES
from workers.publish import PUSH_BLOCK_MAX_BYTES, block_requests


def frames(count: int, width: int, height: int) -> list[streamer_pb2.VideoFrame]:
    pixels = bytes(width * height * 3)
    return [streamer_pb2.VideoFrame(frame_index=i, width=width, height=height, data=pixels) for i in range(count)]


def test_a_block_goes_in_one_call_unless_its_frames_outgrow_a_message() -> None:
    small = frames(12, 832, 480)  # 14 MiB: one call
    assert [len(r.frames) for r in block_requests(small)] == [12]
    large = frames(12, 1920, 1080)  # 6 MiB a frame: 5 frames per 32 MiB call
    calls = block_requests(large)
    assert [len(r.frames) for r in calls] == [5, 5, 2]
    assert [f.frame_index for r in calls for f in r.frames] == list(range(12))  # in order, each once
    assert max(r.ByteSize() for r in calls) < MAX_MESSAGE_BYTES
    assert PUSH_BLOCK_MAX_BYTES == MAX_MESSAGE_BYTES // 2


def test_a_frame_larger_than_the_limit_still_goes_alone() -> None:
    assert [len(r.frames) for r in block_requests(frames(3, 64, 64), max_bytes=100)] == [1, 1, 1]
    assert block_requests([]) == []
