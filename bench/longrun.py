"""Long runs of the whole mesh under `inferix serve` with Redis (issue 41): a soak and a chaos run.

soak  (`make soak`, SOAK_MINUTES, default 60): one toyworld session of that many minutes of video,
      paced in real time as a watched session is, watched over WebRTC by its viewer page in headless
      Chromium (`--chromium`; Debian's chromium) and over the SDK's event stream, and recorded by
      the streamer; the worker making it is SIGKILLed at half time and the scheduler at three
      quarters (`inferix serve` restarts both). The page's figures: frames decoded, the freezes
      Chromium counted in the video it showed (WebRTC `freezeCount`, `totalFreezesDuration`) and
      when, and the streamer's underruns as the page shows them.
chaos (`make chaos`, CHAOS_MINUTES, default 10): 6 sessions of that many minutes of video each (paced
      in real time as far as two workers keep up; `--blocks` to set their length) while a
      random process of the mesh (a worker, the scheduler, kvcache_svc, the streamer, Redis) gets
      SIGKILL or SIGTERM every 10-20 s (seeded, every kill logged); `inferix serve` restarts its
      services, this script restarts Redis (append-only file, fsync always: nothing acknowledged is
      lost).

Both then check and report (JSON on stdout, exit 1 when a check fails): every session completed
with every block announced exactly once, its frames (count and SHA-256 at the streamer) equal to a
solo `inferix generate` of the same session, its MP4 recording downloadable with that many frames;
the recovery time of every kill (from the signal to the next block a worker makes, i.e. one with
engine time, as the client sees it); client reconnects; and the peak RSS of every process (sampled
every second from /proc, per service across its restarts), with its RSS after warm-up and at the end.

    python bench/longrun.py soak --minutes 60
    python bench/longrun.py chaos --minutes 10 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from playwright.sync_api import Page, sync_playwright

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.client import BlockDone, Client, StateChanged
from inferix.server import INTERNAL_TOKEN_HEADER

FPS, FRAMES_PER_BLOCK = 16, 3  # toyworld
TOKEN = "longrun-internal-token"
SERVICES = ("scheduler", "kvcache", "streamer", "worker0", "worker1")
PROMPTS = (
    "a red ball bouncing to the right",
    "two blue squares falling",
    "a green ball bouncing to the left",
    "a yellow square moving up",
    "a red square and a blue ball",
    "a purple ball falling",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Redis:
    """A redis-server this script starts, kills and restarts on one port, with an fsync'd AOF."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],  # fmt: skip
            stdout=(self.dir / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    @property
    def pid(self) -> int | None:
        return None if self.process is None or self.process.poll() is not None else self.process.pid

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        self.process.wait(30)

    def stop(self) -> None:
        if self.pid is not None:
            self.signal(signal.SIGTERM)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class Serve:
    """`python -m inferix_cli serve` with two workers on Redis; its services' pids from their port files."""

    def __init__(self, workdir: Path, redis: Redis, lookahead: int) -> None:
        self.workdir = workdir / "serve"
        cmd = [sys.executable, "-m", "inferix_cli", "serve", "--port", "0", "--http-port", "0", "--workers", "2",
               "--workdir", str(self.workdir), "--redis-url", redis.url, "--rtmp", "off", "--capacity-probe", "0",
               "--realtime-streams", "8", "--lookahead", str(lookahead)]  # fmt: skip
        env = {**os.environ, "INFERIX_THREADS": "1", "INFERIX_INTERNAL_TOKEN": TOKEN}
        self.log = (workdir / "serve.out").open("w")
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.address = self._wait(r"^scheduler\s+(\S+)")
        self.streamer = self._wait(r"^streamer\s+(\S+)")
        self._wait(r"^Ctrl-C to stop")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            self.log.flush()

    def _wait(self, pattern: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match.group(match.lastindex or 0)
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"inferix serve: no line {pattern!r}; see {self.log.name}")

    def pid(self, service: str) -> int | None:
        try:
            pid = int(json.loads((self.workdir / f"{service}.port.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return pid if rss_kib(pid) is not None else None

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@dataclass
class RssSampler:
    """Peak, after-warm-up and last RSS (KiB) of each process, sampled every second."""

    pids: Callable[[], dict[str, int | None]]
    warm_up_s: float
    peak: dict[str, int] = field(default_factory=dict)
    warm: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> RssSampler:
        began = time.monotonic()

        def loop() -> None:
            while not self._stop.wait(1.0):
                for name, pid in self.pids().items():
                    rss = None if pid is None else rss_kib(pid)
                    if rss is None:
                        continue
                    self.peak[name] = max(self.peak.get(name, 0), rss)
                    self.last[name] = rss
                    if time.monotonic() - began >= self.warm_up_s and name not in self.warm:
                        self.warm[name] = rss

        threading.Thread(target=loop, daemon=True).start()
        return self

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        return {
            name: {
                "peak_mib": self.peak[name] / 1024,
                "warm_mib": self.warm.get(name, 0) / 1024,
                "end_mib": self.last[name] / 1024,
            }  # fmt: skip
            for name in sorted(self.peak)
        }


@dataclass
class Watch:
    """One session's events as its client saw them (reconnecting through scheduler restarts)."""

    session_id: str
    blocks: list[BlockDone] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each BlockDone
    states: list[str] = field(default_factory=list)
    reconnects: int = 0
    error: str = ""


def watch(address: str, watched: Watch, on_block: Callable[[BlockDone], None] | None = None) -> None:
    def waiting(what: str) -> None:
        watched.reconnects += 1

    try:
        with Client(address, timeout=120, on_wait=waiting) as client:
            for event in client.events(watched.session_id):
                if isinstance(event, BlockDone):
                    watched.blocks.append(event)
                    watched.arrivals.append(time.monotonic())
                    if on_block is not None:
                        on_block(event)
                elif isinstance(event, StateChanged):
                    watched.states.append(event.state)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        watched.error = f"{type(exc).__name__}: {exc}"


# Headless Chromium as the brief's facts say it runs here (no sandbox as root, no GPU, autoplay).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--autoplay-policy=no-user-gesture-required"]  # fmt: skip
# What the viewer page saw: its inbound video's WebRTC stats and the stream status it polls.
PAGE_STATS = """async () => {
  let video = {};
  if (inferixViewer.pc) {
    (await inferixViewer.pc.getStats()).forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "video") video = s;
    });
  }
  const stream = (inferixViewer.status && inferixViewer.status.stream) || {};
  return {frames_decoded: video.framesDecoded || 0, frames_dropped: video.framesDropped || 0,
          freezes: video.freezeCount || 0, freeze_s: video.totalFreezesDuration || 0,
          underruns: stream.underruns || 0, underrun_s: stream.underrun_s || 0, ended: !!stream.ended};
}"""


@dataclass
class PageWatch:
    """A session's viewer page in headless Chromium for the whole run, its stats read every few
    seconds (Playwright's sync API stays on the one thread that started it). The browser starts
    before the session is created, so that the page, opened once its URL exists, misses as little of
    the video's start as a viewer would."""

    chromium: str
    url: str = ""
    began: float = field(default_factory=time.monotonic)
    last: dict[str, float] = field(default_factory=dict)
    freezes_at_s: list[float] = field(default_factory=list)  # run time of each new freeze Chromium counted
    error: str = ""
    _ready: threading.Event = field(default_factory=threading.Event)
    _opened: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, timeout_s: float = 120.0) -> PageWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(timeout_s)
        return self

    def open(self, url: str) -> None:
        self.url = url
        self._opened.set()

    def _run(self) -> None:
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=self.chromium, args=CHROMIUM_FLAGS)
                page = browser.new_page()
                self._ready.set()
                self._opened.wait()
                if self.url:
                    page.goto(self.url)
                    while not self._stop.wait(5.0):
                        self._sample(page)
                        if self.last.get("ended"):
                            break
                    self._sample(page)
                browser.close()
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._ready.set()

    def _sample(self, page: Page) -> None:
        stats = page.evaluate(PAGE_STATS)
        new = int(stats["freezes"]) - int(self.last.get("freezes", 0))
        self.freezes_at_s += [round(time.monotonic() - self.began, 1)] * max(new, 0)
        self.last = stats

    def stop(self, timeout_s: float = 120.0) -> dict[str, object]:
        """Wait for the page to show the stream's end (bounded), then its figures."""
        assert self._thread is not None
        self._opened.set()
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join(60)
        return {**self.last, "freezes_at_s": self.freezes_at_s, "error": self.error}


def solo_digest(prompt: str, blocks: int, seed: int) -> str:
    """sha256 of the frames `inferix generate` makes for the same session, in its own process."""
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [sys.executable, "-m", "inferix_cli", "generate", "--prompt", prompt, "--blocks", str(blocks), "--seed",
             str(seed), "--threads", "1", "--quiet", "--out", str(Path(tmp) / "solo.mp4")],  # fmt: skip
            capture_output=True, text=True, check=True, timeout=3600,
        )  # fmt: skip
    match = re.search(r"frames sha256 ([0-9a-f]{64})", result.stdout)
    assert match, result.stdout
    return match.group(1)


def mp4_frames(path: Path) -> int:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames", "-of", "csv=p=0", str(path)],  # fmt: skip
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.strip() or 0)


def check_session(
    serve: Serve, watched: Watch, prompt: str, seed: int, blocks: int, digest: str, workdir: Path
) -> dict[str, object]:
    """What the issue asks of a finished session, as a report row (its `ok` says whether all hold)."""
    indices = [b.block_index for b in watched.blocks]
    with grpc.insecure_channel(serve.streamer) as channel:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        try:
            info = stub.GetStreamInfo(
                streamer_pb2.GetStreamInfoRequest(session_id=watched.session_id), timeout=60,
                metadata=((INTERNAL_TOKEN_HEADER, TOKEN),),
            )  # fmt: skip
        except grpc.RpcError as exc:  # e.g. a recording lost to a streamer restart: a failed check, reported
            info = streamer_pb2.GetStreamInfoResponse()
            watched.error = watched.error or f"stream info: {exc.code().name}: {exc.details()}"
    recording = workdir / f"{watched.session_id}.mp4"
    try:
        with Client(serve.address, timeout=120) as client:
            client.download_recording(client.get_session(watched.session_id), recording)
        recorded = mp4_frames(recording)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        recorded = -1
        watched.error = watched.error or f"recording: {exc}"
    row: dict[str, object] = {
        "session": watched.session_id,
        "prompt": prompt,
        "seed": seed,
        "completed": bool(watched.states) and watched.states[-1] == "completed",
        "blocks_once": indices == list(range(blocks)),
        "duplicates": len(indices) - len(set(indices)),
        "missing": sorted(set(range(blocks)) - set(indices))[:10],
        "frames": info.frames,
        "frames_equal_solo": info.frames == blocks * FRAMES_PER_BLOCK and info.frames_sha256 == digest,
        "recording_frames": recorded,
        "client_reconnects": watched.reconnects,
        "error": watched.error,
    }
    row["ok"] = (
        row["completed"] and row["blocks_once"] and row["frames_equal_solo"] and recorded == info.frames
        and not watched.error
    )  # fmt: skip
    return row


def recovery_after(kill_at: float, watches: list[Watch]) -> float | None:
    """Seconds from a kill to the first block made after it (one with engine time: not a restored one)."""
    made = [t for w in watches for b, t in zip(w.blocks, w.arrivals, strict=True) if t > kill_at and b.engine_ms > 0]
    return round(min(made) - kill_at, 3) if made else None


def soak(minutes: float, workdir: Path, chromium: str) -> dict[str, object]:
    blocks = max(8, round(minutes * 60 * FPS / FRAMES_PER_BLOCK))
    prompt, seed = PROMPTS[0], 41
    redis = Redis(workdir)
    serve = Serve(workdir, redis, lookahead=2)
    sampler = RssSampler(lambda: {**{s: serve.pid(s) for s in SERVICES}, "redis": redis.pid}, 60.0 * minutes / 12)
    sampler.start()
    kills: list[dict[str, object]] = []
    kill_times: list[float] = []
    viewer = PageWatch(chromium).start()
    page: dict[str, object] = {}
    try:
        with Client(serve.address, timeout=120) as client:
            info = client.create_session(prompt, num_blocks=blocks, seed=seed)
        viewer.open(info.viewer_url)
        watched = Watch(info.session_id)
        plan = [(blocks // 2, "worker"), (3 * blocks // 4, "scheduler")]

        def on_block(block: BlockDone) -> None:
            if plan and block.block_index >= plan[0][0] and block.engine_ms > 0:
                _, what = plan.pop(0)
                service = block.worker_id if what == "worker" else "scheduler"
                pid = serve.pid(service)
                if pid is not None:
                    kill_times.append(time.monotonic())
                    os.kill(pid, signal.SIGKILL)
                    kills.append({"at_block": block.block_index, "service": service, "signal": "SIGKILL"})

        watch(serve.address, watched, on_block)
        page = viewer.stop()
        digest = solo_digest(prompt, blocks, seed)
        row = check_session(serve, watched, prompt, seed, blocks, digest, workdir)
    finally:
        page = page or viewer.stop(0)
        rss = sampler.stop()
        code = serve.stop()
        redis.stop()
    for kill, at in zip(kills, kill_times, strict=True):
        kill["recovery_s"] = recovery_after(at, [watched])
        kill["at_s"] = round(at - viewer.began, 1)  # on the clock of the page's `freezes_at_s`
    # The page must have played the video to its end. It joins the stream a moment after the session
    # starts (page load, WebRTC set-up), so it may miss the first second or so: 90% of the frames.
    decoded, dropped = (int(str(page.get(key, 0))) for key in ("frames_decoded", "frames_dropped"))
    page["frames_of_video"] = blocks * FRAMES_PER_BLOCK
    shown = bool(page.get("ended")) and decoded + dropped >= 0.9 * blocks * FRAMES_PER_BLOCK
    ok = bool(row["ok"]) and len(kills) == 2 and code == 0 and not page["error"] and shown
    return {"run": "soak", "minutes": minutes, "blocks": blocks, "ok": ok, "sessions": [row], "kills": kills,
            "page": page, "serve_exit": code, "rss": rss}  # fmt: skip


def chaos(minutes: float, blocks: int, seed: int, interval: tuple[float, float], workdir: Path) -> dict[str, object]:
    rng = random.Random(seed)
    redis = Redis(workdir)
    serve = Serve(workdir, redis, lookahead=2)
    sampler = RssSampler(lambda: {**{s: serve.pid(s) for s in SERVICES}, "redis": redis.pid}, 60.0 * minutes / 6)
    sampler.start()
    kills: list[dict[str, object]] = []
    watches: list[Watch] = []
    try:
        with Client(serve.address, timeout=120) as client:
            for i, prompt in enumerate(PROMPTS):
                info = client.create_session(prompt, num_blocks=blocks, seed=seed * 100 + i)
                watches.append(Watch(info.session_id))
        threads = [threading.Thread(target=watch, args=(serve.address, w), daemon=True) for w in watches]
        for thread in threads:
            thread.start()
        began = time.monotonic()
        next_kill = began + rng.uniform(*interval)
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            now = time.monotonic()
            if now < next_kill or now - began > 60 * minutes:
                continue
            target = rng.choice([*SERVICES, "redis"])
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            next_kill = now + rng.uniform(*interval)
            pid = redis.pid if target == "redis" else serve.pid(target)
            entry: dict[str, object] = {"t_s": round(now - began, 1), "service": target, "signal": sig.name, "pid": pid}
            kills.append(entry)
            print(f"chaos: {entry}", file=sys.stderr, flush=True)
            if pid is None:
                continue  # restarting right now
            entry["_at"] = time.monotonic()
            if target == "redis":
                redis.signal(sig)
                time.sleep(1.0)
                redis.start()
            else:
                os.kill(pid, sig)
        for thread in threads:
            thread.join()
        # Each solo run is one thread: two side by side halve the wait on a 2-core machine.
        seeds = [seed * 100 + i for i in range(len(PROMPTS))]
        with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
            digests = list(pool.map(solo_digest, PROMPTS, [blocks] * len(PROMPTS), seeds))
        rows = [
            check_session(serve, w, p, s, blocks, d, workdir)
            for w, p, s, d in zip(watches, PROMPTS, seeds, digests, strict=True)
        ]
    finally:
        rss = sampler.stop()
        code = serve.stop()
        redis.stop()
    for entry in kills:
        at = entry.pop("_at", None)
        entry["recovery_s"] = None if not isinstance(at, float) else recovery_after(at, watches)
    ok = all(r["ok"] for r in rows) and code == 0
    return {"run": "chaos", "minutes": minutes, "seed": seed, "interval_s": interval, "blocks_per_session": blocks,
            "ok": ok,
            "sessions": rows, "kills": kills, "serve_exit": code, "rss": rss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", choices=("soak", "chaos"))
    parser.add_argument("--minutes", type=float, help="soak: minutes of video (default 60); chaos: minutes of kills "
                        "(default 10)")  # fmt: skip
    parser.add_argument("--blocks", type=int, help="chaos: blocks per session (default: --minutes of video)")
    parser.add_argument("--seed", type=int, default=1, help="chaos: the seed of the kills and the sessions")
    parser.add_argument("--interval", default="10,20", metavar="MIN,MAX",
                        help="chaos: seconds between two kills, drawn uniformly (default 10,20)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, help="keep logs and recordings here (default: a temporary folder)")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="soak: the browser that watches the session")
    args = parser.parse_args()
    for tool in ("redis-server", "ffprobe"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench/longrun.py needs {tool} (make system-deps)")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.run == "soak":
            report = soak(args.minutes or 60.0, workdir, args.chromium)
        else:
            minutes = args.minutes or 10.0
            low, high = (float(x) for x in args.interval.split(","))
            blocks = args.blocks or max(8, round(minutes * 60 * FPS / FRAMES_PER_BLOCK))
            report = chaos(minutes, blocks, args.seed, (low, high), workdir)
    print(json.dumps(report, indent=1))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
