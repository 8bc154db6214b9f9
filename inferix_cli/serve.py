"""`inferix serve`: the whole mesh on this machine, until Ctrl-C; a service that exits is restarted."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from inferix.errors import UserError
from inferix.mesh_tls import add_mesh_tls_arguments

if TYPE_CHECKING:
    from inferix_cli.mesh import Mesh


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run scheduler, kvcache_svc, streamer and workers locally",
        description=(
            "Start every Inferix service on this machine (127.0.0.1) with embedded defaults: an in-memory "
            "store and the built-in toyworld model unless --model is given. Prints the addresses; Ctrl-C or "
            "SIGTERM stops everything cleanly (scheduler first) and exits 0. It supervises its services: one "
            "that exits is restarted where the others expect it (same ports, same worker id) after a backoff "
            "of 0.5 s doubling up to 30 s, and the exit is logged on one line; sessions on other workers go "
            "on, and a dead worker's sessions move to another. A service that exits again after 5 restarts "
            "within 60 s is in a crash loop: everything stops, with an error naming it and its log, and exit "
            "code 1. Each service logs to <workdir>/<service>.log, appended to on restart."
        ),
        epilog="example: inferix serve --workers 2 --port 50051   then: inferix session create --prompt 'a red ball'.  "
        "restart policy (environment): INFERIX_SERVE_BACKOFF_S (first delay, 0.5), INFERIX_SERVE_BACKOFF_MAX_S "
        "(30), INFERIX_SERVE_CRASH_LOOP_RESTARTS (5; 0 = stop on the first exit), "
        "INFERIX_SERVE_CRASH_LOOP_WINDOW_S (60). INFERIX_INTERNAL_TOKEN, when set, is the mesh's internal token "
        "(default: a fresh random one).",
    )
    parser.add_argument(
        "--port", type=int, default=50051, help="scheduler port for clients (0 = any free port; default 50051)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the scheduler's client port binds, e.g. a LAN address or 0.0.0.0 (use with --tls-cert); "
        "the other services stay on 127.0.0.1 (default 127.0.0.1)",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="PEM certificate chain: the scheduler serves its client port with TLS (clients: grpcs://HOST:PORT, "
        "--ca for a private CA) and the streamer its viewer page over HTTPS (https:// viewer links); "
        "a replaced file is served without a restart",
    )
    parser.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--mesh-tls",
        action="store_true",
        help="mutual TLS between the services (on top of the internal token): a throwaway mesh CA and one "
        "certificate per service are made in <workdir>/mesh-tls/ at each start, unless --mesh-tls-ca/-cert/-key "
        "give one certificate (for 127.0.0.1) that every service uses",
    )
    add_mesh_tls_arguments(parser)
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=0,
        metavar="T",
        help="torch CPU threads of each worker process (default: torch's, every core). The count is part of "
        "a session's numerics on a CPU: compare with `inferix generate --threads T`. On a small CPU, "
        "--workers C --worker-threads 1 serves small models faster (see Workers and CPU cores in docs/serve.md)",
    )
    parser.add_argument(
        "--ranks-per-worker",
        type=int,
        default=1,
        metavar="N",
        help="run each worker as a sequence-parallel pod of N ranks under torchrun (one per GPU with "
        "--device cuda; gloo on CPU). Rank 0 serves; the model's heads / tokens must split evenly. "
        "Strategy: INFERIX_SP_STRATEGY (default auto). Default 1",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder, or built-in: toyworld (default), toyworld-play, toyworld-play-1f, tiny, matrixgame2-tiny",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-pages", type=int, default=256, help="KV pages per worker (one latent frame each)")
    parser.add_argument("--redis-url", default=None, help="use Redis for sessions and committed blocks")
    parser.add_argument("--api-keys-file", type=Path, default=None, help="require API keys (one per line)")
    parser.add_argument("--lookahead", type=int, default=2, help="blocks generated ahead of playback (default 2)")
    parser.add_argument(
        "--realtime-streams",
        type=int,
        default=0,
        metavar="N",
        help="each worker admits N real-time streams per resolution instead of the measured number (0: measured)",
    )
    parser.add_argument(
        "--capacity-probe",
        type=int,
        default=8,
        metavar="N",
        help="workers measure their real-time capacity with up to N probe sessions at startup (0: none; default 8)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="workers compile their DiT step with torch.compile and warm it up before they serve (minutes more "
        "start-up; Wan-family models, one device per worker)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="workers replay their DiT step from CUDA graphs captured before they serve (CUDA devices only)",
    )
    parser.add_argument(
        "--quant",
        default=None,
        help="workers quantize their DiT's block linears: none, int8 (W8A8), int8-wo (weights only), fp8, fp8-tensor "
        "(default: the model folder's; see Quantization in the README)",
    )
    parser.add_argument(
        "--decoder",
        default=None,
        metavar="vae|taehv:PATH",
        help="what every worker decodes latents with: vae (the model's own, default) or taehv:PATH (a TAEHV "
        "weight file; Wan-latent models; default: the model folder's 'decoder:'); all workers alike, so a "
        "recovered session decodes as it began",
    )
    parser.add_argument(
        "--kv-dtype",
        default="auto",
        choices=("auto", "fp8", "int8"),
        help="workers' KV cache storage: auto (the model's dtype), fp8 or int8 "
        "(8-bit pages with a scale per page and head)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="logs (<service>.log), port files and recordings (default: a temp dir)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=8088,
        help="viewer pages (WebRTC) and WHEP on this port (0 = any; default 8088)",
    )
    parser.add_argument(
        "--rtmp",
        default="auto",
        help="RTMP output: auto (start a local nginx with the RTMP module when installed), off, "
        "or the rtmp:// application URL of your own server (default auto)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferix.mesh_tls import mesh_tls_from_args
    from inferix.server import INTERNAL_TOKEN_ENV
    from inferix.spec.families.matrixgame import TINY_MODEL
    from inferix.spec.presets import BUILTIN_MODELS
    from inferix_cli.mesh import MeshConfig, start_mesh
    from inferix_cli.mesh.launch import ServiceStartError
    from inferix_cli.mesh.local import MESH_ROLES
    from inferix_cli.mesh.pki import make_mesh_pki
    from inferix_cli.mesh.rtmp_relay import RtmpServerError
    from inferix_cli.mesh.supervisor import RestartPolicy, Supervisor

    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.ranks_per_worker < 1:
        raise UserError(f"--ranks-per-worker must be at least 1, got {args.ranks_per_worker}")
    if args.worker_threads < 0:
        raise UserError(f"--worker-threads must be at least 1 (or 0: torch's default), got {args.worker_threads}")
    builtin = (*BUILTIN_MODELS, TINY_MODEL)
    if args.model is not None and not args.model.is_dir() and str(args.model) not in builtin:
        raise UserError(
            f"--model {args.model}: not a folder nor a built-in model ({', '.join(builtin)}); see README: model folders"
        )
    if args.realtime_streams < 0 or args.capacity_probe < 0:
        raise UserError("--realtime-streams and --capacity-probe must be >= 0")
    if args.rtmp not in ("auto", "off") and not args.rtmp.startswith(("rtmp://", "rtmps://")):
        raise UserError(f"--rtmp must be auto, off or an rtmp:// URL, got {args.rtmp!r}")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UserError("--tls-cert and --tls-key go together (a certificate and its private key)")
    try:
        given = mesh_tls_from_args(args)
    except SystemExit as exc:
        raise UserError(str(exc).removeprefix("error: ")) from None
    files = [("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)]
    if given is not None:
        files += [("--mesh-tls-ca", given.ca), ("--mesh-tls-cert", given.cert), ("--mesh-tls-key", given.key)]
    for flag, path in files:
        if path is not None and not path.is_file():
            raise UserError(f"{flag} {path}: no such file")
    try:
        policy = RestartPolicy.from_env()
    except ValueError as exc:
        raise UserError(f"restart policy: {exc}") from exc
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="inferix-serve-"))).resolve()
    if given is not None:
        resolved = type(given)(given.ca.resolve(), given.cert.resolve(), given.key.resolve())
        mesh_tls = dict.fromkeys(MESH_ROLES, resolved)
    elif args.mesh_tls:
        mesh_tls = make_mesh_pki(workdir / "mesh-tls", MESH_ROLES)
    else:
        mesh_tls = {}
    token = os.environ.get(INTERNAL_TOKEN_ENV)
    config = MeshConfig(
        workdir=workdir,
        workers=args.workers,
        ranks_per_worker=args.ranks_per_worker,
        model=args.model,
        device=args.device,
        kv_pages=args.kv_pages,
        scheduler_port=args.port,
        redis_url=args.redis_url,
        api_keys_file=args.api_keys_file,
        lookahead=args.lookahead,
        worker_threads=args.worker_threads,
        realtime_streams=args.realtime_streams,
        capacity_probe=args.capacity_probe,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
        quant=args.quant,
        decoder=None if args.decoder is None else _decoder_path(args.decoder),
        kv_dtype=args.kv_dtype,
        http_port=args.http_port,
        rtmp=args.rtmp,
        env={INTERNAL_TOKEN_ENV: token} if token else {},
        scheduler_host=args.host,
        tls_cert=args.tls_cert.resolve() if args.tls_cert else None,
        tls_key=args.tls_key.resolve() if args.tls_key else None,
        mesh_tls=mesh_tls,
    )
    pods = f" of {args.ranks_per_worker} ranks" if args.ranks_per_worker > 1 else ""
    model = args.model or "toyworld (built-in)"
    threads = f", {args.worker_threads} CPU thread(s) each" if args.worker_threads else ""
    print(f"starting Inferix ({args.workers} worker(s){pods}{threads}, model {model}) ...", flush=True)
    if args.device == "cpu" and args.ranks_per_worker == 1:
        note = oversubscription_note(args.workers, args.worker_threads, os.environ, len(os.sched_getaffinity(0)))
        if note:
            print(note, file=sys.stderr, flush=True)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    terminated = False

    def interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        raise KeyboardInterrupt  # while starting: start_mesh stops what it started

    signal.signal(signal.SIGTERM, interrupt)
    try:
        mesh: Mesh | None = None
        try:
            mesh = start_mesh(config)
            supervisor = Supervisor(mesh, policy)

            def request_stop(signum: int, frame: FrameType | None) -> None:
                supervisor.request_stop()  # no restart from now on; the loop below ends within its poll interval

            for sig in previous:
                signal.signal(sig, request_stop)
        except (ServiceStartError, RtmpServerError) as exc:
            raise UserError(str(exc).splitlines()[0] + f" (logs in {workdir})") from exc
        except KeyboardInterrupt:
            if mesh is not None:  # it had just started
                mesh.stop()
            if not terminated:
                raise  # Ctrl-C: "interrupted", exit code 130
            print("stopped while starting (SIGTERM)", flush=True)
            return 0
        _print_addresses(mesh, workdir)
        try:
            crash_loop = supervisor.run()
        except BaseException:  # a bug must not leave the services running
            supervisor.stop()
            raise
        if crash_loop is not None:
            print(f"inferix serve: error: {crash_loop.message()}", file=sys.stderr, flush=True)
        print("stopping ...", flush=True)
        codes = supervisor.stop()
        print("stopped: " + ", ".join(f"{name}={code}" for name, code in codes.items()), flush=True)
        return 1 if crash_loop is not None else 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def oversubscription_note(workers: int, worker_threads: int, environ: Mapping[str, str], cores: int) -> str | None:
    """A note when the workers' torch threads together outnumber the `cores` and fewer would do, else
    None. Each worker runs its blocks on an OpenMP team, and teams that share cores stall one another:
    2 toyworld workers of 2 threads on 2 cores served less than half the frames of 2 workers of one
    thread (`python -P bench/worker_layout.py`, bench/RESULTS.md)."""
    given = environ.get("INFERIX_THREADS") or environ.get("OMP_NUM_THREADS") or str(cores)
    if not given.isdigit():  # the workers will say what is wrong with it
        return None
    threads = worker_threads or int(given) or cores
    fit = max(1, cores // workers)
    if workers == 1 or threads <= fit:
        return None
    return (
        f"note: {workers} workers of {threads} CPU threads each on {cores} cores: their OpenMP teams stall one "
        f"another; --worker-threads {fit} serves more (compare frames with `inferix generate --threads {fit}`: "
        "the thread count is part of a session's numerics). See docs/serve.md, Workers and CPU cores"
    )


def _decoder_path(value: str) -> str:
    """``--decoder`` with its TAEHV file made absolute (the workers run in the mesh's folder), checked to exist."""
    from inferix.spec.decoders import parse_decoder

    choice = parse_decoder(value, "--decoder")
    if choice.path is None:
        return str(choice)
    path = choice.path.resolve()
    if not path.is_file():
        raise UserError(f"--decoder {value}: {path} is not a file (a TAEHV weight file, .pth or .safetensors)")
    return f"{choice.kind}:{path}"


def _print_addresses(mesh: Mesh, workdir: Path) -> None:
    tls = " (TLS; --ca FILE when a private CA signed it)" if mesh.config.tls else ""
    serve = mesh.config.mesh_tls.get("serve")
    mesh_line = f"mesh TLS    mutual TLS between the services, CA {serve.ca}\n" if serve is not None else ""
    print(
        f"scheduler   {mesh.address}   <- clients: inferix session --server {mesh.address} ...{tls}\n"
        f"streamer    {mesh.streamer.address}\n"
        f"viewer      {mesh.viewer_url}/watch/<session>   <- each session's webrtc_page URL (with its token)\n"
        + (
            f"rtmp        {mesh.rtmp_url}/<session>   <- sessions with outputs.rtmp: ffplay -rtmp_live live URL\n"
            if mesh.rtmp_url
            else f"rtmp        {mesh.rtmp_note}\n"
        )
        + f"kvcache     {mesh.kvcache.address}\n"
        + mesh_line
        + "".join(f"{w.name:<11} {w.address}\n" for w in mesh.workers)
        + "metrics     "
        + " ".join(f"{p.name}:{p.metrics_port}" for p in mesh.processes() if p.metrics_port)
        + f"\nlogs        {workdir}   <- <service>.log; services that exit are restarted (see --help)"
        + "\nCtrl-C to stop",
        flush=True,
    )
