"""`inferix cluster status`: the mesh's workers as kvcache_svc sees them, for an operator.

It asks kvcache_svc (`ListWorkers`, an internal call: the mesh token, and a mesh certificate under
mesh TLS) rather than the Kubernetes API, so it shows the same under `inferix serve` and in a
cluster, and what `kubectl` cannot: each worker's sessions, KV pages, real-time capacity and load,
its recent real-time factor, and whether it is draining.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import grpc

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc
from inferix.errors import UserError
from inferix.mesh_tls import add_mesh_tls_arguments, mesh_tls_from_args, use
from inferix.server import INTERNAL_TOKEN_ENV, channel

EXAMPLE = (
    "example: INFERIX_INTERNAL_TOKEN=<the mesh token> inferix cluster status --kvcache 127.0.0.1:50053.  "
    "In Kubernetes: kubectl -n inferix port-forward svc/inferix-kvcache 50053, with the token from the "
    "mesh Secret (key internal-token)."
)


@dataclass(frozen=True)
class WorkerRow:
    """One worker, as printed (and as `--json` writes it)."""

    worker: str
    state: str  # serving | draining | suspect | silent
    model: str
    model_settings: str  # its model folder's model.yaml as JSON ("": the preset as shipped)
    device: str
    sessions: int
    streams: str  # real-time streams per resolution measured
    load: float  # share of the real-time capacity in use
    realtime_factor: float
    kv_used: int
    kv_reserved: int
    kv_total: int
    kv_offloaded: int
    seen_s_ago: float

    @classmethod
    def of(cls, info: kvcache_pb2.WorkerInfo, now: float) -> WorkerRow:
        return cls(
            worker=info.worker_id,
            state=_state(info),
            model=info.model,
            model_settings=info.model_settings,
            device=info.device or "?",
            sessions=info.kv.sessions,
            streams=", ".join(f"{c.streams} at {c.resolution.width}x{c.resolution.height}" for c in info.capacity)
            or "not measured",
            load=info.stream_load,
            realtime_factor=info.realtime_factor,
            kv_used=info.kv.used_pages,
            kv_reserved=info.reserved_pages,
            kv_total=info.kv.total_pages,
            kv_offloaded=info.kv.host_pages_used,
            seen_s_ago=max(0.0, now - info.last_seen_unix),
        )


def _state(info: kvcache_pb2.WorkerInfo) -> str:
    if info.departed:
        return "draining"  # deregistered: leaving; its sessions move elsewhere
    if info.suspect:
        return "suspect"  # the scheduler could not reach it since its last heartbeat
    return "serving" if info.alive else "silent"  # silent: no heartbeat within the timeout


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="the mesh's workers: state, sessions, KV pages, real-time capacity and factor",
        description="Operator views of a running mesh (inferix serve or the Helm chart), from its own services.",
    )
    commands = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    status = commands.add_parser(
        "status",
        help="one line per worker, from kvcache_svc",
        description=(
            "Lists every worker kvcache_svc knows: state (serving, draining after SIGTERM, suspect: unreachable "
            "since its last heartbeat, silent: no heartbeat within the timeout), model (with '(model.yaml)' where "
            "its model folder changes the shipped preset; --json gives the settings), device, sessions, "
            "real-time streams it holds and the share in use, its real-time factor over its recent blocks "
            "(video seconds per second of block time; below 1 its viewers stall), and KV pages used / reserved / "
            "total (offloaded to host memory). Needs the mesh token in INFERIX_INTERNAL_TOKEN (what the services "
            "share; set it before `inferix serve` to use this command there) and, under mesh TLS, a mesh certificate."
        ),
        epilog=EXAMPLE,
    )
    status.add_argument(
        "--kvcache",
        default=os.environ.get("INFERIX_KVCACHE_ADDRESS", "127.0.0.1:50053"),
        help="kvcache_svc address (env INFERIX_KVCACHE_ADDRESS; default %(default)s)",
    )
    status.add_argument("--json", action="store_true", help="one JSON object per worker, one per line")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for kvcache_svc")
    add_mesh_tls_arguments(status)
    status.set_defaults(func=run_status)


def run_status(args: argparse.Namespace) -> int:
    use(mesh_tls_from_args(args))
    rows = asyncio.run(_list_workers(args.kvcache, args.timeout))
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return 0
    print(render(rows))
    return 0


async def _list_workers(address: str, timeout: float) -> list[WorkerRow]:
    async with channel(address) as chan:
        try:
            reply = await kvcache_pb2_grpc.KVCacheServiceStub(chan).ListWorkers(
                kvcache_pb2.ListWorkersRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise UserError(_explain(address, exc)) from None
    now = time.time()
    return [WorkerRow.of(info, now) for info in sorted(reply.workers, key=lambda w: w.worker_id)]


def _explain(address: str, exc: grpc.aio.AioRpcError) -> str:
    code = exc.code()
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return (
            f"kvcache_svc at {address} refused the call: set {INTERNAL_TOKEN_ENV} to the mesh's internal token "
            "(Kubernetes: the mesh Secret's internal-token)"
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return (
            f"no kvcache_svc answers at {address} ({code.name}: {exc.details()}); check --kvcache (Kubernetes: "
            "kubectl port-forward svc/<release>-kvcache 50053), and under mesh TLS the --mesh-tls-* files"
        )
    return f"kvcache_svc at {address}: {code.name}: {exc.details()}"


COLUMNS = ("WORKER", "STATE", "MODEL", "DEVICE", "SESSIONS", "STREAMS", "LOAD", "RT FACTOR", "KV PAGES", "SEEN")


def render(rows: list[WorkerRow]) -> str:
    """A plain-text table, then a summary line."""
    if not rows:
        return "no workers registered with kvcache_svc"
    cells = [
        (
            r.worker,
            r.state,
            r.model + (" (model.yaml)" if r.model_settings else ""),
            r.device,
            str(r.sessions),
            r.streams,
            f"{r.load:.0%}",
            f"{r.realtime_factor:.2f}x" if r.realtime_factor else "-",
            f"{r.kv_used}/{r.kv_reserved}/{r.kv_total}" + (f" (+{r.kv_offloaded} host)" if r.kv_offloaded else ""),
            f"{r.seen_s_ago:.1f}s ago",
        )
        for r in rows
    ]
    widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(COLUMNS)]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
             for line in [COLUMNS, *cells]]  # fmt: skip
    serving = [r for r in rows if r.state == "serving"]
    slow = [r.worker for r in serving if 0 < r.realtime_factor < 1]
    lines.append(
        f"{len(serving)}/{len(rows)} serving, {sum(r.sessions for r in rows)} session(s); KV pages used/reserved/total"
        + (f"; below real time: {', '.join(slow)}" if slow else "")
    )
    return "\n".join(lines)
