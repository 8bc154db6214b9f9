"""Placement: which worker gets a session. Pure functions over plain dataclasses, no I/O.

Policy: among alive, non-excluded workers serving the session's model, pick the one with the
most free pages (ties: lowest worker id, so the choice is deterministic and testable). Spreading
rather than packing is deliberate: sessions on one GPU share its compute, and interactive
latency (a prompt change must show within `lookahead + 1` blocks) degrades with every extra
session on a worker long before its KV pool is full. Reservations are upper bounds, so a
worker's free pages are what is left after the larger of its reservations and its reported use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvcache_svc.errors import NoCapacityError, NotFoundError


@dataclass(frozen=True)
class WorkerLoad:
    """What placement needs to know about one worker."""

    worker_id: str
    model: str
    total_pages: int
    used_pages: int
    reserved_pages: int
    alive: bool

    @property
    def free_pages(self) -> int:
        """Pages neither reserved nor in use. Use can exceed reservations (sessions admitted by
        an in-memory kvcache_svc before it restarted still hold pages), so the larger counts."""
        return max(0, self.total_pages - max(self.used_pages, self.reserved_pages))


@dataclass(frozen=True)
class PlacementRequest:
    session_id: str
    model: str
    pages: int
    exclude: frozenset[str] = field(default_factory=frozenset)


def eligible(worker: WorkerLoad, request: PlacementRequest) -> bool:
    """Available (heartbeating, not draining, not suspect), serving the model, not excluded."""
    return worker.alive and worker.model == request.model and worker.worker_id not in request.exclude


def fits(worker: WorkerLoad, request: PlacementRequest) -> bool:
    return eligible(worker, request) and worker.free_pages >= request.pages


def choose_worker(workers: Iterable[WorkerLoad], request: PlacementRequest) -> WorkerLoad:
    """The worker for `request`, or NotFoundError (nobody serves the model) / NoCapacityError."""
    workers = list(workers)
    serving = sorted((w for w in workers if w.model == request.model), key=lambda w: w.worker_id)
    if not serving:
        models = sorted({w.model for w in workers})
        served = ", ".join(repr(m) for m in models) if models else "none (no worker has registered)"
        raise NotFoundError(f"no worker serves model {request.model!r}; served models: {served}")
    fitting = [w for w in serving if fits(w, request)]
    if not fitting:
        raise NoCapacityError(_no_room(serving, request))
    return min(fitting, key=lambda w: (-w.free_pages, w.worker_id))


def _no_room(serving: list[WorkerLoad], request: PlacementRequest) -> str:
    def state(worker: WorkerLoad) -> str:
        if worker.worker_id in request.exclude:
            return "excluded"
        if not worker.alive:
            return "unavailable"
        return f"{worker.free_pages} free of {worker.total_pages}"

    candidates = [w for w in serving if eligible(w, request)]
    most = max((w.free_pages for w in candidates), default=0)
    workers = "; ".join(f"{w.worker_id}: {state(w)}" for w in serving)
    return (
        f"no worker has room for session {request.session_id!r}: it needs {request.pages} pages of model "
        f"{request.model!r}, the most free on an eligible worker is {most} ({workers}); "
        "retry later, ask for fewer pages (a smaller window), or add workers"
    )
