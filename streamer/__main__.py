"""`python -m streamer`: run the Streamer service (frame ingest, H.264 encode, MP4 recordings)."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from functools import partial
from pathlib import Path

from inferix.server import ServerOptions, add_server_arguments, run_server
from streamer.encoder import ENCODER_CHOICES, LIBX264, resolve_encoder
from streamer.service import StreamerConfig, register


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
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.queue_frames < 1:
        parser.error("--queue-frames must be at least 1")
    try:
        codec = resolve_encoder(args.encoder)
    except ValueError as exc:
        parser.error(str(exc))
    data_dir: Path = args.data_dir
    if data_dir is None:
        (Path.cwd() / "out").mkdir(exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="streamer-", dir=Path.cwd() / "out"))
    data_dir.mkdir(parents=True, exist_ok=True)
    config = StreamerConfig(data_dir=data_dir.resolve(), codec=codec, queue_frames=args.queue_frames)
    # Frame ingest is internal; recordings and stream info are read by clients.
    internal = ("/inferix.v1.StreamerService/PushFrames", "/inferix.v1.StreamerService/FinishStream")
    asyncio.run(
        run_server(
            "streamer", ServerOptions.from_args(args), partial(register, config=config), internal_methods=internal
        )
    )


if __name__ == "__main__":
    main()
