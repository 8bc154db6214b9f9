"""The worker registry and session reservations, kept in a `Store`.

One record per worker (`kvcache/workers/<id>`, JSON) holds its declared pool, its last report
(KV usage and its measured real-time capacity per resolution), the last heartbeat sequence, and
the reservations of the sessions placed on it: their pages and their stream costs (the share of
the worker's real-time capacity each takes, decided at admission). Keeping the reservations
inside the worker's record is what makes admission safe without a global lock: "check free
pages and stream load, then reserve" is one atomic `Store.update` of that record, so two
kvcache_svc replicas (or concurrent RPCs) can never over-commit a worker. Liveness is derived
from the wall-clock `last_seen_unix`, which stays meaningful across restarts and hosts.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from inferix.spec.capacity import Resolution, StreamCapacity
from inferix.store import Store, StoreConflictError
from kvcache_svc.errors import InvalidRequestError, NotFoundError, PreconditionError
from kvcache_svc.placement import (
    PlacementRequest,
    WorkerLoad,
    choose_worker,
    eligible,
    fits,
    request_cost,
)

WORKERS_PREFIX = "kvcache/workers/"
MAX_ADMIT_ROUNDS = 32  # a lost round means a concurrent admission took the room; re-place on fresh state

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def require_id(kind: str, value: str) -> str:
    """Ids become store keys, so they are restricted to a safe, unambiguous alphabet."""
    if not value:
        raise InvalidRequestError(f"{kind} is required")
    if not _ID.fullmatch(value):
        raise InvalidRequestError(
            f"{kind} {value!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def check_capacity(worker_id: str, capacity: Sequence[StreamCapacity]) -> list[StreamCapacity]:
    """A worker's reported real-time capacity, checked: one entry per resolution, sizes set, numbers
    finite and not negative."""
    seen: set[Resolution] = set()
    for entry in capacity:
        where = f"capacity of worker {worker_id!r} at {entry.resolution}"
        if entry.resolution.width < 1 or entry.resolution.height < 1:
            raise InvalidRequestError(f"{where}: the resolution's width and height must both be set")
        if entry.resolution in seen:
            raise InvalidRequestError(f"{where}: reported twice (one entry per resolution)")
        seen.add(entry.resolution)
        if entry.streams < 0 or entry.measured_up_to < 0:
            raise InvalidRequestError(f"{where}: streams and measured_up_to must be >= 0")
        for name in ("block_ms", "budget_ms"):
            value = getattr(entry, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidRequestError(f"{where}: {name} must be a finite number >= 0, got {value}")
    return list(capacity)


def _decode_capacity(entry: dict[str, Any]) -> StreamCapacity:
    fields = dict(entry)
    return StreamCapacity(resolution=Resolution(**fields.pop("resolution")), **fields)


@dataclass(frozen=True)
class KVReport:
    """A worker's pool as it reports it (the KVUsage message, as a dataclass)."""

    total_pages: int
    used_pages: int = 0
    page_bytes: int = 0
    host_pages_used: int = 0
    sessions: int = 0


@dataclass
class WorkerRecord:
    worker_id: str
    address: str
    model: str
    total_pages: int
    page_bytes: int
    used_pages: int = 0
    host_pages_used: int = 0
    sessions: int = 0
    model_settings: str = ""  # how its model folder changes the model's preset ("": as shipped)
    session_ids: list[str] = field(default_factory=list)
    sequence: int = 0  # last accepted heartbeat sequence; RegisterWorker resets it to 0
    last_seen_unix: float = 0.0
    reservations: dict[str, int] = field(default_factory=dict)  # session id -> pages
    departed: bool = False  # deregistered while draining; RegisterWorker clears it
    suspect_since: float = 0.0  # wall clock of the last failure report; a later heartbeat clears it
    capacity: list[StreamCapacity] = field(default_factory=list)  # real-time streams per resolution measured
    # Session id -> its share of the real-time capacity (only sessions with a non-zero share).
    stream_costs: dict[str, float] = field(default_factory=dict)
    device: str = ""  # what it computes on, as it says (for operators)
    realtime_factor: float = 0.0  # video seconds per second of block time, recent blocks (0: none yet)

    @property
    def suspect(self) -> bool:
        return self.suspect_since > 0.0 and self.last_seen_unix <= self.suspect_since

    @property
    def reserved_pages(self) -> int:
        return sum(self.reservations.values())

    @property
    def stream_load(self) -> float:
        """Share of its real-time capacity its sessions take (1 = full)."""
        return sum(self.stream_costs.values())

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> WorkerRecord:
        """Records written before a field existed decode with its default."""
        fields = json.loads(data)
        fields["capacity"] = [_decode_capacity(c) for c in fields.get("capacity", [])]
        return cls(**fields)


def _settings(model_settings: str) -> str:
    """A worker's model settings in an error message."""
    return f"model.yaml {model_settings[:200]}" if model_settings else "the shipped preset"


class _LostRace(Exception):
    """The chosen worker no longer fits by the time its record is updated."""


class Registry:
    """Register / heartbeat / list workers; admit and release sessions."""

    def __init__(self, store: Store, heartbeat_timeout_s: float, clock: Callable[[], float] = time.time) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
        self.store = store
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock

    @staticmethod
    def _key(worker_id: str) -> str:
        return WORKERS_PREFIX + worker_id

    def up(self, record: WorkerRecord) -> bool:
        """Heartbeating and not departed (a suspect one may still come back)."""
        return self.clock() - record.last_seen_unix <= self.heartbeat_timeout_s and not record.departed

    def alive(self, record: WorkerRecord) -> bool:
        """Placement may choose it: up and not suspect."""
        return self.up(record) and not record.suspect

    def load(self, record: WorkerRecord, ignore_session: str = "") -> WorkerLoad:
        """Placement view of `record`; `ignore_session`'s own reservation does not count, so that
        re-admitting a session (resize or move) does not compete with itself."""
        reserved = sum(pages for sid, pages in record.reservations.items() if sid != ignore_session)
        load = sum(cost for sid, cost in record.stream_costs.items() if sid != ignore_session)
        return WorkerLoad(
            record.worker_id,
            record.model,
            record.total_pages,
            record.used_pages,
            reserved,
            self.alive(record),
            tuple(record.capacity),
            load,
        )

    async def workers(self) -> list[WorkerRecord]:
        """Every registered worker, alive or not, sorted by id."""
        keys = await self.store.list_prefix(WORKERS_PREFIX)
        return [WorkerRecord.decode(data) for data in await self.store.get_many(keys) if data is not None]

    async def register(
        self,
        worker_id: str,
        address: str,
        model: str,
        kv: KVReport,
        capacity: Sequence[StreamCapacity] = (),
        device: str = "",
        model_settings: str = "",
    ) -> WorkerRecord:
        """Add or replace a worker, with its measured real-time `capacity` (empty: not measured). A
        re-registering worker (e.g. restarted) keeps the reservations of its sessions (pages and
        stream costs), so it must keep serving the same model and room for their pages.

        Every live worker of a model must serve it with the same `model_settings` (its model.yaml):
        a session may move to any of them and its frames must not change, and the scheduler sizes
        sessions by one preset per model."""
        require_id("worker_id", worker_id)
        capacity = check_capacity(worker_id, capacity)
        if not address:
            raise InvalidRequestError(f"address of worker {worker_id!r} is required (host:port of its Worker service)")
        if not model:
            raise InvalidRequestError(f"model of worker {worker_id!r} is required")
        if kv.total_pages < 1:
            raise InvalidRequestError(
                f"worker {worker_id!r} must declare its KV pool capacity: kv.total_pages is {kv.total_pages}"
            )
        if kv.used_pages > kv.total_pages:
            raise InvalidRequestError(
                f"worker {worker_id!r} reports {kv.used_pages} used pages, more than its {kv.total_pages} total"
            )
        for other in await self.workers():
            same_model = other.worker_id != worker_id and other.model == model and self.up(other)
            if same_model and other.model_settings != model_settings:
                raise PreconditionError(
                    f"worker {worker_id!r} serves model {model!r} with another model.yaml than live worker "
                    f"{other.worker_id!r} ({_settings(model_settings)} against {_settings(other.model_settings)}); "
                    "every worker of a model must run the same settings, so that a session makes the same "
                    "frames on any of them: give them the same model folder, or drain the other workers first"
                )

        def fn(old: bytes | None) -> bytes:
            reservations: dict[str, int] = {}
            stream_costs: dict[str, float] = {}
            if old is not None:
                previous = WorkerRecord.decode(old)
                reservations, stream_costs = previous.reservations, previous.stream_costs
                if reservations and (previous.model, previous.model_settings) != (model, model_settings):
                    raise PreconditionError(
                        f"worker {worker_id!r} re-registers for model {model!r} ({_settings(model_settings)}) but "
                        f"holds reservations for model {previous.model!r} ({_settings(previous.model_settings)}; "
                        f"sessions {sorted(reservations)}); release them first"
                    )
                if previous.reserved_pages > kv.total_pages:
                    raise PreconditionError(
                        f"worker {worker_id!r} re-registers with {kv.total_pages} pages but its sessions reserve "
                        f"{previous.reserved_pages}; release them first"
                    )
            record = WorkerRecord(
                worker_id=worker_id,
                address=address,
                model=model,
                model_settings=model_settings,
                total_pages=kv.total_pages,
                page_bytes=kv.page_bytes,
                used_pages=kv.used_pages,
                host_pages_used=kv.host_pages_used,
                sessions=kv.sessions,
                last_seen_unix=self.clock(),
                reservations=reservations,
                capacity=capacity,
                stream_costs=stream_costs,
                device=device[:200],
            )
            return record.encode()

        return WorkerRecord.decode(await self._update(worker_id, fn))

    async def heartbeat(
        self,
        worker_id: str,
        sequence: int,
        kv: KVReport,
        session_ids: Iterable[str],
        capacity: Sequence[StreamCapacity] = (),
        realtime_factor: float = 0.0,
    ) -> WorkerRecord:
        """Record a usage report; a non-empty `capacity` replaces the worker's real-time capacity
        (sessions keep the stream costs they were admitted with). Sequences must increase strictly,
        so a delayed or duplicated report can never overwrite a newer one."""
        require_id("worker_id", worker_id)
        session_ids = list(session_ids)
        capacity = check_capacity(worker_id, capacity)

        def fn(old: bytes | None) -> bytes:
            if old is None:
                raise NotFoundError(f"worker {worker_id!r} is not registered: call RegisterWorker first")
            record = WorkerRecord.decode(old)
            if kv.total_pages and kv.total_pages != record.total_pages:
                raise InvalidRequestError(
                    f"heartbeat of worker {worker_id!r} reports {kv.total_pages} total pages but it registered "
                    f"{record.total_pages}; re-register to change the capacity"
                )
            if kv.used_pages > record.total_pages:
                raise InvalidRequestError(
                    f"heartbeat of worker {worker_id!r} reports {kv.used_pages} used pages, more than its declared "
                    f"capacity of {record.total_pages}"
                )
            if sequence <= record.sequence:
                raise PreconditionError(
                    f"stale heartbeat from worker {worker_id!r}: sequence {sequence} is not newer than the last "
                    f"seen {record.sequence} (sequences start at 1 after RegisterWorker and must increase)"
                )
            record.sequence = sequence
            record.used_pages = kv.used_pages
            record.host_pages_used = kv.host_pages_used
            record.sessions = kv.sessions
            record.session_ids = session_ids
            if capacity:
                record.capacity = capacity
            if math.isfinite(realtime_factor) and realtime_factor >= 0:
                record.realtime_factor = realtime_factor
            record.last_seen_unix = self.clock()
            return record.encode()

        return WorkerRecord.decode(await self._update(worker_id, fn))

    async def deregister(self, worker_id: str) -> WorkerRecord:
        """A draining worker leaves placement now; its sessions move when the scheduler re-places them."""
        require_id("worker_id", worker_id)

        def fn(old: bytes | None) -> bytes:
            if old is None:
                raise NotFoundError(f"worker {worker_id!r} is not registered")
            record = WorkerRecord.decode(old)
            record.departed = True
            return record.encode()

        return WorkerRecord.decode(await self._update(worker_id, fn))

    async def report_failure(self, worker_id: str) -> WorkerRecord:
        """Someone could not reach the worker: no admission on it until its next heartbeat."""
        require_id("worker_id", worker_id)
        now = self.clock()

        def fn(old: bytes | None) -> bytes:
            if old is None:
                raise NotFoundError(f"worker {worker_id!r} is not registered")
            record = WorkerRecord.decode(old)
            record.suspect_since = max(now, record.last_seen_unix)
            return record.encode()

        return WorkerRecord.decode(await self._update(worker_id, fn))

    async def admit(
        self,
        session_id: str,
        model: str,
        pages: int,
        exclude: Iterable[str] = (),
        resolution: Resolution | None = None,
    ) -> WorkerRecord:
        """Reserve `pages` and the session's share of real-time streams at `resolution` (None: pages
        only) on the best worker and return it.

        Idempotent: a session that already holds the same reservation on an eligible worker gets
        that worker back (with the stream cost it was admitted with). Otherwise (new session, new
        size, or its worker is now excluded or dead) it is placed afresh and any older reservation
        is dropped afterwards, so for a moment it is counted twice: over-reserving is safe,
        over-committing is not.
        """
        require_id("session_id", session_id)
        if not model:
            raise InvalidRequestError(f"model is required to admit session {session_id!r}")
        if pages < 1:
            raise InvalidRequestError(f"session {session_id!r} must ask for at least 1 page, got {pages}")
        if resolution is not None and resolution.pixels == 0:
            if resolution.width or resolution.height:
                raise InvalidRequestError(
                    f"resolution {resolution} of session {session_id!r}: set both width and height (or neither)"
                )
            resolution = None
        request = PlacementRequest(session_id, model, pages, frozenset(exclude), resolution)
        for _ in range(MAX_ADMIT_ROUNDS):
            records = await self.workers()
            holders = [r for r in records if session_id in r.reservations]
            for record in holders:
                if record.reservations[session_id] == pages and eligible(self.load(record, session_id), request):
                    return record
            chosen = choose_worker((self.load(r, session_id) for r in records), request)
            try:
                placed = await self._reserve(chosen.worker_id, request)
            except _LostRace:
                continue
            for record in holders:
                if record.worker_id != placed.worker_id:
                    await self._unreserve(record.worker_id, session_id)
            return placed
        raise StoreConflictError(
            f"admission of session {session_id!r} lost to concurrent admissions {MAX_ADMIT_ROUNDS} times"
        )

    async def release(self, session_id: str) -> list[str]:
        """Drop the session's reservation(s); returns the workers that held one."""
        require_id("session_id", session_id)
        holders = [r.worker_id for r in await self.workers() if session_id in r.reservations]
        if not holders:
            raise NotFoundError(f"session {session_id!r} holds no reservation (never admitted, or already released)")
        for worker_id in holders:
            await self._unreserve(worker_id, session_id)
        return holders

    async def holds_reservation(self, session_id: str) -> bool:
        return any(session_id in r.reservations for r in await self.workers())

    async def _update(self, worker_id: str, fn: Callable[[bytes | None], bytes]) -> bytes:
        new = await self.store.update(self._key(worker_id), fn)
        assert new is not None  # fn always returns a record
        return new

    async def _reserve(self, worker_id: str, request: PlacementRequest) -> WorkerRecord:
        def fn(old: bytes | None) -> bytes:
            if old is None:
                raise _LostRace
            record = WorkerRecord.decode(old)
            load = self.load(record, request.session_id)
            if not fits(load, request):
                raise _LostRace
            record.reservations[request.session_id] = request.pages
            cost = request_cost(load, request)
            if cost > 0:
                record.stream_costs[request.session_id] = cost
            else:
                record.stream_costs.pop(request.session_id, None)
            return record.encode()

        return WorkerRecord.decode(await self._update(worker_id, fn))

    async def _unreserve(self, worker_id: str, session_id: str) -> None:
        def fn(old: bytes | None) -> bytes | None:
            if old is None:
                return None
            record = WorkerRecord.decode(old)
            record.reservations.pop(session_id, None)
            record.stream_costs.pop(session_id, None)
            return record.encode()

        await self.store.update(self._key(worker_id), fn)
