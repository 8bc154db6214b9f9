"""Exact snapshots of a session between two blocks: what its next block reads, in bytes.

A session that supports snapshots (`Capabilities.snapshots`) hands out a `SessionSnapshot` after a
block: its KV pages in the pool's own dtype and layout (`engine.kv.snapshot`), and every other piece
of state its next block reads (the RoPE offset, the clean latents a prompt re-cache re-encodes, the
keys a keyboard branch still reads, the streaming decoder's memory, the prompt, the frame counters).
A new session of the same request that loads it makes the same next block, bit for bit, as the
session it was taken from; the blocks committed after the snapshot are replayed on top as usual.

Capturing copies tensors (fast, on the engine's thread, between blocks); `encode` serialises the
copy (slow, anywhere: the worker does it off the block's path). The bytes are a `torch.save` of
tensors, numbers, strings, lists and dicts only, read back with `weights_only=True`: loading a
snapshot runs no code from it.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

FORMAT = 1  # bump when the tree changes: an older snapshot is then ignored (recovery replays instead)

T = TypeVar("T")


class SnapshotMismatch(ValueError):
    """A snapshot taken of another kind of session (model, size, seed, KV layout): not loadable here."""


@dataclass
class SessionSnapshot:
    """A session after block `next_block - 1`: its next block is `next_block`, its next pixel frame
    `next_frame`. `identity` says what session it is of (a loader compares it with its own);
    `state` is the family's tree of tensors and plain values."""

    next_block: int
    next_frame: int
    identity: dict[str, Any]
    state: dict[str, Any]

    def encode(self) -> bytes:
        buffer = io.BytesIO()
        tree = {
            "format": FORMAT,
            "next_block": self.next_block,
            "next_frame": self.next_frame,
            "identity": self.identity,
            "state": self.state,
        }
        torch.save(tree, buffer)
        return buffer.getvalue()

    @classmethod
    def decode(cls, data: bytes) -> SessionSnapshot:
        tree = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if not isinstance(tree, dict) or tree.get("format") != FORMAT:
            raise SnapshotMismatch(f"a snapshot of format {tree.get('format') if isinstance(tree, dict) else '?'}, "
                                   f"this engine reads format {FORMAT}")  # fmt: skip
        return cls(int(tree["next_block"]), int(tree["next_frame"]), dict(tree["identity"]), dict(tree["state"]))

    def check_identity(self, identity: dict[str, Any]) -> None:
        """`SnapshotMismatch` unless this snapshot was taken of a session like `identity`."""
        if self.identity != identity:
            differ = sorted(k for k in set(self.identity) | set(identity) if self.identity.get(k) != identity.get(k))
            raise SnapshotMismatch(
                "the snapshot is of another kind of session: "
                + ", ".join(f"{k} {self.identity.get(k)!r} != {identity.get(k)!r}" for k in differ)
            )


def copy_tree(value: Any) -> Any:
    """A deep copy of a tree of tensors (moved to the CPU), lists, tuples, dicts and plain values,
    sharing no tensor with `value`."""
    if isinstance(value, Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, list | tuple):
        return type(value)(copy_tree(v) for v in value)
    if isinstance(value, dict):
        return {k: copy_tree(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a snapshot holds tensors, lists, tuples, dicts and plain values, not {type(value).__name__}")


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def dataclass_tree(state: Any) -> dict[str, Any]:
    """A copy of a dataclass state's fields (e.g. a streaming decoder's memory) as a snapshot tree."""
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        raise TypeError(f"{type(state).__name__} is not a dataclass instance: its state cannot be snapshotted")
    return {f.name: copy_tree(getattr(state, f.name)) for f in dataclasses.fields(state)}


def fill_dataclass(template: T, tree: dict[str, Any], device: torch.device) -> T:
    """`template` (a fresh state of the same class) with the fields of `tree`, tensors on `device`."""
    names = {f.name for f in dataclasses.fields(template)}  # type: ignore[arg-type]
    if set(tree) != names:
        raise SnapshotMismatch(f"{type(template).__name__} has fields {sorted(names)}, the snapshot {sorted(tree)}")
    return dataclasses.replace(template, **to_device(tree, device))  # type: ignore[type-var]
