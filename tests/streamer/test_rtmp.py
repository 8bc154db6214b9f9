"""RTMP push and real-time pacing against a real nginx with the RTMP module, started by the suite.

The test plays the scheduler on the streamer's link (announces sessions, hears output events) and
the players are ffprobe pulls of the live stream (`-rtmp_live live`), as an OBS Media Source or
ffplay would read it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix_cli.mesh.launch import ServiceProcess
from inferix_cli.mesh.rtmp_relay import NginxRtmp, nginx_rtmp_missing, start_nginx_rtmp
from tests.streamer.live import (
    RealtimePusher,
    SchedulerLink,
    pull_rtmp,
    start_live_streamer,
    stream_info,
    wait_until,
)
from tests.streamer.media import Video, ffprobe
from tests.streamer.test_service import scrape

ERROR = streamer_pb2.OUTPUT_EVENT_KIND_ERROR
RECOVERED = streamer_pb2.OUTPUT_EVENT_KIND_RECOVERED


@dataclass
class Rig:
    nginx: NginxRtmp
    streamer: ServiceProcess
    stub: streamer_pb2_grpc.StreamerServiceStub
    link: SchedulerLink
    recordings: Path


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    missing = nginx_rtmp_missing()
    if missing is not None:
        pytest.fail(f"{missing}; the RTMP tests need a real server (make system-deps)")
    nginx = start_nginx_rtmp(tmp_path_factory.mktemp("nginx"))
    workdir = tmp_path_factory.mktemp("streamer")
    streamer, _ = start_live_streamer(workdir, rtmp_url=nginx.url)
    channel = grpc.insecure_channel(streamer.address)
    link = SchedulerLink(channel)
    try:
        yield Rig(nginx, streamer, streamer_pb2_grpc.StreamerServiceStub(channel), link, workdir / "recordings")
    finally:
        link.close()
        channel.close()
        code = streamer.stop()
        nginx.stop()
    assert code == 0, f"streamer exited with {code}:\n{streamer.log_tail()}"


def finish(rig: Rig, session_id: str) -> int:
    return rig.stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=session_id), timeout=30).frames


def test_rtmp_stream_is_playable_and_resumes_after_the_server_restarts(rig: Rig) -> None:
    video = Video("rtmp-a", 160, 96, 16.0, (8,) * 30)  # 15 s available; the test stops earlier
    rig.link.announce(video.session_id, rtmp=True, created_at=time.time())
    pusher = RealtimePusher(rig.stub, video).start()
    try:
        wait_until(lambda: stream_info(rig.stub, video.session_id).live.rtmp_state == "connected", 10, "rtmp push")
        url = f"{rig.nginx.url}/{video.session_id}"
        played = pull_rtmp(url, 2.0)
        stream = played.stream
        assert (stream["codec_name"], stream["width"], stream["height"], stream["r_frame_rate"]) == (
            "h264",
            "160",
            "96",
            "16/1",
        ), stream
        assert len(played.packet_times) >= 24 and played.frames >= 12, played  # decoding starts at a keyframe
        assert played.frame_interval_s == pytest.approx(1 / 16, abs=0.002), played.packet_times

        rig.nginx.kill()  # the server drops every connection at once
        lost = rig.link.wait_for(lambda e: e.session_id == video.session_id and e.kind == ERROR, 10)
        assert lost.output == "rtmp" and "lost the connection" in lost.message and "continues" in lost.message
        rig.nginx.restart()
        back = rig.link.wait_for(lambda e: e.session_id == video.session_id and e.kind == RECOVERED, 15)
        assert "reconnected" in back.message
        replayed = pull_rtmp(url, 1.5)
        assert replayed.stream["codec_name"] == "h264" and replayed.frames >= 8, replayed
    finally:
        pusher.stop()
    frames = pusher.join()
    assert finish(rig, video.session_id) == frames  # generation never waited for the outage
    wait_until(lambda: stream_info(rig.stub, video.session_id).live.rtmp_state == "ended", 10, "the live tail")
    live = stream_info(rig.stub, video.session_id).live
    assert live.rtmp_connects == 2 and live.frames_out == frames
    assert scrape(rig.streamer)["inferix_streamer_rtmp_reconnects_total"] >= 1  # this session's second connection
    assert live.dropped_frames["rtmp"] > 0 and live.frames_sent["rtmp"] + live.dropped_frames["rtmp"] <= frames
    recorded = ffprobe(rig.recordings / f"{video.session_id}.mp4")
    assert int(recorded["nb_read_frames"]) == frames  # the MP4 has every frame despite the outage


def test_unreachable_rtmp_server_is_reported_and_the_session_goes_on(rig: Rig) -> None:
    video = Video("rtmp-down", 96, 64, 16.0, (8,) * 4)
    rig.nginx.kill()
    try:
        rig.link.announce(video.session_id, rtmp=True)
        pusher = RealtimePusher(rig.stub, video, ahead_s=2.0).start()
        event = rig.link.wait_for(lambda e: e.session_id == video.session_id and e.kind == ERROR, 10)
        assert "cannot connect to rtmp://" in event.message and "retrying" in event.message
        assert pusher.join() == video.frames
        assert finish(rig, video.session_id) == video.frames
        wait_until(lambda: stream_info(rig.stub, video.session_id).live.frames_out == video.frames, 10, "pacing")
        live = stream_info(rig.stub, video.session_id).live
        assert live.rtmp_state in ("retrying", "ended") and "Connection refused" in live.rtmp_error
        assert live.dropped_frames["rtmp"] > 0 and live.rtmp_connects == 0
        assert int(ffprobe(rig.recordings / f"{video.session_id}.mp4")["nb_read_frames"]) == video.frames
    finally:
        rig.nginx.restart()


def test_live_output_is_paced_at_the_model_frame_rate(rig: Rig) -> None:
    video = Video("paced", 64, 48, 16.0, (48,))  # three seconds of video pushed in one burst
    started = time.monotonic()
    assert rig.stub.PushFrames(video.block(0), timeout=30).accepted == 48
    time.sleep(max(0.0, started + 1.1 - time.monotonic()))
    out = stream_info(rig.stub, video.session_id).live.frames_out
    elapsed = time.monotonic() - started
    assert abs(out - (elapsed - 0.1) * 16) <= 4, (out, elapsed)  # ~16 frames a second, not the burst
    assert finish(rig, video.session_id) == 48  # the MP4 has them all already
    wait_until(lambda: stream_info(rig.stub, video.session_id).live.frames_out == 48, 5, "the paced tail")
    assert time.monotonic() - started == pytest.approx(0.1 + 47 / 16, abs=0.5)
