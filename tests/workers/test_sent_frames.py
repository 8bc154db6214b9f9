"""`workers.publish.SentFrames`: the frames a worker keeps until its streamer holds them on disk."""

from __future__ import annotations

import numpy as np

from workers.publish import SentFrames


def block(first: int, frames: int = 3) -> np.ndarray:
    """Frames whose every byte is the frame index, so a slice shows which frames it holds."""
    return np.stack([np.full((2, 4, 3), first + i, dtype=np.uint8) for i in range(frames)])


def test_kept_frames_reach_back_to_what_the_streamer_holds_and_no_further() -> None:
    sent = SentFrames()
    for index in range(5):
        sent.add(index, 3 * index, block(3 * index))
    assert sent.end == 15 and len(sent.blocks) == 5
    sent.trim(7)  # blocks 0 and 1 (frames 0..5) are durable; block 2 holds frame 7, so it stays
    assert [first for _, first, _ in sent.blocks] == [6, 9, 12]
    assert sent.bytes == sum(rgb.nbytes for _, _, rgb in sent.blocks)
    kept = sent.since(7)
    assert kept is not None
    assert [(index, first) for index, first, _ in kept] == [(2, 7), (3, 9), (4, 12)]
    assert [int(rgb[0, 0, 0, 0]) for _, _, rgb in kept] == [7, 9, 12]  # block 2 from its second frame
    assert sum(rgb.shape[0] for _, _, rgb in kept) == 8
    assert sent.since(15) == []  # the streamer holds everything: nothing to re-send
    assert sent.since(5) is None  # frames 5 and before were dropped: not all kept
    assert sent.since(16) is None


def test_the_cap_drops_the_oldest_blocks_and_a_gap_starts_over() -> None:
    one = block(0).nbytes
    sent = SentFrames(max_bytes=2 * one)
    for index in range(4):
        sent.add(index, 3 * index, block(3 * index))
    assert [index for index, _, _ in sent.blocks] == [2, 3] and sent.bytes == 2 * one
    assert sent.since(3) is None and sent.since(6) is not None
    sent.add(9, 27, block(27))  # a block that does not follow: what came before cannot be re-sent with it
    assert [index for index, _, _ in sent.blocks] == [9] and sent.end == 30 and sent.bytes == one
