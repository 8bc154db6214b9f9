"""The streamer as a real process over real gRPC: recordings checked with ffprobe and decoded with PyAV."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.server import channel as aio_channel
from inferix.telemetry import BLOCK_INDEX_ATTR
from inferix_cli.mesh.launch import ServiceProcess
from tests.otlp import SpanCollector
from tests.streamer.conftest import start_streamer
from tests.streamer.media import Video, decode, ffprobe, mean_abs_error, pattern

Stub = streamer_pb2_grpc.StreamerServiceStub

MAX_MEAN_ABS_ERROR = 8.0  # on 0..255, after RGB -> YUV 4:2:0 -> H.264 -> RGB


def scrape(process: ServiceProcess) -> dict[str, float]:
    """The streamer's Prometheus samples, keyed `name{label=value,...}`."""
    assert process.metrics_port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{process.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def push(stub: Stub, requests: Iterable[streamer_pb2.PushFramesRequest]) -> tuple[int, int]:
    response = stub.PushFrames(iter(requests), timeout=30)
    return response.accepted, response.duplicates


def push_error(stub: Stub, requests: Iterable[streamer_pb2.PushFramesRequest]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.PushFrames(iter(requests), timeout=30)
    return caught.value


def frames_of(stub: Stub, session_id: str) -> int:
    return int(stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=10).frames)


def download(stub: Stub, session_id: str, path: Path) -> Path:
    chunks = stub.GetRecording(streamer_pb2.GetRecordingRequest(session_id=session_id), timeout=30)
    path.write_bytes(b"".join(response.chunk for response in chunks))
    return path


def check_recording(path: Path, video: Video) -> None:
    """ffprobe agrees on codec, size, rate and frame count; every decoded frame matches the one pushed."""
    probe = ffprobe(path)
    assert probe["codec_name"] == "h264", probe
    assert (int(probe["width"]), int(probe["height"])) == (video.width, video.height), probe
    assert probe["pix_fmt"] == "yuv420p", probe
    assert probe["r_frame_rate"] == f"{video.fps:g}/1", probe
    assert int(probe["nb_read_frames"]) == video.frames, probe
    decoded = decode(path)
    assert len(decoded) == video.frames
    errors = [mean_abs_error(frame, pattern(i, video.width, video.height)) for i, frame in enumerate(decoded)]
    assert max(errors) < MAX_MEAN_ABS_ERROR, f"mean abs error per frame: {[round(e, 2) for e in errors]}"


def test_two_sessions_push_concurrently_and_record_playable_mp4s(
    stub: Stub, streamer: ServiceProcess, tmp_path: Path
) -> None:
    alpha = Video("alpha", 96, 64, 16.0, (9, 12, 12))  # Wan-like: 9 frames in the first block, 12 after
    beta = Video("beta", 64, 48, 24.0, (8, 8, 8))
    before = scrape(streamer)

    def worker_alpha() -> list[tuple[int, int]]:
        results = [push(stub, alpha.block(0)), push(stub, alpha.block(1))]
        # a worker dies halfway through block 2; its replacement re-sends the whole block
        results.append(push(stub, alpha.requests(alpha.block_range(2)[:5])))
        results.append(push(stub, alpha.block(2)))
        results.append(push(stub, alpha.block(1)))  # and an already-delivered block once more
        return results

    def worker_beta() -> list[tuple[int, int]]:
        return [push(stub, beta.block(block)) for block in range(3)]

    with ThreadPoolExecutor(2) as pool:
        alpha_results, beta_results = pool.submit(worker_alpha), pool.submit(worker_beta)
        assert alpha_results.result() == [(9, 0), (12, 0), (5, 0), (7, 5), (0, 12)]
        assert beta_results.result() == [(8, 0), (8, 0), (8, 0)]

    info = stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id="alpha"), timeout=10)
    assert (info.session_id, info.frames, info.width, info.height, info.fps, info.finished) == (
        "alpha",
        33,
        96,
        64,
        16.0,
        False,
    )
    assert scrape(streamer)["inferix_streamer_sessions_active"] >= 2
    for video in (alpha, beta):
        finish = streamer_pb2.FinishStreamRequest(session_id=video.session_id)
        assert stub.FinishStream(finish, timeout=30).frames == video.frames
        assert stub.FinishStream(finish, timeout=30).frames == video.frames  # idempotent
        info = stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=video.session_id), timeout=10)
        assert info.finished and info.frames == video.frames
        check_recording(download(stub, video.session_id, tmp_path / f"{video.session_id}.mp4"), video)

    after = scrape(streamer)
    assert delta(before, after, "inferix_streamer_frames_received_total") == alpha.frames + beta.frames
    assert delta(before, after, "inferix_streamer_frames_duplicate_total") == 5 + 12
    # duplicates are skipped before the encoder: one encode per unique frame
    assert delta(before, after, "inferix_streamer_encode_seconds_count") == alpha.frames + beta.frames
    assert after["inferix_streamer_sessions_active"] == before.get("inferix_streamer_sessions_active", 0)


def test_bad_frames_are_rejected_and_the_session_stays_intact(
    stub: Stub, streamer: ServiceProcess, tmp_path: Path
) -> None:
    video = Video("gamma", 96, 64, 16.0, (4, 4))
    assert push(stub, video.block(0)) == (4, 0)
    before = scrape(streamer)
    bad_frames = {
        "width": (video.frame(4, width=128), "frame.width must be 96"),
        "height": (video.frame(4, height=48), "frame.height must be 64"),
        "data": (video.frame(4, data=b"\x00" * 100), "frame.data must hold width*height*3 = 18432 bytes"),
        "frame_index": (video.frame(6), "frame.frame_index must be 4"),
        "format": (video.frame(4, format=streamer_pb2.PIXEL_FORMAT_UNSPECIFIED), "must be PIXEL_FORMAT_RGB24"),
        "fps": (video.frame(4, fps=24.0), "frame.fps must be 16"),
    }
    for field, (frame, message) in bad_frames.items():
        error = push_error(stub, [streamer_pb2.PushFramesRequest(frame=frame)])
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, error)
        assert message in (error.details() or ""), (field, error.details())
        assert frames_of(stub, "gamma") == 4, field

    # good frames before a bad one in the same call are kept
    good_then_gap = [*video.requests([4, 5]), streamer_pb2.PushFramesRequest(frame=video.frame(7))]
    error = push_error(stub, good_then_gap)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "frame.frame_index must be 6" in (error.details() or "") and "accepted 2" in (error.details() or "")
    assert frames_of(stub, "gamma") == 6
    assert push(stub, video.requests([6, 7])) == (2, 0)
    assert stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id="gamma"), timeout=30).frames == 8
    check_recording(download(stub, "gamma", tmp_path / "gamma.mp4"), video)

    after = scrape(streamer)
    for field in bad_frames:
        expected = 2 if field == "frame_index" else 1
        assert delta(before, after, f"inferix_streamer_frames_rejected_total{{reason={field}}}") == expected, field


def test_a_block_pushed_in_one_call_is_admitted_frame_by_frame(
    stub: Stub, streamer: ServiceProcess, tmp_path: Path
) -> None:
    """PushBlock, as workers push: a block's frames in one message, admitted as PushFrames admits them:
    frames sent before are skipped, and those before a refused frame are kept."""
    video = Video("block-call", 96, 64, 16.0, (4, 4, 4))

    def push_block(indices: Iterable[int]) -> streamer_pb2.PushFramesResponse:
        request = streamer_pb2.PushBlockRequest(frames=[video.frame(i) for i in indices])
        return stub.PushBlock(request, timeout=30)

    before = scrape(streamer)
    first = push_block(video.block_range(0))
    assert (first.accepted, first.duplicates) == (4, 0)
    again = push_block(range(2, 8))  # two frames re-sent, then four new ones
    assert (again.accepted, again.duplicates) == (4, 2)
    with pytest.raises(grpc.RpcError) as caught:
        push_block([8, 9, 11])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert "frame.frame_index must be 10" in details and "accepted 2" in details, details
    assert frames_of(stub, "block-call") == 10
    assert push_block([10, 11]).accepted == 2
    finish = streamer_pb2.FinishStreamRequest(session_id="block-call", frames=12)
    assert stub.FinishStream(finish, timeout=30).frames == 12
    check_recording(download(stub, "block-call", tmp_path / "block-call.mp4"), video)
    after = scrape(streamer)
    assert delta(before, after, "inferix_streamer_frames_received_total") == 12
    assert delta(before, after, "inferix_streamer_frames_duplicate_total") == 2
    assert delta(before, after, "inferix_streamer_frames_rejected_total{reason=frame_index}") == 1


def test_a_bad_first_frame_opens_no_session(stub: Stub) -> None:
    cases = {
        "width": (Video("odd", 95, 64, 16.0, (1,)).frame(0), "positive even number"),
        "fps": (Video("still", 64, 64, 0.0, (1,)).frame(0), "positive frame rate"),
        "session_id": (Video("../escape", 64, 64, 16.0, (1,)).frame(0), "frame.session_id must be"),
        "format": (Video("yuv", 64, 64, 16.0, (1,)).frame(0, format=7), "got unknown value 7"),
    }
    # A session that starts mid-way (this streamer restarted): OUT_OF_RANGE tells the sender to re-send from 0.
    late = ("frame_index", (Video("late", 64, 64, 16.0, (1,)).frame(5), "send its video from frame 0"))
    for field, (frame, message) in [*cases.items(), late]:
        error = push_error(stub, [streamer_pb2.PushFramesRequest(frame=frame)])
        code = grpc.StatusCode.OUT_OF_RANGE if frame.session_id == "late" else grpc.StatusCode.INVALID_ARGUMENT
        assert error.code() == code, (field, error)
        assert message in (error.details() or ""), (field, error.details())
        with pytest.raises(grpc.RpcError) as caught:
            frames_of(stub, frame.session_id)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND, field


def test_unknown_sessions_unfinished_recordings_and_late_frames(stub: Stub, streamer: ServiceProcess) -> None:
    calls = {
        "GetStreamInfo": lambda: stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id="nope"), timeout=10),
        "FinishStream": lambda: stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id="nope"), timeout=10),
        "GetRecording": lambda: list(
            stub.GetRecording(streamer_pb2.GetRecordingRequest(session_id="nope"), timeout=10)
        ),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND, name
        assert "no session 'nope'" in (caught.value.details() or ""), name

    video = Video("epsilon", 64, 48, 16.0, (3,))
    assert push(stub, video.block(0)) == (3, 0)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.GetRecording(streamer_pb2.GetRecordingRequest(session_id="epsilon"), timeout=10))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "call FinishStream first" in (caught.value.details() or "")

    assert stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id="epsilon"), timeout=30).frames == 3
    before = scrape(streamer)
    error = push_error(stub, video.requests([3]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is finished with 3 frames" in (error.details() or "")
    assert push(stub, video.block(0)) == (0, 3)  # re-sends stay harmless after the end
    assert frames_of(stub, "epsilon") == 3
    assert delta(before, scrape(streamer), "inferix_streamer_frames_rejected_total{reason=finished}") == 1


def test_health_check_answers_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "inferix.v1.StreamerService"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service


def test_sigterm_journals_open_sessions_exports_spans_and_exits_zero(tmp_path: Path) -> None:
    collector = SpanCollector().start()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)  # as a traced worker would send
    env = collector.env
    process = start_streamer(tmp_path, env=env)
    try:
        video = Video("zeta", 64, 48, 16.0, (6, 6))
        with grpc.insecure_channel(process.address) as channel:
            stub = Stub(channel)
            for block in range(2):
                assert stub.PushFrames(video.block(block), metadata=traceparent, timeout=30).accepted == 6
        code = process.stop()  # no FinishStream: shutdown closes the open session's recording and journals it
    finally:
        process.kill()
        collector.stop()
    assert code == 0, f"streamer exited with {code}:\n{process.log_tail()}"
    recordings = tmp_path / "recordings"
    assert sorted(p.name for p in recordings.iterdir()) == ["zeta.journal.json", "zeta.segments"]
    assert json.loads((recordings / "zeta.journal.json").read_text())["frames"] == 12  # every frame is durable
    segments = sorted((recordings / "zeta.segments").iterdir())
    assert [p.name for p in segments] == ["0000000000.mp4"], "an unfinished .part file was left behind"
    check_recording(segments[0], video)

    encode_spans = [span for span in collector.spans if span.name == "streamer.encode"]
    attributes = [{a.key: a.value.int_value for a in span.attributes} for span in encode_spans]
    assert sorted((a[BLOCK_INDEX_ATTR], a["inferix.frames"]) for a in attributes) == [(0, 6), (1, 6)]
    # each block's encode belongs to the trace of the push that delivered it
    assert {span.trace_id.hex() for span in encode_spans} == {trace_id}
    push_spans = {span.span_id for span in collector.spans if span.name.endswith("/PushFrames")}
    assert push_spans and all(span.parent_span_id in push_spans for span in encode_spans)


def test_help_lists_the_streamer_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    for option in (
        "--data-dir",
        "--encoder",
        "--port-file",
        "--metrics-port",
        "--http-port",
        "--rtmp-url",
        "--viewer-secret-file",
        "--jitter-buffer-ms",
        "--underrun-policy",
    ):
        assert option in result.stdout, option


def test_a_refused_push_reaches_an_aio_sender_as_its_refusal_even_mid_stream(streamer: ServiceProcess) -> None:
    """A worker (grpc.aio) pushes a block of large frames to a streamer that lost the session. The
    streamer refuses at the first frame; the sender must read OUT_OF_RANGE (its cue to re-send from
    frame 0), never the INTERNAL "Failed execute_batch" that a status sent while it still writes gives."""
    # Blocks larger than the HTTP/2 window, so the sender is mid-write when the refusal comes; the
    # INTERNAL it got before the fix showed up under CPU load (one in a few dozen pushes).
    video = Video("lost", 512, 512, 16.0, (16, 16))
    pushes_made = 16

    async def pushes() -> list[grpc.StatusCode]:
        codes = []
        async with aio_channel(streamer.address) as chan:
            aio_stub = streamer_pb2_grpc.StreamerServiceStub(chan)
            for _ in range(pushes_made):
                try:
                    await aio_stub.PushFrames(video.block(1), timeout=30)
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code())
        return codes

    assert asyncio.run(pushes()) == [grpc.StatusCode.OUT_OF_RANGE] * pushes_made
