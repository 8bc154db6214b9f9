"""Common bootstrap of the gRPC services: health, reflection, tracing, metrics, shutdown.

Every service (`python -m scheduler`, `python -m workers`, `python -m kvcache_svc`,
`python -m streamer`) is started the same way:

    parser = argparse.ArgumentParser(...); add_server_arguments(parser, "scheduler", 50051)
    options = ServerOptions.from_args(parser.parse_args())
    asyncio.run(run_server("scheduler", options, register))

`register(server)` adds the servicers and returns their full service names plus an optional
async `drain()` called on SIGTERM before the server stops. With `--port 0` the OS picks a free
port; `--port-file` receives `{"grpc": port, "metrics": port}` once the server listens, which is
how tests and `inferix serve` find a child process (and its "pid": the process that serves).
A service started by a local mesh (`inferix serve`, `inferix_cli.mesh.launch`) gets its launcher's pid
in INFERIX_PARENT_PID and drains and stops, as on SIGTERM, once that process is gone: a launcher killed
outright (SIGKILL, a `timeout`) leaves no service behind holding its ports and cores.

A service given `add_tls_arguments` (the scheduler: the mesh's only public port) serves TLS on its
port with `--tls-cert/--tls-key`, re-reading the files when they change (a rotated certificate is
served without a restart), and then also listens in plaintext on `--internal-port` for the mesh's
own callers (the streamer's viewer commands, probes): they stay on the cluster network, as every
other internal call does. The port file then has "internal" too.

Mesh TLS (`--mesh-tls-ca/-cert/-key`, INFERIX_MESH_TLS_*; see inferix/mesh_tls.py): the service's port,
or the scheduler's internal port, requires mutual TLS: a client certificate signed by the mesh CA, on
top of the internal token. Every internal channel made in the process (`channel`) presents the service's
certificate. Probes that cannot present one (Kubernetes' gRPC probes) use `--health-port`: plaintext,
grpc.health.v1 only. The port file then has "health" too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hmac
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from inferix import mesh_tls
from inferix.mesh_channel import RotatingChannel
from inferix.mesh_tls import CertificateFiles, MeshTls, add_mesh_tls_arguments, mesh_tls_from_args
from inferix.telemetry import exporting, server_interceptor, setup_tracing, shutdown_tracing

PARENT_PID_ENV = "INFERIX_PARENT_PID"
PARENT_POLL_S = 1.0  # how often a service started by a local mesh checks that its launcher lives
log = logging.getLogger("inferix.server")

MAX_MESSAGE_BYTES = 64 * 2**20  # a decoded 480x832 RGB frame is 1.2 MB; latents are smaller

Drain = Callable[[], Awaitable[None]]


@dataclass
class Registration:
    service_names: list[str]
    drain: Drain | None = None
    # Called once the server listens, with the port the mesh's services reach it on (e.g. to register with
    # another service): the bound port, or the plaintext internal port when the public one serves TLS.
    on_start: Callable[[int], Awaitable[None]] | None = None
    # Told which signal stops the server (SIGTERM or SIGINT) before `drain` runs.
    stopped_by: Callable[[signal.Signals], None] | None = None


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0
    port_file: Path | None = None
    metrics_port: int | None = None
    grace_s: float = 10.0
    log_level: str = "INFO"
    tls: TlsOptions | None = None
    mesh_tls: MeshTls | None = None
    # The port the mesh's own services use when the service's port is public (the scheduler) and TLS or mesh
    # TLS is on: (host, port; 0 = any free port). Plaintext, or mutual TLS with mesh TLS.
    internal: tuple[str, int] | None = None
    health_port: int | None = None  # plaintext grpc.health.v1 only (0 = any; None = none)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        tls, mesh = TlsOptions.from_args(args), mesh_tls_from_args(args)
        public = hasattr(args, "internal_port")  # a service with a client port: add_tls_arguments
        return cls(
            host=args.host,
            port=args.port,
            port_file=args.port_file,
            metrics_port=args.metrics_port,
            grace_s=args.grace,
            log_level=args.log_level,
            tls=tls,
            mesh_tls=mesh,
            internal=(args.internal_host, args.internal_port) if public and (tls or mesh) else None,
            health_port=args.health_port,
        )


@dataclass(frozen=True)
class TlsOptions:
    """TLS on the public port (the mesh's own services use the internal port meanwhile)."""

    cert: Path
    key: Path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TlsOptions | None:
        """From `add_tls_arguments`' flags; None when TLS is off (or the service has no such flags)."""
        cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise SystemExit("error: --tls-cert and --tls-key go together (a certificate and its private key)")
        return cls(cert, key)


def _env(service: str, name: str, default: str | None) -> str | None:
    return os.environ.get(f"INFERIX_{service.upper()}_{name}", os.environ.get(f"INFERIX_{name}", default))


def add_server_arguments(parser: argparse.ArgumentParser, service: str, default_port: int) -> None:
    """Flags shared by every service; each falls back to INFERIX_<SERVICE>_<NAME> / INFERIX_<NAME>."""
    parser.add_argument("--host", default=_env(service, "HOST", "127.0.0.1"), help="address to bind")
    parser.add_argument(
        "--port", type=int, default=int(_env(service, "PORT", str(default_port)) or 0), help="gRPC port (0 = any)"
    )
    parser.add_argument("--port-file", type=Path, default=None, help="write the bound ports here as JSON")
    metrics = _env(service, "METRICS_PORT", None)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(metrics) if metrics is not None else None,
        help="serve Prometheus metrics on this port (0 = any; default: off)",
    )
    parser.add_argument("--grace", type=float, default=10.0, help="seconds to finish in-flight work on SIGTERM")
    parser.add_argument("--log-level", default=_env(service, "LOG_LEVEL", "INFO"))
    health = _env(service, "HEALTH_PORT", None)
    parser.add_argument(
        "--health-port",
        type=int,
        default=int(health) if health is not None else None,
        help="also serve the gRPC health check alone, in plaintext, on this port: for probes that cannot present "
        "a mesh TLS certificate, such as Kubernetes' gRPC probes (0 = any; default: off)",
    )
    add_mesh_tls_arguments(parser)


def add_tls_arguments(parser: argparse.ArgumentParser, service: str) -> None:
    """TLS on the service's port; each flag falls back to INFERIX_<SERVICE>_<NAME> / INFERIX_<NAME>."""
    group = parser.add_argument_group("TLS (the public port)")
    cert, key = _env(service, "TLS_CERT", None), _env(service, "TLS_KEY", None)
    group.add_argument(
        "--tls-cert",
        type=Path,
        default=Path(cert) if cert else None,
        help="PEM certificate chain: serve TLS on --port (re-read when the file changes; env INFERIX_TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        type=Path,
        default=Path(key) if key else None,
        help="PEM private key of --tls-cert (re-read with it; env INFERIX_TLS_KEY)",
    )
    group.add_argument(
        "--internal-host",
        default=_env(service, "INTERNAL_HOST", "127.0.0.1"),
        help="with TLS or mesh TLS: address of the port for the mesh's own services (default 127.0.0.1)",
    )
    group.add_argument(
        "--internal-port",
        type=int,
        default=int(_env(service, "INTERNAL_PORT", "0") or 0),
        help="with TLS or mesh TLS: port for the mesh's own services (the streamer's viewer commands, health "
        "probes): plaintext, or mutual TLS with mesh TLS (0 = any; default 0)",
    )


INTERNAL_TOKEN_ENV = "INFERIX_INTERNAL_TOKEN"
INTERNAL_TOKEN_HEADER = "x-inferix-internal-token"


def internal_token() -> str | None:
    """The mesh-wide secret of internal calls (scheduler <-> workers <-> kvcache_svc <-> streamer)."""
    return os.environ.get(INTERNAL_TOKEN_ENV) or None


class InternalTokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls to internal services that lack the mesh's token (PERMISSION_DENIED).

    With the token set, a client that can reach kvcache_svc or a worker still cannot read another
    session's latents or drive its blocks. Health checks and reflection stay open for probes.
    """

    def __init__(self, token: str, protected_prefixes: tuple[str, ...]) -> None:
        self._token = token.encode()
        self._protected = protected_prefixes

        async def deny(request: object, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"internal call without a valid {INTERNAL_TOKEN_HEADER}"
            )

        async def deny_stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
            await deny(request, context)
            yield None  # never reached: abort raises; the yield makes this a streaming handler

        # One refusal per call shape: (request streaming, response streaming).
        self._deny = {
            (False, False): grpc.unary_unary_rpc_method_handler(deny),
            (True, False): grpc.stream_unary_rpc_method_handler(deny),
            (False, True): grpc.unary_stream_rpc_method_handler(deny_stream),
            (True, True): grpc.stream_stream_rpc_method_handler(deny_stream),
        }

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if not details.method.startswith(self._protected):
            return await continuation(details)
        sent = next((v for k, v in details.invocation_metadata or () if k == INTERNAL_TOKEN_HEADER), "")
        value = sent.encode() if isinstance(sent, str) else bytes(sent)
        if hmac.compare_digest(value, self._token):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return self._deny[(False, False)]
        return self._deny[(bool(handler.request_streaming), bool(handler.response_streaming))]


def _with_token(details: Any, token: str) -> Any:
    return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), (INTERNAL_TOKEN_HEADER, token)))


class _TokenUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _TokenUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _TokenStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self.token), requests)


class _TokenStreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self.token), requests)


def token_interceptors(token: str) -> list[Any]:
    """Client interceptors adding the internal token: one object per call type, because
    grpc.aio files each interceptor under the first call type it implements only."""
    return [cls(token) for cls in (_TokenUnaryUnary, _TokenUnaryStream, _TokenStreamUnary, _TokenStreamStream)]


def _start_metrics(host: str, port: int) -> int:
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=host)
    return int(server.server_port)


async def run_server(
    service: str,
    options: ServerOptions,
    register: Callable[[grpc.aio.Server], Registration],
    interceptors: list[grpc.aio.ServerInterceptor] | None = None,
    internal_methods: tuple[str, ...] = (),
) -> None:
    """Serve until SIGTERM/SIGINT, then drain and stop gracefully.

    `internal_methods`: method-name prefixes (e.g. "/inferix.v1.WorkerService/") that require the
    mesh's internal token when INFERIX_INTERNAL_TOKEN is set.
    """
    logging.basicConfig(level=options.log_level, format=f"%(asctime)s {service} %(levelname)s %(message)s")
    setup_tracing(f"inferix-{service}")
    mesh_tls.use(options.mesh_tls)  # before `register`: the service's channels present its certificate
    token = internal_token()
    guard = [InternalTokenInterceptor(token, internal_methods)] if token and internal_methods else []
    server = grpc.aio.server(
        interceptors=[*([server_interceptor()] if exporting() else []), *guard, *(interceptors or [])],
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    registration = register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*registration.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    ports = _bind(service, server, options)
    port = ports["grpc"]
    probes = _health_server(health_servicer, options, ports)
    await server.start()
    if probes is not None:
        await probes.start()
    for name in ["", *registration.service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    metrics_port = _start_metrics(options.host, options.metrics_port) if options.metrics_port is not None else None
    if options.port_file is not None:
        tmp = options.port_file.with_suffix(".tmp")
        # pid: the process that serves and drains on SIGTERM (rank 0 when a launcher such as torchrun
        # started this one; the launcher stops the service through it, see inferix_cli/mesh/launch.py).
        tmp.write_text(json.dumps({**ports, "metrics": metrics_port, "pid": os.getpid()}))
        tmp.replace(options.port_file)  # atomic: readers never see a partial file
    kind = "mutual TLS" if options.mesh_tls else "plaintext"
    internal = f", {kind} for the mesh on {options.internal[0]}:{ports['internal']}" if options.internal else ""
    own = " (TLS)" if options.tls else " (mutual TLS)" if options.mesh_tls and not options.internal else ""
    log.info(
        "serving on %s:%d%s%s%s%s",
        options.host,
        port,
        own,
        internal,
        f", health checks in plaintext on :{ports['health']}" if "health" in ports else "",
        f", metrics on :{metrics_port}" if metrics_port else "",
    )
    if registration.on_start is not None:
        await registration.on_start(ports.get("internal", port))
    # What start-up made (a worker's model, the modules, stubs and tables) lives until exit: frozen, it
    # is out of the collector's sight. A full collection walks every object with the GIL held, which a
    # worker's engine thread then waits for; frozen, a later one walks only what came after start-up.
    gc.collect()
    gc.freeze()

    stop = asyncio.Event()
    received: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    parent = _parent_pid()
    watch = asyncio.create_task(_watch_parent(parent, on_signal)) if parent is not None else None
    await stop.wait()
    if watch is not None:
        watch.cancel()
    log.info("shutting down (%s): draining in-flight work (grace %.1fs)", received[0].name, options.grace_s)
    if registration.stopped_by is not None:
        registration.stopped_by(received[0])
    await health_servicer.enter_graceful_shutdown()
    if registration.drain is not None:
        try:
            await asyncio.wait_for(registration.drain(), timeout=options.grace_s)
        except TimeoutError:
            log.warning("drain did not finish within %.1fs", options.grace_s)
    await server.stop(options.grace_s)
    if probes is not None:
        await probes.stop(None)
    shutdown_tracing()
    log.info("stopped")


def _parent_pid() -> int | None:
    """The pid of the local mesh that launched this service (INFERIX_PARENT_PID), if any."""
    value = os.environ.get(PARENT_PID_ENV, "")
    try:
        return int(value) if value else None
    except ValueError:
        log.warning("%s=%r is not a pid: this service does not watch its launcher", PARENT_PID_ENV, value)
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: it exists
        return True
    return True


async def _watch_parent(pid: int, stop: Callable[[signal.Signals], None]) -> None:
    """Stop the service as on SIGTERM (drain first) once the process that launched it is gone."""
    while _alive(pid):
        await asyncio.sleep(PARENT_POLL_S)
    log.warning("the local mesh that launched this service (pid %d) is gone: stopping", pid)
    stop(signal.SIGTERM)


def _bind(service: str, server: grpc.aio.Server, options: ServerOptions) -> dict[str, int]:
    """Add the server's ports: {"grpc": port} (plaintext, TLS, or mutual TLS with mesh TLS and no internal
    port), plus {"internal": port} for the mesh's own services (plaintext, or mutual TLS with mesh TLS)."""
    address = f"{options.host}:{options.port}"
    mesh = options.mesh_tls
    if options.tls is not None:
        ports = {
            "grpc": server.add_secure_port(address, CertificateFiles(options.tls.cert, options.tls.key).credentials())
        }
    elif mesh is not None and options.internal is None:
        ports = {"grpc": server.add_secure_port(address, mesh.server_credentials())}
    else:
        ports = {"grpc": server.add_insecure_port(address)}
    if options.internal is not None:
        internal = "{}:{}".format(*options.internal)
        if mesh is not None:
            ports["internal"] = server.add_secure_port(internal, mesh.server_credentials())
        else:
            ports["internal"] = server.add_insecure_port(internal)
    if 0 in ports.values():
        raise SystemExit(f"{service}: cannot bind {address}" + (" or its internal port" if options.internal else ""))
    return ports


def _health_server(
    servicer: health.aio.HealthServicer, options: ServerOptions, ports: dict[str, int]
) -> grpc.aio.Server | None:
    """The plaintext health-only server of `--health-port` (its port added to `ports`), or None."""
    if options.health_port is None:
        return None
    probes = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, probes)
    ports["health"] = probes.add_insecure_port(f"{options.host}:{options.health_port}")
    if ports["health"] == 0:
        raise SystemExit(f"cannot bind the health port {options.host}:{options.health_port}")
    return probes


def channel(address: str) -> grpc.aio.Channel:
    """An aio channel to another service, with trace propagation when this process exports spans, the
    internal token, large messages allowed, and mutual TLS when this process has mesh TLS
    (inferix.mesh_tls.use)."""
    from inferix.telemetry import client_interceptors

    token = internal_token()
    traced = client_interceptors() if exporting() else []
    interceptors = [*traced, *(token_interceptors(token) if token else [])]
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # gRPC's defaults (1 s, growing 1.6x to 120 s) would leave a call failing for seconds after a
        # restarted service is back; a mesh peer is worth a connection attempt every second.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    mesh = mesh_tls.active()
    if mesh is None:
        return grpc.aio.insecure_channel(address, interceptors=interceptors, options=options)
    # Mutual TLS: the callee's certificate is checked for the host in `address` (a Service DNS name, 127.0.0.1).
    return RotatingChannel(
        mesh, lambda creds: grpc.aio.secure_channel(address, creds, interceptors=interceptors, options=options)
    )
