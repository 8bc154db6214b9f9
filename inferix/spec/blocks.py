"""A committed block: what the mesh keeps of every block made, so that any worker can rebuild the
session by recompute (clean latents, where they start, under which prompt).

The one form of it shared by the worker (which commits it), kvcache_svc (which stores it) and the
engine (which replays it). Latents travel as float32 little-endian bytes, [frames, channels,
height, width], so this layer needs neither torch nor numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferix.api.v1 import common_pb2, kvcache_pb2

FLOAT32_BYTES = 4


@dataclass(frozen=True)
class CommittedBlock:
    """Clean latents of one block; shape [frames, channels, height, width], float32 little-endian."""

    block_index: int
    start_frame: int  # latent-frame index of the block's first frame
    shape: tuple[int, ...]
    latents: bytes
    prompt: str = ""
    # Chunk-pipelined models (MAGI-1): the in-flight window after this chunk, same layout as latents.
    carry_shape: tuple[int, ...] = ()
    carry: bytes = b""
    # Action-conditioned models (Matrix-Game 2.0): the action held during the block, as a client
    # sends it (keys by name, mouse values in the schema's axis order); empty: neutral, or a model without actions.
    action_keys: tuple[str, ...] = ()
    action_mouse: tuple[float, ...] = ()
    # A prompt switch re-encoded the KV cache before this block (LongLive's re-cache): a replay does it again.
    recached: bool = False

    def problem(self) -> str | None:
        """What is wrong with the block's data (None when it is well-formed)."""
        if len(self.shape) != 4 or min(self.shape) < 1:
            return f"shape must be [frames, channels, height, width] with every dimension >= 1, got {list(self.shape)}"
        expected = FLOAT32_BYTES * math.prod(self.shape)
        if len(self.latents) != expected:
            return f"latents hold {len(self.latents)} bytes but shape {list(self.shape)} of float32 needs {expected}"
        if self.carry_shape and FLOAT32_BYTES * math.prod(self.carry_shape) != len(self.carry):
            return f"carry holds {len(self.carry)} bytes but carry_shape {list(self.carry_shape)} of float32 needs more"
        return None

    def to_proto(self) -> kvcache_pb2.CommittedBlock:
        message = kvcache_pb2.CommittedBlock(
            block_index=self.block_index,
            start_frame=self.start_frame,
            shape=list(self.shape),
            latents=self.latents,
            prompt=self.prompt,
            carry_shape=list(self.carry_shape),
            carry=self.carry,
            recached=self.recached,
        )
        if self.action_keys or self.action_mouse:
            message.action.CopyFrom(common_pb2.HeldAction(keys=self.action_keys, mouse=self.action_mouse))
        return message

    @classmethod
    def from_proto(cls, message: kvcache_pb2.CommittedBlock) -> CommittedBlock:
        return cls(
            message.block_index,
            message.start_frame,
            tuple(message.shape),
            message.latents,
            message.prompt,
            tuple(message.carry_shape),
            message.carry,
            tuple(message.action.keys),
            tuple(message.action.mouse),
            message.recached,
        )

    def encode(self) -> bytes:
        return self.to_proto().SerializeToString(deterministic=True)

    @classmethod
    def decode(cls, data: bytes) -> CommittedBlock:
        return cls.from_proto(kvcache_pb2.CommittedBlock.FromString(data))
