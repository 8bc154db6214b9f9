"""Prometheus metrics of kvcache_svc (served on `--metrics-port`).

Gauges are recomputed from the registry on a timer rather than on each RPC: liveness changes
with time alone (a worker that stops reporting dies without any RPC), and with Redis another
replica may have changed the state.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter, Gauge

from inferix.store import StoreError
from kvcache_svc.registry import Registry

log = logging.getLogger("kvcache_svc.metrics")

WORKERS_ALIVE = Gauge(
    "inferix_kvcache_workers_alive",
    "Workers placement may choose: heard from within the heartbeat timeout, not draining, not suspect",
)
WORKERS_REGISTERED = Gauge("inferix_kvcache_workers_registered", "Workers registered, alive or not")
PAGES_TOTAL = Gauge("inferix_kvcache_pages_total", "KV pool pages declared by alive workers")
PAGES_USED = Gauge("inferix_kvcache_pages_used", "KV pool pages in use on alive workers, as last reported")
HOST_PAGES_USED = Gauge(
    "inferix_kvcache_host_pages_used", "KV pages offloaded to host memory on alive workers, as last reported"
)
PAGES_RESERVED = Gauge("inferix_kvcache_pages_reserved", "KV pool pages reserved by admitted sessions on alive workers")
ADMISSIONS = Counter("inferix_kvcache_admissions", "Admit requests by outcome", ["outcome"])
SNAPSHOTS = Counter(
    "inferix_kvcache_snapshots",
    "KV snapshots received, by outcome: stored (the session's latest now), older (a newer one was kept)",
    ["outcome"],
)
BLOCKS_DROPPED = Counter(
    "inferix_kvcache_blocks_dropped",
    "Committed blocks deleted because the session's anchor snapshot covers them (what bounds the store)",
)
REFUSALS = Counter(
    "inferix_kvcache_refusals",
    "Admit requests refused for want of room, by reason: realtime (an available worker had the KV pages but "
    "not the real-time streams), pages (KV pages only), unavailable (no worker available)",
    ["reason"],
)
STREAM_LOAD = Gauge(
    "inferix_kvcache_stream_load",
    "Stream loads of alive workers, summed (1 = one worker's real-time streams all in use)",
)
OFFLOADS = Counter("inferix_kvcache_offloads", "Sessions told to move their KV pages to host memory")
WORKER_FAILURES = Counter("inferix_kvcache_worker_failures", "Workers reported unreachable by the scheduler")
for _outcome in ("accepted", "rejected"):
    ADMISSIONS.labels(outcome=_outcome)  # export both series from the start, at 0
for _reason in ("pages", "realtime", "unavailable"):
    REFUSALS.labels(reason=_reason)


async def refresh(registry: Registry) -> None:
    """Recompute the gauges from the registry once."""
    records = await registry.workers()
    alive = [r for r in records if registry.alive(r)]
    WORKERS_REGISTERED.set(len(records))
    WORKERS_ALIVE.set(len(alive))
    PAGES_TOTAL.set(sum(r.total_pages for r in alive))
    PAGES_USED.set(sum(r.used_pages for r in alive))
    HOST_PAGES_USED.set(sum(r.host_pages_used for r in alive))
    PAGES_RESERVED.set(sum(r.reserved_pages for r in alive))
    STREAM_LOAD.set(sum(r.stream_load for r in alive))


async def refresh_forever(registry: Registry, interval_s: float) -> None:
    """Keep the gauges current until cancelled; a store outage is logged, not fatal."""
    while True:
        try:
            await refresh(registry)
        except StoreError as exc:
            log.warning("cannot refresh metrics: %s", exc)
        await asyncio.sleep(interval_s)
