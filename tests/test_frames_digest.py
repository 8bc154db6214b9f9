"""`inferix.frames_digest`: a chain over frames that can be resumed from its 32-byte state."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from inferix.frames_digest import FramesDigest


def test_the_digest_is_a_sha256_chain_over_frames_and_resumes_from_its_state() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(7, 6, 8, 3), dtype=np.uint8)
    state = hashlib.sha256().digest()
    for frame in frames:
        state = hashlib.sha256(state + frame.tobytes()).digest()
    whole = FramesDigest()
    whole.update_frames(frames)
    assert whole.hexdigest() == state.hex()

    head = FramesDigest()
    head.update_frames(frames[:3])
    tail = FramesDigest.from_hex(head.hexdigest())
    for frame in frames[3:]:
        tail.update(frame.tobytes())
    assert tail.hexdigest() == whole.hexdigest()

    # frame boundaries count: the same bytes cut into other frames give another digest
    regrouped = FramesDigest()
    regrouped.update(frames[:2].tobytes())
    regrouped.update_frames(frames[2:])
    assert regrouped.hexdigest() != whole.hexdigest()
    # a non-contiguous block (a slice) digests as its frames' bytes
    sliced = FramesDigest()
    sliced.update_frames(np.concatenate([frames, frames], axis=2)[:, :, :8])
    assert sliced.hexdigest() == whole.hexdigest()


def test_a_bad_state_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        FramesDigest(b"short")
    with pytest.raises(ValueError, match="not a frames digest state"):
        FramesDigest.from_hex("zz")
