"""The gRPC adapters of `scheduler.hosting`'s protocols: `GrpcKVCache` (kvcache_svc) and
`GrpcWorkers` (the workers' service and health checks). They own what the status codes mean to
the scheduler, so that placement and dispatch never see a transport."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferix.api.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc, worker_pb2, worker_pb2_grpc
from inferix.server import channel
from scheduler.hosting import (
    CallFailed,
    CannotContinue,
    NoRoom,
    OpenedSession,
    PlacementUnavailable,
    WorkerInfo,
    WorkerRef,
)

# A callee that could not be reached or did not answer in time: it may be gone.
UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


def _failed(exc: grpc.aio.AioRpcError) -> CallFailed:
    return CallFailed(exc.code().name, exc.details() or "")


class GrpcKVCache:
    """`KVCache` over kvcache_svc's gRPC API."""

    def __init__(self, address: str) -> None:
        self._stub = kvcache_pb2_grpc.KVCacheServiceStub(channel(address))

    async def admit(
        self,
        session_id: str,
        model: str,
        pages: int,
        resolution: common_pb2.Resolution,
        exclude: list[str],
        timeout: float,
    ) -> WorkerRef | NoRoom:
        request = kvcache_pb2.AdmitRequest(
            session_id=session_id, model=model, pages=pages, exclude_workers=exclude, resolution=resolution
        )
        try:
            reply = await self._stub.Admit(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND):
                return NoRoom(exc.details() or f"kvcache_svc answered {exc.code().name}")
            if exc.code() in UNREACHABLE:
                raise PlacementUnavailable(f"kvcache_svc: {exc.code().name}") from exc
            raise
        return WorkerRef(reply.worker.worker_id, reply.worker.address)

    async def workers(self, timeout: float) -> list[WorkerInfo]:
        try:
            reply = await self._stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from exc
        return [WorkerInfo(w.address, w.model, w.alive, w.suspect, w.model_settings) for w in reply.workers]

    async def report_failure(self, worker_id: str, reason: str, timeout: float) -> None:
        request = kvcache_pb2.ReportWorkerFailureRequest(worker_id=worker_id, reason=reason)
        try:
            await self._stub.ReportWorkerFailure(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from exc

    async def release(self, session_id: str, timeout: float) -> None:
        try:
            await self._stub.Release(kvcache_pb2.ReleaseRequest(session_id=session_id), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: it held no reservation
                raise _failed(exc) from exc

    async def set_activity(self, session_id: str, paused: bool, timeout: float) -> None:
        request = kvcache_pb2.SetSessionActivityRequest(session_id=session_id, paused=paused)
        try:
            await self._stub.SetSessionActivity(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from exc


class GrpcWorkers:
    """`WorkerClient` over the workers' gRPC API; one channel per worker carries its calls and health checks."""

    def __init__(self) -> None:
        self._stubs: dict[str, tuple[worker_pb2_grpc.WorkerServiceStub, health_pb2_grpc.HealthStub]] = {}

    def unreachable(self, exc: Exception) -> str | None:
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in UNREACHABLE:
            return exc.code().name
        return None

    async def probe(self, address: str, timeout: float) -> bool:
        try:
            await self._health(address).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def draining(self, address: str, timeout: float) -> bool:
        try:
            reply = await self._health(address).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.NOT_SERVING)

    async def open_session(
        self,
        address: str,
        session_id: str,
        spec: common_pb2.SessionSpec,
        streamer_address: str,
        announced_blocks: int,
        timeout: float,
    ) -> OpenedSession:
        request = worker_pb2.OpenSessionRequest(
            session_id=session_id, spec=spec, streamer_address=streamer_address, announced_blocks=announced_blocks
        )
        try:
            reply = await self._worker(address).OpenSession(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            # The worker's FAILED_PRECONDITION at OpenSession: it cannot continue the session (see CannotContinue).
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise CannotContinue(exc.details() or "the worker cannot continue the session") from exc
            raise
        return OpenedSession(reply.next_block, list(reply.blocks), reply.decoder)

    async def run_block(
        self,
        address: str,
        session_id: str,
        block_index: int,
        prompt: str,
        recache: bool,
        action: common_pb2.HeldAction | None,
        timeout: float,
    ) -> common_pb2.BlockEvent:
        request = worker_pb2.RunBlockRequest(
            session_id=session_id, block_index=block_index, prompt=prompt, recache=recache
        )
        if action is not None:
            request.held_action.CopyFrom(action)
        reply = await self._worker(address).RunBlock(request, timeout=timeout)
        return reply.block

    async def close_session(self, address: str, session_id: str, timeout: float, finish_stream: bool = True) -> None:
        request = worker_pb2.CloseSessionRequest(session_id=session_id, finish_stream=finish_stream)
        try:
            await self._worker(address).CloseSession(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from exc

    async def prefetch(self, address: str, session_id: str, timeout: float) -> None:
        request = worker_pb2.PrefetchSessionRequest(session_id=session_id)
        try:
            await self._worker(address).PrefetchSession(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from exc

    async def session_ids(self, address: str, timeout: float) -> list[str]:
        try:
            status = await self._worker(address).GetStatus(worker_pb2.GetStatusRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from exc
        return list(status.session_ids)

    def _worker(self, address: str) -> worker_pb2_grpc.WorkerServiceStub:
        return self._channel(address)[0]

    def _health(self, address: str) -> health_pb2_grpc.HealthStub:
        return self._channel(address)[1]

    def _channel(self, address: str) -> tuple[worker_pb2_grpc.WorkerServiceStub, health_pb2_grpc.HealthStub]:
        if address not in self._stubs:
            shared = channel(address)
            self._stubs[address] = (worker_pb2_grpc.WorkerServiceStub(shared), health_pb2_grpc.HealthStub(shared))
        return self._stubs[address]
