"""A TLS mesh (`inferix serve --tls-cert/--tls-key`) serves sessions end to end: the SDK (sync and
async), the CLI, the health probe, and the viewer page's commands through the scheduler's internal port."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

from inferix.client import AsyncClient, BlockDone, Client, StateChanged
from inferix.health import check
from inferix_cli.mesh import Mesh
from inferix_cli.mesh.launch import ServiceProcess
from tests.mesh.conftest import KEY_A
from tests.tls.conftest import Pki, inferix_cli


def test_the_mesh_serves_tls_to_clients_only(tls_mesh: Mesh) -> None:
    assert tls_mesh.address == f"grpcs://{tls_mesh.scheduler.address}"
    assert tls_mesh.internal_address != tls_mesh.scheduler.address  # the mesh's own plaintext port
    serving, status = check(tls_mesh.scheduler.address)
    assert not serving and status.startswith("UNAVAILABLE"), status


def test_sdk_session_end_to_end(tls_mesh: Mesh, pki: Pki, tmp_path: Path) -> None:
    with Client(tls_mesh.address, api_key=KEY_A, ca=pki.ca.cert_path, timeout=60) as client:
        info = client.create_session("a red ball bouncing", num_blocks=2, seed=3)
        events = list(client.events(info.session_id))
        assert [e.block_index for e in events if isinstance(e, BlockDone)] == [0, 1]
        assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
        final = client.get_session(info.session_id)
        assert final.state == "completed" and final.blocks_done == 2
        # The viewer page's status goes from the streamer to the scheduler's internal (plaintext) port.
        page = final.viewer_url.partition("#")[0].replace("/watch/", "/api/sessions/")
        token = final.viewer_url.partition("#token=")[2]
        assert page.startswith("https://")  # the viewer page is served over HTTPS with the mesh's pair
        request = urllib.request.Request(page, headers={"Authorization": f"Bearer {token}"})
        trusting = ssl.create_default_context(cafile=pki.ca.cert_path)
        with urllib.request.urlopen(request, timeout=30, context=trusting) as reply:
            assert reply.status == 200 and info.session_id in json.dumps(json.load(reply))
        mp4 = client.download_recording(final, tmp_path / "session.mp4")  # from the streamer, in the mesh
        assert mp4.stat().st_size > 0


def test_async_sdk_session(tls_mesh: Mesh, pki: Pki) -> None:
    async def run() -> list[int]:
        ca = pki.ca.cert_path.read_bytes()
        async with AsyncClient(tls_mesh.scheduler.address, api_key=KEY_A, tls=True, ca=ca, timeout=60) as client:
            info = await client.create_session("a green ball", num_blocks=2)
            return [e.block_index async for e in client.events(info.session_id) if isinstance(e, BlockDone)]

    assert asyncio.run(run()) == [0, 1]


def test_cli_session_end_to_end(tls_mesh: Mesh, pki: Pki) -> None:
    env = {"INFERIX_SERVER": tls_mesh.address, "INFERIX_CA": str(pki.ca.cert_path), "INFERIX_API_KEY": KEY_A}
    created = inferix_cli("session", "create", "--prompt", "a blue square", "--blocks", "2", "--watch", env=env)
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.splitlines()[0]
    assert "state completed" in created.stdout
    got = inferix_cli("session", "get", session_id, env=env)
    assert got.returncode == 0 and f"{session_id}  completed" in got.stdout, got.stderr
    # The same with flags, and --tls on a plain HOST:PORT.
    listed = inferix_cli(
        "session", "--server", tls_mesh.scheduler.address, "--tls", "--ca", str(pki.ca.cert_path), "--api-key", KEY_A,
        "list",
    )  # fmt: skip
    assert listed.returncode == 0 and session_id in listed.stdout, listed.stderr


def test_health_probe_command_over_tls(tls_mesh: Mesh, pki: Pki) -> None:
    probe = [sys.executable, "-m", "inferix.health", tls_mesh.address, "inferix.v1.SchedulerService"]
    served = subprocess.run([*probe, "--ca", str(pki.ca.cert_path)], capture_output=True, text=True, timeout=60)
    assert served.returncode == 0 and served.stdout.strip().endswith("SERVING"), served.stderr
    refused = subprocess.run(probe, capture_output=True, text=True, timeout=60)  # the system's roots
    assert refused.returncode == 1 and "UNAVAILABLE" in refused.stderr, refused.stderr


def test_a_restarted_scheduler_serves_tls_again(tls_mesh: Mesh, pki: Pki) -> None:
    """`inferix serve` restarts a scheduler that died where clients expect it: the same port, TLS again."""
    before = tls_mesh.scheduler
    before.kill()
    relaunched = tls_mesh.relaunch(before)
    assert not isinstance(relaunched, ServiceProcess)
    tls_mesh.replace(relaunched.wait())
    assert tls_mesh.scheduler.port == before.port and tls_mesh.scheduler.pid != before.pid
    with Client(tls_mesh.address, api_key=KEY_A, ca=pki.ca.cert_path, timeout=60) as client:
        assert isinstance(client.list_sessions(), list)
    assert check(tls_mesh.internal_address, "inferix.v1.SchedulerService") == (True, "SERVING")


def test_lvbench_runs_over_tls(tls_mesh: Mesh, pki: Pki, tmp_path: Path) -> None:
    """`inferix lvbench run` takes --tls / --ca as `inferix session` does (inferix_cli/scheduler_address.py)."""
    annotations = tmp_path / "annotations.json"
    video = {"video_id": "ball", "captions": [{"start": 0.0, "end": 0.5, "text": "a red ball bouncing"}]}
    annotations.write_text(json.dumps({"videos": [video]}))
    out = tmp_path / "videos"
    args = ["lvbench", "run", "--annotations", str(annotations), "--out", str(out), "--api-key", KEY_A, "--quiet"]
    served = inferix_cli(*args, "--server", tls_mesh.scheduler.address, "--tls", "--ca", str(pki.ca.cert_path))
    assert served.returncode == 0 and "1 of 1 videos" in served.stdout, served.stdout + served.stderr
    assert (out / "ball.mp4").stat().st_size > 0
    missing = inferix_cli(*args, "--server", tls_mesh.address, "--ca", str(tmp_path / "no-ca.pem"))
    assert missing.returncode == 2 and "--server / --ca: CA file" in missing.stderr, missing.stderr
