"""`python -m kvcache_svc`: serve the KVCacheService (see `--help`)."""

from __future__ import annotations

import argparse
import asyncio
import os

from inferix.server import ServerOptions, add_server_arguments, run_server
from inferix.store import StoreError, StoreURLError, open_store
from kvcache_svc.offload import Watermarks
from kvcache_svc.service import KVCacheConfig, add_to_server


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    defaults = KVCacheConfig()
    parser = argparse.ArgumentParser(
        prog="python -m kvcache_svc",
        description="KV-cache placement service: worker registry, admission control, committed block latents.",
    )
    add_server_arguments(parser, "kvcache", 50053)
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("INFERIX_REDIS_URL") or None,
        help="keep state in Redis (redis://host:port/db) so it is shared and survives restarts; "
        "default: in memory (env INFERIX_REDIS_URL)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        # A string default goes through `type` too, so a bad environment value is reported like a bad flag.
        default=os.environ.get("INFERIX_KVCACHE_HEARTBEAT_TIMEOUT", str(defaults.heartbeat_timeout_s)),
        help="a worker not heard from for this many seconds is dead: listed as such and never chosen "
        "(env INFERIX_KVCACHE_HEARTBEAT_TIMEOUT; default %(default)s)",
    )
    parser.add_argument(
        "--finished-ttl",
        type=_seconds,
        default=defaults.finished_ttl_s,
        help="seconds the committed blocks of a released session are kept (default %(default)s)",
    )
    parser.add_argument(
        "--offload-high-watermark",
        type=float,
        default=defaults.watermarks.high,
        help="offload the least recently used sessions when a worker's device pages exceed this fraction "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--offload-low-watermark",
        type=float,
        default=defaults.watermarks.low,
        help="... down to this fraction (default %(default)s); paused sessions are always offloaded",
    )
    return parser


async def serve(options: ServerOptions, redis_url: str | None, config: KVCacheConfig) -> None:
    try:
        store = open_store(redis_url)
        await store.ping()
    except StoreURLError as exc:
        raise SystemExit(f"kvcache: {exc}") from exc
    except StoreError as exc:
        raise SystemExit(f"kvcache: cannot use the store: {exc}") from exc
    try:
        await run_server(
            "kvcache",
            options,
            lambda server: add_to_server(server, store, config),
            internal_methods=("/inferix.v1.KVCacheService/",),
        )
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        marks = Watermarks(high=args.offload_high_watermark, low=args.offload_low_watermark)
    except ValueError as exc:
        raise SystemExit(f"kvcache: {exc}") from None
    config = KVCacheConfig(
        heartbeat_timeout_s=args.heartbeat_timeout, finished_ttl_s=args.finished_ttl, watermarks=marks
    )
    asyncio.run(serve(ServerOptions.from_args(args), args.redis_url, config))


if __name__ == "__main__":
    main()
