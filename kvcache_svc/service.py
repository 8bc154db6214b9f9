"""The grpc.aio servicer of `inferix.v1.KVCacheService`: proto <-> registry, errors -> statuses.

The servicer holds no state of its own (everything is in the store), so several replicas on one
Redis, or a restarted process, answer the same.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from inferix.api.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from inferix.server import Registration
from inferix.spec.blocks import CommittedBlock
from inferix.spec.capacity import Resolution, StreamCapacity
from inferix.store import Store, StoreConflictError, StoreError, StoreUnavailableError
from kvcache_svc import metrics
from kvcache_svc.blocks import BlockStore
from kvcache_svc.errors import (
    AlreadyCommittedError,
    InvalidRequestError,
    KVCacheError,
    NoCapacityError,
    NotFoundError,
    PreconditionError,
)
from kvcache_svc.offload import SessionReport, Watermarks, plan_offload
from kvcache_svc.registry import KVReport, Registry, WorkerRecord, require_id
from kvcache_svc.snapshots import SnapshotStore

log = logging.getLogger("kvcache_svc")
# GetCommittedBlocks reads this many blocks from the store at a time and streams messages of about
# this size, so neither a session's length nor the 64 MiB message cap bounds recovery.
FETCH_BLOCKS = 16
STREAM_MESSAGE_BYTES = 4 * 2**20

SERVICE_NAME = kvcache_pb2.DESCRIPTOR.services_by_name["KVCacheService"].full_name

# Most specific first: the first matching class decides the status.
_STATUS: list[tuple[type[Exception], grpc.StatusCode]] = [
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (NoCapacityError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AlreadyCommittedError, grpc.StatusCode.ALREADY_EXISTS),
    (StoreConflictError, grpc.StatusCode.ABORTED),
    (StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (StoreError, grpc.StatusCode.INTERNAL),
]

S = TypeVar("S")
Q = TypeVar("Q")
R = TypeVar("R")


def _with_statuses(handler: Callable[[S, Q, Any], Awaitable[R]]) -> Callable[[S, Q, Any], Awaitable[R]]:
    """Turn our exceptions into gRPC statuses carrying their message; others stay UNKNOWN."""

    @functools.wraps(handler)
    async def wrapper(self: S, request: Q, context: Any) -> R:
        try:
            return await handler(self, request, context)
        except (KVCacheError, StoreError) as exc:
            code = next(code for cls, code in _STATUS if isinstance(exc, cls))
            await context.abort(code, str(exc))
            raise  # context.abort always raises; this line only satisfies the type checker

    return wrapper


def _stream_with_statuses(
    handler: Callable[[S, Q, Any], AsyncIterator[R]],
) -> Callable[[S, Q, Any], AsyncIterator[R]]:
    """`_with_statuses` for server-streaming handlers."""

    @functools.wraps(handler)
    async def wrapper(self: S, request: Q, context: Any) -> AsyncIterator[R]:
        try:
            async for item in handler(self, request, context):
                yield item
        except (KVCacheError, StoreError) as exc:
            code = next(code for cls, code in _STATUS if isinstance(exc, cls))
            await context.abort(code, str(exc))

    return wrapper


@dataclass(frozen=True)
class KVCacheConfig:
    heartbeat_timeout_s: float = 10.0
    # Committed blocks of a released (finished) session are kept this long, then expire.
    finished_ttl_s: float = 24 * 3600.0
    watermarks: Watermarks = Watermarks()

    def __post_init__(self) -> None:
        if self.heartbeat_timeout_s <= 0 or self.finished_ttl_s <= 0:
            raise ValueError(f"timeouts must be > 0 seconds: {self}")

    @property
    def heartbeat_interval_s(self) -> float:
        """What workers are told: three reports per timeout, so one lost report is harmless."""
        return self.heartbeat_timeout_s / 3


def _report(kv: common_pb2.KVUsage) -> KVReport:
    return KVReport(kv.total_pages, kv.used_pages, kv.page_bytes, kv.host_pages_used, kv.sessions)


def _describe_capacity(capacity: list[StreamCapacity]) -> str:
    if not capacity:
        return "real-time capacity not measured"
    return "real-time streams: " + ", ".join(f"{c.streams} at {c.resolution}" for c in capacity)


def _worker_info(record: WorkerRecord, alive: bool) -> kvcache_pb2.WorkerInfo:
    return kvcache_pb2.WorkerInfo(
        worker_id=record.worker_id,
        address=record.address,
        model=record.model,
        model_settings=record.model_settings,
        kv=common_pb2.KVUsage(
            total_pages=record.total_pages,
            used_pages=record.used_pages,
            page_bytes=record.page_bytes,
            host_pages_used=record.host_pages_used,
            sessions=record.sessions,
        ),
        reserved_pages=record.reserved_pages,
        last_seen_unix=record.last_seen_unix,
        alive=alive,
        suspect=record.suspect,
        departed=record.departed,
        capacity=[c.to_proto() for c in record.capacity],
        stream_load=record.stream_load,
        device=record.device,
        realtime_factor=record.realtime_factor,
    )


def _paused_key(session_id: str) -> str:
    return f"kvcache/paused/{session_id}"


class KVCacheServicer(kvcache_pb2_grpc.KVCacheServiceServicer):
    def __init__(self, store: Store, config: KVCacheConfig) -> None:
        self.config = config
        self.store = store
        self.registry = Registry(store, config.heartbeat_timeout_s)
        self.blocks = BlockStore(store)
        self.snapshots = SnapshotStore(store)

    @_with_statuses
    async def RegisterWorker(
        self, request: kvcache_pb2.RegisterWorkerRequest, context: Any
    ) -> kvcache_pb2.RegisterWorkerResponse:
        record = await self.registry.register(
            request.worker_id,
            request.address,
            request.model,
            _report(request.kv),
            [StreamCapacity.from_proto(c) for c in request.capacity],
            request.device,
            request.model_settings,
        )
        log.info(
            "worker %s registered: %s, model %s, %d pages, %s", record.worker_id, record.address, record.model,
            record.total_pages, _describe_capacity(record.capacity),
        )  # fmt: skip
        return kvcache_pb2.RegisterWorkerResponse(heartbeat_interval_s=self.config.heartbeat_interval_s)

    @_with_statuses
    async def DeregisterWorker(
        self, request: kvcache_pb2.DeregisterWorkerRequest, context: Any
    ) -> kvcache_pb2.DeregisterWorkerResponse:
        record = await self.registry.deregister(request.worker_id)
        log.info("worker %s deregistered (draining); %d session(s) reserved on it", record.worker_id,
                 len(record.reservations))  # fmt: skip
        return kvcache_pb2.DeregisterWorkerResponse()

    @_with_statuses
    async def ReportWorkerFailure(
        self, request: kvcache_pb2.ReportWorkerFailureRequest, context: Any
    ) -> kvcache_pb2.ReportWorkerFailureResponse:
        record = await self.registry.report_failure(request.worker_id)
        metrics.WORKER_FAILURES.inc()
        log.warning("worker %s reported unreachable (%s): no admission on it until it heartbeats again",
                    record.worker_id, request.reason[:200] or "no reason given")  # fmt: skip
        return kvcache_pb2.ReportWorkerFailureResponse()

    @_with_statuses
    async def Heartbeat(self, request: kvcache_pb2.HeartbeatRequest, context: Any) -> kvcache_pb2.HeartbeatResponse:
        record = await self.registry.heartbeat(
            request.worker_id,
            request.sequence,
            _report(request.kv),
            request.session_ids,
            [StreamCapacity.from_proto(c) for c in request.capacity],
            request.realtime_factor,
        )
        reports = [SessionReport(r.session_id, r.device_pages, r.last_block_unix) for r in request.session_reports]
        flags = await self.store.get_many([_paused_key(r.session_id) for r in reports])
        paused = {r.session_id for r, flag in zip(reports, flags, strict=True) if flag is not None}
        offload = plan_offload(record.total_pages, request.kv.used_pages, reports, paused, self.config.watermarks)
        if offload:
            metrics.OFFLOADS.inc(len(offload))
        return kvcache_pb2.HeartbeatResponse(offload_session_ids=offload)

    @_with_statuses
    async def SetSessionActivity(
        self, request: kvcache_pb2.SetSessionActivityRequest, context: Any
    ) -> kvcache_pb2.SetSessionActivityResponse:
        require_id("session_id", request.session_id)
        if request.paused:
            await self.store.put(_paused_key(request.session_id), b"1", ttl_s=self.config.finished_ttl_s)
        else:
            await self.store.delete(_paused_key(request.session_id))
        return kvcache_pb2.SetSessionActivityResponse()

    @_with_statuses
    async def ListWorkers(
        self, request: kvcache_pb2.ListWorkersRequest, context: Any
    ) -> kvcache_pb2.ListWorkersResponse:
        records = await self.registry.workers()
        return kvcache_pb2.ListWorkersResponse(workers=[_worker_info(r, self.registry.alive(r)) for r in records])

    @_with_statuses
    async def Admit(self, request: kvcache_pb2.AdmitRequest, context: Any) -> kvcache_pb2.AdmitResponse:
        resolution = Resolution.from_proto(request.resolution) if request.HasField("resolution") else None
        try:
            record = await self.registry.admit(
                request.session_id, request.model, request.pages, request.exclude_workers, resolution
            )
        except (KVCacheError, StoreError) as exc:
            metrics.ADMISSIONS.labels(outcome="rejected").inc()
            if isinstance(exc, NoCapacityError):
                metrics.REFUSALS.labels(reason=exc.reason).inc()
            raise
        metrics.ADMISSIONS.labels(outcome="accepted").inc()
        log.info(
            "session %s admitted on %s (%d pages, %.0f%% of its real-time streams; worker at %.0f%%)",
            request.session_id, record.worker_id, request.pages, 100 * record.stream_costs.get(request.session_id, 0.0),
            100 * record.stream_load,
        )  # fmt: skip
        return kvcache_pb2.AdmitResponse(worker=_worker_info(record, self.registry.alive(record)))

    @_with_statuses
    async def Release(self, request: kvcache_pb2.ReleaseRequest, context: Any) -> kvcache_pb2.ReleaseResponse:
        workers = await self.registry.release(request.session_id)
        blocks = await self.blocks.expire(request.session_id, self.config.finished_ttl_s)
        await self.snapshots.expire(request.session_id, self.config.finished_ttl_s)
        log.info(
            "session %s released from %s; its %d committed blocks expire in %.0fs",
            request.session_id, ", ".join(workers), blocks, self.config.finished_ttl_s,
        )  # fmt: skip
        return kvcache_pb2.ReleaseResponse()

    @_with_statuses
    async def CommitBlock(
        self, request: kvcache_pb2.CommitBlockRequest, context: Any
    ) -> kvcache_pb2.CommitBlockResponse:
        if not request.HasField("block"):
            raise InvalidRequestError(f"CommitBlock for session {request.session_id!r} carries no block")
        await self.blocks.commit(request.session_id, CommittedBlock.from_proto(request.block))
        return kvcache_pb2.CommitBlockResponse()

    @_stream_with_statuses
    async def GetCommittedBlocks(
        self, request: kvcache_pb2.GetCommittedBlocksRequest, context: Any
    ) -> AsyncIterator[kvcache_pb2.GetCommittedBlocksResponse]:
        """Streams the blocks in order, each message at most ~`STREAM_MESSAGE_BYTES` (one block at least)."""
        listed = await self.blocks.listing(request.session_id, request.from_block)
        if listed is None and not await self.registry.holds_reservation(request.session_id):
            raise NotFoundError(
                f"session {request.session_id!r} has no committed blocks and no reservation "
                "(never admitted, or its blocks expired after release)"
            )
        wanted = listed or []
        batch: list[kvcache_pb2.CommittedBlock] = []
        size = 0
        for start in range(0, len(wanted), FETCH_BLOCKS):
            for block in await self.blocks.read(request.session_id, wanted[start : start + FETCH_BLOCKS]):
                message = block.to_proto()
                if batch and size + message.ByteSize() > STREAM_MESSAGE_BYTES:
                    yield kvcache_pb2.GetCommittedBlocksResponse(blocks=batch)
                    batch, size = [], 0
                batch.append(message)
                size += message.ByteSize()
        if batch or not wanted:
            yield kvcache_pb2.GetCommittedBlocksResponse(blocks=batch)

    @_with_statuses
    async def PutSnapshot(
        self, request: kvcache_pb2.PutSnapshotRequest, context: Any
    ) -> kvcache_pb2.PutSnapshotResponse:
        if not request.HasField("snapshot"):
            raise InvalidRequestError(f"PutSnapshot for session {request.session_id!r} carries no snapshot")
        put = await self.snapshots.put(request.session_id, request.snapshot, request.durable_frames)
        metrics.SNAPSHOTS.labels(outcome="stored" if put.stored else "older").inc()
        if put.anchor:  # nothing reads the blocks before the anchor any more
            dropped = await self.blocks.drop_before(request.session_id, put.anchor)
            metrics.BLOCKS_DROPPED.inc(dropped)
        return kvcache_pb2.PutSnapshotResponse(stored=put.stored)

    @_with_statuses
    async def GetSnapshot(
        self, request: kvcache_pb2.GetSnapshotRequest, context: Any
    ) -> kvcache_pb2.GetSnapshotResponse:
        snapshot = await self.snapshots.get(request.session_id, anchor=request.anchor)
        if snapshot is None:
            return kvcache_pb2.GetSnapshotResponse(found=False)
        return kvcache_pb2.GetSnapshotResponse(found=True, snapshot=snapshot)

    @_with_statuses
    async def PutSnapshotPiece(
        self, request: kvcache_pb2.PutSnapshotPieceRequest, context: Any
    ) -> kvcache_pb2.PutSnapshotPieceResponse:
        await self.snapshots.put_piece(request.session_id, request.next_block, request.index, request.data)
        return kvcache_pb2.PutSnapshotPieceResponse()

    @_with_statuses
    async def GetSnapshotPiece(
        self, request: kvcache_pb2.GetSnapshotPieceRequest, context: Any
    ) -> kvcache_pb2.GetSnapshotPieceResponse:
        data = await self.snapshots.get_piece(request.session_id, request.next_block, request.index)
        return kvcache_pb2.GetSnapshotPieceResponse(data=data)


def add_to_server(server: grpc.aio.Server, store: Store, config: KVCacheConfig) -> Registration:
    """Register the servicer and start the metrics refresher; `drain` stops the refresher."""
    servicer = KVCacheServicer(store, config)
    kvcache_pb2_grpc.add_KVCacheServiceServicer_to_server(servicer, server)
    refresher = asyncio.get_running_loop().create_task(
        metrics.refresh_forever(servicer.registry, min(1.0, config.heartbeat_interval_s))
    )
    log.info("store: %r; heartbeat timeout %.1fs", store, config.heartbeat_timeout_s)

    async def drain() -> None:
        refresher.cancel()
        await asyncio.gather(refresher, return_exceptions=True)

    return Registration([SERVICE_NAME], drain)
