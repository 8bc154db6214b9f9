from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PixelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIXEL_FORMAT_UNSPECIFIED: _ClassVar[PixelFormat]
    PIXEL_FORMAT_RGB24: _ClassVar[PixelFormat]
PIXEL_FORMAT_UNSPECIFIED: PixelFormat
PIXEL_FORMAT_RGB24: PixelFormat

class VideoFrame(_message.Message):
    __slots__ = ("session_id", "block_index", "frame_index", "width", "height", "format", "data", "fps")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FRAME_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    block_index: int
    frame_index: int
    width: int
    height: int
    format: PixelFormat
    data: bytes
    fps: float
    def __init__(self, session_id: _Optional[str] = ..., block_index: _Optional[int] = ..., frame_index: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., format: _Optional[_Union[PixelFormat, str]] = ..., data: _Optional[bytes] = ..., fps: _Optional[float] = ...) -> None: ...

class PushFramesRequest(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: VideoFrame
    def __init__(self, frame: _Optional[_Union[VideoFrame, _Mapping]] = ...) -> None: ...

class PushFramesResponse(_message.Message):
    __slots__ = ("accepted", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class FinishStreamRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("session_id", "frames", "width", "height", "fps", "finished", "frames_sha256")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_SHA256_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    frames: int
    width: int
    height: int
    fps: float
    finished: bool
    frames_sha256: str
    def __init__(self, session_id: _Optional[str] = ..., frames: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., fps: _Optional[float] = ..., finished: _Optional[bool] = ..., frames_sha256: _Optional[str] = ...) -> None: ...

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
