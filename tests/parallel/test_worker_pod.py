"""The worker service as a sequence-parallel pod: `python -m workers` under torchrun, 2 gloo ranks.

Real processes throughout: a mesh whose one worker is a torchrun pod serves a session with a
prompt change, and its frames must equal those of the single-rank `inferix generate` CLI. Rank 0
alone serves (gRPC and metrics ports); the follower binds none and leaves when rank 0 drains.
The worker's session path over a pod (`WanEngine(driver=...)`, `PodSession`: offload,
prefetch and concurrent callers) runs on forked ranks against the single-rank worker path.

Bit-exactness: Ulysses gives the single-rank frames bit for bit (each rank runs the same attention
kernel on whole heads). Ring attention merges partial softmaxes, so the latents differ by ~1e-6 and
a few dozen of the ~2.2M uint8 values of a tiny-model block by 1: its frames are compared within 1.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from engine.contract import VideoBlock
from engine.families.wan.engine import WanEngine, shared_pool
from engine.families.wan.loader import load_wan_model
from engine.parallel.cost import ParallelConfig
from engine.parallel.pod_driver import PodDriver
from engine.parallel.pod_main import serve_pod
from inferix.client import BlockDone, Client, PromptChange
from inferix_cli.mesh import start_mesh
from inferix_cli.mesh.launch import ServiceProcess
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info
from tests.parallel.pod import run_ranks
from workers.pod import build_worker_pod

LISTEN = "0A"  # TCP state in /proc/net/tcp


def listening_ports(pid: int) -> set[int]:
    """TCP ports that process `pid` listens on (its socket inodes matched against /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def pod_ranks(worker: ServiceProcess) -> dict[int, int]:
    """{rank: pid} of the processes torchrun started for this worker."""
    ranks = {}
    for pid in worker.children():
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
        )
        ranks[int(environ["RANK"])] = pid
    return ranks


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pod_worker_serves_a_session_like_the_single_rank_cli(tmp_path: Path) -> None:
    schedule = (PromptChange(0, "a red ball bouncing to the right"), PromptChange(2, "the ball turns green"))
    # Ulysses (bit-exact, see above), chosen through the worker's environment fallback.
    env = {"INFERIX_SP_STRATEGY": "ulysses"}
    mesh = start_mesh(mesh_config(tmp_path, workers=1, ranks_per_worker=2, rtmp="off", env=env))
    try:
        worker = mesh.workers[0]
        ranks = pod_ranks(worker)
        assert sorted(ranks) == [0, 1], ranks
        assert worker.serving_pid == ranks[0]  # rank 0 wrote the port file
        service_ports = {worker.port, worker.metrics_port}
        assert service_ports <= listening_ports(ranks[0])
        assert not service_ports & (listening_ports(ranks[1]) | listening_ports(worker.pid))

        with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
            info = client.create_session(list(schedule), num_blocks=4, seed=5)
            blocks = [e for e in client.events(info.session_id) if isinstance(e, BlockDone)]
        assert [b.block_index for b in blocks] == [0, 1, 2, 3]
        assert [b.prompt for b in blocks] == ["a red ball bouncing to the right"] * 2 + ["the ball turns green"] * 2
        streamed = stream_info(mesh, info.session_id)
        assert streamed.finished and streamed.frames == 4 * 3  # toyworld: 3 video frames per block
    finally:
        codes = mesh.stop()
    # Stopped through rank 0: it drains, releases the follower, and torchrun sees two clean exits.
    log = worker.log_path.read_text()
    assert all(code == 0 for code in codes.values()), (codes, log[-3000:])
    assert not [pid for pid in ranks.values() if running(pid)]  # no rank outlives torchrun
    assert "sequence parallel: ulysses (ulysses=2 ring=1)" in log  # rank 0 logs the plan
    assert "rank 1: rank 0 shut the pod down; exiting" in log
    assert streamed.frames_sha256 == generate_digest(schedule, 4, 5)  # bit-exact with the single-rank CLI


def worker_path(generator: WanEngine, concurrent: bool) -> dict[str, Any]:
    """What the worker service does with sessions: two sessions, an offload and a prefetch, a prompt
    change, then blocks of both sessions from two threads at once (or one after the other)."""
    a = generator.open("a red ball bouncing", seed=5, num_blocks=3, session_id="a")
    b = generator.open("a blue square", seed=6, num_blocks=1, session_id="b")
    blocks: dict[str, list[VideoBlock]] = {"a": [a.next_block()], "b": []}
    a.offload()
    offloaded = a.kv_usage()
    a.prefetch()
    a.set_prompt("a green ball bouncing")

    def run(video: Any, n: int) -> None:
        blocks[video.session_id].extend(video.next_block() for _ in range(n))

    jobs = [threading.Thread(target=run, args=(a, 2)), threading.Thread(target=run, args=(b, 1))]
    for job in jobs:
        job.start()
        if not concurrent:
            job.join()
    for job in jobs:
        job.join()
    b.close()
    a.offload()
    return {
        "offloaded": (offloaded.tier, offloaded.host_pages, offloaded.device_pages),
        "latents": {k: [x.latents for x in v] for k, v in blocks.items()},
        "frames": {k: [x.frames for x in v] for k, v in blocks.items()},
        "finished": (a.finished, b.finished),
    }


def test_pod_sessions_match_the_single_rank_worker_path(tmp_path: Path) -> None:
    model = load_wan_model("tiny")  # the forked ranks inherit it (and shard their own copy of its DiT)
    reference = worker_path(WanEngine(model, shared_pool(model, 64)), concurrent=False)

    def rank_main(rank: int) -> dict[str, Any]:
        engine, choice = build_worker_pod(model, ParallelConfig(), kv_pages=64)  # auto: ring-pass-kv
        result: dict[str, Any] = {"plan": choice.plan.name}

        def serve(driver: PodDriver) -> None:
            result.update(worker_path(WanEngine(model, driver=driver), concurrent=True))

        serve_pod(engine, serve)
        # Every rank executed every command on its own shard: "b" is closed, "a" lives in host memory.
        result["tiers"] = {sid: s.cache.usage().tier for sid, s in engine.sessions.items()}
        return result

    driver, follower = run_ranks(rank_main, 2, tmp_path)
    assert driver["plan"] == "ring-pass-kv"
    assert driver["tiers"] == follower["tiers"] == {"a": "host"}
    assert driver["offloaded"] == reference["offloaded"] and driver["offloaded"][0] == "host"
    assert driver["finished"] == reference["finished"] == (True, True)
    assert "frames" not in follower  # no decode (nor text encoding) on the followers
    for sid in ("a", "b"):
        for ours, theirs in zip(driver["latents"][sid], reference["latents"][sid], strict=True):
            assert float((ours - theirs).abs().max()) <= 1e-5
        for ours, theirs in zip(driver["frames"][sid], reference["frames"][sid], strict=True):
            assert int(np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).max()) <= 1


def test_uneven_split_fails_at_startup_with_the_reason(tmp_path: Path) -> None:
    # Ulysses over 3 ranks cannot split the tiny model's 2 heads: every rank stops before serving.
    port_file = tmp_path / "worker.port.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    command += ["--nproc-per-node", "3", "-m", "workers", "--model", "tiny", "--sp-strategy", "ulysses"]
    command += ["--threads", "1"]
    command += ["--port", "0", "--port-file", str(port_file), "--kvcache", "127.0.0.1:1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    for rank in range(3):
        assert f"python -m workers (rank {rank}): error: ulysses: Ulysses degree 3 must divide num_heads=2" in output
    assert not port_file.exists()  # rank 0 never listened
