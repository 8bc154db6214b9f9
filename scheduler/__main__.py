"""`python -m scheduler`: the client-facing Scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import grpc

from inferix.server import Registration, ServerOptions, add_server_arguments, run_server


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m scheduler",
        description="Inferix scheduler: sessions, admission, block dispatch and the Interact stream.",
    )
    add_server_arguments(parser, "scheduler", 50051)
    parser.add_argument("--kvcache", default=env("INFERIX_KVCACHE_ADDRESS", "127.0.0.1:50053"))
    parser.add_argument("--streamer", default=env("INFERIX_STREAMER_ADDRESS", "127.0.0.1:50054"))
    parser.add_argument(
        "--streamer-public", default=env("INFERIX_STREAMER_PUBLIC_ADDRESS", ""), help="streamer address for clients"
    )
    parser.add_argument("--redis-url", default=env("INFERIX_REDIS_URL"), help="session store (default: in-memory)")
    keys_file = env("INFERIX_API_KEYS_FILE")
    parser.add_argument(
        "--api-keys-file",
        type=Path,
        default=Path(keys_file) if keys_file else None,
        help="file of API keys (one per line); INFERIX_API_KEYS=k1,k2 also works; none = open server",
    )
    parser.add_argument("--lookahead", type=int, default=int(env("INFERIX_LOOKAHEAD", "2")), help="default lookahead")
    parser.add_argument("--block-deadline", type=float, default=600.0, help="seconds a worker may take per block")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from inferix.errors import UserError
    from inferix.store import open_store
    from scheduler.auth import ApiKeys
    from scheduler.service import SchedulerConfig, SchedulerService, add_to_server

    try:
        keys = ApiKeys.load(args.api_keys_file)
        store = open_store(args.redis_url)
    except UserError as exc:
        raise SystemExit(f"scheduler: error: {exc}") from None
    config = SchedulerConfig(
        kvcache_address=args.kvcache,
        streamer_address=args.streamer,
        streamer_public_address=args.streamer_public,
        default_lookahead=args.lookahead,
        block_deadline_s=args.block_deadline,
    )

    def register(server: grpc.aio.Server) -> Registration:
        return add_to_server(server, SchedulerService(config, store, keys))

    asyncio.run(run_server("scheduler", ServerOptions.from_args(args), register))


if __name__ == "__main__":
    main()
