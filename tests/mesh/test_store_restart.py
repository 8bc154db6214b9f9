"""Restart redis-server (persistent) and kvcache_svc, or lose Redis for a while, mid-session: nothing is lost."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix_cli.mesh import start_mesh
from inferix_cli.mesh.launch import start_service
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info
from tests.store.redis_server import start_redis_server


def test_redis_and_kvcache_restart_mid_session(tmp_path: Path) -> None:
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    redis = start_redis_server(redis_dir, persistent=True)
    profile_dir = tmp_path / "worker-profile"  # the worker profiles every block, written on SIGTERM
    config = mesh_config(tmp_path / "mesh", workers=1, redis_url=redis.url(db=0), lookahead=64)
    config.env["INFERIX_PROFILE_DIR"] = str(profile_dir)
    mesh = start_mesh(config)
    try:
        with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
            info = client.create_session("a red ball", num_blocks=6, seed=31)
            events: list[object] = []
            restarted = False
            for event in client.events(info.session_id):
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == 1 and not restarted:
                    restarted = True
                    kvcache = mesh.kvcache
                    assert kvcache.stop() == 0
                    redis.stop()
                    redis = start_redis_server(redis_dir, port=redis.port, persistent=True)
                    args = ["--redis-url", redis.url(db=0), "--heartbeat-timeout", "10"]
                    mesh.kvcache = start_service(
                        "kvcache-restarted", "kvcache_svc", args, mesh.config.workdir, port=kvcache.port
                    )
            final = client.get_session(info.session_id)
        blocks = [e.block_index for e in events if isinstance(e, BlockDone)]
        assert blocks == [0, 1, 2, 3, 4, 5]
        assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
        assert final.state == "completed"
        streamed = stream_info(mesh, info.session_id)
        assert streamed.frames == 6 * 3  # toyworld: 3 video frames per block
        assert streamed.frames_sha256 == generate_digest((PromptChange(0, "a red ball"),), 6, 31)
    finally:
        codes = mesh.stop()
        redis.stop()
    if any(codes.values()):
        pytest.fail(f"services exited with {codes}")
    report = json.loads((profile_dir / "profile-rank0.json").read_text())
    assert report["summary"]["blocks"] == 6
    assert {"denoise_step", "context_pass", "vae_decode"} <= {r["name"] for r in report["regions"]}


def test_redis_away_for_five_seconds_delays_a_session_but_loses_nothing(tmp_path: Path) -> None:
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    redis = start_redis_server(redis_dir, persistent=True)
    mesh = start_mesh(mesh_config(tmp_path / "mesh", workers=1, redis_url=redis.url(db=0), lookahead=64))
    try:
        with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
            info = client.create_session("a red ball", num_blocks=8, seed=33)
            events: list[object] = []
            away = False
            for event in client.events(info.session_id):
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == 1 and not away:
                    away = True
                    redis.stop()
                    time.sleep(5)
                    redis = start_redis_server(redis_dir, port=redis.port, persistent=True)
            final = client.get_session(info.session_id)
        assert [e.block_index for e in events if isinstance(e, BlockDone)] == list(range(8))
        assert final.state == "completed"
        streamed = stream_info(mesh, info.session_id)
        assert streamed.frames == 8 * 3
        assert streamed.frames_sha256 == generate_digest((PromptChange(0, "a red ball"),), 8, 33)
    finally:
        codes = mesh.stop()
        redis.stop()
    assert not any(codes.values()), codes
