"""Generate LV-Bench videos through a running Inferix mesh, with the client SDK only.

Each video is one session whose prompt schedule comes from its captions (`lvbench.schedule`);
the runner watches its block events (progress bar, timings), downloads the MP4 when it ends and
records everything in `manifest.json`, rewritten after every video so an interrupted run keeps
what it finished. A video that fails is recorded and the run goes on; a scheduler that cannot
be reached stops the run at once, since no video could succeed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import grpc
from tqdm import tqdm

from inferix.client import BlockDone, Client, ReconnectPolicy, SessionError, SessionInfo
from inferix.client.retry import DEFAULT_RETRY_S
from inferix.errors import UserError
from lvbench.dataset import VideoAnnotation
from lvbench.schedule import BlockTiming, VideoPlan, plan_video

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class RunConfig:
    server: str
    out: Path
    model: str = "toyworld"
    tls: bool | None = None  # as `inferix.client.Client` takes them: grpcs:// in `server`, or a CA, mean TLS too
    ca: Path | None = None
    seed: int = 0
    width: int = 0  # 0 = the model's native size
    height: int = 0
    api_key: str | None = None
    timeout: float = 60.0  # seconds per unary call and per recording download
    skip_existing: bool = False
    progress: bool = True
    retry_s: float = DEFAULT_RETRY_S  # how long a call waits for a restarting scheduler or streamer
    on_wait: Callable[[str], None] | None = None  # told once per outage that a call is waiting


@dataclass
class VideoRun:
    """What happened to one video (one row of manifest.json)."""

    video_id: str
    status: Literal["ok", "failed", "skipped"]
    num_blocks: int = 0
    frames: int = 0
    prompts: list[dict[str, object]] = field(default_factory=list)
    dropped_captions: list[int] = field(default_factory=list)
    mp4: str | None = None
    session_id: str | None = None
    wall_s: float | None = None  # create -> session ended
    first_block_s: float | None = None  # create -> first block done
    mean_block_ms: float | None = None  # engine time per block
    realtime_factor: float | None = None  # seconds of video per second of wall time
    blocks_match_plan: bool | None = None  # the server's block frame ranges equal the planned ones
    error: str | None = None


def _generate(client: Client, plan: VideoPlan, timing: BlockTiming, config: RunConfig, run: VideoRun) -> None:
    started = time.perf_counter()
    info = client.create_session(
        plan.prompt_changes(),
        model=config.model,
        width=config.width,
        height=config.height,
        seed=config.seed,
        num_blocks=plan.num_blocks,
    )
    run.session_id = info.session_id
    blocks: list[BlockDone] = []
    errors: list[str] = []
    with tqdm(
        total=plan.num_blocks,
        desc=plan.video_id,
        unit="block",
        leave=False,
        disable=not config.progress,
        file=sys.stderr,
    ) as bar:
        try:
            for event in client.events(info.session_id):
                if isinstance(event, BlockDone):
                    if not blocks:
                        run.first_block_s = time.perf_counter() - started
                    blocks.append(event)
                    bar.update(1)
                elif isinstance(event, SessionError):
                    errors.append(event.message)
        except KeyboardInterrupt:  # do not leave the session generating for nobody
            client.cancel_session(info.session_id)
            raise
    run.wall_s = time.perf_counter() - started
    final: SessionInfo = client.get_session(info.session_id)
    if final.state != "completed":
        raise RuntimeError(f"session {final.state}: {final.error or '; '.join(errors) or 'no reason given'}")
    run.frames = sum(b.num_frames for b in blocks)
    run.mean_block_ms = sum(b.engine_ms for b in blocks) / len(blocks) if blocks else None
    run.realtime_factor = run.frames / timing.fps / run.wall_s if run.wall_s else None
    run.blocks_match_plan = [b.first_frame for b in blocks] == [
        timing.block_start_frame(k) for k in range(plan.num_blocks)
    ]
    run.mp4 = _download(client, final, config.out / f"{plan.video_id}.mp4", config.timeout).name


def _download(client: Client, session: SessionInfo, path: Path, timeout: float) -> Path:
    """The streamer finishes the MP4 just after the session ends: retry while it says not yet."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return client.download_recording(session, path)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 1.0)


def _write_manifest(config: RunConfig, timing: BlockTiming, runs: list[VideoRun]) -> None:
    manifest = {
        "server": config.server,
        "model": config.model,
        "seed": config.seed,
        "timing": asdict(timing),
        "videos": [asdict(r) for r in runs],
    }
    tmp = config.out / f"{MANIFEST}.part"
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(config.out / MANIFEST)


def _previous_runs(out: Path) -> dict[str, dict[str, Any]]:
    """The rows of an earlier manifest in `out`, so that --skip-existing keeps what they recorded."""
    try:
        return {row["video_id"]: row for row in json.loads((out / MANIFEST).read_text())["videos"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _skip(run: VideoRun, previous: dict[str, Any]) -> None:
    for f in fields(VideoRun):
        if f.name in previous and f.name not in ("video_id", "status", "error"):
            setattr(run, f.name, previous[f.name])
    run.status, run.mp4 = "skipped", f"{run.video_id}.mp4"


def run_benchmark(videos: list[VideoAnnotation], timing: BlockTiming, config: RunConfig) -> list[VideoRun]:
    """Generate every video in turn; returns (and writes to manifest.json) one `VideoRun` each."""
    config.out.mkdir(parents=True, exist_ok=True)
    previous = _previous_runs(config.out) if config.skip_existing else {}
    runs: list[VideoRun] = []
    with (
        Client(
            config.server,
            api_key=config.api_key,
            timeout=config.timeout,
            tls=config.tls,
            ca=config.ca,
            retry=ReconnectPolicy(config.retry_s),
            on_wait=config.on_wait,
        ) as client,
        tqdm(total=len(videos), desc="videos", unit="video", disable=not config.progress, file=sys.stderr) as bar,
    ):
        for video in videos:
            run = VideoRun(video.video_id, "ok")
            runs.append(run)
            try:
                plan = plan_video(video, timing)
                run.num_blocks, run.dropped_captions = plan.num_blocks, list(plan.dropped)
                run.prompts = [asdict(p) for p in plan.prompts]
                if config.skip_existing and (config.out / f"{video.video_id}.mp4").is_file():
                    _skip(run, previous.get(video.video_id, {}))
                else:
                    _generate(client, plan, timing, config, run)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    raise UserError(
                        f"no scheduler at {config.server}: start one with `inferix serve` or pass --server"
                    ) from None
                run.status, run.error = "failed", f"{exc.code().name}: {exc.details()}"
            except (UserError, RuntimeError, OSError) as exc:
                run.status, run.error = "failed", str(exc)
            _write_manifest(config, timing, runs)
            bar.update(1)
            bar.set_postfix(failed=sum(r.status == "failed" for r in runs))
    return runs
