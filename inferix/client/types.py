"""Plain dataclasses the SDK returns (no protobuf in user code)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.spec.latency import LatencyMode
from inferix.spec.schedule import PromptChange

SessionStateName = Literal["unspecified", "queued", "running", "paused", "completed", "cancelled", "failed"]
TERMINAL_STATES = ("completed", "cancelled", "failed")


def state_name(value: int) -> SessionStateName:
    return common_pb2.SessionState.Name(value).removeprefix("SESSION_STATE_").lower()


def state_value(name: str) -> int:
    return common_pb2.SessionState.Value(f"SESSION_STATE_{name.upper()}")


@dataclass(frozen=True)
class ActionKeyInfo:
    """One key of a model's actions: what it does and the key that sends it ("" when none)."""

    name: str
    key: str


@dataclass(frozen=True)
class MouseAxisInfo:
    """One mouse axis: a per-frame camera step within [minimum, maximum]."""

    name: str
    minimum: float
    maximum: float


@dataclass(frozen=True)
class ActionSchemaInfo:
    """What `act()` takes for this session's model: keys by key or name, one mouse value per axis
    in this order; `one_hot`: one key at a time."""

    keys: tuple[ActionKeyInfo, ...]
    mouse: tuple[MouseAxisInfo, ...]
    one_hot: bool

    @classmethod
    def from_proto(cls, schema: common_pb2.ActionSchema) -> ActionSchemaInfo:
        return cls(
            tuple(ActionKeyInfo(k.name, k.key) for k in schema.keys),
            tuple(MouseAxisInfo(a.name, a.minimum, a.maximum) for a in schema.mouse),
            schema.one_hot,
        )


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    state: SessionStateName
    model: str
    width: int
    height: int
    seed: int
    num_blocks: int  # 0 = unbounded
    blocks_done: int
    worker_id: str
    current_prompt: str
    mp4_url: str
    error: str
    rtmp_url: str = ""  # set when the session asked for RTMP and the server has it
    viewer_url: str = ""  # the live viewer page; its #token= is a credential for this session
    prompts: tuple[PromptChange, ...] = field(default_factory=tuple)
    # Action-conditioned models (Matrix-Game 2.0): what they take, and what is held for the next block.
    action_schema: ActionSchemaInfo | None = None
    current_keys: tuple[str, ...] = ()
    current_mouse: tuple[float, ...] = ()
    latency: str = "smooth"  # the session's latency mode: "interactive" or "smooth"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_proto(cls, s: common_pb2.Session) -> SessionInfo:
        return cls(
            session_id=s.session_id,
            state=state_name(s.state),
            model=s.spec.model,
            width=s.spec.resolution.width,
            height=s.spec.resolution.height,
            seed=s.spec.seed,
            num_blocks=s.spec.num_blocks,
            blocks_done=s.blocks_done,
            worker_id=s.worker_id,
            current_prompt=s.current_prompt,
            mp4_url=s.urls.mp4,
            error=s.error,
            rtmp_url=s.urls.rtmp,
            latency=LatencyMode.from_proto(s.spec.latency).value,
            viewer_url=s.urls.webrtc_page,
            prompts=tuple(PromptChange(p.at_block, p.text, p.recache) for p in s.spec.prompts),
            action_schema=ActionSchemaInfo.from_proto(s.action_schema) if s.HasField("action_schema") else None,
            current_keys=tuple(s.current_action.keys),
            current_mouse=tuple(s.current_action.mouse),
        )


@dataclass(frozen=True)
class BlockDone:
    session_id: str
    block_index: int
    first_frame: int
    num_frames: int
    prompt: str
    worker_id: str
    engine_ms: float
    dispatch_to_done_ms: float
    # The action the block was made under (action-conditioned models; empty for text models).
    keys: tuple[str, ...] = ()
    mouse: tuple[float, ...] = ()


@dataclass(frozen=True)
class StateChanged:
    session_id: str
    state: SessionStateName
    reason: str


@dataclass(frozen=True)
class CommandAccepted:
    session_id: str
    command: str
    applies_at_block: int


@dataclass(frozen=True)
class SessionError:
    session_id: str
    code: int
    message: str


Event = BlockDone | StateChanged | CommandAccepted | SessionError


def event_from_proto(r: scheduler_pb2.InteractResponse) -> Event:
    kind = r.WhichOneof("event")
    if kind == "block":
        b = r.block
        return BlockDone(
            r.session_id,
            b.block_index,
            b.first_frame,
            b.num_frames,
            b.prompt,
            b.worker_id,
            b.timings.total_ms,
            b.timings.dispatch_to_done_ms,
            tuple(b.action.keys),
            tuple(b.action.mouse),
        )
    if kind == "state":
        return StateChanged(r.session_id, state_name(r.state.state), r.state.reason)
    if kind == "accepted":
        return CommandAccepted(r.session_id, r.accepted.command, r.accepted.applies_at_block)
    return SessionError(r.session_id, r.error.code, r.error.message)


def action_request(
    keys: list[str] | tuple[str, ...], mouse: list[float] | tuple[float, ...]
) -> scheduler_pb2.InteractRequest:
    """An Interact action: keys held (by key or name) and one mouse value per axis (empty: still)."""
    return scheduler_pb2.InteractRequest(action=scheduler_pb2.Action(keys=list(keys), mouse=list(mouse)))


def image_bytes(image: bytes | str | Path | None) -> bytes:
    """A start image as sent: its bytes, read from a path when given one."""
    if image is None:
        return b""
    return image if isinstance(image, bytes) else Path(image).read_bytes()


def session_spec(
    prompt: str | list[PromptChange] | None,
    *,
    model: str,
    width: int,
    height: int,
    seed: int,
    num_blocks: int,
    lookahead: int,
    wait_for_capacity: bool,
    rtmp: bool = False,
    image: bytes | str | Path | None = None,
    latency: str = "smooth",
) -> common_pb2.SessionSpec:
    changes = [PromptChange(0, prompt)] if isinstance(prompt, str) else list(prompt or [])
    return common_pb2.SessionSpec(
        model=model,
        resolution=common_pb2.Resolution(width=width, height=height),
        seed=seed,
        prompts=[common_pb2.PromptChange(at_block=c.at_block, text=c.text, recache=c.recache) for c in changes],
        num_blocks=num_blocks,
        outputs=common_pb2.OutputOptions(mp4=True, rtmp=rtmp),
        lookahead=lookahead,
        wait_for_capacity=wait_for_capacity,
        image=image_bytes(image),
        latency=LatencyMode.parse(latency).to_proto(),
    )
