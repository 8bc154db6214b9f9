"""The part every family's session has alike: iteration, the context manager, the KV cache's host
tier, where it is (id, next block, finished: its loop's), and the inputs it refuses (text for an
image-to-world model, actions for a text model), written once. A family's session holds its block loop
(`loop`), says where its KV cache is (`kv_cache`) and how to make and close its blocks (`next_block`,
`close`), and overrides what it takes (`set_prompt`, `hold`, `schema`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Generic, Protocol, Self, TypeVar

from engine.kv.session_cache import SessionUsage
from engine.snapshot import SessionSnapshot
from inferix.errors import UserError
from inferix.spec.action_schema import ActionSchema
from inferix.spec.actions import HeldAction

Block = TypeVar("Block")


class HostTieredCache(Protocol):
    """What the tail needs of a session's KV cache (a paged cache, or a pod's proxy of one)."""

    def offload(self) -> None: ...

    def prefetch(self) -> None: ...

    def usage(self) -> SessionUsage: ...


class BlockLoop(Protocol):
    """What the tail reads of a family's block loop (`WanLoop`, `MagiLoop`, `MatrixGameLoop`, a pod's
    `PodSession`)."""

    @property
    def session_id(self) -> str: ...

    @property
    def next_block_index(self) -> int: ...

    @property
    def finished(self) -> bool: ...


class SessionTail(ABC, Generic[Block]):
    """Mixed into each family's session class."""

    # What a player sends the session's model (toyworld-play, Matrix-Game); None: it takes no actions.
    schema: ActionSchema | None = None
    loop: BlockLoop

    @property
    @abstractmethod
    def kv_cache(self) -> HostTieredCache: ...

    @property
    def session_id(self) -> str:
        return self.loop.session_id

    @property
    def next_block_index(self) -> int:
        return self.loop.next_block_index

    @property
    def finished(self) -> bool:
        return self.loop.finished

    @abstractmethod
    def next_block(self) -> Block: ...

    @abstractmethod
    def close(self) -> None: ...

    def set_prompt(self, text: str, recache: bool = False) -> None:
        """Switch prompt at the next block boundary (a model that takes text overrides this)."""
        raise UserError("this model takes no text prompts; steer it with actions")

    def hold(self, action: HeldAction) -> None:
        """Hold an action from the next block on (a model that takes actions overrides this)."""
        raise UserError("this model takes no actions; steer it with prompts")

    def snapshot(self) -> SessionSnapshot:
        """A copy of everything the next block reads (a family whose capabilities say `snapshots`
        overrides this and `load_snapshot`)."""
        raise UserError("this model has no KV snapshots; it recovers by replaying its committed blocks")

    def load_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Continue from `snapshot` instead of replaying the blocks it covers."""
        raise UserError("this model has no KV snapshots; it recovers by replaying its committed blocks")

    def redecode_state_at(self, snapshot: SessionSnapshot) -> Any:
        """A `redecode` state that continues at the snapshot's block: the decoder's memory there."""
        raise UserError("this model has no KV snapshots; its frames are decoded again from the first block")

    def offload(self) -> None:
        """Move the session's KV pages to host memory (`KVCapacityError` if the host tier is full)."""
        self.kv_cache.offload()

    def prefetch(self) -> None:
        """Bring offloaded KV pages back to the device (a no-op when none are offloaded)."""
        self.kv_cache.prefetch()

    def kv_usage(self) -> SessionUsage:
        """The session's KV pages: on the device, offloaded, and what it may hold at most."""
        return self.kv_cache.usage()

    def __iter__(self) -> Iterator[Block]:
        while not self.finished:
            yield self.next_block()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
