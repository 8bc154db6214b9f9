"""A worker's real-time capacity: how many streams of one resolution it runs at once in real time.

The one form shared by the worker (which measures it, `workers.capacity`), kvcache_svc (which
admits sessions within it) and the API (the StreamCapacity message).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferix.api.v1 import common_pb2, kvcache_pb2


@dataclass(frozen=True, order=True)
class Resolution:
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"

    def to_proto(self) -> common_pb2.Resolution:
        return common_pb2.Resolution(width=self.width, height=self.height)

    @classmethod
    def from_proto(cls, message: common_pb2.Resolution) -> Resolution:
        return cls(message.width, message.height)


@dataclass(frozen=True)
class StreamCapacity:
    """Real-time streams of one resolution a worker holds (the StreamCapacity message)."""

    resolution: Resolution
    streams: int  # sessions at once with every block inside the budget (0: not even one)
    block_ms: float = 0.0  # block latency at `streams` sessions (at 1 when streams is 0)
    budget_ms: float = 0.0  # real-time budget of a block: its frames / fps
    measured_up_to: int = 0  # largest batch size measured; beyond it latencies are extrapolated

    def to_proto(self) -> kvcache_pb2.StreamCapacity:
        return kvcache_pb2.StreamCapacity(
            resolution=self.resolution.to_proto(),
            streams=self.streams,
            block_ms=self.block_ms,
            budget_ms=self.budget_ms,
            measured_up_to=self.measured_up_to,
        )

    @classmethod
    def from_proto(cls, message: kvcache_pb2.StreamCapacity) -> StreamCapacity:
        return cls(
            Resolution.from_proto(message.resolution),
            message.streams,
            message.block_ms,
            message.budget_ms,
            message.measured_up_to,
        )
