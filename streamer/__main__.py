"""`python -m streamer`: run the Streamer service (frame ingest, H.264 encode, MP4, RTMP push, WebRTC viewers).

Besides gRPC (and metrics) the streamer serves HTTP (`--http-port`): the viewer page, WHEP and the
page's JSON API. Its port goes into the port file as "http", next to "grpc" and "metrics": the
gRPC bootstrap writes its file to a side path, and once HTTP listens the full file is written
atomically where `--port-file` says, so a launcher that sees the file sees every port.

`--tls-cert/--tls-key` make the HTTP server HTTPS (re-read when the files change). The gRPC port
(frames from workers, the scheduler link, recordings) is the mesh's internal port: plaintext, or mutual
TLS with mesh TLS (`--mesh-tls-*`, inferix/mesh_tls.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc

from inferix.errors import UserError
from inferix.server import Registration, ServerOptions, add_server_arguments, run_server
from inferix.viewer_token import SECRET_ENV, ViewerTokens, load_viewer_tokens
from streamer.control import SchedulerControl
from streamer.encoder import ENCODER_CHOICES, LIBX264, resolve_encoder
from streamer.ice import DEFAULT_TTL_S, IceConfigError, IceServers
from streamer.limits import HttpLimits
from streamer.link import LinkHub
from streamer.live import LiveConfig
from streamer.pacing import PacingConfig, UnderrunPolicy
from streamer.rtmp import RtmpConfig
from streamer.service import StreamerConfig, StreamerService, register
from streamer.tls import ReloadingTls
from streamer.web import ViewerServer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m streamer",
        description="Inferix Streamer: receives frames from workers, encodes H.264 once per session, records MP4s.",
    )
    add_server_arguments(parser, "streamer", 50054)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=os.environ.get("INFERIX_STREAMER_DATA_DIR"),
        help="where recordings (<session id>.mp4) are written "
        "(env INFERIX_STREAMER_DATA_DIR; default: a new temporary folder under ./out/)",
    )
    parser.add_argument(
        "--encoder",
        choices=ENCODER_CHOICES,
        default=os.environ.get("INFERIX_STREAMER_ENCODER", LIBX264),
        help="H.264 encoder: libx264 (CPU), h264_nvenc (NVIDIA GPU; fails at startup if it cannot open), "
        "auto (NVENC when it opens, else libx264) (env INFERIX_STREAMER_ENCODER; default: %(default)s)",
    )
    parser.add_argument(
        "--queue-frames",
        type=int,
        default=48,
        help="frames buffered per session between ingest and encoder; a full queue slows that session's pushes",
    )
    parser.add_argument(
        "--segment-seconds",
        type=float,
        default=4.0,
        help="a recording in progress is written in closed segments of this length; a restarted streamer keeps "
        "all but the segment in progress, and workers hold that much video to re-send (default: %(default)s)",
    )
    env = os.environ.get
    live = parser.add_argument_group("live outputs (RTMP push, WebRTC viewers)")
    http_port = env("INFERIX_STREAMER_HTTP_PORT")
    live.add_argument(
        "--http-port",
        type=int,
        default=int(http_port) if http_port else None,
        help="viewer page, WHEP and the page API on this port (0 = any free port, -1 = off; "
        "env INFERIX_STREAMER_HTTP_PORT; default 8088, or any free port when --port is 0)",
    )
    live.add_argument(
        "--rtmp-url",
        default=env("INFERIX_STREAMER_RTMP_URL", ""),
        help="RTMP application to push sessions that ask for it to, as <url>/<session id> "
        "(e.g. rtmp://127.0.0.1:1935/live; env INFERIX_STREAMER_RTMP_URL; default: no RTMP)",
    )
    live.add_argument(
        "--scheduler",
        default=env("INFERIX_SCHEDULER_ADDRESS", ""),
        help="scheduler API address for the viewer page's commands (default: the one the scheduler announces)",
    )
    live.add_argument(
        "--viewer-secret-file",
        type=Path,
        default=None,
        help=f"secret shared with the scheduler that signs viewer tokens (or env {SECRET_ENV}); "
        "without one the viewer page and WHEP answer 503",
    )
    live.add_argument(
        "--jitter-buffer-ms",
        type=float,
        default=float(env("INFERIX_STREAMER_JITTER_BUFFER_MS", "100")),
        help="live output starts this long after the first frame arrives; a smooth session keeps it, an "
        "interactive one starts with it and then follows the measured arrival jitter (default %(default)g)",
    )
    live.add_argument(
        "--underrun-policy",
        choices=[p.value for p in UnderrunPolicy],
        default=env("INFERIX_STREAMER_UNDERRUN_POLICY", UnderrunPolicy.HOLD.value),
        help="when generation falls behind a smooth session: hold (viewers keep the last frame, timestamps "
        "follow the clock) or stall (timestamps stay continuous, players re-buffer); interactive sessions play "
        "a late frame as it comes and give the held time back (default %(default)s)",
    )
    live.add_argument(
        "--max-backlog-s",
        type=float,
        default=60.0,
        help="seconds of video the live outputs may hold ahead; beyond it they skip to a keyframe",
    )
    live.add_argument(
        "--max-viewers",
        type=int,
        default=int(env("INFERIX_STREAMER_MAX_VIEWERS", "16")),
        help="WebRTC viewers per session; one more is refused with 503 (env INFERIX_STREAMER_MAX_VIEWERS; "
        "default %(default)s)",
    )
    _add_ice_arguments(parser)
    _add_http_arguments(parser)
    return parser


def _add_ice_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    group = parser.add_argument_group("STUN / TURN for WebRTC viewers behind NAT")
    group.add_argument(
        "--ice-server",
        action="append",
        metavar="URL",
        default=[url for url in env("INFERIX_ICE_SERVERS", "").split(",") if url],
        help="a STUN or TURN server viewers and the streamer use, e.g. turn:turn.example.com:3478?transport=udp "
        "(repeat for more; env INFERIX_ICE_SERVERS, comma-separated; default: none, direct connections only)",
    )
    group.add_argument(
        "--turn-secret-file",
        type=Path,
        help="the TURN server's shared secret (coturn static-auth-secret), from which each viewer gets "
        "short-lived credentials (or env INFERIX_TURN_SECRET)",
    )
    group.add_argument(
        "--turn-credential-ttl-s",
        type=int,
        default=int(env("INFERIX_TURN_CREDENTIAL_TTL_S", str(DEFAULT_TTL_S))),
        help="seconds a viewer's TURN credentials stay valid (env INFERIX_TURN_CREDENTIAL_TTL_S; default %(default)s)",
    )


def _ice_servers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> IceServers:
    """The ICE servers from the flags; parser.error on a bad URL or a missing TURN secret."""
    secret = os.environ.get("INFERIX_TURN_SECRET", "").strip() or None
    if args.turn_secret_file is not None:
        try:
            secret = args.turn_secret_file.read_text().strip()
        except OSError as exc:
            parser.error(f"--turn-secret-file {args.turn_secret_file}: cannot read it ({exc.strerror})")
    try:
        return IceServers.parse(args.ice_server, secret, args.turn_credential_ttl_s)
    except IceConfigError as exc:
        parser.error(str(exc))


def _add_http_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    group = parser.add_argument_group("HTTPS and limits of the HTTP server (the gRPC port stays plaintext)")
    cert, key = env("INFERIX_STREAMER_TLS_CERT"), env("INFERIX_STREAMER_TLS_KEY")
    group.add_argument(
        "--tls-cert",
        dest="http_tls_cert",  # not ServerOptions' tls_cert: the gRPC port is internal and stays plaintext
        metavar="FILE",
        type=Path,
        default=Path(cert) if cert else None,
        help="PEM certificate chain: serve the viewer page, WHEP and the page API over HTTPS "
        "(re-read when the file changes; env INFERIX_STREAMER_TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        dest="http_tls_key",
        metavar="FILE",
        type=Path,
        default=Path(key) if key else None,
        help="PEM private key of --tls-cert (re-read with it; env INFERIX_STREAMER_TLS_KEY)",
    )
    defaults = HttpLimits()
    group.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(env("INFERIX_STREAMER_MAX_BODY_BYTES", str(defaults.max_body_bytes))),
        help="largest request body (SDP offer, command) accepted; larger is 413 "
        "(env INFERIX_STREAMER_MAX_BODY_BYTES; default %(default)s)",
    )
    group.add_argument(
        "--body-timeout-s",
        type=float,
        default=float(env("INFERIX_STREAMER_BODY_TIMEOUT_S", str(defaults.body_timeout_s))),
        help="seconds a client has to send a request body; slower is 408 "
        "(env INFERIX_STREAMER_BODY_TIMEOUT_S; default %(default)g)",
    )
    group.add_argument(
        "--commands-per-s",
        type=float,
        default=float(env("INFERIX_STREAMER_COMMANDS_PER_S", str(defaults.commands_per_s))),
        help="page API commands per second per session and viewer token (bursts of as many); more is 429 "
        "(env INFERIX_STREAMER_COMMANDS_PER_S; default %(default)g)",
    )
    group.add_argument(
        "--offers-per-s",
        type=float,
        default=float(env("INFERIX_STREAMER_OFFERS_PER_S", str(defaults.offers_per_s))),
        help="WHEP offers per second per session and viewer token; more is 429 "
        "(env INFERIX_STREAMER_OFFERS_PER_S; default %(default)g)",
    )
    group.add_argument(
        "--idle-timeout-s",
        type=float,
        default=float(env("INFERIX_STREAMER_IDLE_TIMEOUT_S", str(defaults.idle_timeout_s))),
        help="seconds a connection may go without a whole request header, from its opening or its last "
        "answer; then it is closed (slow headers, idle keep-alives; env INFERIX_STREAMER_IDLE_TIMEOUT_S; "
        "default %(default)g)",
    )


def _http_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[HttpLimits, ReloadingTls | None]:
    """The HTTP server's limits and TLS from the flags; parser.error on a bad value."""
    if args.max_body_bytes < 1024:
        parser.error("--max-body-bytes must be at least 1024 (an SDP offer is a few KiB)")
    for flag, value in (
        ("--body-timeout-s", args.body_timeout_s),
        ("--commands-per-s", args.commands_per_s),
        ("--offers-per-s", args.offers_per_s),
        ("--idle-timeout-s", args.idle_timeout_s),
    ):
        if not value > 0:
            parser.error(f"{flag} must be positive, got {value:g}")
    limits = HttpLimits(
        args.max_body_bytes, args.body_timeout_s, args.commands_per_s, args.offers_per_s, args.idle_timeout_s
    )
    if (args.http_tls_cert is None) != (args.http_tls_key is None):
        parser.error("--tls-cert and --tls-key go together (a certificate and its private key)")
    tls = ReloadingTls(args.http_tls_cert, args.http_tls_key) if args.http_tls_cert is not None else None
    return limits, tls


@dataclass(frozen=True)
class _HttpSettings:
    """The HTTP server's configuration from the flags."""

    tokens: ViewerTokens | None
    limits: HttpLimits
    tls: ReloadingTls | None
    port: int  # -1 = off
    port_file: Path | None  # where the launcher waits for {"grpc", "metrics", "http"}


@dataclass
class _HttpFront:
    """Starts the HTTP server once gRPC listens and writes the complete port file."""

    service: StreamerService
    control: SchedulerControl
    http: _HttpSettings
    host: str
    grpc_port_file: Path | None  # where run_server wrote {"grpc", "metrics"}
    server: ViewerServer | None = None

    async def start(self, grpc_port: int) -> None:
        ports: dict[str, int | None] = {"grpc": grpc_port, "metrics": None}
        if self.grpc_port_file is not None:
            ports.update(json.loads(self.grpc_port_file.read_text()))
            self.grpc_port_file.unlink()
        http = self.http
        if http.port >= 0:
            self.server = ViewerServer(
                self.service.live, self.control, http.tokens, http.limits, http.tls, self.service.recording
            )
            try:
                ports["http"] = await self.server.start(self.host, http.port)
            except OSError as exc:
                raise SystemExit(f"streamer: cannot serve HTTP on {self.host}:{http.port}: {exc.strerror}") from exc
        if http.port_file is not None:
            tmp = http.port_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(ports))
            tmp.replace(http.port_file)

    async def drain(self) -> None:
        await self.service.drain()
        if self.server is not None:
            await self.server.stop()
        await self.control.close()


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.queue_frames < 1:
        parser.error("--queue-frames must be at least 1")
    if not (math.isfinite(args.segment_seconds) and args.segment_seconds > 0):
        parser.error(f"--segment-seconds must be a positive number of seconds, got {args.segment_seconds:g}")
    try:
        codec = resolve_encoder(args.encoder)
    except ValueError as exc:
        parser.error(str(exc))
    data_dir: Path = args.data_dir
    if data_dir is None:
        (Path.cwd() / "out").mkdir(exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="streamer-", dir=Path.cwd() / "out"))
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.max_viewers < 1:
        parser.error("--max-viewers must be at least 1")
    if args.rtmp_url and not args.rtmp_url.startswith(("rtmp://", "rtmps://")):
        parser.error(f"--rtmp-url must start with rtmp:// or rtmps://, got {args.rtmp_url!r}")
    try:
        tokens = load_viewer_tokens(args.viewer_secret_file)
    except UserError as exc:
        parser.error(str(exc))
    limits, tls = _http_options(parser, args)
    pacing = PacingConfig(args.jitter_buffer_ms / 1e3, UnderrunPolicy(args.underrun_policy), args.max_backlog_s)
    rtmp = RtmpConfig(args.rtmp_url) if args.rtmp_url else None
    live = LiveConfig(pacing, rtmp, args.max_viewers, _ice_servers(parser, args))
    config = StreamerConfig(
        data_dir=data_dir.resolve(),
        segment_seconds=args.segment_seconds,
        codec=codec,
        queue_frames=args.queue_frames,
        live=live,
    )
    if args.http_port is None:
        args.http_port = 0 if args.port == 0 else 8088
    options = ServerOptions.from_args(args)
    port_file = options.port_file
    if port_file is not None:
        options.port_file = port_file.with_name(port_file.name + ".grpc")
    http = _HttpSettings(tokens, limits, tls, args.http_port, port_file)
    asyncio.run(_serve(config, options, args.scheduler, http))


async def _serve(
    config: StreamerConfig,
    options: ServerOptions,
    scheduler: str,
    http: _HttpSettings,
) -> None:
    control = SchedulerControl(scheduler, fixed=bool(scheduler))
    service = StreamerService(config, LinkHub(control))
    front = _HttpFront(service, control, http, options.host, options.port_file)

    def setup(server: grpc.aio.Server) -> Registration:
        registration = register(server, service)
        registration.on_start = front.start
        registration.drain = front.drain
        return registration

    # Frame ingest and the scheduler link are internal; recordings and stream info are read by clients.
    internal = (
        "/inferix.v1.StreamerService/PushFrames",
        "/inferix.v1.StreamerService/PushBlock",
        "/inferix.v1.StreamerService/FinishStream",
        "/inferix.v1.StreamerService/Link",
    )
    await run_server("streamer", options, setup, internal_methods=internal)


if __name__ == "__main__":
    main()
