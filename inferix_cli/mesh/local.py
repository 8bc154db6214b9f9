"""Start the whole mesh on one machine: kvcache_svc, streamer, N workers, scheduler (+ nginx RTMP).

A worker may be a sequence-parallel pod (`ranks_per_worker` > 1): torchrun with one rank per
process, `--device cuda` giving rank r the GPU r.

Used by `inferix serve` and by the integration tests, so both run exactly the same processes.
Every child binds 127.0.0.1 (ports chosen by the OS unless given) and is stopped by pid.

`Mesh.relaunch` starts a child again where the others expect it: kvcache_svc, the streamer and the
scheduler on their gRPC ports (and the streamer's HTTP port), nginx on its RTMP port, a worker under
its worker id (it registers its new address with kvcache_svc); metrics ports stay too, and logs are
appended to. Nothing here restarts on its own: `inferix serve` opts in with inferix_cli/mesh/supervisor.py.

TLS (`tls_cert`, `tls_key`): the scheduler serves its client port with TLS (and may bind `scheduler_host`,
e.g. a LAN address); the mesh's own services keep reaching it in plaintext on its internal port, on
127.0.0.1 (see inferix/server.py). Once it listens, the mesh checks that the TLS port serves the given
certificate and that the scheduler answers its health check.
The streamer serves the viewer page, WHEP and the page API over HTTPS with the same pair (viewer links
are https://); its gRPC port stays plaintext, for the mesh only.

Mesh TLS (`mesh_tls`, one `MeshTls` per service role, see inferix_cli/mesh/pki.py): every internal port
(kvcache_svc, the streamer's gRPC, the workers, the scheduler's internal port) requires mutual TLS; each
child gets its role's certificate in INFERIX_MESH_TLS_*, and a plaintext health-only port that the
mesh's own checks use. The internal token is still sent and checked.

Live outputs: the streamer serves the viewer page (WebRTC) on its HTTP port, and the scheduler and
streamer share a fresh viewer secret (INFERIX_VIEWER_SECRET) to sign and check viewer tokens. When
nginx with the RTMP module is installed, a local RTMP server is started too (config generated in
the workdir, free port), so `spec.outputs.rtmp` sessions are playable in OBS, VLC or ffplay.
"""

from __future__ import annotations

import logging
import secrets
import signal
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc
from inferix.health import check
from inferix.mesh_tls import MeshTls
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix.viewer_token import SECRET_ENV
from inferix_cli.mesh.launch import ServiceProcess, ServiceStartError, StartingService, launch_service
from inferix_cli.mesh.rtmp_relay import NginxRtmp, nginx_rtmp_missing, start_nginx_rtmp

log = logging.getLogger("inferix.serve")
# Who holds a mesh TLS certificate: the four services, and `inferix serve` itself (its own checks).
MESH_ROLES = ("kvcache", "streamer", "worker", "scheduler", "serve")
WORKER_REGISTRATION_TIMEOUT_S = 180.0  # a worker loads its model, then probes its capacity, then registers
COMPILE_WARM_UP_S = 900.0  # more for a worker started with --compile (inductor on a CPU: minutes)


@dataclass
class MeshConfig:
    workdir: Path
    workers: int = 1
    # Ranks of each worker (a sequence-parallel pod under torchrun; rank 0 serves, see workers/pod.py).
    ranks_per_worker: int = 1
    model: Path | None = None
    device: str = "cpu"
    kv_pages: int = 256
    scheduler_port: int = 0
    redis_url: str | None = None
    api_keys_file: Path | None = None
    lookahead: int = 2
    worker_threads: int = 0
    # Workers measure their real-time capacity with up to this many probe sessions at startup (0: none).
    capacity_probe: int = 8
    # Workers claim this many real-time streams instead of the measured number (0: measured).
    realtime_streams: int = 0
    # Workers compile their DiT step (torch.compile) and warm it up before they listen.
    compile: bool = False
    # Workers replay their DiT step from CUDA graphs captured before they listen.
    cuda_graphs: bool = False
    # Workers quantize their DiT (`--quant`; None: the model folder's choice).
    quant: str | None = None
    # What every worker decodes with (`--decoder`, "vae" / "taehv:PATH"; None: the model folder's choice).
    decoder: str | None = None
    # Workers store their KV pages in 8 bits ("fp8", "int8") or the model's dtype ("auto").
    kv_dtype: str = "auto"
    # Workers ship a KV snapshot of each session every this many blocks (`--snapshot-every`; None:
    # the workers' default, auto; 0: none).
    snapshot_every: int | None = None
    metrics: bool = True
    heartbeat_timeout_s: float = 10.0
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = 0  # the streamer's viewer page / WHEP port (0 = any free port)
    # RTMP server: "auto" = start local nginx-rtmp when installed, "off", or an RTMP application URL to push to.
    rtmp: str = "auto"
    # The scheduler's client port: the address it binds, and TLS with this certificate chain and key (PEM).
    scheduler_host: str = "127.0.0.1"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Mutual TLS between the services: the certificate of each role in MESH_ROLES ({}: off).
    mesh_tls: dict[str, MeshTls] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


@dataclass
class Mesh:
    config: MeshConfig
    kvcache: ServiceProcess
    streamer: ServiceProcess
    workers: list[ServiceProcess]
    scheduler: ServiceProcess
    rtmp_server: NginxRtmp | None = None  # the local nginx we started, if any
    rtmp_url: str = ""  # where sessions are pushed and played ("" = no RTMP)
    rtmp_note: str = ""  # why there is no RTMP, for `inferix serve` to say
    viewer_url: str = ""  # the streamer's HTTP server (viewer pages at <viewer_url>/watch/<session>)

    @property
    def address(self) -> str:
        """The scheduler's address for clients (`grpcs://host:port` with TLS)."""
        address = f"{_reachable(self.scheduler.host)}:{self.scheduler.port}"
        return f"grpcs://{address}" if self.config.tls else address

    @property
    def internal_address(self) -> str:
        """Where the mesh's own services reach the scheduler (its internal port with TLS or mesh TLS)."""
        internal = self.scheduler.ports.get("internal")
        return f"127.0.0.1:{internal}" if internal else self.scheduler.address

    @property
    def health_address(self) -> str:
        """Where the scheduler answers health checks without a certificate (its health port with mesh TLS)."""
        health = self.scheduler.ports.get("health")
        return f"127.0.0.1:{health}" if health else self.internal_address

    def processes(self) -> list[ServiceProcess]:
        """The gRPC services."""
        return [self.scheduler, *self.workers, self.streamer, self.kvcache]

    def children(self) -> list[ServiceProcess]:
        """Every child process in stop order: the services, and nginx after the streamer (its pushes end cleanly)."""
        rtmp = [self.rtmp_server.process] if self.rtmp_server is not None else []
        return [self.scheduler, *self.workers, self.streamer, *rtmp, self.kvcache]

    def add_worker(self, name: str | None = None) -> ServiceProcess:
        worker = _launch_worker(self.config, name or f"worker{len(self.workers)}", self.kvcache.address).wait()
        self.workers.append(worker)
        return worker

    def relaunch(self, child: ServiceProcess) -> StartingService | ServiceProcess:
        """Start `child` (one of `children()`, exited) again, with the same ports and worker id; its log is
        appended to. Returns the process to wait for (nginx, quick to start, is returned started).

        Raises RtmpServerError when nginx does not start again.
        """
        child.kill()  # reap it, and kill what a launcher left behind (a pod restarts as a whole)
        config = self.config
        metrics = child.metrics_port or 0
        if self.rtmp_server is not None and child is self.rtmp_server.process:
            self.rtmp_server.restart()
            return self.rtmp_server.process
        if child is self.kvcache:
            return _launch_kvcache(config, child.port, metrics, append_log=True)
        if child is self.streamer:
            http = child.ports.get("http")
            return _launch_streamer(config, self.rtmp_url, child.port, http, metrics, append_log=True)
        if child is self.scheduler:
            addresses = (self.kvcache.address, self.streamer.address, self.viewer_url, self.rtmp_url)
            return _launch_scheduler(config, *addresses, child.port, metrics, append_log=True)
        if any(child is worker for worker in self.workers):
            return _launch_worker(config, child.name, self.kvcache.address, metrics_port=metrics, append_log=True)
        raise ValueError(f"{child.name} is not a child of this mesh")

    def replace(self, child: ServiceProcess) -> None:
        """Put a relaunched `child` in the place of the process of the same name."""
        if self.rtmp_server is not None and child.name == self.rtmp_server.process.name:
            self.rtmp_server.process = child
        elif child.name == self.kvcache.name:
            self.kvcache = child
        elif child.name == self.streamer.name:
            self.streamer = child
        elif child.name == self.scheduler.name:
            self.scheduler = child
        else:
            index = next((i for i, w in enumerate(self.workers) if w.name == child.name), None)
            if index is None:
                raise ValueError(f"{child.name} is not a child of this mesh")
            self.workers[index] = child

    def stop(self) -> dict[str, int]:
        """Stop every process, scheduler first (it stops sessions at a block boundary, and with a store
        leaves them to resume), each with its `stop_signal`."""
        return {p.name: p.stop(sig=self.stop_signal(p)) for p in self.children()}

    def stop_signal(self, child: ServiceProcess) -> signal.Signals:
        """SIGTERM, but SIGINT for a worker when the whole mesh stops: no scheduler is left to move its
        sessions, so it must not wait for that as a SIGTERM'd worker does."""
        return signal.SIGINT if child in self.workers else signal.SIGTERM


def _launch_worker(
    config: MeshConfig, name: str, kvcache: str, metrics_port: int = 0, append_log: bool = False
) -> StartingService:
    args = ["--kvcache", kvcache, "--worker-id", name, "--device", config.device, "--kv-pages", str(config.kv_pages)]
    if config.model is not None:
        args += ["--model", str(config.model)]
    if config.worker_threads:
        args += ["--threads", str(config.worker_threads)]
    args += ["--capacity-probe", str(config.capacity_probe), "--realtime-streams", str(config.realtime_streams)]
    if config.compile:
        args.append("--compile")
    if config.cuda_graphs:
        args.append("--cuda-graphs")
    if config.quant is not None:
        args += ["--quant", config.quant]
    if config.decoder is not None:
        args += ["--decoder", config.decoder]
    if config.kv_dtype != "auto":
        args += ["--kv-dtype", config.kv_dtype]
    if config.snapshot_every is not None:
        args += ["--snapshot-every", str(config.snapshot_every)]
    module = "workers"
    if config.ranks_per_worker > 1:
        # A pod: torchrun starts the ranks, rank 0 writes the port file and is stopped first
        # (inferix_cli/mesh/launch.py).
        ranks = str(config.ranks_per_worker)
        args = ["--standalone", "--nnodes", "1", "--nproc-per-node", ranks, "--max-restarts", "0", "-m", module, *args]
        module = "torch.distributed.run"
    # A worker listens once its model is loaded: longer than the control plane's start-up.
    timeout = 180 + (COMPILE_WARM_UP_S if config.compile else 0)
    return _launch(config, name, module, args, 0, metrics_port, append_log, timeout=timeout, role="worker")


def _launch(
    config: MeshConfig,
    name: str,
    module: str,
    args: list[str],
    port: int,
    metrics_port: int,
    append_log: bool,
    timeout: float = 60.0,
    host: str = "127.0.0.1",
    role: str = "",
) -> StartingService:
    """One of the mesh's services on `host:port` (0 = any port), with the mesh's environment and metrics (and
    with mesh TLS: `role`'s certificate, and a plaintext health-only port for the mesh's checks)."""
    env = config.env
    mesh = config.mesh_tls.get(role or name)
    if mesh is not None:
        env = {**env, **mesh.environ()}
        args = [*args, "--health-port", "0"]
    return launch_service(
        name,
        module,
        args,
        config.workdir,
        env=env,
        timeout=timeout,
        metrics=config.metrics,
        port=port,
        metrics_port=metrics_port,
        append_log=append_log,
        host=host,
    )


def _redis_args(config: MeshConfig) -> list[str]:
    return ["--redis-url", config.redis_url] if config.redis_url else []


def _launch_kvcache(
    config: MeshConfig, port: int = 0, metrics_port: int = 0, append_log: bool = False
) -> StartingService:
    return _launch(config, "kvcache", "kvcache_svc", _redis_args(config), port, metrics_port, append_log)


def _launch_streamer(
    config: MeshConfig,
    rtmp_url: str,
    port: int = 0,
    http_port: int | None = None,
    metrics_port: int = 0,
    append_log: bool = False,
) -> StartingService:
    http = config.http_port if http_port is None else http_port
    args = ["--data-dir", str(config.workdir / "recordings"), "--http-port", str(http)]
    args += ["--encoder", "auto"]  # NVENC where an NVIDIA GPU has it, libx264 elsewhere
    if rtmp_url:
        args += ["--rtmp-url", rtmp_url]
    if config.tls_cert is not None and config.tls_key is not None:
        # The viewer page is as public as the scheduler's port: HTTPS with the same pair (gRPC stays internal).
        args += ["--tls-cert", str(config.tls_cert), "--tls-key", str(config.tls_key)]
    return _launch(config, "streamer", "streamer", args, port, metrics_port, append_log)


def _launch_scheduler(
    config: MeshConfig,
    kvcache: str,
    streamer: str,
    viewer_url: str,
    rtmp_url: str,
    port: int,
    metrics_port: int = 0,
    append_log: bool = False,
) -> StartingService:
    args = ["--kvcache", kvcache, "--streamer", streamer, "--lookahead", str(config.lookahead)]
    args += ["--viewer-page-url", viewer_url, *_redis_args(config)]
    if rtmp_url:
        args += ["--rtmp-play-url", rtmp_url]
    if config.api_keys_file is not None:
        args += ["--api-keys-file", str(config.api_keys_file)]
    if config.tls_cert is not None and config.tls_key is not None:
        args += ["--tls-cert", str(config.tls_cert), "--tls-key", str(config.tls_key), "--internal-host", "127.0.0.1"]
    return _launch(config, "scheduler", "scheduler", args, port, metrics_port, append_log, host=config.scheduler_host)


def _check_scheduler(config: MeshConfig, scheduler: ServiceProcess, health_address: str) -> None:
    """The scheduler answers its health check (on its internal port with TLS, its health port with mesh TLS)
    and, with TLS, its client port completes a handshake with the configured certificate."""
    serving, status = check(health_address, "inferix.v1.SchedulerService", timeout=10)
    if not serving:
        raise ServiceStartError(f"scheduler is not serving ({status}); its log: {scheduler.log_path}")
    if config.tls_cert is None:
        return
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # which CA signed it is the clients' business; the file is what counts
    try:
        with (
            socket.create_connection((_reachable(scheduler.host), scheduler.port), timeout=10) as raw,
            context.wrap_socket(raw) as tls,
        ):
            served = tls.getpeercert(binary_form=True)
    except OSError as exc:
        raise ServiceStartError(f"scheduler: no TLS handshake on {scheduler.address}: {exc}") from exc
    if served != _first_certificate(config.tls_cert):
        raise ServiceStartError(f"scheduler on {scheduler.address} does not serve the certificate {config.tls_cert}")


def _reachable(host: str) -> str:
    """An address on this machine to reach a server bound to `host` (a wildcard: the loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _first_certificate(path: Path) -> bytes:
    """The DER of the first certificate in a PEM file (the server's own, before its chain)."""
    text = path.read_text()
    start = text.index(ssl.PEM_HEADER)
    end = text.index(ssl.PEM_FOOTER, start) + len(ssl.PEM_FOOTER)
    return ssl.PEM_cert_to_DER_cert(text[start:end])


def _rtmp(config: MeshConfig) -> tuple[NginxRtmp | None, str, str]:
    """(server we started, RTMP application URL, note when there is none) for `config.rtmp`."""
    if config.rtmp == "off":
        return None, "", "RTMP off (--rtmp off)"
    if config.rtmp != "auto":
        return None, config.rtmp, ""
    missing = nginx_rtmp_missing()
    if missing is not None:
        return None, "", f"RTMP off: {missing}"
    server = start_nginx_rtmp(config.workdir)
    return server, server.url, ""


def _wait_registered(config: MeshConfig, kvcache: ServiceProcess, workers: list[ServiceProcess]) -> None:
    """Wait until every worker is registered and alive in kvcache_svc: a worker measures its real-time
    capacity before it registers (a second or two), and the mesh is ready when sessions can be placed."""
    expected = {f"worker{i}" for i in range(len(workers))}
    token = ((INTERNAL_TOKEN_HEADER, config.env[INTERNAL_TOKEN_ENV]),)
    limit = WORKER_REGISTRATION_TIMEOUT_S + (COMPILE_WARM_UP_S if config.compile else 0)
    deadline = time.monotonic() + limit
    mesh = config.mesh_tls.get("serve")
    opened = (
        grpc.secure_channel(kvcache.address, mesh.channel_credentials())
        if mesh is not None
        else grpc.insecure_channel(kvcache.address)
    )
    with opened as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        while True:
            reply = stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=10, metadata=token)
            alive = {w.worker_id for w in reply.workers if w.alive}
            if expected <= alive:
                return
            for worker in workers:
                if worker.process.poll() is not None:
                    tail = worker.log_path.read_text(errors="replace")[-3000:]
                    raise ServiceStartError(f"{worker.name} exited with code {worker.process.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(expected - alive))
                raise ServiceStartError(
                    f"{missing} did not register with kvcache_svc within {limit:.0f} s "
                    f"(see the logs in {config.workdir})"
                )
            time.sleep(0.1)


def start_mesh(config: MeshConfig) -> Mesh:
    """Start every service; internal calls carry a fresh random token (INFERIX_INTERNAL_TOKEN) and viewer
    tokens are signed with a fresh secret (INFERIX_VIEWER_SECRET).

    Services that need nothing of each other start side by side (kvcache_svc with the streamer, the
    workers with each other): each spends its first seconds importing and loading, so a mesh is up in
    the time of its slowest chain, kvcache_svc -> workers -> scheduler, not of all its processes.
    The scheduler still starts after the workers listen, so that a scheduler resuming stored sessions
    finds the workers' model settings."""
    if config.ranks_per_worker < 1:
        raise ValueError(f"ranks_per_worker must be >= 1, got {config.ranks_per_worker}")
    config.env.setdefault(INTERNAL_TOKEN_ENV, secrets.token_hex(16))
    config.env.setdefault(SECRET_ENV, secrets.token_urlsafe(32))
    started: list[ServiceProcess] = []
    starting: list[StartingService] = []

    def ready(service: StartingService) -> ServiceProcess:
        running = service.wait()
        starting.remove(service)
        started.append(running)
        return running

    try:
        rtmp_server, rtmp_url, rtmp_note = _rtmp(config)
        if rtmp_server is not None:
            started.append(rtmp_server.process)
        kvcache_start, streamer_start = _launch_kvcache(config), _launch_streamer(config, rtmp_url)
        starting += [kvcache_start, streamer_start]
        kvcache = ready(kvcache_start)
        worker_starts = [_launch_worker(config, f"worker{i}", kvcache.address) for i in range(config.workers)]
        starting += worker_starts
        streamer = ready(streamer_start)
        scheme = "https" if config.tls else "http"
        viewer_url = f"{scheme}://{streamer.host}:{streamer.ports['http']}"
        workers = [ready(worker) for worker in worker_starts]
        addresses = (kvcache.address, streamer.address, viewer_url, rtmp_url)
        scheduler_start = _launch_scheduler(config, *addresses, config.scheduler_port)
        starting.append(scheduler_start)
        scheduler = ready(scheduler_start)
        mesh = Mesh(config, kvcache, streamer, workers, scheduler, rtmp_server, rtmp_url, rtmp_note, viewer_url)
        _check_scheduler(config, scheduler, mesh.health_address)
        _wait_registered(config, kvcache, workers)
        return mesh
    except BaseException:
        for service in starting:
            service.kill()
        for process in reversed(started):
            process.stop()
        raise
