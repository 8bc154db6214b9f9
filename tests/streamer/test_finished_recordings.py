"""Finished recordings outlive the streamer process (`streamer/finished.py`), on real processes.

A streamer records sessions, is SIGKILLed, and a new one starts on the same recordings folder: it
serves every recording the first one finished (GetRecording, HTTP with Range, GetStreamInfo with the
frame count and frames SHA-256, a repeated FinishStream, re-sent frames skipped), and never a
recording that was in progress, cut short by a shutdown, or changed on disk since.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.frames_digest import FramesDigest
from inferix.viewer_token import ViewerTokens
from inferix_cli.mesh.launch import ServiceProcess
from tests.streamer.live import SECRET, start_live_streamer, wait_until
from tests.streamer.media import Video, ffprobe, pattern

Stub = streamer_pb2_grpc.StreamerServiceStub
TOKENS = ViewerTokens(SECRET.encode())


def frames_sha256(video: Video) -> str:
    digest = FramesDigest()
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
        partial = recordings / "in-progress.segments" / "0000000000.mp4.part"  # no segment closed yet
        wait_until(partial.is_file, 10, "the partial recording")
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


def test_a_shutdown_journals_every_frame_and_a_changed_file_is_never_served(tmp_path: Path) -> None:
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
        assert first.stop() == 0  # SIGTERM closes the open session's recording and journals it; it did not end
        recordings = tmp_path / "recordings"
        assert (
            not (recordings / "cut-by-sigterm.mp4").exists() and not (recordings / "cut-by-sigterm.mp4.json").exists()
        )
        truncated = recordings / "then-truncated.mp4"
        truncated.write_bytes(truncated.read_bytes()[:-10])

        second, http_port = start_live_streamer(tmp_path)
        with grpc.insecure_channel(second.address) as channel:
            stub = Stub(channel)
            # the next streamer holds all 6 frames of the cut session, not finished, and serves no recording
            resumed = info(stub, cut.session_id)
            assert (resumed.frames, resumed.finished, resumed.frames_sha256) == (6, False, frames_sha256(cut))
            with pytest.raises(grpc.RpcError) as caught:
                grpc_bytes(stub, cut.session_id)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value
            # a FinishStream that does not say how many frames it has cannot tell whether any are missing
            with pytest.raises(grpc.RpcError) as caught:
                stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=cut.session_id), timeout=30)
            assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "does not say how many" in (caught.value.details() or "")
            # its worker finishes it without re-sending a frame
            finish = streamer_pb2.FinishStreamRequest(session_id=cut.session_id, frames=6)
            assert stub.FinishStream(finish, timeout=30).frames == 6
            (tmp_path / "cut.mp4").write_bytes(grpc_bytes(stub, cut.session_id))
            assert ffprobe(tmp_path / "cut.mp4")["nb_read_frames"] == "6"
            assert not (recordings / "cut-by-sigterm.segments").exists()
            message = not_found(lambda: info(stub, done.session_id))
            assert "not the one that was finished" in message, message
            assert http_get(http_port, done.session_id)[0] == 404
            not_found(lambda: info(stub, "..%2Fetc"))
    finally:
        first.kill()
        if second is not None:
            assert second.stop() == 0, second.log_tail()
    assert "then-truncated.mp4 has" in second.log_path.read_text()


def test_a_streamer_killed_mid_session_goes_on_after_its_last_durable_segment(tmp_path: Path) -> None:
    """SIGKILL loses only the segment in progress: the next process asks for the frames after the
    journal's last one, skips earlier ones as duplicates, and the recording ends up whole."""
    video = Video("killed-mid-session", 64, 48, 16.0, (6,) * 6)  # 36 frames; segments of 8 (0.5 s)
    first, _ = start_live_streamer(tmp_path, extra=["--segment-seconds", "0.5"])
    second: ServiceProcess | None = None
    recordings = tmp_path / "recordings"
    journal = recordings / "killed-mid-session.journal.json"
    try:
        with grpc.insecure_channel(first.address) as channel:
            stub = Stub(channel)
            durable = [stub.PushFrames(video.block(block), timeout=30).durable_frames for block in range(5)]
        assert durable == sorted(durable) and durable[-1] <= 24, durable  # reported as segments close
        wait_until(lambda: journal.is_file() and json.loads(journal.read_text())["frames"] == 24, 10, "segment 3")

        second, _ = restart(first, tmp_path)
        with grpc.insecure_channel(second.address) as channel:
            stub = Stub(channel)
            resumed = info(stub, video.session_id)
            assert (resumed.frames, resumed.finished) == (24, False)
            assert resumed.frames_sha256 == frames_sha256(replace(video, blocks=(24,)))
            with pytest.raises(grpc.RpcError) as caught:  # the worker's next block: past what is here
                stub.PushFrames(video.block(5), timeout=30)
            assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "send its video from frame 24" in (caught.value.details() or "")
            early = streamer_pb2.FinishStreamRequest(session_id=video.session_id, frames=36)
            with pytest.raises(grpc.RpcError) as caught:
                stub.FinishStream(early, timeout=30)
            assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "re-send from frame 24" in (caught.value.details() or "")
            # the worker re-sends from frame 24 (here: from 18, the block holding it), then the new block
            sent = stub.PushFrames(video.requests(range(18, 30)), timeout=30)
            assert (sent.duplicates, sent.accepted) == (6, 6)
            stub.PushFrames(video.block(5), timeout=30)
            wrong = streamer_pb2.FinishStreamRequest(session_id=video.session_id, frames=40)
            with pytest.raises(grpc.RpcError) as caught:
                stub.FinishStream(wrong, timeout=30)
            assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
            # a sender that knows fewer frames than are here (its predecessor pushed a block it never
            # committed) gets the recording as it is: nothing is missing
            fewer = streamer_pb2.FinishStreamRequest(session_id=video.session_id, frames=33)
            assert stub.FinishStream(fewer, timeout=30).frames == 36
            assert info(stub, video.session_id).frames_sha256 == frames_sha256(video)
            (tmp_path / "whole.mp4").write_bytes(grpc_bytes(stub, video.session_id))
        assert ffprobe(tmp_path / "whole.mp4")["nb_read_frames"] == "36"
        assert not journal.exists() and not (recordings / "killed-mid-session.segments").exists()
        assert "resumed after frame 23, from its recording journal" in second.log_path.read_text()
    finally:
        first.kill()
        if second is not None:
            assert second.stop() == 0, second.log_tail()
