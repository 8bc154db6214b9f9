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

A service given `add_tls_arguments` (the scheduler: the mesh's only public port) serves TLS on its
port with `--tls-cert/--tls-key`, re-reading the files when they change (a rotated certificate is
served without a restart), and then also listens in plaintext on `--internal-port` for the mesh's
own callers (the streamer's viewer commands, probes): they stay on the cluster network, as every
other internal call does. The port file then has "internal" too.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from inferix.telemetry import server_interceptor, setup_tracing, shutdown_tracing

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


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0
    port_file: Path | None = None
    metrics_port: int | None = None
    grace_s: float = 10.0
    log_level: str = "INFO"
    tls: TlsOptions | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        return cls(
            host=args.host,
            port=args.port,
            port_file=args.port_file,
            metrics_port=args.metrics_port,
            grace_s=args.grace,
            log_level=args.log_level,
            tls=TlsOptions.from_args(args),
        )


@dataclass(frozen=True)
class TlsOptions:
    """TLS on the public port, and the plaintext port the mesh's own services use meanwhile."""

    cert: Path
    key: Path
    internal_host: str = "127.0.0.1"
    internal_port: int = 0  # 0 = any free port

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TlsOptions | None:
        """From `add_tls_arguments`' flags; None when TLS is off (or the service has no such flags)."""
        cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise SystemExit("error: --tls-cert and --tls-key go together (a certificate and its private key)")
        return cls(cert, key, args.internal_host, args.internal_port)


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
        help="with TLS: address of the plaintext port for the mesh's own services (default 127.0.0.1)",
    )
    group.add_argument(
        "--internal-port",
        type=int,
        default=int(_env(service, "INTERNAL_PORT", "0") or 0),
        help="with TLS: plaintext port for the mesh's own services: the streamer's viewer commands, "
        "health probes (0 = any; default 0)",
    )


class CertificateFiles:
    """A certificate and key on disk, served by gRPC and read again whenever either file changes.

    `grpc.dynamic_ssl_server_credentials` asks `fetch` before each new handshake: it compares the files'
    (inode, size, mtime), which also catches a Kubernetes Secret update (a symlink swapped to a new
    file). A pair that does not load (half-written, key not matching) is not taken: the server keeps the
    previous one, logs a warning, and tries again once the files change again.
    """

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self._stamp: tuple[tuple[int, int, int], ...] | None = None
        self._refused: tuple[tuple[int, int, int], ...] | None = None

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        stats = (os.stat(self.cert), os.stat(self.key))  # follows symlinks: the files as served
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        """The pair, checked to load as a server certificate (ssl.SSLError, OSError otherwise)."""
        stamp = self._stat()
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert, self.key)
        config = grpc.ssl_server_certificate_configuration([(self.key.read_bytes(), self.cert.read_bytes())])
        self._stamp = stamp
        return config

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new pair when the files changed, None to keep serving the current one."""
        try:
            stamp = self._stat()
            if stamp in (self._stamp, self._refused):
                return None
            self._refused = stamp  # warned once per bad pair, not at every handshake
            config = self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "TLS certificate %s / key %s not reloaded (keeping the current one): %s", self.cert, self.key, exc
            )
            return None
        log.info("TLS certificate reloaded from %s", self.cert)
        return config

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that follow the files; SystemExit when they do not load now."""
        try:
            initial = self._load()
        except (OSError, ssl.SSLError) as exc:
            raise SystemExit(f"error: TLS certificate {self.cert} / key {self.key}: {exc}") from None
        return grpc.dynamic_ssl_server_credentials(initial, self.fetch)


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
    token = internal_token()
    guard = [InternalTokenInterceptor(token, internal_methods)] if token and internal_methods else []
    server = grpc.aio.server(
        interceptors=[server_interceptor(), *guard, *(interceptors or [])],
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
    await server.start()
    for name in ["", *registration.service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    metrics_port = _start_metrics(options.host, options.metrics_port) if options.metrics_port is not None else None
    if options.port_file is not None:
        tmp = options.port_file.with_suffix(".tmp")
        # pid: the process that serves and drains on SIGTERM (rank 0 when a launcher such as torchrun
        # started this one; the launcher stops the service through it, see inferix/mesh/launch.py).
        tmp.write_text(json.dumps({**ports, "metrics": metrics_port, "pid": os.getpid()}))
        tmp.replace(options.port_file)  # atomic: readers never see a partial file
    internal = f", plaintext for the mesh on {options.tls.internal_host}:{ports['internal']}" if options.tls else ""
    log.info(
        "serving on %s:%d%s%s%s",
        options.host,
        port,
        " (TLS)" if options.tls else "",
        internal,
        f", metrics on :{metrics_port}" if metrics_port else "",
    )
    if registration.on_start is not None:
        await registration.on_start(ports.get("internal", port))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight work (grace %.1fs)", options.grace_s)
    await health_servicer.enter_graceful_shutdown()
    if registration.drain is not None:
        try:
            await asyncio.wait_for(registration.drain(), timeout=options.grace_s)
        except TimeoutError:
            log.warning("drain did not finish within %.1fs", options.grace_s)
    await server.stop(options.grace_s)
    shutdown_tracing()
    log.info("stopped")


def _bind(service: str, server: grpc.aio.Server, options: ServerOptions) -> dict[str, int]:
    """Add the server's ports: {"grpc": port} in plaintext, or TLS plus {"internal": plaintext port}."""
    address = f"{options.host}:{options.port}"
    if options.tls is None:
        ports = {"grpc": server.add_insecure_port(address)}
    else:
        tls = options.tls
        ports = {
            "grpc": server.add_secure_port(address, CertificateFiles(tls.cert, tls.key).credentials()),
            "internal": server.add_insecure_port(f"{tls.internal_host}:{tls.internal_port}"),
        }
    if 0 in ports.values():
        raise SystemExit(f"{service}: cannot bind {address}" + (" or its internal port" if options.tls else ""))
    return ports


def channel(address: str) -> grpc.aio.Channel:
    """An aio channel to another service, with trace propagation and large messages allowed."""
    from inferix.telemetry import client_interceptors

    token = internal_token()
    extra = token_interceptors(token) if token else []
    return grpc.aio.insecure_channel(
        address,
        interceptors=[*client_interceptors(), *extra],
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
