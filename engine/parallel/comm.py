"""The collectives sequence parallelism issues, each wrapped to count the bytes a rank sends.

Every byte the parallel engine moves between ranks goes through a `GroupComm`, so the
`CommCounter` is the measured traffic that `cost.predict` is checked against (tests, bench).
A byte is counted once, by the rank that sends it; a rank's own chunk of an all-to-all is a
local copy and is not counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class CommCounter:
    """Bytes sent and operations (collective calls, ring hops) issued by one rank, by phase."""

    bytes_sent: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    operations: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, phase: str, nbytes: int) -> None:
        self.bytes_sent[phase] += nbytes
        self.operations[phase] += 1

    @property
    def total_operations(self) -> int:
        return sum(self.operations.values())

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.operations.clear()


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class PendingShift:
    """A ring hop in flight: `wait()` returns the tensor received from the previous rank."""

    def __init__(self, works: list[dist.Work], received: Tensor) -> None:
        self._works = works
        self._received = received

    def wait(self) -> Tensor:
        for work in self._works:
            work.wait()
        return self._received


class GroupComm:
    """A process group seen from one member: its global ranks in group order and this rank's index."""

    def __init__(self, group: dist.ProcessGroup | None, ranks: list[int], counter: CommCounter) -> None:
        self.group = group
        self.ranks = ranks
        self.index = ranks.index(dist.get_rank())
        self.counter = counter

    @property
    def size(self) -> int:
        return len(self.ranks)

    def all_to_all(self, chunks: list[Tensor], phase: str) -> list[Tensor]:
        """Send chunks[i] to member i; returns what member i sent to this rank (same shapes)."""
        if len(chunks) != self.size:
            raise ValueError(f"all_to_all needs {self.size} chunks, got {len(chunks)}")
        inputs = [c.contiguous() for c in chunks]
        outputs = [torch.empty_like(c) for c in inputs]
        dist.all_to_all(outputs, inputs, group=self.group)
        self.counter.add(phase, sum(_nbytes(c) for i, c in enumerate(inputs) if i != self.index))
        return outputs

    def all_gather(self, tensor: Tensor, phase: str) -> list[Tensor]:
        """Every member's `tensor` (same shape on all), in group order."""
        tensor = tensor.contiguous()
        outputs = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(outputs, tensor, group=self.group)
        self.counter.add(phase, (self.size - 1) * _nbytes(tensor))
        return outputs

    def start_shift(self, tensor: Tensor, phase: str) -> PendingShift:
        """Start one ring hop: send `tensor` to the next member, receive the previous one's.

        Asynchronous so the caller computes on the current tensor while the next one travels.
        """
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        nxt = self.ranks[(self.index + 1) % self.size]
        prev = self.ranks[(self.index - 1) % self.size]
        ops = [
            dist.P2POp(dist.isend, tensor, nxt, group=self.group),
            dist.P2POp(dist.irecv, received, prev, group=self.group),
        ]
        works = dist.batch_isend_irecv(ops)
        self.counter.add(phase, _nbytes(tensor))
        return PendingShift(works, received)


__all__ = ["CommCounter", "GroupComm", "PendingShift"]
