"""The worker's link to kvcache_svc: block commits, committed-block reads, snapshot reads, registration,
heartbeats.

A block's clean latents are committed after its frames were published, so a crash between the two
makes a successor regenerate the block (bit-identical; the streamer drops the re-sent frames)
rather than lose it. Heartbeats report KV usage, the sessions held and the real-time capacity, and
carry kvcache_svc's offload decisions back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from engine.contract import VideoBlock
from inferix.api.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from inferix.server import channel
from inferix.spec.blocks import CommittedBlock
from workers.retry import while_away

log = logging.getLogger("inferix.worker")
INTERNAL_DEADLINE_S = 30.0
COMMITTED_PAGE_DEADLINE_S = 60.0  # one page of committed blocks (~4 MiB)
SNAPSHOT_DEADLINE_S = 60.0  # one snapshot message or piece (up to 64 MiB)


def state_sha256(state: bytes) -> str:
    """The digest a snapshot in pieces carries of its whole state (hex)."""
    return hashlib.sha256(state).hexdigest()


@dataclass
class WorkerReport:
    """What a heartbeat (or the registration) reports, built fresh for each."""

    kv: common_pb2.KVUsage
    session_ids: list[str]
    session_reports: list[kvcache_pb2.SessionKVReport]
    capacity: list[kvcache_pb2.StreamCapacity]
    realtime_factor: float


class KVCacheLink:
    def __init__(self, address: str, worker_id: str) -> None:
        self.address = address
        self.worker_id = worker_id
        self.stub = kvcache_pb2_grpc.KVCacheServiceStub(channel(address))
        self._sequence = 0

    async def commit(self, session_id: str, block: VideoBlock, action: common_pb2.HeldAction) -> None:
        """Store the block's latents, with the action it was made under (commits are idempotent)."""
        committed = dataclasses.replace(
            block.committed(), action_keys=tuple(action.keys), action_mouse=tuple(action.mouse)
        )
        request = kvcache_pb2.CommitBlockRequest(session_id=session_id, block=committed.to_proto())

        async def attempt() -> None:
            try:
                await self.stub.CommitBlock(request, timeout=INTERNAL_DEADLINE_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:  # ALREADY_EXISTS: a re-run of a committed block
                    raise

        await while_away(f"commit of {session_id} block {block.index}: kvcache_svc", attempt)

    async def committed_groups(
        self, session_id: str, before_block: int | None = None, from_block: int = 0
    ) -> AsyncIterator[list[CommittedBlock]]:
        """The session's committed blocks in order (from `from_block`), in groups: a page (one stream
        message) at a time, each page its own call, so a replay that takes long between pages never runs
        into a stream deadline."""
        while before_block is None or from_block < before_block:
            call = self.stub.GetCommittedBlocks(
                kvcache_pb2.GetCommittedBlocksRequest(session_id=session_id, from_block=from_block),
                timeout=COMMITTED_PAGE_DEADLINE_S,
            )
            page = await call.read()
            call.cancel()
            if page is grpc.aio.EOF or not page.blocks:
                return
            group = [
                CommittedBlock.from_proto(b)
                for b in page.blocks
                if before_block is None or b.block_index < before_block
            ]
            if group:
                yield group
            from_block = page.blocks[-1].block_index + 1

    async def snapshot(self, session_id: str, anchor: bool = False) -> kvcache_pb2.KVSnapshot | None:
        """The session's latest snapshot, or its anchor (see kvcache_svc/snapshots.py); None: none."""
        request = kvcache_pb2.GetSnapshotRequest(session_id=session_id, anchor=anchor)
        reply = await self.stub.GetSnapshot(request, timeout=SNAPSHOT_DEADLINE_S)
        return reply.snapshot if reply.found else None

    async def snapshot_state(self, session_id: str, found: kvcache_pb2.KVSnapshot) -> bytes | None:
        """A snapshot's state: inline, or its pieces put together; None when they do not match its digest."""
        if not found.pieces:
            return found.state
        pieces = []
        for index in range(found.pieces):
            request = kvcache_pb2.GetSnapshotPieceRequest(
                session_id=session_id, next_block=found.next_block, index=index
            )
            pieces.append((await self.stub.GetSnapshotPiece(request, timeout=SNAPSHOT_DEADLINE_S)).data)
        state = b"".join(pieces)
        if await asyncio.to_thread(state_sha256, state) != found.state_sha256:
            return None
        return state

    async def register_and_heartbeat(
        self,
        address: str,
        model: str,
        model_settings: str,
        device: str,
        interval: float,
        report: Callable[[], WorkerReport],
        offload: Callable[[list[str]], Awaitable[None]],
        stop: asyncio.Event,
    ) -> None:
        """Register with kvcache_svc, then report until `stop` (re-registering if forgotten); sessions
        kvcache_svc asks to offload go to `offload`."""
        registered = False
        while not stop.is_set():
            try:
                if not registered:
                    now = report()
                    reply = await self.stub.RegisterWorker(
                        kvcache_pb2.RegisterWorkerRequest(
                            worker_id=self.worker_id,
                            address=address,
                            model=model,
                            model_settings=model_settings,
                            kv=now.kv,
                            capacity=now.capacity,
                            device=device,
                        ),
                        timeout=5,
                    )
                    interval = reply.heartbeat_interval_s or interval
                    registered = True
                    log.info("registered with kvcache_svc at %s as %s", self.address, address)
                self._sequence += 1
                now = report()
                reply = await self.stub.Heartbeat(
                    kvcache_pb2.HeartbeatRequest(
                        worker_id=self.worker_id,
                        sequence=self._sequence,
                        kv=now.kv,
                        session_ids=now.session_ids,
                        session_reports=now.session_reports,
                        capacity=now.capacity,
                        realtime_factor=now.realtime_factor,
                    ),
                    timeout=5,
                )
                if reply.offload_session_ids:
                    await offload(list(reply.offload_session_ids))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    registered = False  # kvcache_svc restarted without our record
                else:
                    log.warning("heartbeat to kvcache_svc failed: %s", exc.details())
            except Exception:  # keep heartbeating: a dead loop would make the worker look dead
                log.exception("heartbeat failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    async def deregister(self) -> None:
        """Leave placement (kvcache_svc need not wait for missed heartbeats)."""
        try:
            await self.stub.DeregisterWorker(kvcache_pb2.DeregisterWorkerRequest(worker_id=self.worker_id), timeout=5)
            log.info("deregistered from kvcache_svc")
        except grpc.aio.AioRpcError as exc:  # heartbeats have stopped: it will time out anyway
            log.warning("deregistration failed (%s); kvcache_svc notices when heartbeats stop", exc.code().name)
