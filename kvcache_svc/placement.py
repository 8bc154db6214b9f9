"""Placement: which worker gets a session. Pure functions over plain dataclasses, no I/O.

A worker fits a session when it is available (alive, not excluded) for the session's model and
has room on two counts:

- **KV pages.** Reservations are upper bounds, so a worker's free pages are what is left after
  the larger of its reservations and its reported use; the session's pages must fit in them.
- **Real-time streams.** A worker reports, per resolution it has measured, how many sessions it
  runs at once with every block inside the real-time budget (continuous batching). A session
  takes a share of that capacity, its *stream cost*, decided at admission (`stream_cost`):
  1 / streams at a measured resolution; 1 (the whole worker) where it cannot hold even one
  real-time stream; at an unmeasured resolution, estimated from the measured one with the most
  pixels, scaled by pixel count (capped at 1); 0 when the worker has measured nothing or the
  session names no resolution, so admission is then by pages alone. The worker's *stream load*
  is the sum of its sessions' costs; the session fits when load + cost <= 1.

Policy: among fitting workers, pick the lowest stream load after admission, then the most free
pages, then the lowest worker id, so the choice is deterministic and testable. Spreading rather
than packing is deliberate: sessions on one GPU share its compute, and interactive latency (a
prompt change must show within `lookahead + 1` blocks) degrades with every extra session on a
worker long before its KV pool is full. A worker that has measured nothing counts as unloaded.

A refusal (`NoCapacityError`) says, worker by worker, why it has no room: its real-time streams
in use with the measured numbers behind them (block latency and budget), and its free pages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from inferix.spec.capacity import Resolution, StreamCapacity
from kvcache_svc.errors import NoCapacityError, NotFoundError

# Slack of the stream-load comparison, so that e.g. six sessions of cost 1/6 fill a worker exactly.
LOAD_EPSILON = 1e-9


@dataclass(frozen=True)
class WorkerLoad:
    """What placement needs to know about one worker."""

    worker_id: str
    model: str
    total_pages: int
    used_pages: int
    reserved_pages: int
    alive: bool
    capacity: tuple[StreamCapacity, ...] = ()  # empty: real-time capacity not measured
    stream_load: float = 0.0  # sum of its sessions' stream costs (1 = full)

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
    resolution: Resolution | None = None  # None: admission by pages only


def measured(capacity: Sequence[StreamCapacity], resolution: Resolution) -> StreamCapacity | None:
    """The entry of `capacity` measured at exactly `resolution`, if any."""
    return next((c for c in capacity if c.resolution == resolution), None)


def reference(capacity: Sequence[StreamCapacity]) -> StreamCapacity | None:
    """The entry an unmeasured resolution is estimated from: the one with the most pixels (ties: the
    widest), or None when nothing is measured."""
    return max(capacity, key=lambda c: (c.resolution.pixels, c.resolution.width), default=None)


def stream_cost(capacity: Sequence[StreamCapacity], resolution: Resolution | None) -> float:
    """The share (0..1) of a worker's real-time capacity that one session at `resolution` takes."""
    if resolution is None or resolution.pixels == 0:
        return 0.0
    exact = measured(capacity, resolution)
    if exact is not None:
        return 1.0 / exact.streams if exact.streams >= 1 else 1.0
    ref = reference(capacity)
    if ref is None:
        return 0.0
    scale = resolution.pixels / ref.resolution.pixels
    return min(1.0, scale / max(ref.streams, 1))


def request_cost(worker: WorkerLoad, request: PlacementRequest) -> float:
    return stream_cost(worker.capacity, request.resolution)


def eligible(worker: WorkerLoad, request: PlacementRequest) -> bool:
    """Available (heartbeating, not draining, not suspect), serving the model, not excluded."""
    return worker.alive and worker.model == request.model and worker.worker_id not in request.exclude


def pages_fit(worker: WorkerLoad, request: PlacementRequest) -> bool:
    return worker.free_pages >= request.pages


def streams_fit(worker: WorkerLoad, request: PlacementRequest) -> bool:
    cost = request_cost(worker, request)
    return cost == 0.0 or worker.stream_load + cost <= 1.0 + LOAD_EPSILON


def fits(worker: WorkerLoad, request: PlacementRequest) -> bool:
    return eligible(worker, request) and pages_fit(worker, request) and streams_fit(worker, request)


def _preference(worker: WorkerLoad, request: PlacementRequest) -> tuple[float, int, str]:
    """Sort key: lowest stream load after admission (rounded, so float noise never decides), then
    the most free pages, then the lowest id."""
    load_after = round(worker.stream_load + request_cost(worker, request), 9)
    return (load_after, -worker.free_pages, worker.worker_id)


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
        message, reason = _no_room(serving, request)
        raise NoCapacityError(message, reason)
    return min(fitting, key=lambda w: _preference(w, request))


def _count(value: float) -> str:
    """A stream count for people: whole numbers as such, others to one decimal."""
    rounded = round(value, 1)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.1f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _measurement(entry: StreamCapacity, in_use: str = "") -> str:
    """E.g. "6 real-time streams at 64x64 (block 180 ms at 6 streams, budget 188 ms)", or with `in_use`
    "5 of 6 real-time streams at 64x64 in use (...)"."""
    at = _plural(max(entry.streams, 1), "stream")
    held = f"{_plural(entry.streams, 'real-time stream')} at {entry.resolution}"
    if entry.streams < 1:
        held = f"not one real-time stream at {entry.resolution}"
    if in_use:
        held = f"{in_use} of {held} in use"
    return f"{held} (block {entry.block_ms:.0f} ms at {at}, budget {entry.budget_ms:.0f} ms)"


def realtime_state(worker: WorkerLoad, request: PlacementRequest) -> str:
    """The worker's real-time capacity as it bears on `request`, with the measured numbers; empty when
    it does not (nothing measured, or the request names no resolution)."""
    cost = request_cost(worker, request)
    if cost == 0.0 or request.resolution is None:
        return ""
    load = worker.stream_load
    exact = measured(worker.capacity, request.resolution)
    if exact is not None and exact.streams >= 1:
        return _measurement(exact, in_use=_count(load * exact.streams))
    if exact is not None:
        return f"{_measurement(exact)}, so a session there takes the whole worker, {load:.0%} of it in use"
    ref = reference(worker.capacity)
    assert ref is not None  # a non-zero cost at an unmeasured resolution comes from a reference
    return (
        f"{load:.0%} of its real-time streams in use, a stream at {request.resolution} (not measured) taking "
        f"an estimated {cost:.0%}, scaled by pixels from {_measurement(ref)}"
    )


def _no_room(serving: list[WorkerLoad], request: PlacementRequest) -> tuple[str, str]:
    """The refusal message, and its reason for the metrics: "realtime" when some available worker had
    the pages but not the real-time streams, "pages" when it was pages alone, "unavailable" when no
    worker was available at all."""

    def state(worker: WorkerLoad) -> str:
        if worker.worker_id in request.exclude:
            return "excluded"
        if not worker.alive:
            return "unavailable"
        pages = f"{worker.free_pages} free of {worker.total_pages} pages"
        realtime = realtime_state(worker, request)
        return f"{realtime}, {pages}" if realtime else pages

    candidates = [w for w in serving if eligible(w, request)]
    if not candidates:
        reason = "unavailable"
    elif any(pages_fit(w, request) and not streams_fit(w, request) for w in candidates):
        reason = "realtime"
    else:
        reason = "pages"
    remedies = []
    if any(not pages_fit(w, request) for w in candidates):
        remedies.append("fewer pages (a smaller window)")
    if any(not streams_fit(w, request) for w in candidates):
        remedies.append("a lower resolution")
    advice = "retry later or add workers"
    if remedies:
        advice = f"retry later, ask for {' or '.join(remedies)}, or add workers"
    at = f" at {request.resolution}" if request.resolution is not None and request.resolution.pixels else ""
    workers = "; ".join(f"{w.worker_id}: {state(w)}" for w in serving)
    return (
        f"no worker has room for session {request.session_id!r} (model {request.model!r}{at}, "
        f"{_plural(request.pages, 'KV page')}): {workers}; {advice}",
        reason,
    )
