"""Served throughput per worker: N sessions through `inferix serve` vs the same N batched in-engine.

In-engine: N toyworld sessions of one `WanEngine`, every block (DiT and decode) run through one
`BlockBatcher`, as a worker runs them, as fast as it goes. Served: one worker of a mesh on
127.0.0.1 (scheduler -> worker -> streamer + kvcache_svc), N sessions created at once by the SDK
(concurrent calls) with a lookahead past their length (throughput, not real-time pacing), frames/s from the first
create to the last completion. Both with the same torch threads, in one run. Then a fresh worker's
start-up capacity probe, whose claim is printed next to the real-time streams served (the largest N
whose sessions each got the model's fps or more): what a worker claims for admission should be what
it serves. From the worker's
metrics it also prints the sessions per batched forward, where a served block's time goes (the
worker's `inferix_worker_block_stage_seconds`: scheduler round trip, admission, frames handed out
before the context pass (from admission; 0 for a tree without it), compute, frame publishing,
commit) and what the worker's engine thread did with its wall time
(`inferix_worker_engine_seconds_total`: forwards, decodes, the rest of the steps, gaps between
steps, idle), and the CPU each process used over the run (worker, streamer, scheduler, kvcache_svc,
the clients in this process; in-engine: this process), as % of all cores: on a small machine the
other services' share is CPU the worker's torch threads do not get.

    python -P bench/served.py [--sessions 1 2 4 8] [--blocks 24] [--threads 2] [--before DIR] [--repeats R]
    python -P bench/served.py --model mid --sessions 1 --blocks 8 --repeats 3

`--model mid`: a mid-size DiT where one session fills a forward (dim 384, 6 layers, 448 tokens per
latent frame at 224x512, 4 denoising steps and a context pass per block, as Self Forcing), served
from a model folder this bench writes to a temporary folder: toyworld's trained VAE, text encoder
and tokenizer with a seeded random DiT of that size (its frames are noise; only speed is measured).
The worker registers the folder's model.yaml, so the scheduler sizes its sessions (224x512, 12 KV
pages each) by it.

(`-P`: this folder's bench/engine_speed.py must not shadow the `engine` package.)
"""

from __future__ import annotations

import os

from inferix.openmp import openmp_wait

# The worker's OpenMP wait (inferix/openmp.py), for the in-engine figure too: the same policy on both
# sides, and a long-spinning bench would starve the mesh it measures.
os.environ.update(openmp_wait(os.environ))

import argparse
import re
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from engine.checkpoint import seeded_state_dict
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model
from inferix.client import BlockDone, Client, StateChanged
from inferix.spec.presets import load_preset
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh

FRAMES_PER_BLOCK = 3  # toyworld's patch VAE: a latent frame is a video frame
ROOT = Path(__file__).resolve().parent.parent
TOYWORLD = ROOT / "engine" / "families" / "wan" / "weights" / "toyworld"
# bench/batching.py's and bench/engine_speed.py's mid-size DiT, at 224x512 (28x64 latents, 448 tokens).
MID_OVERRIDES = {
    "dit": {"dim": 384, "ffn_dim": 1536, "num_heads": 6, "num_layers": 6, "freq_dim": 256},
    "pipeline": {"sampling": {"denoising_steps": [1000, 750, 500, 250]}},
    "video": {"height": 224, "width": 512},
}


def write_mid_model(folder: Path) -> Path:
    """A model folder of the mid-size DiT: toyworld's model.yaml with MID_OVERRIDES, a seeded random
    DiT checkpoint of that size, toyworld's other files linked."""
    folder.mkdir(parents=True)
    config = yaml.safe_load((TOYWORLD / "model.yaml").read_text())
    config.update(MID_OVERRIDES)
    config["files"] = {"dit": ["mid_dit.safetensors"]}
    (folder / "model.yaml").write_text(yaml.safe_dump(config))
    dit_config = load_preset(config.pop("preset"), config).dit
    for name in ("toyworld_vae.safetensors", "toyworld_text_encoder.safetensors", "tokenizer"):
        (folder / name).symlink_to(TOYWORLD / name)
    save_file(seeded_state_dict(lambda: CausalWanDiT(dit_config), seed=0), str(folder / "mid_dit.safetensors"))
    return folder


def in_engine_fps(engine: WanEngine, n: int, blocks: int) -> tuple[float, float]:
    """Frames/s of N sessions batched in this process, and the CPU it used (% of all cores)."""
    sessions = [engine.open(f"a ball number {i}", seed=i, num_blocks=blocks) for i in range(n)]
    batcher = engine.batcher()
    began, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for _ in range(blocks):
            for session in sessions:
                batcher.add(session.block_job())
            while batcher.busy:
                batcher.step()
    seconds = time.perf_counter() - began
    share = 100 * (time.process_time() - cpu) / (seconds * (os.cpu_count() or 1))
    for session in sessions:
        session.close()
    return n * blocks * FRAMES_PER_BLOCK / seconds, share


def served_fps(client: Client, n: int, blocks: int, size: tuple[int, int]) -> float:
    """N sessions of `size` (width, height) created at once (concurrent calls, as N clients would),
    followed to their end."""
    began = time.perf_counter()

    def create(i: int) -> str:
        info = client.create_session(f"a ball number {i}", num_blocks=blocks, seed=i, width=size[0], height=size[1])
        return info.session_id

    with ThreadPoolExecutor(n) as pool:
        ids = list(pool.map(create, range(n)))
    frames = 0
    for session_id in ids:
        for event in client.events(session_id):
            if isinstance(event, BlockDone):
                frames += event.num_frames
            if isinstance(event, StateChanged) and event.state in ("completed", "failed", "cancelled"):
                assert event.state == "completed", event
    return frames / (time.perf_counter() - began)


def cpu_seconds(mesh: Mesh) -> dict[str, float]:
    """CPU time (user + system) so far of the worker, the rest of the mesh, and this process (the
    clients following the sessions): what shares the machine's cores with the worker's engine."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    times = os.times()
    return {
        "worker": of(mesh.workers[0].pid),
        "streamer": of(mesh.streamer.pid),
        "scheduler": of(mesh.scheduler.pid),
        "kvcache": of(mesh.kvcache.pid),
        "client": times.user + times.system,
    }


def scrape(port: int) -> dict[str, float]:
    """The worker's counters that the report reads, by name (and label)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for name, value in re.findall(r"^(inferix_worker_\S+) (\S+)$", text, re.M):
        values[name] = float(value)
    return values


CPU_PARTS = ("worker", "streamer", "scheduler", "kvcache", "client")
STAGES = ("dispatch", "admit", "frames", "compute", "publish", "commit")
PARTS = ("forward", "decode", "step", "gap")


def breakdown(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Means over the blocks served between two scrapes `seconds` apart: sessions per forward, each
    block stage (ms), and the engine thread's share of that wall time by part (idle: the rest)."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    out = {"batch": delta("inferix_worker_batch_sessions_sum") / max(delta("inferix_worker_batch_sessions_count"), 1)}
    for stage in STAGES:
        key = f'inferix_worker_block_stage_seconds_{{}}{{{{stage="{stage}"}}}}'
        out[stage] = 1e3 * delta(key.format("sum")) / max(delta(key.format("count")), 1)
    parts = {part: delta(f'inferix_worker_engine_seconds_total{{part="{part}"}}') for part in PARTS}
    parts["idle"] = max(seconds - sum(parts.values()), 0.0)
    out.update({f"%{part}": 100 * spent / seconds for part, spent in parts.items()})
    return out


def start(
    workdir: Path, threads: int, model: Path | None, probe: int = 0, tree: Path | None = None, workers: int = 1
) -> Mesh:
    """`workers` workers of `model` (None: toyworld); `probe`: their start-up capacity probe's sessions
    at most (0: none, 64 streams claimed so that admission never queues a session of the bench); `tree`:
    the source tree its services run from (default: this one)."""
    config = MeshConfig(
        workdir=workdir,
        workers=workers,
        model=model,
        worker_threads=threads,
        lookahead=100_000,
        realtime_streams=0 if probe else 64,
        capacity_probe=probe,
        rtmp="off",
        env={"PYTHONPATH": str(tree or ROOT)},
    )
    return start_mesh(config)


def probed_streams(workdir: Path, threads: int, model: Path | None, workers: int = 1) -> float:
    """The real-time streams a fresh mesh's workers claim together after their start-up probes (up to 8
    sessions each)."""
    mesh = start(workdir, threads, model, probe=8, workers=workers)
    try:
        total = 0.0
        for worker in mesh.workers:
            values = scrape(worker.metrics_port or 0)
            total += max(v for k, v in values.items() if k.startswith("inferix_worker_realtime_streams{"))
        return total
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        choices=["toyworld", "mid"],
        default="toyworld",
        help="toyworld (default) or the mid-size DiT of a model folder this bench writes (see above)",
    )
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--blocks", type=int, default=24, help="blocks per session (default 24: 4.5 s of video)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in-engine and of the worker (default 2)")
    parser.add_argument(
        "--before",
        type=Path,
        help="a source tree of an earlier commit (e.g. `git archive COMMIT | tar -x -C DIR`): a second mesh runs "
        "from it, side by side with this tree's, each N measured on both in turn",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure each N this many times, in-engine and served in turn, and keep each figure's best "
        "(on a machine others load too, the best of a few runs is the least disturbed one)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trees = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    rows: dict[str, list[tuple[int, dict[str, float]]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_mid_model(Path(tmp) / "mid") if args.model == "mid" else None
        engine = WanEngine(load_wan_model(model or "toyworld"))
        in_engine_fps(engine, 1, 2)  # warm-up
        size = (engine.model.width, engine.model.height)
        # The services' `python -m` puts their working folder first on their path, before PYTHONPATH.
        os.chdir(tmp)
        meshes = {name: start(Path(tmp) / name, args.threads, model, tree=tree) for name, tree in trees.items()}
        try:
            clients = {name: Client(mesh.address, timeout=900) for name, mesh in meshes.items()}
            for client in clients.values():
                served_fps(client, 1, 2, size)  # warm-up
            for n in args.sessions:
                engine_fps, engine_cpu = 0.0, 0.0
                best: dict[str, dict[str, float]] = {}
                for _ in range(args.repeats):
                    fps, share = in_engine_fps(engine, n, args.blocks)
                    if fps > engine_fps:
                        engine_fps, engine_cpu = fps, share
                    for name, mesh in meshes.items():
                        port = mesh.workers[0].metrics_port or 0
                        before, cpu, began = scrape(port), cpu_seconds(mesh), time.perf_counter()
                        fps = served_fps(clients[name], n, args.blocks, size)
                        window = time.perf_counter() - began
                        row = {"served": fps, **breakdown(before, scrape(port), window)}
                        cores = os.cpu_count() or 1
                        for part, spent in cpu_seconds(mesh).items():  # % of all cores over the run
                            row[f"cpu {part}"] = 100 * (spent - cpu[part]) / (window * cores)
                        print(f"{name} N={n}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
                        if name not in best or fps > best[name]["served"]:
                            best[name] = row
                print(f"in-engine N={n}: {engine_fps:.1f} (best of {args.repeats}), CPU {engine_cpu:.1f}%", flush=True)
                for name in meshes:
                    rows[name].append((n, {"engine": engine_fps, "cpu engine": engine_cpu, **best[name]}))
            for client in clients.values():
                client.close()
        finally:
            for mesh in meshes.values():
                mesh.stop()
        claimed = probed_streams(Path(tmp) / "probe", args.threads, model)
    fps = float(engine.model.fps)
    for name, tree in trees.items():
        print(f"\n{name} ({tree}): {args.model}, {args.blocks} blocks/session, {args.threads} torch threads, 1 worker")
        print(
            f"{'N':>3} {'in-engine fps':>14} {'served fps':>11} {'served/engine':>14} {'sessions/forward':>17}"
            "   CPU, % of all cores: in-engine | served: worker / streamer / scheduler / kvcache_svc / clients"
        )
        for n, row in rows[name]:
            print(
                f"{n:>3} {row['engine']:>14.1f} {row['served']:>11.1f} {row['served'] / row['engine']:>13.2f}x "
                f"{row['batch']:>17.2f}   {row['cpu engine']:.1f}% | "
                + " / ".join(f"{row['cpu ' + part]:.1f}%" for part in CPU_PARTS)
            )
        print("per served block, mean ms by stage; the worker's engine thread, % of its wall time by part")
        print(f"{'N':>3} " + " ".join(f"{s:>9}" for s in STAGES) + " " + " ".join(f"{p:>8}" for p in (*PARTS, "idle")))
        for n, row in rows[name]:
            print(
                f"{n:>3} "
                + " ".join(f"{row[s]:>9.1f}" for s in STAGES)
                + " "
                + " ".join(f"{row['%' + p]:>7.1f}%" for p in (*PARTS, "idle"))
            )
    # Real time served: the largest N measured whose sessions each got at least the model's fps.
    realtime = max((n for n, row in rows["now"] if row["served"] / n >= fps), default=0)
    print(
        f"\nbest of {args.repeats} run(s) per figure. Capacity probe of a fresh worker (this tree): {claimed:.0f} "
        f"real-time streams claimed; served (this tree), frames/s per session: "
        + ", ".join(f"N={n} {row['served'] / n:.1f}" for n, row in rows["now"])
        + f" ({fps:.0f} fps is real time): {realtime} real-time streams served"
    )


if __name__ == "__main__":
    main()
