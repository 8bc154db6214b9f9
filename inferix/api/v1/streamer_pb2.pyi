from inferix.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PixelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIXEL_FORMAT_UNSPECIFIED: _ClassVar[PixelFormat]
    PIXEL_FORMAT_RGB24: _ClassVar[PixelFormat]

class OutputEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_EVENT_KIND_UNSPECIFIED: _ClassVar[OutputEventKind]
    OUTPUT_EVENT_KIND_ERROR: _ClassVar[OutputEventKind]
    OUTPUT_EVENT_KIND_RECOVERED: _ClassVar[OutputEventKind]
PIXEL_FORMAT_UNSPECIFIED: PixelFormat
PIXEL_FORMAT_RGB24: PixelFormat
OUTPUT_EVENT_KIND_UNSPECIFIED: OutputEventKind
OUTPUT_EVENT_KIND_ERROR: OutputEventKind
OUTPUT_EVENT_KIND_RECOVERED: OutputEventKind

class VideoFrame(_message.Message):
    __slots__ = ("session_id", "block_index", "frame_index", "width", "height", "format", "data", "fps", "backfill")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FRAME_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    block_index: int
    frame_index: int
    width: int
    height: int
    format: PixelFormat
    data: bytes
    fps: float
    backfill: bool
    def __init__(self, session_id: _Optional[str] = ..., block_index: _Optional[int] = ..., frame_index: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., format: _Optional[_Union[PixelFormat, str]] = ..., data: _Optional[bytes] = ..., fps: _Optional[float] = ..., backfill: _Optional[bool] = ...) -> None: ...

class PushFramesRequest(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: VideoFrame
    def __init__(self, frame: _Optional[_Union[VideoFrame, _Mapping]] = ...) -> None: ...

class PushBlockRequest(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[VideoFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[VideoFrame, _Mapping]]] = ...) -> None: ...

class PushBlockResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "durable_frames")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    durable_frames: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., durable_frames: _Optional[int] = ...) -> None: ...

class PushFramesResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "durable_frames")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    durable_frames: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., durable_frames: _Optional[int] = ...) -> None: ...

class FinishStreamRequest(_message.Message):
    __slots__ = ("session_id", "frames")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    frames: int
    def __init__(self, session_id: _Optional[str] = ..., frames: _Optional[int] = ...) -> None: ...

class FinishStreamResponse(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: int
    def __init__(self, frames: _Optional[int] = ...) -> None: ...

class GetStreamInfoRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetStreamInfoResponse(_message.Message):
    __slots__ = ("session_id", "frames", "width", "height", "fps", "finished", "frames_sha256", "live")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SHA256_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    frames: int
    width: int
    height: int
    fps: float
    finished: bool
    frames_sha256: str
    live: LiveStats
    def __init__(self, session_id: _Optional[str] = ..., frames: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., fps: _Optional[float] = ..., finished: _Optional[bool] = ..., frames_sha256: _Optional[str] = ..., live: _Optional[_Union[LiveStats, _Mapping]] = ...) -> None: ...

class LiveStats(_message.Message):
    __slots__ = ("frames_out", "underruns", "underrun_seconds", "time_to_first_frame_ms", "backlog_frames", "viewers", "rtmp_state", "rtmp_error", "rtmp_connects", "dropped_frames", "frames_sent")
    class DroppedFramesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class FramesSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    FRAMES_OUT_FIELD_NUMBER: _ClassVar[int]
    UNDERRUNS_FIELD_NUMBER: _ClassVar[int]
    UNDERRUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_FRAME_MS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FRAMES_FIELD_NUMBER: _ClassVar[int]
    VIEWERS_FIELD_NUMBER: _ClassVar[int]
    RTMP_STATE_FIELD_NUMBER: _ClassVar[int]
    RTMP_ERROR_FIELD_NUMBER: _ClassVar[int]
    RTMP_CONNECTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SENT_FIELD_NUMBER: _ClassVar[int]
    frames_out: int
    underruns: int
    underrun_seconds: float
    time_to_first_frame_ms: float
    backlog_frames: int
    viewers: int
    rtmp_state: str
    rtmp_error: str
    rtmp_connects: int
    dropped_frames: _containers.ScalarMap[str, int]
    frames_sent: _containers.ScalarMap[str, int]
    def __init__(self, frames_out: _Optional[int] = ..., underruns: _Optional[int] = ..., underrun_seconds: _Optional[float] = ..., time_to_first_frame_ms: _Optional[float] = ..., backlog_frames: _Optional[int] = ..., viewers: _Optional[int] = ..., rtmp_state: _Optional[str] = ..., rtmp_error: _Optional[str] = ..., rtmp_connects: _Optional[int] = ..., dropped_frames: _Optional[_Mapping[str, int]] = ..., frames_sent: _Optional[_Mapping[str, int]] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("hello", "session")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    hello: LinkHello
    session: SessionAnnouncement
    def __init__(self, hello: _Optional[_Union[LinkHello, _Mapping]] = ..., session: _Optional[_Union[SessionAnnouncement, _Mapping]] = ...) -> None: ...

class LinkHello(_message.Message):
    __slots__ = ("scheduler_address",)
    SCHEDULER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    scheduler_address: str
    def __init__(self, scheduler_address: _Optional[str] = ...) -> None: ...

class SessionAnnouncement(_message.Message):
    __slots__ = ("session_id", "rtmp", "webrtc", "created_at_unix", "latency")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RTMP_FIELD_NUMBER: _ClassVar[int]
    WEBRTC_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rtmp: bool
    webrtc: bool
    created_at_unix: float
    latency: _common_pb2.LatencyMode
    def __init__(self, session_id: _Optional[str] = ..., rtmp: _Optional[bool] = ..., webrtc: _Optional[bool] = ..., created_at_unix: _Optional[float] = ..., latency: _Optional[_Union[_common_pb2.LatencyMode, str]] = ...) -> None: ...

class LinkResponse(_message.Message):
    __slots__ = ("session_id", "output", "kind", "message")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    output: str
    kind: OutputEventKind
    message: str
    def __init__(self, session_id: _Optional[str] = ..., output: _Optional[str] = ..., kind: _Optional[_Union[OutputEventKind, str]] = ..., message: _Optional[str] = ...) -> None: ...

class GetRecordingRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetRecordingResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    def __init__(self, chunk: _Optional[bytes] = ...) -> None: ...
