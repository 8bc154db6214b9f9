"""`inferix cluster status` against a real mesh: every worker with its state, device, sessions, KV pages
and real-time factor, as a table and as JSON; clear one-line errors without the mesh token or the service."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from inferix.client import Client
from inferix.server import INTERNAL_TOKEN_ENV
from inferix_cli.mesh import Mesh


def cluster_status(mesh: Mesh, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in mesh.config.env.items() if k != INTERNAL_TOKEN_ENV}
    if token is not None:
        env[INTERNAL_TOKEN_ENV] = token
    command = [sys.executable, "-m", "inferix_cli", "cluster", "status", "--kvcache", mesh.kvcache.address, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_cluster_status_lists_every_worker_with_its_load(mesh: Mesh, client: Client) -> None:
    info = client.create_session("a red ball", num_blocks=3, seed=5)
    list(client.events(info.session_id))  # the session made its blocks: its worker has a real-time factor
    token = mesh.config.env[INTERNAL_TOKEN_ENV]

    def listed() -> dict[str, dict[str, object]]:
        result = cluster_status(mesh, "--json", token=token)
        assert result.returncode == 0, result.stderr
        return {row["worker"]: row for row in map(json.loads, result.stdout.splitlines())}

    deadline = time.monotonic() + 30  # the worker reports its real-time factor with its next heartbeat
    rows = listed()
    while max(float(str(row["realtime_factor"])) for row in rows.values()) == 0:
        assert time.monotonic() < deadline, f"no worker reported a real-time factor: {rows}"
        time.sleep(1)
        rows = listed()
    assert set(rows) == {w.name for w in mesh.workers}
    for row in rows.values():
        assert row["state"] == "serving" and row["model"] == "toyworld" and row["model_settings"] == "", row
        assert row["device"].startswith("cpu: ") and row["kv_total"] > 0 and row["seen_s_ago"] < 30, row
        assert row["kv_used"] <= row["kv_total"] and row["load"] >= 0, row

    table = cluster_status(mesh, token=token)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["WORKER", "STATE", "MODEL", "DEVICE"]
    assert {line.split()[0] for line in lines[1:-1]} == set(rows)
    assert lines[-1].startswith(f"{len(rows)}/{len(rows)} serving")


def test_cluster_status_says_what_is_missing(mesh: Mesh) -> None:
    refused = cluster_status(mesh)  # no mesh token: kvcache_svc refuses internal calls
    assert refused.returncode == 2
    assert f"refused the call: set {INTERNAL_TOKEN_ENV}" in refused.stderr and "Traceback" not in refused.stderr

    token = mesh.config.env[INTERNAL_TOKEN_ENV]
    env_address = cluster_status(mesh, "--kvcache", "127.0.0.1:1", "--timeout", "2", token=token)
    assert env_address.returncode == 2
    assert "no kvcache_svc answers at 127.0.0.1:1" in env_address.stderr, env_address.stderr
