from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LatencyMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LATENCY_MODE_UNSPECIFIED: _ClassVar[LatencyMode]
    LATENCY_MODE_SMOOTH: _ClassVar[LatencyMode]
    LATENCY_MODE_INTERACTIVE: _ClassVar[LatencyMode]

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_QUEUED: _ClassVar[SessionState]
    SESSION_STATE_RUNNING: _ClassVar[SessionState]
    SESSION_STATE_PAUSED: _ClassVar[SessionState]
    SESSION_STATE_COMPLETED: _ClassVar[SessionState]
    SESSION_STATE_CANCELLED: _ClassVar[SessionState]
    SESSION_STATE_FAILED: _ClassVar[SessionState]
LATENCY_MODE_UNSPECIFIED: LatencyMode
LATENCY_MODE_SMOOTH: LatencyMode
LATENCY_MODE_INTERACTIVE: LatencyMode
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_QUEUED: SessionState
SESSION_STATE_RUNNING: SessionState
SESSION_STATE_PAUSED: SessionState
SESSION_STATE_COMPLETED: SessionState
SESSION_STATE_CANCELLED: SessionState
SESSION_STATE_FAILED: SessionState

class Resolution(_message.Message):
    __slots__ = ("width", "height")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    width: int
    height: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class PromptChange(_message.Message):
    __slots__ = ("at_block", "text", "recache")
    AT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RECACHE_FIELD_NUMBER: _ClassVar[int]
    at_block: int
    text: str
    recache: bool
    def __init__(self, at_block: _Optional[int] = ..., text: _Optional[str] = ..., recache: _Optional[bool] = ...) -> None: ...

class OutputOptions(_message.Message):
    __slots__ = ("mp4", "rtmp", "webrtc")
    MP4_FIELD_NUMBER: _ClassVar[int]
    RTMP_FIELD_NUMBER: _ClassVar[int]
    WEBRTC_FIELD_NUMBER: _ClassVar[int]
    mp4: bool
    rtmp: bool
    webrtc: bool
    def __init__(self, mp4: _Optional[bool] = ..., rtmp: _Optional[bool] = ..., webrtc: _Optional[bool] = ...) -> None: ...

class SessionSpec(_message.Message):
    __slots__ = ("model", "resolution", "seed", "prompts", "num_blocks", "outputs", "lookahead", "wait_for_capacity", "image", "latency", "decoder")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    model: str
    resolution: Resolution
    seed: int
    prompts: _containers.RepeatedCompositeFieldContainer[PromptChange]
    num_blocks: int
    outputs: OutputOptions
    lookahead: int
    wait_for_capacity: bool
    image: bytes
    latency: LatencyMode
    decoder: str
    def __init__(self, model: _Optional[str] = ..., resolution: _Optional[_Union[Resolution, _Mapping]] = ..., seed: _Optional[int] = ..., prompts: _Optional[_Iterable[_Union[PromptChange, _Mapping]]] = ..., num_blocks: _Optional[int] = ..., outputs: _Optional[_Union[OutputOptions, _Mapping]] = ..., lookahead: _Optional[int] = ..., wait_for_capacity: _Optional[bool] = ..., image: _Optional[bytes] = ..., latency: _Optional[_Union[LatencyMode, str]] = ..., decoder: _Optional[str] = ...) -> None: ...

class HeldAction(_message.Message):
    __slots__ = ("keys", "mouse")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MOUSE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    mouse: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., mouse: _Optional[_Iterable[float]] = ...) -> None: ...

class ActionKey(_message.Message):
    __slots__ = ("name", "key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class MouseAxis(_message.Message):
    __slots__ = ("name", "minimum", "maximum")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_FIELD_NUMBER: _ClassVar[int]
    name: str
    minimum: float
    maximum: float
    def __init__(self, name: _Optional[str] = ..., minimum: _Optional[float] = ..., maximum: _Optional[float] = ...) -> None: ...

class ActionSchema(_message.Message):
    __slots__ = ("keys", "mouse", "one_hot")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MOUSE_FIELD_NUMBER: _ClassVar[int]
    ONE_HOT_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ActionKey]
    mouse: _containers.RepeatedCompositeFieldContainer[MouseAxis]
    one_hot: bool
    def __init__(self, keys: _Optional[_Iterable[_Union[ActionKey, _Mapping]]] = ..., mouse: _Optional[_Iterable[_Union[MouseAxis, _Mapping]]] = ..., one_hot: _Optional[bool] = ...) -> None: ...

class PlaybackUrls(_message.Message):
    __slots__ = ("mp4", "rtmp", "webrtc_page")
    MP4_FIELD_NUMBER: _ClassVar[int]
    RTMP_FIELD_NUMBER: _ClassVar[int]
    WEBRTC_PAGE_FIELD_NUMBER: _ClassVar[int]
    mp4: str
    rtmp: str
    webrtc_page: str
    def __init__(self, mp4: _Optional[str] = ..., rtmp: _Optional[str] = ..., webrtc_page: _Optional[str] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "spec", "state", "blocks_done", "worker_id", "urls", "error", "created_at_unix", "current_prompt", "action_schema", "current_action")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_DONE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    URLS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    CURRENT_PROMPT_FIELD_NUMBER: _ClassVar[int]
    ACTION_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    spec: SessionSpec
    state: SessionState
    blocks_done: int
    worker_id: str
    urls: PlaybackUrls
    error: str
    created_at_unix: float
    current_prompt: str
    action_schema: ActionSchema
    current_action: HeldAction
    def __init__(self, session_id: _Optional[str] = ..., spec: _Optional[_Union[SessionSpec, _Mapping]] = ..., state: _Optional[_Union[SessionState, str]] = ..., blocks_done: _Optional[int] = ..., worker_id: _Optional[str] = ..., urls: _Optional[_Union[PlaybackUrls, _Mapping]] = ..., error: _Optional[str] = ..., created_at_unix: _Optional[float] = ..., current_prompt: _Optional[str] = ..., action_schema: _Optional[_Union[ActionSchema, _Mapping]] = ..., current_action: _Optional[_Union[HeldAction, _Mapping]] = ...) -> None: ...

class BlockTimings(_message.Message):
    __slots__ = ("denoise_ms", "context_ms", "decode_ms", "total_ms", "dispatch_to_done_ms")
    DENOISE_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_TO_DONE_MS_FIELD_NUMBER: _ClassVar[int]
    denoise_ms: float
    context_ms: float
    decode_ms: float
    total_ms: float
    dispatch_to_done_ms: float
    def __init__(self, denoise_ms: _Optional[float] = ..., context_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., dispatch_to_done_ms: _Optional[float] = ...) -> None: ...

class BlockEvent(_message.Message):
    __slots__ = ("block_index", "first_frame", "num_frames", "prompt", "timings", "worker_id", "action")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    first_frame: int
    num_frames: int
    prompt: str
    timings: BlockTimings
    worker_id: str
    action: HeldAction
    def __init__(self, block_index: _Optional[int] = ..., first_frame: _Optional[int] = ..., num_frames: _Optional[int] = ..., prompt: _Optional[str] = ..., timings: _Optional[_Union[BlockTimings, _Mapping]] = ..., worker_id: _Optional[str] = ..., action: _Optional[_Union[HeldAction, _Mapping]] = ...) -> None: ...

class KVUsage(_message.Message):
    __slots__ = ("total_pages", "used_pages", "page_bytes", "host_pages_used", "sessions")
    TOTAL_PAGES_FIELD_NUMBER: _ClassVar[int]
    USED_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGES_USED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    total_pages: int
    used_pages: int
    page_bytes: int
    host_pages_used: int
    sessions: int
    def __init__(self, total_pages: _Optional[int] = ..., used_pages: _Optional[int] = ..., page_bytes: _Optional[int] = ..., host_pages_used: _Optional[int] = ..., sessions: _Optional[int] = ...) -> None: ...
