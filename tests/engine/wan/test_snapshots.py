"""Exact KV snapshots (engine/snapshot.py): a session that loads one makes the blocks of the session it was
taken from, bit for bit, alone or with the blocks committed after it replayed on top."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.capabilities import MAGI, MATRIXGAME, WAN, EngineRequest, refusal
from engine.contract import Session, SessionRequest
from engine.registry import load_engine
from engine.snapshot import SessionSnapshot, SnapshotMismatch
from inferix.spec.actions import HeldAction


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def request(session_id: str, seed: int = 5) -> SessionRequest:
    return SessionRequest(prompt="a red ball bouncing to the right", seed=seed, session_id=session_id)


def run(session: Session, blocks: int, switch_at: int | None = None) -> list[bytes]:
    frames = []
    for _ in range(blocks):
        if session.next_block_index == switch_at:
            session.set_prompt("the ball turns green", recache=True)
        frames.append(session.next_block().frames.tobytes())
    return frames


@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8"])
def test_a_loaded_snapshot_continues_bit_for_bit(kv_dtype: str) -> None:
    engine = load_engine("toyworld", kv_pages=32, kv_dtype=kv_dtype)
    with engine.open_session(request("a")) as original:
        run(original, 9, switch_at=4)  # a LongLive re-cache before the snapshot: its latents are in it
        data = original.snapshot().encode()
        expected = run(original, 6, switch_at=11)  # and one after it, which re-encodes the snapshot's latents
    snapshot = SessionSnapshot.decode(data)
    assert (snapshot.next_block, snapshot.next_frame) == (9, 27)
    with engine.open_session(request("b")) as restored:
        restored.load_snapshot(snapshot)
        assert (restored.next_block_index, restored.prompt_text) == (9, "the ball turns green")
        assert run(restored, 6, switch_at=11) == expected


def test_a_snapshot_plus_the_blocks_committed_after_it_equals_a_replay_from_the_start() -> None:
    engine = load_engine("toyworld", kv_pages=32, kv_dtype="int8")
    with engine.open_session(request("a")) as original:
        committed = []
        for index in range(12):
            if index == 4:  # a paused session's pages are on the host: it is captured from there
                original.offload()
                snapshot = original.snapshot()
            committed.append(original.next_block().committed())
        expected = run(original, 3)
    with engine.open_session(request("b")) as restored:
        restored.load_snapshot(SessionSnapshot.decode(snapshot.encode()))
        frames = restored.restore(committed[4:8], from_start=False)
        frames += restored.restore(committed[8:], from_start=False)  # in pages, as the worker does
        assert frames == [3] * 8 and restored.next_block_index == 12
        assert run(restored, 3) == expected


def test_a_snapshot_decodes_the_blocks_after_it_again_as_they_were_made() -> None:
    """A restarted streamer's missing frames are decoded again from the session's anchor snapshot (its
    decoder memory), not from the first block."""
    engine = load_engine("toyworld", kv_pages=32)
    with engine.open_session(request("a")) as original:
        committed, frames = [], []
        for index in range(10):
            if index == 6:
                snapshot = SessionSnapshot.decode(original.snapshot().encode())
            block = original.next_block()
            committed.append(block.committed())
            frames.append(block.frames)
    with engine.open_session(request("b")) as successor:
        state = successor.redecode_state_at(snapshot)
        again = [successor.redecode(block, state) for block in committed[6:]]
        assert all(a.tobytes() == f.tobytes() for a, f in zip(again, frames[6:], strict=True))
    with engine.open_session(request("c", seed=6)) as other, pytest.raises(SnapshotMismatch, match="seed 5 != 6"):
        other.redecode_state_at(snapshot)


def test_an_action_model_snapshot_keeps_its_held_keys() -> None:
    engine = load_engine("toyworld-play", kv_pages=32)
    held = HeldAction(keys=(1,), mouse=())
    with engine.open_session(request("a")) as original:
        original.hold(held)
        run(original, 5)
        snapshot = SessionSnapshot.decode(original.snapshot().encode())
        expected = run(original, 3)
    with engine.open_session(request("b")) as restored:
        restored.load_snapshot(snapshot)
        assert run(restored, 3) == expected


def test_a_snapshot_of_another_session_kind_is_refused_and_leaves_the_session_as_it_was() -> None:
    engine = load_engine("toyworld", kv_pages=32)
    with engine.open_session(request("a")) as original:
        run(original, 3)
        snapshot = original.snapshot()
    with engine.open_session(request("b", seed=6)) as other_seed:
        with pytest.raises(SnapshotMismatch, match="seed 5 != 6"):
            other_seed.load_snapshot(snapshot)
        assert other_seed.next_block_index == 0
    int8 = load_engine("toyworld", kv_pages=32, kv_dtype="int8")
    with int8.open_session(request("c")) as other_layout:
        with pytest.raises(SnapshotMismatch, match="kv_dtype='auto'"):
            other_layout.load_snapshot(snapshot)
        assert other_layout.next_block_index == 0 and not other_layout.kv_usage().frames


def test_only_wan_models_on_one_device_take_snapshots() -> None:
    assert refusal(WAN, EngineRequest(snapshots=True)) is None
    for caps in (MAGI, MATRIXGAME):
        assert refusal(caps, EngineRequest(snapshots=True)) == (
            f"--snapshot-every: {caps.name} has no KV snapshots yet (it recovers by replay); use --snapshot-every 0"
        )
    assert refusal(WAN, EngineRequest(snapshots=True, pod=True)) == (
        "--snapshot-every: a sequence-parallel pod recovers by replay, not snapshots; use --snapshot-every 0"
    )
