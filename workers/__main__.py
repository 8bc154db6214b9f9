"""`python -m workers`: the Worker service (loads one model, runs block jobs)."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import uuid
from pathlib import Path

import grpc

from inferix.server import Registration, ServerOptions, add_server_arguments, run_server


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers",
        description="Inferix worker: loads a model once and runs the scheduler's block jobs.",
    )
    add_server_arguments(parser, "worker", 50052)
    env = os.environ.get
    parser.add_argument(
        "--model", type=Path, default=env("INFERIX_MODEL"), help="model folder (default: built-in tiny model)"
    )
    parser.add_argument("--device", default=env("INFERIX_DEVICE", "cpu"))
    parser.add_argument("--dtype", default=env("INFERIX_DTYPE"), help="fp32, bf16, fp16 (default by device)")
    parser.add_argument(
        "--kv-pages",
        type=int,
        default=int(env("INFERIX_KV_PAGES", "256")),
        help="KV pool pages (one latent frame each at the model's native resolution)",
    )
    parser.add_argument(
        "--worker-id", default=env("INFERIX_WORKER_ID", f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    )
    parser.add_argument(
        "--kvcache", default=env("INFERIX_KVCACHE_ADDRESS", "127.0.0.1:50053"), help="kvcache_svc address"
    )
    parser.add_argument(
        "--advertise-address",
        default=env("INFERIX_ADVERTISE_ADDRESS"),
        help="address the scheduler uses to reach this worker (default: HOST:PORT)",
    )
    parser.add_argument("--threads", type=int, default=int(env("INFERIX_THREADS", "0")), help="torch CPU threads")
    parser.add_argument(
        "--profile",
        type=Path,
        default=Path(env("INFERIX_PROFILE_DIR", "")) if env("INFERIX_PROFILE_DIR") else None,
        metavar="DIR",
        help="profile every block and write the report to DIR on shutdown (env INFERIX_PROFILE_DIR)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.kv_pages < 1:
        raise SystemExit(f"--kv-pages must be >= 1, got {args.kv_pages}")
    import torch

    from workers.engine.model_dir import load_model
    from workers.service import WorkerConfig, WorkerService, add_to_server

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    model = load_model(args.model, dtype=dtype, device=args.device)
    config = WorkerConfig(args.worker_id, args.kvcache, args.kv_pages, profile_dir=args.profile)
    options = ServerOptions.from_args(args)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def register(server: grpc.aio.Server) -> Registration:
        # Built inside the event loop: grpc.aio channels belong to the loop that creates them.
        service = WorkerService(model, config)
        registration = add_to_server(server, service)

        async def on_start(port: int) -> None:
            service.start_profiler()
            address = args.advertise_address or f"{options.host}:{port}"
            tasks.append(asyncio.create_task(service.register_and_heartbeat(address, stop)))

        async def drain() -> None:
            stop.set()
            await service.drain()

        return Registration(registration.service_names, drain=drain, on_start=on_start)

    asyncio.run(run_server("worker", options, register, internal_methods=("/inferix.v1.WorkerService/",)))


if __name__ == "__main__":
    main()
