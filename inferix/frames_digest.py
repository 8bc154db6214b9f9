"""The frames digest: one SHA-256 value that pins a session's raw frames bit for bit.

It is a chain, one link per frame: `h_0 = SHA-256("")`, `h_k = SHA-256(h_{k-1} || frame_k)`, where
`frame_k` is the k-th frame's RGB24 bytes; the digest of a session is `h_n` in hex. A chain rather
than one SHA-256 over all bytes because its whole state after any frame is those 32 bytes: a
streamer that restarts mid-session reads them back from its recording journal and goes on from the
last durable frame, instead of needing the video again from frame 0 (hashlib cannot export the
running state of a plain SHA-256).

`inferix generate`, the streamer (`GetStreamInfo.frames_sha256`) and every test that compares them
compute it here, so "same digest" means "same frames, same order".
"""

from __future__ import annotations

import hashlib

import numpy as np

STATE_BYTES = 32
_EMPTY = hashlib.sha256().digest()


class FramesDigest:
    """The running chain over frames given in order."""

    def __init__(self, state: bytes = _EMPTY) -> None:
        if len(state) != STATE_BYTES:
            raise ValueError(f"a frames digest state is {STATE_BYTES} bytes, got {len(state)}")
        self._state = state

    @classmethod
    def from_hex(cls, text: str) -> FramesDigest:
        """Resume from `hexdigest()` of an earlier chain (e.g. a recording journal's)."""
        try:
            return cls(bytes.fromhex(text))
        except ValueError as exc:
            raise ValueError(f"not a frames digest state: {text[:80]!r} ({exc})") from None

    def update(self, frame: bytes | memoryview) -> None:
        """Add one frame's raw bytes."""
        link = hashlib.sha256(self._state)
        link.update(frame)
        self._state = link.digest()

    def update_frames(self, frames: np.ndarray) -> None:
        """Add every frame of a uint8 [T, H, W, 3] block, in order."""
        for frame in frames:
            self.update(np.ascontiguousarray(frame).data)

    def hexdigest(self) -> str:
        return self._state.hex()
