"""Finished recordings outlive the streamer process (`streamer/finished.py`), on real processes.

A streamer records sessions, is SIGKILLed, and a new one starts on the same recordings folder: it
serves every recording the first one finished (GetRecording, HTTP with Range, GetStreamInfo with the
frame count and frames SHA-256, a repeated FinishStream, re-sent frames skipped), and never a
recording that was in progress, cut short by a shutdown, or changed on disk since.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.viewer_token import ViewerTokens
from inferix_cli.mesh.launch import ServiceProcess
from tests.streamer.live import SECRET, start_live_streamer, wait_until
from tests.streamer.media import Video, pattern

Stub = streamer_pb2_grpc.StreamerServiceStub
TOKENS = ViewerTokens(SECRET.encode())


def frames_sha256(video: Video) -> str:
    digest = hashlib.sha256()
    for index in range(video.frames):
        digest.update(pattern(index, video.width, video.height).tobytes())
    return digest.hexdigest()


def info(stub: Stub, session_id: str) -> streamer_pb2.GetStreamInfoResponse:
    return stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=10)


def grpc_bytes(stub: Stub, session_id: str) -> bytes:
    chunks = stub.GetRecording(streamer_pb2.GetRecordingRequest(session_id=session_id), timeout=30)
    return b"".join(chunk.chunk for chunk in chunks)


def http_get(http_port: int, session_id: str, byte_range: str = "") -> tuple[int, bytes, dict[str, str]]:
    headers = {"Authorization": f"Bearer {TOKENS.mint(session_id)}"}
    if byte_range:
        headers["Range"] = byte_range
    url = f"http://127.0.0.1:{http_port}/recordings/{session_id}.mp4"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def not_found(call: object) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value
    return caught.value.details() or ""


def restart(streamer: ServiceProcess, workdir: Path) -> tuple[ServiceProcess, int]:
    assert streamer.kill() == -9, streamer.log_tail()
    return start_live_streamer(workdir)


def test_a_restarted_streamer_serves_what_the_last_one_finished(tmp_path: Path) -> None:
    done = Video("finished-before", 96, 64, 16.0, (9, 12, 12))
    cut = Video("in-progress", 64, 48, 16.0, (6, 6))
    first, _ = start_live_streamer(tmp_path)
    second: ServiceProcess | None = None
    try:
        with grpc.insecure_channel(first.address) as channel:
            stub = Stub(channel)
            for block in range(3):
                stub.PushFrames(done.block(block), timeout=30)
            assert (
                stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=done.session_id), timeout=30).frames == 33
            )
            before = info(stub, done.session_id)
            mp4 = grpc_bytes(stub, done.session_id)
            stub.PushFrames(cut.block(0), timeout=30)  # never finished: the streamer dies first
        assert before.frames_sha256 == frames_sha256(done)
        recordings = tmp_path / "recordings"
        # the encoder thread writes asynchronously: kill once the partial recording is on disk
        wait_until(lambda: (recordings / "in-progress.mp4.part").is_file(), 10, "the partial recording")
        assert (recordings / "finished-before.mp4.json").is_file()
        assert not (recordings / "in-progress.mp4.json").exists()

        second, http_port = restart(first, tmp_path)
        with grpc.insecure_channel(second.address) as channel:
            stub = Stub(channel)
            after = info(stub, done.session_id)
            assert (after.frames, after.frames_sha256, after.finished) == (33, before.frames_sha256, True)
            assert (after.width, after.height, after.fps) == (96, 64, 16.0)
            assert grpc_bytes(stub, done.session_id) == mp4
            status, body, _ = http_get(http_port, done.session_id)
            assert status == 200 and body == mp4
            status, part, headers = http_get(http_port, done.session_id, "bytes=100-299")
            assert status == 206 and part == mp4[100:300], (status, headers)
            assert headers["Content-Range"] == f"bytes 100-299/{len(mp4)}"
            # the worker's repeated FinishStream and re-sent frames are answered as before the restart
            assert (
                stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=done.session_id), timeout=30).frames == 33
            )
            assert stub.PushFrames(done.block(2), timeout=30).duplicates == 12
            with pytest.raises(grpc.RpcError) as caught:
                stub.PushFrames(done.requests([33]), timeout=30)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "is finished with 33 frames" in (caught.value.details() or "")

            # the recording in progress is not served: not over gRPC, not over HTTP, not as stream info
            message = not_found(lambda: grpc_bytes(stub, cut.session_id))
            assert "its recording was not finished" in message, message
            not_found(lambda: info(stub, cut.session_id))
            assert http_get(http_port, cut.session_id)[0] == 404
            # its worker re-sends it from frame 0; then it is recorded whole and served
            with pytest.raises(grpc.RpcError) as caught:
                stub.PushFrames(cut.block(1), timeout=30)
            assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
            for block in range(2):
                stub.PushFrames(cut.block(block), timeout=30)
            assert (
                stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=cut.session_id), timeout=30).frames == 12
            )
            assert info(stub, cut.session_id).frames_sha256 == frames_sha256(cut)
    finally:
        first.kill()
        if second is not None:
            assert second.stop() == 0, second.log_tail()


def test_a_shutdown_cut_short_or_a_changed_file_is_never_served_as_finished(tmp_path: Path) -> None:
    cut = Video("cut-by-sigterm", 64, 48, 16.0, (6,))
    done = Video("then-truncated", 64, 48, 16.0, (6,))
    first, _ = start_live_streamer(tmp_path)
    second: ServiceProcess | None = None
    try:
        with grpc.insecure_channel(first.address) as channel:
            stub = Stub(channel)
            stub.PushFrames(cut.block(0), timeout=30)
            stub.PushFrames(done.block(0), timeout=30)
            stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=done.session_id), timeout=30)
        assert first.stop() == 0  # SIGTERM finalizes the open session's MP4, but it did not end
        recordings = tmp_path / "recordings"
        assert (recordings / "cut-by-sigterm.mp4").is_file() and not (recordings / "cut-by-sigterm.mp4.json").exists()
        truncated = recordings / "then-truncated.mp4"
        truncated.write_bytes(truncated.read_bytes()[:-10])

        second, http_port = start_live_streamer(tmp_path)
        with grpc.insecure_channel(second.address) as channel:
            stub = Stub(channel)
            assert "its recording was not finished" in not_found(lambda: grpc_bytes(stub, cut.session_id))
            message = not_found(lambda: info(stub, done.session_id))
            assert "not the one that was finished" in message, message
            assert http_get(http_port, done.session_id)[0] == 404
            not_found(lambda: info(stub, "..%2Fetc"))
    finally:
        first.kill()
        if second is not None:
            assert second.stop() == 0, second.log_tail()
    assert "then-truncated.mp4 has" in second.log_path.read_text()
