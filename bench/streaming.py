"""Streamer benchmark: encode+mux throughput on one core, and glass-to-glass latency into Chromium.

1. **Throughput.** One process pinned to one CPU core encodes 832x480 frames with the streamer's
   `H264Encoder` and muxes every packet twice, as a live session does: into the MP4 recorder and
   into FLV (the RTMP container, written to memory). Reported as frames per second and as a
   multiple of real time at 16 fps (target >= 3x).
2. **Glass to glass, per latency mode.** A real `python -m streamer` process; frames are pushed over
   gRPC at 16 fps on the wall clock, each carrying its index as black/white cells; the streamer's
   own viewer page in headless Chromium (Debian's, driven by Playwright) plays the session over
   WebRTC, and a `requestVideoFrameCallback` hook reads the index of every presented frame.
   Latency = presented (Chromium's clock) - pushed (ours); same machine, same wall clock. Two
   sessions, one after the other in the same streamer and browser: `smooth` (the default: the
   streamer's fixed jitter buffer, the browser's own playout delay) and `interactive` (announced so
   over the scheduler link, as the scheduler does for `--latency interactive`: the adaptive jitter
   buffer, and the page asks Chromium for no playout delay). The first `--settle-s` seconds are not
   measured in either (joining at a keyframe; the interactive buffer measures the jitter for its
   first window before it shrinks). Targets: interactive p50 <= 60 ms, p95 <= 90 ms.

    python bench/streaming.py                         # both, defaults
    python bench/streaming.py --seconds 20 --encoder h264_nvenc
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from queue import Empty
from typing import Any

import av
import grpc
import numpy as np

from inferix.api.v1 import common_pb2, streamer_pb2, streamer_pb2_grpc
from inferix.viewer_token import ViewerTokens
from inferix_cli.mesh.launch import start_service
from streamer.encoder import LIBX264, H264Encoder
from streamer.packets import StreamFormat
from streamer.segments import SegmentedRecorder

WIDTH, HEIGHT, FPS = 832, 480, 16.0
BITS = 16  # frame index cells in the top band
CELL_H = 32
SECRET = "bench-viewer-secret-0123456789abcdef"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=240, help="frames encoded in the throughput run (default 240)")
    p.add_argument("--encoder", default=LIBX264, help="libx264 (default) or h264_nvenc")
    p.add_argument("--seconds", type=float, default=16.0, help="length of each glass-to-glass session (default 16)")
    p.add_argument(
        "--settle-s", type=float, default=6.0, help="seconds at the start of each session not measured (default 6)"
    )
    p.add_argument(
        "--jitter-buffer-ms",
        type=float,
        default=100.0,
        help="the streamer's jitter buffer (smooth; the interactive one's start) (default 100)",
    )
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--skip-latency", action="store_true", help="throughput only (no Chromium)")
    return p.parse_args()


def scene(index: int) -> np.ndarray:
    """A moving, textured 832x480 scene with the frame index in the top band (white cell = bit set)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    t = index / FPS
    red = 128 + 90 * np.sin(2 * np.pi * (x / 300 + t * 0.3))
    green = 128 + 80 * np.cos(2 * np.pi * (y / 200 - t * 0.2))
    blue = 128 + 60 * np.sin(2 * np.pi * ((x + y) / 400 + t * 0.5))
    frame = np.stack([red, green, blue], axis=-1)
    cx, cy = WIDTH / 2 + 250 * np.cos(t), HEIGHT / 2 + 120 * np.sin(1.3 * t)  # a moving disc
    frame[(x - cx) ** 2 + (y - cy) ** 2 < 60**2] = (240, 230, 40)
    noise = np.random.default_rng(index).normal(0, 4, frame.shape)  # film grain: not trivially compressible
    frame = np.clip(frame + noise, 0, 255).astype(np.uint8)
    cell_w = WIDTH // BITS
    for bit in range(BITS):
        frame[:CELL_H, bit * cell_w : (bit + 1) * cell_w] = 255 if index >> bit & 1 else 0
    return frame


# ---- 1. throughput --------------------------------------------------------------------------------
def _throughput(frames: int, encoder: str, out: multiprocessing.Queue) -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core (x264 sizes its threads to it)
    fmt = StreamFormat(WIDTH, HEIGHT, FPS)
    scenes = [scene(i).tobytes() for i in range(48)]  # three seconds, looped
    with tempfile.TemporaryDirectory() as tmp:
        h264 = H264Encoder(fmt, encoder)
        mp4 = SegmentedRecorder(Path(tmp), "bench", fmt)
        flv = av.open(io.BytesIO(), "w", format="flv")
        flv_stream = None
        per_frame = []
        started = time.perf_counter()
        for index in range(frames):
            t0 = time.perf_counter()
            for packet in h264.encode(scenes[index % len(scenes)], index):
                mp4.write(packet)
                if flv_stream is None:
                    with av.open(io.BytesIO(packet.data), format="h264") as probe:
                        flv_stream = flv.add_stream_from_template(probe.streams.video[0])
                out_packet = av.Packet(packet.data)
                out_packet.pts = out_packet.dts = round(packet.pts * 1000 / FPS)
                out_packet.time_base = flv_stream.time_base = Fraction(1, 1000)
                out_packet.stream = flv_stream
                flv.mux(out_packet)
            per_frame.append(time.perf_counter() - t0)
        for packet in h264.flush():
            mp4.write(packet)
        mp4.close()
        flv.close()
        elapsed = time.perf_counter() - started
        recording = mp4.assemble()  # the segments joined, as a session's MP4 is when it ends
        assert recording is not None, "the recorder wrote no segment"
        size = recording.stat().st_size
    per_frame.sort()
    out.put(
        {
            "fps": frames / elapsed,
            "p50_ms": per_frame[len(per_frame) // 2] * 1e3,
            "p95_ms": per_frame[int(len(per_frame) * 0.95)] * 1e3,
            "kbps": size * 8 / (frames / FPS) / 1e3,
        }
    )


def throughput(frames: int, encoder: str) -> dict[str, float]:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.get_context("fork").Process(target=_throughput, args=(frames, encoder, queue))
    process.start()
    deadline = time.monotonic() + 600
    while True:  # not a bare queue.get: a child that died would leave the run waiting out the timeout
        try:
            result: dict[str, float] = queue.get(timeout=1)
            break
        except Empty:
            if not process.is_alive() or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the encode child ended without a result (exit code {process.exitcode})") from None
    process.join()
    return result


# ---- 2. glass to glass ----------------------------------------------------------------------------
_HOOK = """
([cellHeight, bits]) => {
  const video = document.getElementById('video');
  const canvas = document.createElement('canvas');
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  window.presented = [];
  const onFrame = (now, meta) => {
    if (video.videoWidth) {
      canvas.width = video.videoWidth; canvas.height = cellHeight;
      ctx.drawImage(video, 0, 0, video.videoWidth, cellHeight, 0, 0, video.videoWidth, cellHeight);
      const row = ctx.getImageData(0, cellHeight / 2, video.videoWidth, 1).data;
      const cell = video.videoWidth / bits;
      let index = 0;
      for (let bit = 0; bit < bits; bit++) {
        const x = Math.floor((bit + 0.5) * cell) * 4;
        if (row[x] + row[x + 1] + row[x + 2] > 3 * 128) index |= 1 << bit;
      }
      window.presented.push([index, performance.timeOrigin + meta.presentationTime]);
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}
"""


def _announce(address: str, session_id: str, stop: threading.Event) -> threading.Thread:
    """Open the scheduler link and announce `session_id` as interactive (what the scheduler does for a
    session created with `--latency interactive`); the link stays open until `stop`."""

    def requests() -> Iterator[streamer_pb2.LinkRequest]:
        yield streamer_pb2.LinkRequest(
            session=streamer_pb2.SessionAnnouncement(
                session_id=session_id, webrtc=True, created_at_unix=time.time(),
                latency=common_pb2.LATENCY_MODE_INTERACTIVE,
            )
        )  # fmt: skip
        stop.wait()

    def run() -> None:
        with grpc.insecure_channel(address) as channel:
            for _ in streamer_pb2_grpc.StreamerServiceStub(channel).Link(requests()):
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _session(args: argparse.Namespace, browser: Any, streamer: Any, http: int, mode: str) -> dict[str, float]:
    """One session pushed in real time and played in the browser; its glass-to-glass latencies."""
    session_id = f"g2g-{mode}"
    total = int(args.seconds * FPS)
    scenes = [scene(i) for i in range(48)]
    pushed: dict[int, float] = {}
    stop = threading.Event()
    if mode == "interactive":
        _announce(streamer.address, session_id, stop)
        time.sleep(0.5)  # the announcement is in before the first frame (as a scheduler's always is)

    def frames() -> Iterator[streamer_pb2.PushFramesRequest]:
        started = time.monotonic()
        for index in range(total):
            time.sleep(max(0.0, started + index / FPS - time.monotonic()))  # generated in real time
            pixels = scenes[index % len(scenes)].copy()
            cell_w = WIDTH // BITS
            for bit in range(BITS):
                pixels[:CELL_H, bit * cell_w : (bit + 1) * cell_w] = 255 if index >> bit & 1 else 0
            pushed[index] = time.time() * 1e3  # ms, like performance.timeOrigin
            frame = streamer_pb2.VideoFrame(
                session_id=session_id,
                block_index=index // 3,
                frame_index=index,
                width=WIDTH,
                height=HEIGHT,
                format=streamer_pb2.PIXEL_FORMAT_RGB24,
                data=pixels.tobytes(),
                fps=FPS,
            )
            yield streamer_pb2.PushFramesRequest(frame=frame)

    with grpc.insecure_channel(streamer.address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = streamer_pb2_grpc.StreamerServiceStub(ch)
        pusher = threading.Thread(target=lambda: stub.PushFrames(frames(), timeout=args.seconds + 60))
        pusher.start()
        token = ViewerTokens(SECRET.encode()).mint(session_id)
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{http}/watch/{session_id}#token={token}")
        deadline = time.monotonic() + 30
        while not page.evaluate("document.getElementById('video').readyState >= 2"):  # CSP: no eval
            assert time.monotonic() < deadline, "the viewer page did not start playing"
            time.sleep(0.05)
        page.evaluate(_HOOK, [CELL_H, BITS])
        pusher.join()
        time.sleep(1.0)
        presented: list[list[float]] = page.evaluate("window.presented")
        shown = page.evaluate("[inferixViewer.latency, inferixViewer.displayDelayMs]")
        stream = page.evaluate("inferixViewer.status && inferixViewer.status.stream")
        page.close()
    stop.set()
    # presented times are Chromium's wall clock in ms; the first seconds are not measured (see the docstring)
    skip = args.settle_s * FPS
    latencies = sorted(at - pushed[int(index)] for index, at in presented if int(index) in pushed and index >= skip)
    return {
        "frames": len(latencies),
        "expected": total - skip,
        "p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "p95_ms": latencies[int(len(latencies) * 0.95)] if latencies else float("nan"),
        "min_ms": latencies[0] if latencies else float("nan"),
        "page_mode": shown[0] or "?",
        "page_shown_ms": shown[1] if shown[1] is not None else float("nan"),
        "jitter_buffer_ms": float(stream["jitter_buffer_ms"]) if stream else float("nan"),
        "underruns": float(stream["underruns"]) if stream else float("nan"),
        "underrun_s": float(stream["underrun_s"]) if stream else float("nan"),
    }


def glass_to_glass(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Both latency modes, one session each, in one streamer and one browser."""
    from playwright.sync_api import sync_playwright

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        streamer = start_service(
            "streamer",
            "streamer",
            ["--data-dir", str(workdir / "rec"), "--http-port", "0", "--jitter-buffer-ms", str(args.jitter_buffer_ms)]
            + ["--encoder", args.encoder],
            workdir,
            env={"INFERIX_VIEWER_SECRET": SECRET},
        )
        try:
            http = json.loads((workdir / "streamer.port.json").read_text())["http"]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_FLAGS)
                for mode in ("smooth", "interactive"):
                    print(f"  {mode} ...", flush=True)
                    results[mode] = _session(args, browser, streamer, http, mode)
                browser.close()
        finally:
            streamer.stop()
    return results


def main() -> None:
    args = parse_args()
    print(f"encode+mux {WIDTH}x{HEIGHT} {args.encoder}, one core, {args.frames} frames ...", flush=True)
    encode = throughput(args.frames, args.encoder)
    rows = [
        (
            "encode+mux (MP4 + FLV), 1 core",
            f"{encode['fps']:.1f} fps = {encode['fps'] / FPS:.1f}x real time",
            ">= 3.0x real time",
            f"{encode['fps'] / FPS / 3.0:.2f}",
        ),
        ("  encode+mux per frame p50 / p95", f"{encode['p50_ms']:.1f} / {encode['p95_ms']:.1f} ms", "", ""),
        ("  bitrate (MP4)", f"{encode['kbps']:.0f} kbit/s", "", ""),
    ]
    g2g: dict[str, dict[str, float]] = {}
    if not args.skip_latency:
        print(f"glass to glass: {args.seconds:g} s at {FPS:g} fps into Chromium, per latency mode ...", flush=True)
        g2g = glass_to_glass(args)
        for mode, result in g2g.items():
            target = 60.0 if mode == "interactive" else 250.0
            rows += [
                (
                    f"glass to glass p50, {mode}",
                    f"{result['p50_ms']:.0f} ms",
                    f"<= {target:.0f} ms",
                    f"{target / result['p50_ms']:.2f}",
                ),
                ("  p95 / min", f"{result['p95_ms']:.0f} / {result['min_ms']:.0f} ms",
                 "<= 90 ms" if mode == "interactive" else "", ""),
                ("  streamer jitter buffer at the end", f"{result['jitter_buffer_ms']:.0f} ms", "", ""),
                ("  underruns (whole session)",
                 f"{result['underruns']:.0f} ({result['underrun_s']:.2f} s held)", "", ""),
                ("  page: mode / received->shown p50",
                 f"{result['page_mode']} / {result['page_shown_ms']:.0f} ms", "", ""),
                ("  frames measured", f"{result['frames']} of {result['expected']:.0f}", "", ""),
            ]  # fmt: skip
    print(f"\n{'metric':<42} {'measured':<30} {'target':<20} ratio (>=1 meets)")
    for name, measured, target_text, ratio in rows:
        print(f"{name:<42} {measured:<30} {target_text:<20} {ratio}")
    print()
    for mode, result in g2g.items():  # one line per mode, for scripts comparing runs
        print(f"{mode} glass-to-glass p50 {result['p50_ms']:.0f} ms p95 {result['p95_ms']:.0f} ms")


if __name__ == "__main__":
    main()
