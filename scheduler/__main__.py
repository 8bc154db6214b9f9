"""`python -m scheduler`: the client-facing Scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path

import grpc

from inferix.server import Registration, ServerOptions, add_server_arguments, add_tls_arguments, run_server


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m scheduler",
        description="Inferix scheduler: sessions, admission, block dispatch and the Interact stream.",
    )
    add_server_arguments(parser, "scheduler", 50051)
    add_tls_arguments(parser, "scheduler")
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
    playback = parser.add_argument_group("playback (URLs returned with each session)")
    playback.add_argument(
        "--viewer-page-url",
        default=env("INFERIX_VIEWER_PAGE_URL", ""),
        help="the streamer's HTTP server as browsers reach it, e.g. http://127.0.0.1:8088 "
        "(with a viewer secret: every session gets a webrtc_page URL)",
    )
    playback.add_argument(
        "--viewer-secret-file",
        type=Path,
        default=None,
        help="secret shared with the streamer that signs viewer tokens (or env INFERIX_VIEWER_SECRET)",
    )
    playback.add_argument(
        "--rtmp-play-url",
        default=env("INFERIX_RTMP_PLAY_URL", ""),
        help="RTMP application players read sessions from, e.g. rtmp://127.0.0.1:1935/live "
        "(enables spec.outputs.rtmp; the streamer pushes to its --rtmp-url)",
    )
    playback.add_argument(
        "--advertise-address",
        default=env("INFERIX_SCHEDULER_ADVERTISE_ADDRESS", ""),
        help="this scheduler's API address as the streamer reaches it (viewer commands); default: host:port "
        "(with TLS: the plaintext --internal-host:--internal-port)",
    )
    return parser.parse_args()


def _advertised(host: str, port: int, override: str) -> str:
    if override:
        return override
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{host}:{port}"


def main() -> None:
    args = parse_args()
    from inferix.errors import UserError
    from inferix.store import open_store
    from inferix.viewer_token import load_viewer_tokens
    from scheduler.auth import ApiKeys
    from scheduler.config import SchedulerConfig
    from scheduler.playback import Playback, PlaybackConfig
    from scheduler.rpc import add_to_server, create_servicer
    from scheduler.streamer_link import StreamerLink
    from scheduler.viewer_gateway import ViewerGateway

    try:
        keys = ApiKeys.load(args.api_keys_file)
        store = open_store(args.redis_url)
        tokens = load_viewer_tokens(args.viewer_secret_file)
    except UserError as exc:
        raise SystemExit(f"scheduler: error: {exc}") from None
    if args.viewer_page_url and tokens is None:
        raise SystemExit("scheduler: error: --viewer-page-url needs a viewer secret (--viewer-secret-file)")
    options = ServerOptions.from_args(args)
    # The streamer reaches the scheduler on the API port, or on the internal one with TLS or mesh TLS.
    own_host, own_port = options.internal or (options.host, options.port)
    # The link announces sessions to the streamer and relays its output errors into session events.
    link = StreamerLink(args.streamer, _advertised(own_host, own_port, args.advertise_address))
    playback = Playback(PlaybackConfig(args.viewer_page_url, args.rtmp_play_url, tokens), announcer=link)
    config = SchedulerConfig(
        kvcache_address=args.kvcache,
        streamer_address=args.streamer,
        streamer_public_address=args.streamer_public,
        default_lookahead=args.lookahead,
        block_deadline_s=args.block_deadline,
        playback=playback,
    )
    gateway = ViewerGateway(tokens)

    def register(server: grpc.aio.Server) -> Registration:
        servicer = create_servicer(config, store, keys)
        gateway.bind(servicer.table.records, keys)
        link.bind(servicer.table.records)
        registration = add_to_server(server, servicer)
        previous = registration.on_start

        async def on_start(port: int) -> None:
            if previous is not None:
                await previous(port)
            link.scheduler_address = _advertised(own_host, port, args.advertise_address)
            await link.start(port)

        registration.on_start = on_start
        return registration

    asyncio.run(run_server("scheduler", options, register, interceptors=[gateway]))


if __name__ == "__main__":
    main()
