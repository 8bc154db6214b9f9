"""`python -m workers`: the Worker service (loads one model, runs block jobs).

Under torchrun (WORLD_SIZE > 1) the worker is a sequence-parallel pod, one rank per device: rank 0
serves gRPC and drives the others (see `workers/pod.py`).
"""

from __future__ import annotations

import os

from inferix.openmp import openmp_wait

# Before torch loads its OpenMP runtime: a worker shares its cores with its own event loop and gRPC
# threads (and, under `inferix serve`, with the other services), so its OpenMP threads spin only
# briefly before they sleep (inferix/openmp.py).
os.environ.update(openmp_wait(os.environ))

import argparse
import asyncio
import logging
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from engine.batching import CPU_MAX_TOKENS, CUDA_MAX_TOKENS
from inferix.errors import UserError
from inferix.server import Registration, ServerOptions, add_server_arguments, run_server
from inferix.spec.served import model_settings
from workers.pod import add_parallel_arguments, rank, world_size

if TYPE_CHECKING:
    from engine.parallel.pod_driver import PodDriver
    from engine.registry import Model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers",
        description="Inferix worker: loads a model once and runs the scheduler's block jobs.",
    )
    add_server_arguments(parser, "worker", 50052)
    env = os.environ.get
    parser.add_argument(
        "--model",
        type=Path,
        default=env("INFERIX_MODEL"),
        help="model folder, or built-in: toyworld (default), tiny, matrixgame2-tiny",
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
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=int(env("INFERIX_MAX_BATCH_TOKENS", "0")),
        help=f"token rows per batched DiT forward at most (sessions' blocks run batched; default 0: "
        f"{CPU_MAX_TOKENS} on a CPU, {CUDA_MAX_TOKENS} on a GPU)",
    )
    parser.add_argument(
        "--capacity-probe",
        type=int,
        default=int(env("INFERIX_CAPACITY_PROBE", "8")),
        metavar="STREAMS",
        help="at startup, measure real-time capacity with up to this many probe sessions (0: learn it from "
        "the blocks served; default 8)",
    )
    parser.add_argument(
        "--realtime-streams",
        type=int,
        default=int(env("INFERIX_REALTIME_STREAMS", "0")),
        metavar="N",
        help="claim N real-time streams per resolution for admission instead of the measured number "
        "(e.g. to leave headroom; 0: measured, the default)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        default=env("INFERIX_COMPILE", "") == "1",
        help="compile the DiT step with torch.compile and warm it up at the native resolution before serving "
        "(minutes more start-up; Wan-family models on one device; env INFERIX_COMPILE=1)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        default=env("INFERIX_CUDA_GRAPHS", "") == "1",
        help="replay the DiT step from CUDA graphs captured at the native resolution before serving "
        "(Wan-family models on one CUDA device, without --compile; env INFERIX_CUDA_GRAPHS=1)",
    )
    parser.add_argument(
        "--quant",
        default=env("INFERIX_QUANT") or None,
        help="quantize the DiT's block linears: none, int8, int8-wo, fp8, fp8-tensor (default: the model "
        "folder's; env INFERIX_QUANT)",
    )
    parser.add_argument(
        "--decoder",
        default=env("INFERIX_DECODER") or None,
        metavar="vae|taehv:PATH",
        help="decode latents with: vae (the model's own) or taehv:PATH (a TAEHV weight file; Wan-latent models); "
        "default: the model folder's 'decoder:'; env INFERIX_DECODER. Every worker of a mesh alike",
    )
    parser.add_argument(
        "--kv-dtype",
        default=env("INFERIX_KV_DTYPE", "auto"),
        choices=("auto", "fp8", "int8"),
        help="KV cache storage: auto (the model's dtype), fp8 or int8 "
        "(8-bit pages with a scale per page and head); env INFERIX_KV_DTYPE",
    )
    parser.add_argument(
        "--snapshot-every",
        default=env("INFERIX_SNAPSHOT_EVERY", "auto"),
        metavar="N|auto",
        help="ship an exact KV snapshot of each session to kvcache_svc every N blocks, so that a worker taking "
        "over replays at most N blocks: auto (default) picks N per session from a snapshot's measured cost "
        "against the block time, at most 1%% of the worker's time (see docs/mesh.md, Recovery), 0 turns "
        "snapshots off (recovery replays every committed "
        "block); Wan-family models on one device; env INFERIX_SNAPSHOT_EVERY",
    )
    add_parallel_arguments(parser)
    args = parser.parse_args()
    from workers.snapshots import parse_every  # torch is imported only once the arguments are good

    try:
        args.snapshot_every = parse_every(args.snapshot_every)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main() -> None:
    args = parse_args()
    if args.kv_pages < 1:
        raise SystemExit(f"--kv-pages must be >= 1, got {args.kv_pages}")
    if args.max_batch_tokens < 0:
        raise SystemExit(f"--max-batch-tokens must be >= 0 (0: by device), got {args.max_batch_tokens}")
    if args.capacity_probe < 0:
        raise SystemExit(f"--capacity-probe must be >= 0, got {args.capacity_probe}")
    if args.realtime_streams < 0:
        raise SystemExit(f"--realtime-streams must be >= 0 (0: measured), got {args.realtime_streams}")
    import torch

    from engine.capabilities import EngineRequest, check
    from engine.registry import LoadOptions, family_capabilities, load_model
    from workers.pod import run_worker_pod

    # The format run_server uses; set here already so that start-up (the pod's plan) is logged too.
    me = rank()
    pod = world_size() > 1
    name = f"worker rank {me}" if pod and me else "worker"
    level = args.log_level if me == 0 else logging.WARNING  # a follower: warnings, and its pod lifecycle
    logging.basicConfig(level=level, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    logging.getLogger("inferix.worker.pod").setLevel(logging.INFO)
    if not pod:  # the engine thread computes; no other thread of the worker runs several (workers/engine_host.py)
        args.threads = args.threads or torch.get_num_threads()
        torch.set_num_threads(1)
    elif args.threads:  # each rank computes on its main thread
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    try:
        family = family_capabilities(args.model)
        request = EngineRequest(
            quant=args.quant,
            kv_dtype=args.kv_dtype,
            decoder=args.decoder,
            pod=pod,
            compile=args.compile,
            cuda_graphs=args.cuda_graphs,
            snapshots=bool(args.snapshot_every),
        )
        check(family, request)  # before minutes of loading
        if pod:  # only a family whose capabilities allow pods gets here (checked above)
            run_worker_pod(args, dtype, lambda model, driver: serve(args, model, driver))
            exit_shut_down_rank()
        else:
            options = LoadOptions(dtype, args.device, quant=args.quant, decoder=args.decoder)
            serve(args, load_model(args.model, options, served=True))
    except UserError as exc:
        where = f" (rank {me})" if pod else ""
        print(f"python -m workers{where}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def exit_shut_down_rank() -> None:
    """End a pod rank that has shut down cleanly (drained, process groups destroyed) with exit code 0,
    skipping the interpreter's teardown: there the C++ destructors of a rank's communication threads
    abort about one exit in ten ("terminate called without an active exception", SIGABRT, with no
    Python frame left), and torchrun would report the pod as failed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve(args: argparse.Namespace, model: Model, driver: PodDriver | None = None) -> None:
    """The gRPC worker service until SIGTERM; with `driver` (rank 0 of a pod) it drives the pod."""
    from workers.service import WorkerConfig, WorkerService, add_to_server

    config = WorkerConfig(
        args.worker_id,
        args.kvcache,
        args.kv_pages,
        model_settings=model_settings(args.model) if args.model is not None else "",
        profile_dir=args.profile,
        max_batch_tokens=args.max_batch_tokens,
        capacity_probe_streams=args.capacity_probe,
        realtime_streams=args.realtime_streams,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
        kv_dtype=args.kv_dtype,
        snapshot_every=args.snapshot_every,
        threads=args.threads,
    )
    options = ServerOptions.from_args(args)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def register(server: grpc.aio.Server) -> Registration:
        # Built inside the event loop: grpc.aio channels belong to the loop that creates them.
        service = WorkerService(model, config, driver)
        registration = add_to_server(server, service)

        async def on_start(port: int) -> None:
            await service.probe_capacity()  # before registering: admission knows the capacity from the start
            service.start_profiler()
            address = args.advertise_address or f"{options.host}:{port}"
            tasks.append(asyncio.create_task(service.register_and_heartbeat(address, stop)))

        def stopped_by(sig: signal.Signals) -> None:
            # SIGTERM (pod deleted, scaled in, rolled): the schedulers move the sessions away, wait for
            # that. SIGINT (Ctrl-C, or `inferix serve` stopping the whole mesh after its scheduler):
            # nobody is left to move them, so stop once the blocks in flight are committed.
            service.hand_over = sig == signal.SIGTERM

        async def drain() -> None:
            # Take no session or block from now on; health is NOT_SERVING already, which tells the
            # schedulers to move this worker's sessions after their blocks in flight, which are
            # finished, published and committed here first.
            service.draining = True
            stop.set()  # no heartbeat may revive the record after it is deregistered
            await asyncio.gather(*tasks, return_exceptions=True)
            await service.deregister()
            await service.drain()

        return Registration(registration.service_names, drain=drain, on_start=on_start, stopped_by=stopped_by)

    asyncio.run(run_server("worker", options, register, internal_methods=("/inferix.v1.WorkerService/",)))


if __name__ == "__main__":
    main()
