"""Start the whole mesh on one machine: kvcache_svc, streamer, N workers, scheduler.

Used by `inferix serve` and by the integration tests, so both run exactly the same processes.
Every child binds 127.0.0.1 (ports chosen by the OS unless given) and is stopped by pid.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from inferix.launch import ServiceProcess, start_service
from inferix.server import INTERNAL_TOKEN_ENV

log = logging.getLogger("inferix.serve")


@dataclass
class MeshConfig:
    workdir: Path
    workers: int = 1
    model: Path | None = None
    device: str = "cpu"
    kv_pages: int = 256
    scheduler_port: int = 0
    redis_url: str | None = None
    api_keys_file: Path | None = None
    lookahead: int = 2
    worker_threads: int = 0
    metrics: bool = True
    heartbeat_timeout_s: float = 10.0
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Mesh:
    config: MeshConfig
    kvcache: ServiceProcess
    streamer: ServiceProcess
    workers: list[ServiceProcess]
    scheduler: ServiceProcess

    @property
    def address(self) -> str:
        return self.scheduler.address

    def processes(self) -> list[ServiceProcess]:
        return [self.scheduler, *self.workers, self.streamer, self.kvcache]

    def add_worker(self, name: str | None = None) -> ServiceProcess:
        worker = _start_worker(self.config, name or f"worker{len(self.workers)}", self.kvcache.address)
        self.workers.append(worker)
        return worker

    def stop(self) -> dict[str, int]:
        """SIGTERM every process, scheduler first (it stops sessions at a block boundary)."""
        return {p.name: p.stop() for p in self.processes()}


def _start_worker(config: MeshConfig, name: str, kvcache: str) -> ServiceProcess:
    args = ["--kvcache", kvcache, "--worker-id", name, "--device", config.device, "--kv-pages", str(config.kv_pages)]
    if config.model is not None:
        args += ["--model", str(config.model)]
    if config.worker_threads:
        args += ["--threads", str(config.worker_threads)]
    return start_service(name, "workers", args, config.workdir, env=config.env, timeout=180, metrics=config.metrics)


def start_mesh(config: MeshConfig) -> Mesh:
    """Start every service; internal calls carry a fresh random token (INFERIX_INTERNAL_TOKEN)."""
    config.env.setdefault(INTERNAL_TOKEN_ENV, secrets.token_hex(16))
    started: list[ServiceProcess] = []
    try:
        redis = ["--redis-url", config.redis_url] if config.redis_url else []
        kvcache = start_service("kvcache", "kvcache_svc", redis, config.workdir, env=config.env, metrics=config.metrics)
        started.append(kvcache)
        streamer = start_service(
            "streamer",
            "streamer",
            ["--data-dir", str(config.workdir / "recordings")],
            config.workdir,
            env=config.env,
            metrics=config.metrics,
        )
        started.append(streamer)
        workers = []
        for i in range(config.workers):
            workers.append(_start_worker(config, f"worker{i}", kvcache.address))
            started.append(workers[-1])
        scheduler_args = [
            "--kvcache",
            kvcache.address,
            "--streamer",
            streamer.address,
            "--lookahead",
            str(config.lookahead),
            *redis,
        ]
        if config.api_keys_file is not None:
            scheduler_args += ["--api-keys-file", str(config.api_keys_file)]
        scheduler = start_service(
            "scheduler",
            "scheduler",
            scheduler_args,
            config.workdir,
            env=config.env,
            metrics=config.metrics,
            port=config.scheduler_port,
        )
        return Mesh(config, kvcache, streamer, workers, scheduler)
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
