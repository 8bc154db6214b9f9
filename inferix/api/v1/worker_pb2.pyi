from inferix.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "spec", "streamer_address", "announced_blocks")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STREAMER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ANNOUNCED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    spec: _common_pb2.SessionSpec
    streamer_address: str
    announced_blocks: int
    def __init__(self, session_id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.SessionSpec, _Mapping]] = ..., streamer_address: _Optional[str] = ..., announced_blocks: _Optional[int] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("next_block", "blocks", "decoder")
    NEXT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    next_block: int
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.BlockEvent]
    decoder: str
    def __init__(self, next_block: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[_common_pb2.BlockEvent, _Mapping]]] = ..., decoder: _Optional[str] = ...) -> None: ...

class RunBlockRequest(_message.Message):
    __slots__ = ("session_id", "block_index", "prompt", "recache", "action", "held_action")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RECACHE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    HELD_ACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    block_index: int
    prompt: str
    recache: bool
    action: bytes
    held_action: _common_pb2.HeldAction
    def __init__(self, session_id: _Optional[str] = ..., block_index: _Optional[int] = ..., prompt: _Optional[str] = ..., recache: _Optional[bool] = ..., action: _Optional[bytes] = ..., held_action: _Optional[_Union[_common_pb2.HeldAction, _Mapping]] = ...) -> None: ...

class RunBlockResponse(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: _common_pb2.BlockEvent
    def __init__(self, block: _Optional[_Union[_common_pb2.BlockEvent, _Mapping]] = ...) -> None: ...

class PrefetchSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class PrefetchSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id", "finish_stream")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_STREAM_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    finish_stream: bool
    def __init__(self, session_id: _Optional[str] = ..., finish_stream: _Optional[bool] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("worker_id", "model", "kv", "session_ids")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    kv: _common_pb2.KVUsage
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., kv: _Optional[_Union[_common_pb2.KVUsage, _Mapping]] = ..., session_ids: _Optional[_Iterable[str]] = ...) -> None: ...
