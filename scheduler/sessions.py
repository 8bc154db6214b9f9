"""Session records and their event fan-out.

A `SessionRecord` is the scheduler's view of one session: its validated spec, state, progress,
pending interactive commands and the history of block events (so a client attaching late, or
re-attaching after a disconnect, gets every event from the block it asks for).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from inferix.api.v1 import common_pb2, scheduler_pb2
from scheduler.validation import ValidSpec, schema_proto, validate_action

RECORD_VERSION = 2

TERMINAL = {
    common_pb2.SESSION_STATE_COMPLETED,
    common_pb2.SESSION_STATE_CANCELLED,
    common_pb2.SESSION_STATE_FAILED,
}
STATE_NAMES: dict[int, str] = {
    int(v): common_pb2.SessionState.Name(v).removeprefix("SESSION_STATE_").lower()
    for v in common_pb2.SessionState.values()
    if v != common_pb2.SESSION_STATE_UNSPECIFIED
}


class CorruptRecord(ValueError):
    """A stored session record that cannot be read back."""


class TokenBucket:
    """At most `rate` events per second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


# Actions a session accepts: at most this many per second on average, this many at once.
ACTION_RATE_PER_S = 30.0
ACTION_BURST = 60


# Events an attached client may leave unread before its stream is ended (it re-attaches with from_block).
MAX_UNREAD_EVENTS = 4096
# Events a session keeps for clients that attach later: the latest ones, so that an hour-long session's
# history takes the same memory as a six-minute one's (toyworld: 2,048 blocks are 6.4 minutes of video).
HISTORY_EVENTS = 2048


class EventQueue(asyncio.Queue["scheduler_pb2.InteractResponse | None"]):
    """One attached client's events; None ends its stream. `overflowed`: ended because it left more
    than `limit` events unread."""

    def __init__(self) -> None:
        super().__init__()
        self.limit = MAX_UNREAD_EVENTS
        self.overflowed = False


@dataclass
class PendingPrompt:
    text: str
    recache: bool


@dataclass
class PendingAction:
    """An action accepted for block `at_block` (the boundary it was answered with) and after."""

    at_block: int
    action: common_pb2.HeldAction


@dataclass
class SessionRecord:
    session_id: str
    owner: str
    valid: ValidSpec
    urls: common_pb2.PlaybackUrls
    created_at: float = field(default_factory=time.time)
    state: int = common_pb2.SESSION_STATE_QUEUED
    worker_id: str = ""
    worker_address: str = ""
    # Its worker drains (SIGTERM): move the session after its block in flight. Not persisted.
    worker_leaving: bool = False
    # kvcache_svc's last refusal to admit it (why it waits for room); empty once placed. Not persisted.
    no_room: str = ""
    next_block: int = 0
    # Blocks whose BlockDone event has been published (a re-made block is not announced twice).
    announced_blocks: int = 0
    # Loaded from the store: the events of blocks before `announced_blocks` are still to be fetched.
    history_missing: bool = False
    # The last block sent to its worker and not yet answered (the one after the block being made, when
    # the dispatcher sent it ahead); None: none.
    in_flight: int | None = None
    current_prompt: str = ""
    pending_prompt: PendingPrompt | None = None
    # Action-conditioned models: the action held for the next block (None: the model takes none),
    # and the latest one received since, which takes over at the next block boundary.
    current_action: common_pb2.HeldAction | None = None
    pending_action: PendingAction | None = None
    stop_requested: bool = False
    cancel_requested: bool = False
    error: str = ""
    events: collections.deque[scheduler_pb2.InteractResponse] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY_EVENTS)
    )
    first_block_at: float | None = None
    frames_made: int = 0  # pixel frames of the blocks made so far (0: none since this scheduler took it)
    # Dispatch-to-done seconds of the latest blocks made since this scheduler took the session, but the
    # first (it pays its worker's first-call costs); interactive sessions are dispatched by them. Not persisted.
    generation_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=8))
    paused_since: float | None = None
    paused_total_s: float = 0.0
    prompt_bucket: TokenBucket = field(default_factory=lambda: TokenBucket(rate=4.0, burst=8))
    # A player's page sends on every key change and a sampled mouse: far more than any boundary uses.
    action_bucket: TokenBucket = field(default_factory=lambda: TokenBucket(rate=ACTION_RATE_PER_S, burst=ACTION_BURST))
    _subscribers: list[EventQueue] = field(default_factory=list)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        prompts = self.valid.spec.prompts
        self.current_prompt = prompts[0].text if prompts else ""
        if self.valid.actions is not None:
            self.current_action = validate_action(self.valid, scheduler_pb2.Action())  # neutral: no key, still mouse

    @property
    def spec(self) -> common_pb2.SessionSpec:
        return self.valid.spec

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def boundary(self) -> int:
        """The first block a command sent now can still affect."""
        return self.in_flight + 1 if self.in_flight is not None else self.next_block

    def to_proto(self) -> common_pb2.Session:
        spec = common_pb2.SessionSpec()
        spec.CopyFrom(self.spec)
        spec.ClearField("image")  # the client has it; every GetSession / ListSessions would carry it
        session = common_pb2.Session(
            session_id=self.session_id,
            spec=spec,
            state=self.state,  # type: ignore[arg-type]
            blocks_done=self.next_block,
            worker_id=self.worker_id,
            urls=self.urls,
            error=self.error,
            created_at_unix=self.created_at,
            current_prompt=self.current_prompt,
        )
        if self.valid.actions is not None:
            session.action_schema.CopyFrom(schema_proto(self.valid.actions))
        if self.current_action is not None:
            session.current_action.CopyFrom(self.current_action)
        return session

    def to_json(self) -> bytes:
        """What the store keeps: enough to resume the session in another scheduler process (the
        in-memory parts -- subscribers, event history, rate buckets -- are not persisted)."""
        pending = self.pending_prompt
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "session_id": self.session_id,
                "owner": self.owner,
                "state": int(self.state),
                "blocks_done": self.next_block,
                "announced_blocks": self.announced_blocks,
                "worker_id": self.worker_id,
                "spec": self.spec.SerializeToString().hex(),
                "urls": self.urls.SerializeToString().hex(),
                "error": self.error,
                "created_at": self.created_at,
                "current_prompt": self.current_prompt,
                "pending_prompt": None if pending is None else [pending.text, pending.recache],
                "current_action": _action_json(self.current_action),
                "pending_action": None
                if self.pending_action is None
                else [self.pending_action.at_block, _action_json(self.pending_action.action)],
                "stop_requested": self.stop_requested,
                "paused": self.paused_since is not None,
                "paused_total_s": self.paused_total_s + self._paused_now(),
                "first_block_unix": None if self.first_block_at is None else _to_wall(self.first_block_at),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, revalidate: Callable[[common_pb2.SessionSpec], ValidSpec]) -> SessionRecord:
        """A stored record back in memory; raises `CorruptRecord` (naming what is wrong) for bad data.

        `revalidate` turns the stored (already validated and filled) spec back into a `ValidSpec`.
        """
        try:
            fields = json.loads(data)
            if fields.get("version") != RECORD_VERSION:
                raise CorruptRecord(f"record version {fields.get('version')!r}, expected {RECORD_VERSION}")
            spec = common_pb2.SessionSpec.FromString(bytes.fromhex(fields["spec"]))
            urls = common_pb2.PlaybackUrls.FromString(bytes.fromhex(fields["urls"]))
            record = cls(str(fields["session_id"]), str(fields["owner"]), revalidate(spec), urls)
            record.created_at = float(fields["created_at"])
            state = int(fields["state"])
            if state not in STATE_NAMES:
                raise CorruptRecord(f"unknown state {state}")
            record.state = state
            record.next_block = int(fields["blocks_done"])
            record.announced_blocks = int(fields["announced_blocks"])
            record.worker_id = str(fields["worker_id"])
            record.error = str(fields["error"])
            record.current_prompt = str(fields["current_prompt"])
            pending = fields["pending_prompt"]
            record.pending_prompt = None if pending is None else PendingPrompt(str(pending[0]), bool(pending[1]))
            if record.current_action is not None:  # records of an action-conditioned model
                record.current_action = _action_of(fields["current_action"]) or common_pb2.HeldAction()
                pending_action = fields["pending_action"]
                if pending_action is not None:
                    at_block, held = pending_action
                    record.pending_action = PendingAction(int(at_block), _action_of(held) or common_pb2.HeldAction())
            record.stop_requested = bool(fields["stop_requested"])
            record.paused_total_s = float(fields["paused_total_s"])
            record.paused_since = time.monotonic() if fields["paused"] else None
            first = fields["first_block_unix"]
            record.first_block_at = None if first is None else _to_monotonic(float(first))
            record.history_missing = record.announced_blocks > 0
        except CorruptRecord:
            raise
        except (ValueError, KeyError, TypeError, IndexError, DecodeError) as exc:
            raise CorruptRecord(f"{type(exc).__name__}: {exc}") from exc
        return record

    def _paused_now(self) -> float:
        return time.monotonic() - self.paused_since if self.paused_since is not None else 0.0

    # ---- events -------------------------------------------------------------------------------
    def subscribe(self, from_block: int) -> EventQueue:
        """A queue of the session's events: blocks from `from_block` on, and the other events kept in
        its history -- those after block `from_block - 1` when the history has it (a client that
        re-attaches after its last block gets no event twice), else all of them. The history holds
        the latest HISTORY_EVENTS: a client that asks for blocks older than those starts with the
        oldest kept."""
        queue = EventQueue()
        history = list(self.events)
        for i, event in enumerate(history):
            if event.WhichOneof("event") == "block" and event.block.block_index == from_block - 1:
                history = history[i + 1 :]
                break
        for event in history:
            if event.WhichOneof("event") != "block" or event.block.block_index >= from_block:
                queue.put_nowait(event)
        if self.terminal:
            queue.put_nowait(None)
        else:
            queue.limit = queue.qsize() + MAX_UNREAD_EVENTS
            self._subscribers.append(queue)
        return queue

    def restore_history(self, blocks: list[common_pb2.BlockEvent]) -> None:
        """Put the events of blocks made under a previous scheduler back at the start of the history,
        before "resumed" (for clients that attach later), and send the ones not yet announced to who
        is attached now. All of them precede the resume: the old scheduler may have announced a block
        and died before it persisted that, and a client that saw it must still get "resumed" after it."""
        made = [scheduler_pb2.InteractResponse(session_id=self.session_id, block=b) for b in blocks]
        self.events = collections.deque([*made, *self.events], maxlen=HISTORY_EVENTS)  # the oldest drop out
        self.history_missing = False
        for block in blocks:
            if block.block_index >= self.announced_blocks:
                self.announced_blocks = block.block_index + 1
                self.publish(scheduler_pb2.InteractResponse(block=block), keep=False)

    def announce(self, event: common_pb2.BlockEvent) -> None:
        """Publish a block's event once, in order (a block re-made after a failure is not announced again)."""
        if event.block_index < self.announced_blocks:
            return
        self.announced_blocks = event.block_index + 1
        self.publish(scheduler_pb2.InteractResponse(block=event))

    def unsubscribe(self, queue: EventQueue) -> None:
        if queue in self._subscribers:
            self._subscribers.remove(queue)

    def publish(self, event: scheduler_pb2.InteractResponse, keep: bool = True) -> None:
        event.session_id = self.session_id
        if keep:
            self.events.append(event)
        for queue in list(self._subscribers):
            if queue.qsize() >= queue.limit:  # a client that does not read: its stream ends, memory stays bounded
                queue.overflowed = True
                self._subscribers.remove(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(event)

    def set_state(self, state: int, reason: str = "") -> None:
        if state == self.state:
            return
        self.state = state
        self.publish(scheduler_pb2.InteractResponse(state=scheduler_pb2.StateChange(state=state, reason=reason)))  # type: ignore[arg-type]
        if self.terminal:
            self.close_subscribers()
        self.wake()

    def close_subscribers(self) -> None:
        """End every attached stream (the session ended, or the scheduler is stopping)."""
        for queue in self._subscribers:
            queue.put_nowait(None)
        self._subscribers.clear()

    # ---- dispatch loop coordination -----------------------------------------------------------
    def wake(self) -> None:
        self._wakeup.set()

    async def wait(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        self._wakeup.clear()

    def lead_frames(self, fps: float, frames_per_block: int) -> float:
        """How far ahead of playback an interactive session's next block is dispatched, in frames: the
        median generation time of its recent blocks (the streamer's buffer absorbs their spread), at
        most a block. With none measured yet, a whole block: the next one goes out at once."""
        if not self.generation_s:
            return float(frames_per_block)
        return min(float(frames_per_block), statistics.median(self.generation_s) * fps)

    def keep_up(self, fps: float, made: float, frames: float) -> None:
        """Hold the playback clock at most `frames` ahead of the `made` frames. For an interactive
        session: when generation falls behind, its viewer freezes (the streamer plays each block as it
        comes) and the clock waits with it, so that once generation keeps up again its blocks go out at
        the screen's pace instead of racing, back to back, to catch up a clock nobody watched."""
        if self.first_block_at is None:
            return
        behind = self.playback_frame(fps) - made - frames
        if behind > 0:
            self.first_block_at += behind / fps

    def playback_frame(self, fps: float) -> float:
        """Pixel frames a real-time viewer has watched (the clock starts at the first block)."""
        if self.first_block_at is None:
            return 0.0
        paused = self.paused_total_s + self._paused_now()
        return max(0.0, (time.monotonic() - self.first_block_at - paused) * fps)


def _action_json(action: common_pb2.HeldAction | None) -> list[list[str] | list[float]] | None:
    return None if action is None else [list(action.keys), list(action.mouse)]


def _action_of(data: list[list[Any]] | None) -> common_pb2.HeldAction | None:
    if data is None:
        return None
    keys, mouse = data
    return common_pb2.HeldAction(keys=[str(k) for k in keys], mouse=[float(m) for m in mouse])


def _to_wall(monotonic: float) -> float:
    return time.time() - (time.monotonic() - monotonic)


def _to_monotonic(wall: float) -> float:
    return time.monotonic() - (time.time() - wall)
