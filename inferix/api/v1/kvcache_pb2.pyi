from inferix.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "address", "model", "kv", "reserved_pages", "last_seen_unix", "alive", "suspect", "departed", "capacity", "stream_load", "device", "realtime_factor", "model_settings")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    RESERVED_PAGES_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STREAM_LOAD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    REALTIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    model: str
    kv: _common_pb2.KVUsage
    reserved_pages: int
    last_seen_unix: float
    alive: bool
    suspect: bool
    departed: bool
    capacity: _containers.RepeatedCompositeFieldContainer[StreamCapacity]
    stream_load: float
    device: str
    realtime_factor: float
    model_settings: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., kv: _Optional[_Union[_common_pb2.KVUsage, _Mapping]] = ..., reserved_pages: _Optional[int] = ..., last_seen_unix: _Optional[float] = ..., alive: _Optional[bool] = ..., suspect: _Optional[bool] = ..., departed: _Optional[bool] = ..., capacity: _Optional[_Iterable[_Union[StreamCapacity, _Mapping]]] = ..., stream_load: _Optional[float] = ..., device: _Optional[str] = ..., realtime_factor: _Optional[float] = ..., model_settings: _Optional[str] = ...) -> None: ...

class StreamCapacity(_message.Message):
    __slots__ = ("resolution", "streams", "block_ms", "budget_ms", "measured_up_to")
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_UP_TO_FIELD_NUMBER: _ClassVar[int]
    resolution: _common_pb2.Resolution
    streams: int
    block_ms: float
    budget_ms: float
    measured_up_to: int
    def __init__(self, resolution: _Optional[_Union[_common_pb2.Resolution, _Mapping]] = ..., streams: _Optional[int] = ..., block_ms: _Optional[float] = ..., budget_ms: _Optional[float] = ..., measured_up_to: _Optional[int] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "address", "model", "kv", "capacity", "device", "model_settings")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    model: str
    kv: _common_pb2.KVUsage
    capacity: _containers.RepeatedCompositeFieldContainer[StreamCapacity]
    device: str
    model_settings: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., kv: _Optional[_Union[_common_pb2.KVUsage, _Mapping]] = ..., capacity: _Optional[_Iterable[_Union[StreamCapacity, _Mapping]]] = ..., device: _Optional[str] = ..., model_settings: _Optional[str] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DeregisterWorkerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportWorkerFailureRequest(_message.Message):
    __slots__ = ("worker_id", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportWorkerFailureResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionKVReport(_message.Message):
    __slots__ = ("session_id", "device_pages", "host_pages", "last_block_unix")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_PAGES_FIELD_NUMBER: _ClassVar[int]
    HOST_PAGES_FIELD_NUMBER: _ClassVar[int]
    LAST_BLOCK_UNIX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    device_pages: int
    host_pages: int
    last_block_unix: float
    def __init__(self, session_id: _Optional[str] = ..., device_pages: _Optional[int] = ..., host_pages: _Optional[int] = ..., last_block_unix: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "sequence", "kv", "session_ids", "session_reports", "capacity", "realtime_factor")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_REPORTS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    REALTIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    sequence: int
    kv: _common_pb2.KVUsage
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    session_reports: _containers.RepeatedCompositeFieldContainer[SessionKVReport]
    capacity: _containers.RepeatedCompositeFieldContainer[StreamCapacity]
    realtime_factor: float
    def __init__(self, worker_id: _Optional[str] = ..., sequence: _Optional[int] = ..., kv: _Optional[_Union[_common_pb2.KVUsage, _Mapping]] = ..., session_ids: _Optional[_Iterable[str]] = ..., session_reports: _Optional[_Iterable[_Union[SessionKVReport, _Mapping]]] = ..., capacity: _Optional[_Iterable[_Union[StreamCapacity, _Mapping]]] = ..., realtime_factor: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("offload_session_ids",)
    OFFLOAD_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    offload_session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, offload_session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SetSessionActivityRequest(_message.Message):
    __slots__ = ("session_id", "paused")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    paused: bool
    def __init__(self, session_id: _Optional[str] = ..., paused: _Optional[bool] = ...) -> None: ...

class SetSessionActivityResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("session_id", "model", "pages", "exclude_workers", "resolution")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    pages: int
    exclude_workers: _containers.RepeatedScalarFieldContainer[str]
    resolution: _common_pb2.Resolution
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., pages: _Optional[int] = ..., exclude_workers: _Optional[_Iterable[str]] = ..., resolution: _Optional[_Union[_common_pb2.Resolution, _Mapping]] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommittedBlock(_message.Message):
    __slots__ = ("block_index", "start_frame", "shape", "latents", "prompt", "carry_shape", "carry", "action", "recached")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    START_FRAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    LATENTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CARRY_SHAPE_FIELD_NUMBER: _ClassVar[int]
    CARRY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RECACHED_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    start_frame: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    latents: bytes
    prompt: str
    carry_shape: _containers.RepeatedScalarFieldContainer[int]
    carry: bytes
    action: _common_pb2.HeldAction
    recached: bool
    def __init__(self, block_index: _Optional[int] = ..., start_frame: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., latents: _Optional[bytes] = ..., prompt: _Optional[str] = ..., carry_shape: _Optional[_Iterable[int]] = ..., carry: _Optional[bytes] = ..., action: _Optional[_Union[_common_pb2.HeldAction, _Mapping]] = ..., recached: _Optional[bool] = ...) -> None: ...

class CommitBlockRequest(_message.Message):
    __slots__ = ("session_id", "block")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    block: CommittedBlock
    def __init__(self, session_id: _Optional[str] = ..., block: _Optional[_Union[CommittedBlock, _Mapping]] = ...) -> None: ...

class CommitBlockResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCommittedBlocksRequest(_message.Message):
    __slots__ = ("session_id", "from_block")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_BLOCK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    from_block: int
    def __init__(self, session_id: _Optional[str] = ..., from_block: _Optional[int] = ...) -> None: ...

class GetCommittedBlocksResponse(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[CommittedBlock]
    def __init__(self, blocks: _Optional[_Iterable[_Union[CommittedBlock, _Mapping]]] = ...) -> None: ...

class KVSnapshot(_message.Message):
    __slots__ = ("next_block", "next_frame", "state", "worker_id", "block_frames", "pieces", "state_sha256")
    NEXT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    NEXT_FRAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    STATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    next_block: int
    next_frame: int
    state: bytes
    worker_id: str
    block_frames: _containers.RepeatedScalarFieldContainer[int]
    pieces: int
    state_sha256: str
    def __init__(self, next_block: _Optional[int] = ..., next_frame: _Optional[int] = ..., state: _Optional[bytes] = ..., worker_id: _Optional[str] = ..., block_frames: _Optional[_Iterable[int]] = ..., pieces: _Optional[int] = ..., state_sha256: _Optional[str] = ...) -> None: ...

class PutSnapshotRequest(_message.Message):
    __slots__ = ("session_id", "snapshot", "durable_frames")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    snapshot: KVSnapshot
    durable_frames: int
    def __init__(self, session_id: _Optional[str] = ..., snapshot: _Optional[_Union[KVSnapshot, _Mapping]] = ..., durable_frames: _Optional[int] = ...) -> None: ...

class PutSnapshotResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    def __init__(self, stored: _Optional[bool] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("session_id", "anchor")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    anchor: bool
    def __init__(self, session_id: _Optional[str] = ..., anchor: _Optional[bool] = ...) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("found", "snapshot")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    found: bool
    snapshot: KVSnapshot
    def __init__(self, found: _Optional[bool] = ..., snapshot: _Optional[_Union[KVSnapshot, _Mapping]] = ...) -> None: ...

class PutSnapshotPieceRequest(_message.Message):
    __slots__ = ("session_id", "next_block", "index", "data")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    next_block: int
    index: int
    data: bytes
    def __init__(self, session_id: _Optional[str] = ..., next_block: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutSnapshotPieceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSnapshotPieceRequest(_message.Message):
    __slots__ = ("session_id", "next_block", "index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    next_block: int
    index: int
    def __init__(self, session_id: _Optional[str] = ..., next_block: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class GetSnapshotPieceResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
