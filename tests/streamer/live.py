"""Helpers for the live-output tests: the test as the scheduler on the link, real-time pushing, RTMP pulls."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix_cli.mesh.launch import ServiceProcess, start_service
from tests.streamer.media import Video, ffprobe_path

SECRET = "test-viewer-secret-0123456789abcdef"


def start_live_streamer(
    workdir: Path, rtmp_url: str = "", extra: list[str] | None = None, env: dict[str, str] | None = None
) -> tuple[ServiceProcess, int]:
    """`python -m streamer` with the viewer page on a free port (RTMP push when given); returns (process, http port)."""
    args = ["--data-dir", str(workdir / "recordings"), "--http-port", "0", *(extra or [])]
    if rtmp_url:
        args += ["--rtmp-url", rtmp_url]
    process = start_service(
        "streamer", "streamer", args, workdir, env={"INFERIX_VIEWER_SECRET": SECRET, **(env or {})}, metrics=True
    )
    http_port = int(json.loads((workdir / "streamer.port.json").read_text())["http"])
    return process, http_port


class SchedulerLink:
    """The test plays the scheduler on the streamer's Link: it announces sessions and collects output events."""

    def __init__(self, channel: grpc.Channel, scheduler_address: str = "") -> None:
        self._requests: queue.Queue[streamer_pb2.LinkRequest | None] = queue.Queue()
        self._requests.put(streamer_pb2.LinkRequest(hello=streamer_pb2.LinkHello(scheduler_address=scheduler_address)))
        self.events: list[streamer_pb2.LinkResponse] = []
        self._cond = threading.Condition()
        self._call = streamer_pb2_grpc.StreamerServiceStub(channel).Link(iter(self._requests.get, None))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # cancelled by close()

    def announce(self, session_id: str, rtmp: bool = False, webrtc: bool = True, created_at: float = 0.0) -> None:
        announcement = streamer_pb2.SessionAnnouncement(
            session_id=session_id, rtmp=rtmp, webrtc=webrtc, created_at_unix=created_at
        )
        self._requests.put(streamer_pb2.LinkRequest(session=announcement))

    def wait_for(
        self, predicate: Callable[[streamer_pb2.LinkResponse], bool], timeout: float
    ) -> streamer_pb2.LinkResponse:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((e for e in self.events if predicate(e)), None)
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no matching link event within {timeout}s; got {list(self.events)}"
                self._cond.wait(remaining)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._thread.join(5)


@dataclass
class RealtimePusher:
    """Pushes a session's blocks the way a worker under the scheduler does: at most `ahead_s` ahead of real time."""

    stub: streamer_pb2_grpc.StreamerServiceStub
    video: Video
    ahead_s: float = 0.5
    pushed: int = 0
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> RealtimePusher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        try:
            for block in range(len(self.video.blocks)):
                if self._stop.is_set():
                    return
                frames = self.video.block_range(block)
                due = started + frames.start / self.video.fps - self.ahead_s
                time.sleep(max(0.0, due - time.monotonic()))
                self.stub.PushFrames(self.video.block(block), timeout=30)
                self.pushed = frames.stop
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 60.0) -> int:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the pusher did not finish"
        if self.error is not None:
            raise self.error
        return self.pushed

    def stop(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class Played:
    """What a player got from an RTMP URL."""

    stream: dict[str, str]  # ffprobe's view of the video stream; nb_read_frames = frames decoded
    packet_times: list[float]  # presentation times of the packets read (seconds)

    @property
    def frames(self) -> int:
        return int(self.stream["nb_read_frames"])

    @property
    def frame_interval_s(self) -> float:
        """Median spacing of the packets' timestamps: 1 / fps for a stream paced at the model's rate."""
        gaps = sorted(b - a for a, b in zip(self.packet_times, self.packet_times[1:], strict=False))
        return gaps[len(gaps) // 2]


def pull_rtmp(url: str, seconds: float, timeout: float = 20.0) -> Played:
    """Play `url` like a player for `seconds` of stream time (decoding starts at a keyframe, as players do)."""
    out = subprocess.run(
        [
            ffprobe_path(),
            "-v",
            "error",
            "-rtmp_live",
            "live",
            "-fflags",
            "nobuffer",
            "-analyzeduration",
            "500000",
            "-read_intervals",
            f"%+{seconds}",
            "-count_frames",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=codec_name,width,height,r_frame_rate,nb_read_frames:packet=pts_time",
            "-of",
            "json",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    result = json.loads(out.stdout or "{}")
    streams = result.get("streams", [])
    assert out.returncode == 0 and len(streams) == 1, f"ffprobe {url}: rc={out.returncode} {out.stdout} {out.stderr}"
    times = [float(p["pts_time"]) for p in result.get("packets", []) if "pts_time" in p]
    return Played({key: str(value) for key, value in streams[0].items()}, times)


def stream_info(stub: streamer_pb2_grpc.StreamerServiceStub, session_id: str) -> streamer_pb2.GetStreamInfoResponse:
    """The session's info; an empty one while no frame has arrived yet (NOT_FOUND)."""
    try:
        return stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=10)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return streamer_pb2.GetStreamInfoResponse()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)


@contextlib.contextmanager
def playing(streamer: ServiceProcess, video: Video) -> Iterator[None]:
    """`video` announced on the streamer's link and pushed in real time while the block runs (the test
    plays the scheduler and the worker); then the streamer is stopped, which must exit 0."""
    channel = grpc.insecure_channel(streamer.address)  # frames from workers: the mesh's plaintext port
    link = SchedulerLink(channel)
    link.announce(video.session_id)
    pusher = RealtimePusher(streamer_pb2_grpc.StreamerServiceStub(channel), video).start()
    try:
        yield
    finally:
        pusher.stop()
        link.close()
        channel.close()
        assert streamer.stop() == 0, streamer.log_tail()
