from inferix.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.SessionSpec
    def __init__(self, spec: _Optional[_Union[_common_pb2.SessionSpec, _Mapping]] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("states",)
    STATES_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.SessionState]
    def __init__(self, states: _Optional[_Iterable[_Union[_common_pb2.SessionState, str]]] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Session]
    def __init__(self, sessions: _Optional[_Iterable[_Union[_common_pb2.Session, _Mapping]]] = ...) -> None: ...

class CancelSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CancelSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class Attach(_message.Message):
    __slots__ = ("session_id", "from_block")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_BLOCK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    from_block: int
    def __init__(self, session_id: _Optional[str] = ..., from_block: _Optional[int] = ...) -> None: ...

class SetPrompt(_message.Message):
    __slots__ = ("text", "recache")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RECACHE_FIELD_NUMBER: _ClassVar[int]
    text: str
    recache: bool
    def __init__(self, text: _Optional[str] = ..., recache: _Optional[bool] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("payload", "keys", "mouse")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MOUSE_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    keys: _containers.RepeatedScalarFieldContainer[str]
    mouse: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, payload: _Optional[bytes] = ..., keys: _Optional[_Iterable[str]] = ..., mouse: _Optional[_Iterable[float]] = ...) -> None: ...

class Pause(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Resume(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Stop(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InteractRequest(_message.Message):
    __slots__ = ("attach", "set_prompt", "action", "pause", "resume", "stop")
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    SET_PROMPT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    attach: Attach
    set_prompt: SetPrompt
    action: Action
    pause: Pause
    resume: Resume
    stop: Stop
    def __init__(self, attach: _Optional[_Union[Attach, _Mapping]] = ..., set_prompt: _Optional[_Union[SetPrompt, _Mapping]] = ..., action: _Optional[_Union[Action, _Mapping]] = ..., pause: _Optional[_Union[Pause, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("state", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.SessionState
    reason: str
    def __init__(self, state: _Optional[_Union[_common_pb2.SessionState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class CommandAccepted(_message.Message):
    __slots__ = ("applies_at_block", "command")
    APPLIES_AT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    applies_at_block: int
    command: str
    def __init__(self, applies_at_block: _Optional[int] = ..., command: _Optional[str] = ...) -> None: ...

class ErrorEvent(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class InteractResponse(_message.Message):
    __slots__ = ("session_id", "block", "state", "accepted", "error")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    block: _common_pb2.BlockEvent
    state: StateChange
    accepted: CommandAccepted
    error: ErrorEvent
    def __init__(self, session_id: _Optional[str] = ..., block: _Optional[_Union[_common_pb2.BlockEvent, _Mapping]] = ..., state: _Optional[_Union[StateChange, _Mapping]] = ..., accepted: _Optional[_Union[CommandAccepted, _Mapping]] = ..., error: _Optional[_Union[ErrorEvent, _Mapping]] = ...) -> None: ...
