"""End to end over real gRPC and real processes: sessions, interaction, outputs, errors."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc, worker_pb2, worker_pb2_grpc
from inferix.client import BlockDone, Client, CommandAccepted, PromptChange, SessionError, StateChanged
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import Mesh
from tests.mesh.conftest import KEY_B, generate_digest, stream_info
from tests.streamer.media import ffprobe


def blocks_of(events: list[object]) -> list[BlockDone]:
    return [e for e in events if isinstance(e, BlockDone)]


def states_of(events: list[object]) -> list[str]:
    return [e.state for e in events if isinstance(e, StateChanged)]


def test_session_blocks_arrive_in_order_and_frames_equal_generate(client: Client, mesh: Mesh, tmp_path: Path) -> None:
    schedule = (PromptChange(0, "a red ball bouncing to the right"), PromptChange(2, "the ball turns green"))
    info = client.create_session(list(schedule), num_blocks=4, seed=5)
    assert info.state in ("queued", "running") and info.num_blocks == 4 and (info.width, info.height) == (64, 64)
    events = list(client.events(info.session_id))
    blocks = blocks_of(events)
    assert [b.block_index for b in blocks] == [0, 1, 2, 3]
    assert [b.prompt for b in blocks] == ["a red ball bouncing to the right"] * 2 + ["the ball turns green"] * 2
    # toyworld's VAE does not compress time: 3 video frames per block
    assert [b.first_frame for b in blocks] == [0, 3, 6, 9] and sum(b.num_frames for b in blocks) == 12
    assert states_of(events)[-1] == "completed"
    final = client.get_session(info.session_id)
    assert final.state == "completed" and final.blocks_done == 4

    streamed = stream_info(mesh, info.session_id)
    assert streamed.finished and streamed.frames == 12
    assert streamed.frames_sha256 == generate_digest(schedule, 4, 5)  # bit-exact with the CLI

    mp4 = client.download_recording(final, tmp_path / "session.mp4")
    stream = ffprobe(mp4)
    assert (stream["codec_name"], stream["width"], stream["height"], stream["nb_read_frames"]) == (
        "h264",
        "64",
        "64",
        "12",
    )


def test_generation_keeps_pace_with_playback_of_the_models_frames(client: Client) -> None:
    # 32 blocks of 3 frames = 6 s at 16 fps. The scheduler stays `lookahead` (2) blocks ahead of
    # playback, so the session lasts about 6 s: neither as fast as the CPU allows nor paced as if
    # a block were the Wan VAE's 12 frames (24 s).
    began = time.monotonic()
    info = client.create_session("a red ball bouncing to the right", num_blocks=32, seed=2)
    states = [e.state for e in client.events(info.session_id) if isinstance(e, StateChanged)]
    took = time.monotonic() - began
    assert states[-1] == "completed"
    assert (32 - 2) * 3 / 16 - 0.5 <= took <= 6 * 1.5, f"{took:.1f} s"


def test_prompt_change_pause_resume_and_stop_apply_at_block_boundaries(client: Client) -> None:
    info = client.create_session("a red ball", num_blocks=40, seed=1, lookahead=1)
    events: list[object] = []
    with client.interact(info.session_id) as session:
        stream = session.events()
        for event in stream:
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == 0:
                session.set_prompt("a blue square")
            if isinstance(event, CommandAccepted) and event.command == "set_prompt":
                switch_at = event.applies_at_block
                break
        for event in stream:
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == switch_at:
                session.pause()
            if isinstance(event, StateChanged) and event.state == "paused":
                break
        paused_at = client.get_session(info.session_id).blocks_done
        time.sleep(2.0)
        # at most the block in flight when the pause arrived completes
        assert client.get_session(info.session_id).blocks_done <= paused_at + 1
        session.resume()
        for event in stream:
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index >= paused_at + 2:
                session.stop()
                break
        events.extend(stream)  # until the session ends and the server closes the stream
    blocks = blocks_of(events)
    assert [b.block_index for b in blocks] == list(range(len(blocks)))  # in order, none missing
    assert all(b.prompt == "a red ball" for b in blocks[:switch_at])
    assert all(b.prompt == "a blue square" for b in blocks[switch_at:])
    assert switch_at <= 2  # the next boundary after block 0 finished (one block may be in flight)
    assert states_of(events) == ["running", "paused", "running", "completed"][-len(states_of(events)) :]
    final = client.get_session(info.session_id)
    assert final.state == "completed" and final.blocks_done == len(blocks) < 40


def test_cancel_keeps_what_was_generated(client: Client, mesh: Mesh) -> None:
    info = client.create_session("a red ball", num_blocks=40)
    for event in client.events(info.session_id):
        if isinstance(event, BlockDone):
            break
    cancelled = client.cancel_session(info.session_id)
    assert cancelled.state == "cancelled"
    streamed = stream_info(mesh, info.session_id)
    assert streamed.finished and streamed.frames == 3 * cancelled.blocks_done


def test_prompt_changes_are_rate_limited(client: Client) -> None:
    info = client.create_session("a red ball", num_blocks=40)
    with client.interact(info.session_id, from_block=1 << 30) as session:
        for i in range(30):
            session.set_prompt(f"prompt {i}")
        session.stop()
        replies = [e for e in session.events() if isinstance(e, CommandAccepted | SessionError)]
    limited = [
        e for e in replies if isinstance(e, SessionError) and e.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    ]
    accepted = [e for e in replies if isinstance(e, CommandAccepted) and e.command == "set_prompt"]
    assert limited and "too many prompt changes" in limited[0].message
    assert 1 <= len(accepted) <= 12


def test_api_keys_guard_every_call_and_sessions_are_private(mesh: Mesh, client: Client) -> None:
    own = client.create_session("a red ball", num_blocks=1)
    with Client(mesh.address, timeout=30) as anonymous:
        with pytest.raises(grpc.RpcError) as caught:
            anonymous.list_sessions()
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with Client(mesh.address, api_key="not-a-key-0123456789", timeout=30) as wrong:
        with pytest.raises(grpc.RpcError) as caught:
            wrong.get_session(own.session_id)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with Client(mesh.address, api_key=KEY_B, timeout=30) as bob:
        with pytest.raises(grpc.RpcError) as caught:
            bob.get_session(own.session_id)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as caught:
            bob.cancel_session(own.session_id)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert own.session_id not in {s.session_id for s in bob.list_sessions()}
    assert own.session_id in {s.session_id for s in client.list_sessions()}


@pytest.mark.parametrize(
    ("kwargs", "code", "field"),
    [
        ({"model": "no-such-model"}, grpc.StatusCode.INVALID_ARGUMENT, "spec.model"),
        ({"width": 100, "height": 128}, grpc.StatusCode.INVALID_ARGUMENT, "spec.resolution"),
        ({"num_blocks": 10**6}, grpc.StatusCode.INVALID_ARGUMENT, "spec.num_blocks"),
        ({"prompt": "x" * 3000}, grpc.StatusCode.INVALID_ARGUMENT, "spec.prompts[0].text"),
        ({"prompt": "  "}, grpc.StatusCode.INVALID_ARGUMENT, "spec.prompts[0].text"),
        ({"prompt": [PromptChange(1, "late start")]}, grpc.StatusCode.INVALID_ARGUMENT, "spec.prompts[0].at_block"),
        ({"prompt": [PromptChange(0, "a"), PromptChange(0, "b")]}, grpc.StatusCode.INVALID_ARGUMENT, "at_block"),
        ({"lookahead": 1000}, grpc.StatusCode.INVALID_ARGUMENT, "spec.lookahead"),
    ],
)
def test_invalid_requests_name_the_field(client: Client, kwargs: dict, code: grpc.StatusCode, field: str) -> None:
    args = {"prompt": "a red ball", "num_blocks": 2, **kwargs}
    with pytest.raises(grpc.RpcError) as caught:
        client.create_session(args.pop("prompt"), **args)
    assert caught.value.code() == code
    assert field in caught.value.details()


def test_unknown_session_and_bad_first_command(client: Client) -> None:
    for call in (client.get_session, client.cancel_session):
        with pytest.raises(grpc.RpcError) as caught:
            call("0" * 32)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND and "session_id" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        list(client.events("0" * 32))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_every_service_answers_health_checks(mesh: Mesh) -> None:
    for process in mesh.processes():
        with grpc.insecure_channel(process.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, process.name
            # Watch streams the status (what a scheduler or a load balancer may follow instead of polling)
            watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING, process.name
            watch.cancel()


def test_internal_services_refuse_calls_without_the_mesh_token(client: Client, mesh: Mesh) -> None:
    info = client.create_session("a red ball", num_blocks=1)
    list(client.events(info.session_id))
    request = kvcache_pb2.GetCommittedBlocksRequest(session_id=info.session_id)
    with grpc.insecure_channel(mesh.kvcache.address) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GetCommittedBlocks(request, timeout=10))
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
        replies = list(stub.GetCommittedBlocks(request, timeout=10, metadata=token))
        assert sum(len(reply.blocks) for reply in replies) == 1
    with grpc.insecure_channel(mesh.workers[0].address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            worker_pb2_grpc.WorkerServiceStub(channel).GetStatus(worker_pb2.GetStatusRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_sdk_returns_the_live_playback_urls(client: Client, mesh: Mesh) -> None:
    info = client.create_session("a red ball", num_blocks=1, rtmp=True)
    assert info.rtmp_url.startswith("rtmp://127.0.0.1:") and info.rtmp_url.endswith(f"/{info.session_id}")
    assert f"/watch/{info.session_id}#token=" in info.viewer_url
    assert client.get_session(info.session_id).viewer_url == info.viewer_url
    list(client.events(info.session_id))
