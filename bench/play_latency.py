"""Input-to-photon latency of playing in the browser (issues 25, 40): key press -> first frame made under it
(`--model toyworld-play`: -> first frame showing its object pushed the pressed way; see MOTION_PX).

Both latency modes side by side in one run (issue 40): one session per mode, one after the other on the
same mesh and browser: `interactive` (`latency="interactive"`: dispatched one generation time ahead,
the streamer's adaptive jitter buffer, no browser playout delay) and `smooth` (the default mode, at
`--smooth-lookahead` blocks, 1 by default: the best smooth setting of issue 25). The run ends with one
line per mode: `<mode> key-to-photon p50 <ms> ms p95 <ms> ms underruns <n>` (underruns: the streamer's,
whole session).

A local mesh (one worker serving `matrixgame2-tiny`, the scheduler's default lookahead 0 so that a
session can ask for 0 or more) and the session's own viewer page in headless Chromium (Debian's, driven
by Playwright). The bench focuses the video and presses W and D in turn; each key is held until the page
shows its action applied (its block's event came), then released (the release goes out as the neutral
action and is waited for the same way). Before every key event it waits a random 0 to 1 block, so the
presses land at every phase of the block on screen.

Per press, all on the page's clock (`performance.now()`):

- t_key: the keydown event's `timeStamp` (the page records it with the action it caused);
- N: the block the action applies at, from the answer the page got (`applies_at_block`); the SDK's
  event stream confirms block N was made under exactly that action;
- t_photon: `expectedDisplayTime` (from `requestVideoFrameCallback`) of the first presented frame whose
  index is at least block N's `first_frame` (BlockDone).

Latency = t_photon - t_key: the page's coalescing, the streamer's and scheduler's command path, waiting
for the next block boundary the scheduler can still change, generating block N, the pacer releasing
its frames on time, WebRTC and Chromium's decode and display.

**Which frame is on screen.** By its pixels. Chromium draws every presented frame (a hook on
`requestVideoFrameCallback`, added by the bench, not part of the page) into a canvas at the video's
own size and keeps a 12 x 8 grey thumbnail (4 x 4 pixel means); the bench decodes the session's MP4
recording (the same encoded stream the viewer got: no second encode for H.264 viewers) and makes
the same thumbnails. Each presented frame is the recording frame with the nearest thumbnail. That is
unambiguous here: consecutive frames of matrixgame2-tiny (random weights) differ by ~60 grey levels
per pixel, while the same frame seen by Chromium and by PyAV differs by a few (colour conversion and
rounding). The margin is printed: the largest best-match distance against the smallest second-best
(both mean absolute grey differences of the thumbnails). No counting is involved, so frames Chromium
dropped or never called back for, freezes, and the point the viewer joined cannot shift it.

**Floor.** A press lands on average half a block before the scheduler's next block boundary. With
lookahead L the block it changes is dispatched at that boundary and due on screen L blocks later, or
when it is made if generating it takes longer: floor = 0.5 x block + max(generation p50, L x block).
"Frames ahead" is what the schedule made each press wait: the playback time from the frame on screen
at the keydown to block N's first frame (the display pipeline is in both ends, so latency minus frames
ahead is within a frame of 0 when playback is steady). Two things move the measurement off the floor:
the scheduler's playback clock counts block b from frame 12b while Matrix-Game's block 0 has 9 frames
(block b starts at 12b - 3), so its lead is 3 frames (188 ms) shorter than it thinks; and the streamer
starts its clock a jitter buffer (100 ms) after the first frame and, under `hold`, keeps every freeze
(an underrun) in the timeline, so each freeze adds to every later action's latency. With toyworld-play
the floor adds the frames the world's physics takes to move a resting object MOTION_PX (the photon is the
third frame a key is held: two frames more than the first that shows it). A warm-up session
runs first so the worker's first-call costs do not land in the measured sessions.

    python bench/play_latency.py                     # 30 presses per mode: interactive, then smooth (lookahead 1)
    python bench/play_latency.py --presses 10 --modes interactive
    python bench/play_latency.py --model toyworld-play  # ArrowRight / ArrowLeft in turn, photon by motion
    python bench/play_latency.py --model toyworld-play-1f  # the same with one-frame blocks
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
from PIL import Image
from playwright.sync_api import Page, sync_playwright

from inferix.client import BlockDone, Client, CommandAccepted
from inferix.spec.latency import LATENCY_CHOICES
from inferix.spec.presets import load_preset
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh
from toyworld_lab.play import pushed_from_rest
from toyworld_lab.play_eval import BEAT_FRAMES

MODEL = "matrixgame2-tiny"
KEYS = ("w", "d")  # Playwright key names; the page binds the schema's W and D
# toyworld-play (--model toyworld-play): its object starts at rest in the upper left under seed 1, and the
# arrows push it right and back left. Its frames differ by a few pixels, so no thumbnail tells them apart:
# the photon is the first presented frame in which the object has moved MOTION_PX the pressed way.
PLAY_MODEL = "toyworld-play"
PLAY_MODELS = (PLAY_MODEL, "toyworld-play-1f")  # the same weights with 3-frame and one-frame blocks
BEAT_S = BEAT_FRAMES / 16  # the pauses of a toyworld-play press are in beats (its 3-frame block), whatever the block
PLAY_PROMPT = "a red ball steered by the arrow keys"
PLAY_KEYS = ("ArrowRight", "ArrowLeft")
PLAY_DIRECTIONS = {"right": (1.0, 0.0), "left": (-1.0, 0.0)}  # by schema name (ArrowRight is "right")
# The simulator accelerates a resting object 1.2 px/frame² with friction 0.7 (toyworld_lab/play.py): it moves
# 0.84 px in the first frame a key is held, 2.3 px by the second and 4.1 px by the third, so the photon counted
# is the third frame that shows the key, two frames (125 ms) after the first. A smaller move is within what an
# unpushed object drifts over the half second a press takes to show (1 px gave 32 ms).
MOTION_PX = 3.0
BACKGROUND = (18, 18, 28)  # toyworld_lab.world.BACKGROUND; a pixel 80 RGB units away from it is the object's
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
THUMB = (12, 8)  # thumbnail columns x rows


def frame_hook(summary: str) -> str:
    """JS run in the page: draws each presented frame into a canvas and keeps `{at: its expected display time,
    ...summary}`; `summary` is a JS function body of (rgba, width, height, arg) returning an object."""
    return (
        """
(arg) => {
  const video = document.getElementById('video');
  const canvas = document.createElement('canvas');
  const context = canvas.getContext('2d', { willReadFrequently: true });
  const summarize = (rgba, width, height, arg) => {"""
        + summary
        + """};
  window.benchFrames = [];
  const onFrame = (now, meta) => {
    const width = video.videoWidth, height = video.videoHeight;
    canvas.width = width; canvas.height = height;
    context.drawImage(video, 0, 0, width, height);
    const rgba = context.getImageData(0, 0, width, height).data;
    window.benchFrames.push({ at: meta.expectedDisplayTime, ...summarize(rgba, width, height, arg) });
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}
"""
    )


# A grey thumbnail of `arg` = [columns, rows] cells (matrixgame2-tiny: the frame is found by its pixels).
FRAME_HOOK = frame_hook("""
    const [columns, rows] = arg;
    const cw = width / columns, ch = height / rows, thumb = new Array(columns * rows).fill(0);
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) {
        const i = (y * width + x) * 4;
        thumb[Math.floor(y / ch) * columns + Math.floor(x / cw)] += (rgba[i] + rgba[i + 1] + rgba[i + 2]) / 3;
      }
    }
    return { thumb: thumb.map((v) => v / (cw * ch)) };
""")
# The centroid of the object's pixels, 80 RGB units or more from the background `arg` (toyworld-play).
CENTROID_HOOK = frame_hook("""
    const [r0, g0, b0] = arg;
    let sx = 0, sy = 0, n = 0;
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) {
        const i = (y * width + x) * 4;
        const dr = rgba[i] - r0, dg = rgba[i + 1] - g0, db = rgba[i + 2] - b0;
        if (dr * dr + dg * dg + db * db > 6400) { sx += x + 0.5; sy += y + 0.5; n++; }
      }
    }
    return { x: n ? sx / n : null, y: n ? sy / n : null, area: n };
""")
SENT = (
    "() => inferixViewer.play.sent.map((e) => ({keys: e.keys, inputAt: e.inputAt, sentAt: e.sentAt,"
    " answeredAt: e.answeredAt, appliesAt: e.appliesAt, state: e.state}))"
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presses", type=int, default=30, help="key presses per latency mode (default 30)")
    p.add_argument(
        "--modes", default="interactive,smooth", help="latency modes to measure, in order (default interactive,smooth)"
    )
    p.add_argument("--smooth-lookahead", type=int, default=1, help="the smooth session's lookahead (default 1)")
    p.add_argument("--seed", type=int, default=1, help="seed of the pauses between key events")
    p.add_argument("--threads", type=int, default=1, help="the worker's torch threads (default 1)")
    p.add_argument(
        "--compile", action="store_true", help="the worker compiles its DiT step (inductor; a minute more at start)"
    )
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument(
        "--model",
        choices=(MODEL, *PLAY_MODELS),
        default=MODEL,
        help=f"{MODEL} (photon: block N's first frame, found by its pixels), {' or '.join(PLAY_MODELS)} (photon: "
        f"the first frame in which the object moved {MOTION_PX:g} px the pressed way); default %(default)s",
    )
    return p.parse_args()


@dataclass
class Press:
    keys: tuple[str, ...]
    block: int
    latency_ms: float
    ahead_ms: float  # playback from the frame on screen at the keydown to block N's first frame
    round_trip_ms: float  # page -> streamer -> scheduler -> page, the action's answer
    generation_ms: float  # block N, dispatch to done


@dataclass
class Run:
    mode: str
    lookahead: int
    presses: list[Press]
    presented: int  # frames the hook saw
    match_worst: float  # the largest best-match thumbnail distance (grey levels)
    match_margin: float  # the smallest second-best distance
    out_of_order: int  # presented frames whose index is not above the one before (should be 0)
    chromium_dropped: int
    block_s: float
    underruns: int  # the streamer's, whole session: each freeze under `hold` delays playback for good
    underrun_s: float
    page: dict[str, Any]  # what the page measured: its latency mode, received -> shown p50; the streamer's buffer


@dataclass
class MotionRun:
    """toyworld-play: key press -> the first frame showing the object moving that way."""

    mode: str
    lookahead: int
    latency_ms: list[float]
    missed: int  # presses whose motion never showed within the frames presented before the key-up
    round_trip_ms: list[float]
    generation_ms: float
    block_s: float
    presented: int
    underruns: int
    underrun_s: float
    page: dict[str, Any]


def wait(page: Page, expression: str, timeout_s: float = 30.0) -> Any:
    """Poll a page expression until truthy (the page's CSP forbids Playwright's eval-based waits)."""
    deadline = time.monotonic() + timeout_s
    while not (value := page.evaluate(expression)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {expression}")
        time.sleep(0.02)
    return value


def open_player(browser: Any, url: str, hook: str, hook_arg: Any) -> Page:
    """The viewer page at `url`, playing, with the frame hook installed and the keys going to it."""
    page = browser.new_page()
    try:
        page.goto(url)
        wait(page, "inferixViewer.play !== null && inferixViewer.framesDecoded > 0")
        page.evaluate(hook, hook_arg)
        page.focus("#screen")
    except BaseException:
        page.close()
        raise
    return page


def key_event(page: Page, down: bool, key: str) -> None:
    """One key event, then wait until the action it changed has reached its block (the page says applied)."""
    before = page.evaluate("inferixViewer.play.sent.length")
    (page.keyboard.down if down else page.keyboard.up)(key)
    state = wait(
        page,
        f"inferixViewer.play.sent.length > {before} && ['applied', 'superseded', 'refused']"
        ".includes(inferixViewer.play.sent.at(-1).state) && inferixViewer.play.sent.at(-1).state",
    )
    if state != "applied":
        raise RuntimeError(f"the page's action was {state}: {page.evaluate(SENT)[-1]}")


PAGE = (
    "({latency: inferixViewer.latency, shown_ms: inferixViewer.displayDelayMs,"
    " jitter_buffer_ms: inferixViewer.status.stream.jitter_buffer_ms})"
)


def stop_and_collect(
    client: Client, session_id: str, num_blocks: int, page: Page
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Stop the session, let the viewer play out the frames still due, then return what the page sent, the
    frames the hook saw, the streamer's stream stats and what the page measured (`PAGE`, before the stop)."""
    measured = page.evaluate(PAGE)
    with client.interact(session_id, from_block=num_blocks) as session:
        session.stop()
        next(e for e in session.events() if isinstance(e, CommandAccepted) and e.command == "stop")
    wait(page, "inferixViewer.status && inferixViewer.status.stream.ended", timeout_s=60)
    last = -1  # the stream has ended once the frames due are played: wait until the hook is quiet
    while (count := page.evaluate("window.benchFrames.length")) != last:
        last = count
        time.sleep(1.0)
    stream = page.evaluate("inferixViewer.status.stream")
    return page.evaluate(SENT), page.evaluate("window.benchFrames"), stream, measured


def warm_up(mesh: Mesh, image: Path) -> None:
    """One short session first: the worker's first blocks pay one-off costs."""
    with Client(mesh.address, timeout=120) as client:
        info = client.create_session(model=MODEL, image=image, num_blocks=3)
        for _ in client.events(info.session_id):
            pass


def play(mesh: Mesh, browser: Any, workdir: Path, mode: str, lookahead: int, presses: int, rng: random.Random) -> Run:
    image = workdir / "start.png"
    with Client(mesh.address, timeout=120) as client:
        info = client.create_session(
            model=MODEL, image=image, num_blocks=min(341, presses * (2 * lookahead + 8) + 8), lookahead=lookahead,
            latency=mode,
        )  # fmt: skip
        page = open_player(browser, info.viewer_url, FRAME_HOOK, list(THUMB))
        try:
            block_s = 12 / 16  # refined from the events below; only paces the pauses here
            for i in range(presses):
                key = KEYS[i % len(KEYS)]
                for down in (True, False):
                    time.sleep(rng.uniform(0, block_s))  # any phase of the block on screen
                    key_event(page, down, key)
            sent, presented, stream, measured = stop_and_collect(client, info.session_id, info.num_blocks, page)
            stats = page.evaluate(
                "inferixViewer.pc.getStats().then((r) => { let d = 0; r.forEach((s) => {"
                " if (s.type === 'inbound-rtp' && s.kind === 'video') d = s.framesDropped || 0; }); return d; })"
            )
        finally:
            page.close()
        blocks = {e.block_index: e for e in client.events(info.session_id) if isinstance(e, BlockDone)}
        recording = client.download_recording(client.get_session(info.session_id), workdir / f"{info.session_id}.mp4")
    return measure(mode, lookahead, sent, presented, blocks, stream, int(stats), thumbnails(recording), measured)


def play_motion(
    mesh: Mesh, browser: Any, model: str, mode: str, lookahead: int, presses: int, rng: random.Random
) -> MotionRun:
    """toyworld-play: hold ArrowRight, then ArrowLeft, ... each until its block is made; before each press the
    object comes to rest (two beats after the release, and still on screen), then a random 0 to 1 beat more."""
    per_beat = BEAT_FRAMES // load_preset(model).pipeline.block.num_frame_per_block
    with Client(mesh.address, timeout=120) as client:
        info = client.create_session(
            PLAY_PROMPT, model=model, seed=1, num_blocks=min(5000, (presses * (2 * lookahead + 12) + 8) * per_beat),
            lookahead=lookahead, latency=mode,
        )  # fmt: skip
        page = open_player(browser, info.viewer_url, CENTROID_HOOK, list(BACKGROUND))
        try:
            for i in range(presses):
                key = PLAY_KEYS[i % len(PLAY_KEYS)]
                time.sleep(2 * BEAT_S)
                wait_for_rest(page)
                time.sleep(rng.uniform(0, BEAT_S))  # any phase of the beat
                key_event(page, True, key)
                time.sleep(rng.uniform(0, BEAT_S))
                key_event(page, False, key)
            sent, presented, stream, measured = stop_and_collect(client, info.session_id, info.num_blocks, page)
        finally:
            page.close()
        blocks = {e.block_index: e for e in client.events(info.session_id) if isinstance(e, BlockDone)}
    return measure_motion(mode, lookahead, sent, presented, blocks, stream, measured)


# The object is at rest once its centroid moved less than this over the last REST_FRAMES presented frames.
REST_PX, REST_FRAMES = 0.5, 4
REST = (
    f"(() => {{ const f = window.benchFrames.slice(-{REST_FRAMES}).filter((p) => p.x !== null);"
    f" if (f.length < {REST_FRAMES}) return false;"
    " const xs = f.map((p) => p.x), ys = f.map((p) => p.y);"
    f" return Math.max(...xs) - Math.min(...xs) < {REST_PX} && Math.max(...ys) - Math.min(...ys) < {REST_PX}; }})()"
)


def wait_for_rest(page: Page, timeout_s: float = 3.0) -> None:
    """Until the object on screen is still (a press from motion the pressed way would count too early); a
    model whose object never settles within `timeout_s` is pressed anyway."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(REST) and time.monotonic() < deadline:
        time.sleep(0.02)


def measure_motion(
    mode: str,
    lookahead: int,
    sent: list[dict[str, Any]],
    presented: list[dict[str, Any]],
    blocks: dict[int, BlockDone],
    stream: dict[str, Any],
    page: dict[str, Any],
) -> MotionRun:
    shown = [(float(p["at"]), p["x"], p["y"]) for p in presented]
    latency, round_trip, generation = [], [], []
    missed = 0
    for entry, release in zip(sent, sent[1:], strict=False):
        if not entry["keys"]:
            continue  # a release: the neutral action
        block = blocks[entry["appliesAt"]]
        names = [key.removeprefix("Arrow").lower() for key in entry["keys"]]
        if [key.removeprefix("Arrow").lower() for key in block.keys] != names:
            raise RuntimeError(f"block {block.block_index} was made under {block.keys}, the page sent {entry}")
        dx, dy = PLAY_DIRECTIONS[names[0]]
        before = [s for s in shown if s[0] <= entry["inputAt"] and s[1] is not None]
        if not before:
            missed += 1
            continue
        _, x0, y0 = before[-1]
        moved = next(
            (at for at, x, y in shown
             if entry["inputAt"] < at <= release["inputAt"] + 2000 and x is not None
             and (x - x0) * dx + (y - y0) * dy >= MOTION_PX),
            None,
        )  # fmt: skip
        if moved is None:
            missed += 1
            continue
        latency.append(moved - entry["inputAt"])
        round_trip.append(entry["answeredAt"] - entry["sentAt"])
        generation.append(block.dispatch_to_done_ms)
    fps = float(stream["fps"])
    block_frames = statistics.median(b.num_frames for b in blocks.values())
    return MotionRun(
        mode,
        lookahead,
        latency,
        missed,
        round_trip,
        statistics.median(generation) if generation else 0.0,
        block_frames / fps,
        len(presented),
        int(stream["underruns"]),
        float(stream["underrun_s"]),
        page,
    )


def frames_to_move(px: float) -> int:
    """How many frames a key is held, from rest, before the simulator's object has moved `px` (3 for 3 px)."""
    return next(frame + 1 for frame, moved in enumerate(pushed_from_rest("right", 32)) if moved >= px)


def report_motion(model: str, fps: float, runs: list[MotionRun]) -> None:
    print(f"\n{model}: key press -> first frame with the object {MOTION_PX:g} px the pressed way")
    print(f"{'mode':<16} {'presses':<8} {'p50 ms':>8} {'p95 ms':>8} {'min ms':>8} {'max ms':>8}   floor ms")
    physics = frames_to_move(MOTION_PX) - 1  # frames after the first that shows the key
    for run in runs:
        block_ms = run.block_s * 1e3
        floor = 0.5 * block_ms + max(run.generation_ms, run.lookahead * block_ms) + physics * 1e3 / fps
        values = run.latency_ms
        print(
            f"{label(run.mode, run.lookahead):<16} {len(values):<8}"
            f" {percentile(values, 50):>8.0f} {percentile(values, 95):>8.0f}"
            f" {min(values):>8.0f} {max(values):>8.0f}   {floor:.0f} = 0.5 x {block_ms:.0f} ms block"
            f" + max(generation {run.generation_ms:.0f}, {run.lookahead} x {block_ms:.0f})"
            f" + {physics} frames to move {MOTION_PX:g} px"
        )
    for run in runs:
        print(
            f"{label(run.mode, run.lookahead)}: action round trip page->scheduler->page p50"
            f" {percentile(run.round_trip_ms, 50):.0f} ms; {run.missed} press(es) with no motion seen;"
            f" {run.presented} frames presented; underruns {run.underruns} ({run.underrun_s:.2f} s held); {page(run)}"
        )
    print()
    for run in runs:
        summary(run.mode, run.latency_ms, run.underruns)


def label(mode: str, lookahead: int) -> str:
    return mode if mode == "interactive" else f"{mode} (L={lookahead})"


def page(run: Run | MotionRun) -> str:
    shown, buffer = run.page.get("shown_ms"), run.page.get("jitter_buffer_ms")
    return (
        f"page: mode {run.page.get('latency')}, received->shown p50 {shown if shown is None else round(shown)} ms;"
        f" streamer jitter buffer {buffer} ms"
    )


def summary(mode: str, latency: list[float], underruns: int) -> None:
    """The run's line per mode, for scripts comparing runs."""
    print(
        f"{mode} key-to-photon p50 {percentile(latency, 50):.0f} ms p95 {percentile(latency, 95):.0f} ms"
        f" underruns {underruns}"
    )


def thumbnails(mp4: Path) -> np.ndarray:
    """The recording's frames as grey thumbnails, [frames, rows * columns], as the page hook makes them."""
    columns, rows = THUMB
    thumbs = []
    with av.open(str(mp4)) as container:
        for frame in container.decode(video=0):
            grey = frame.to_ndarray(format="rgb24").astype(np.float64).mean(axis=2)
            height, width = grey.shape
            cells = grey.reshape(rows, height // rows, columns, width // columns).mean(axis=(1, 3))
            thumbs.append(cells.ravel())
    return np.stack(thumbs)


def identify(presented: np.ndarray, recording: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Each presented thumbnail's recording frame; the worst best-match and the smallest second-best
    distance (mean absolute grey difference)."""
    distance = np.concatenate(  # in chunks: the full difference tensor would be gigabytes
        [np.abs(chunk[:, None, :] - recording[None, :, :]).mean(axis=2) for chunk in np.array_split(presented, 64)]
    )
    order = np.argsort(distance, axis=1)
    rows = np.arange(len(presented))
    best, second = distance[rows, order[:, 0]], distance[rows, order[:, 1]]
    return order[:, 0], float(best.max()), float(second.min())


def measure(
    mode: str,
    lookahead: int,
    sent: list[dict[str, Any]],
    presented: list[dict[str, Any]],
    blocks: dict[int, BlockDone],
    stream: dict[str, Any],
    chromium_dropped: int,
    recording: np.ndarray,
    page: dict[str, Any],
) -> Run:
    fps = float(stream["fps"])
    index, worst, margin = identify(np.array([p["thumb"] for p in presented]), recording)
    shown_at = [float(p["at"]) for p in presented]
    presses = []
    for entry in sent:
        if not entry["keys"]:
            continue  # a release: the neutral action
        block = blocks[entry["appliesAt"]]
        if tuple(block.keys) != tuple(entry["keys"]):
            raise RuntimeError(f"block {block.block_index} was made under {block.keys}, the page sent {entry}")
        first = next(i for i, frame in enumerate(index) if frame >= block.first_frame)
        on_screen = max(i for i, at in enumerate(shown_at) if at <= entry["inputAt"])
        presses.append(
            Press(
                tuple(entry["keys"]),
                block.block_index,
                shown_at[first] - entry["inputAt"],
                (block.first_frame - int(index[on_screen])) / fps * 1e3,
                entry["answeredAt"] - entry["sentAt"],
                block.dispatch_to_done_ms,
            )
        )
    block_frames = statistics.median(b.num_frames for b in blocks.values())
    return Run(
        mode,
        lookahead,
        presses,
        len(presented),
        worst,
        margin,
        int(np.sum(np.diff(index) <= 0)),
        chromium_dropped,
        block_frames / fps,
        int(stream["underruns"]),
        float(stream["underrun_s"]),
        page,
    )


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def report(runs: list[Run]) -> None:
    print(f"\n{'mode':<16} {'presses':<8} {'p50 ms':>8} {'p95 ms':>8} {'min ms':>8} {'max ms':>8}   floor ms")
    for run in runs:
        latency = [p.latency_ms for p in run.presses]
        generation = statistics.median(p.generation_ms for p in run.presses)
        block_ms = run.block_s * 1e3
        floor = 0.5 * block_ms + max(generation, run.lookahead * block_ms)
        print(
            f"{label(run.mode, run.lookahead):<16} {len(latency):<8}"
            f" {percentile(latency, 50):>8.0f} {percentile(latency, 95):>8.0f}"
            f" {min(latency):>8.0f} {max(latency):>8.0f}   {floor:.0f} = 0.5 x {block_ms:.0f} ms block"
            f" + max(generation {generation:.0f}, {run.lookahead} x {block_ms:.0f})"
        )
    print()
    for run in runs:
        ahead = [p.ahead_ms for p in run.presses]
        round_trip = [p.round_trip_ms for p in run.presses]
        display = [p.latency_ms - p.ahead_ms for p in run.presses]
        print(
            f"{label(run.mode, run.lookahead)}: frames ahead at the keydown p50 {percentile(ahead, 50):.0f} ms"
            f" (p95 {percentile(ahead, 95):.0f}); latency - frames ahead p50 {percentile(display, 50):.0f} ms;"
            f" action round trip page->scheduler->page p50 {percentile(round_trip, 50):.0f} ms"
            f" (p95 {percentile(round_trip, 95):.0f})"
        )
        print(
            f"  frames: {run.presented} presented, identified by thumbnail (best match <= {run.match_worst:.1f},"
            f" second best >= {run.match_margin:.1f} grey levels), {run.out_of_order} out of order;"
            f" Chromium dropped {run.chromium_dropped}; underruns {run.underruns} ({run.underrun_s:.2f} s held)"
        )
        print(f"  {page(run)}")
    print()
    for run in runs:
        summary(run.mode, [p.latency_ms for p in run.presses], run.underruns)


def main() -> None:
    args = parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    for mode in modes:
        if mode not in LATENCY_CHOICES:
            raise SystemExit(f"--modes: {mode!r} is not a latency mode ({', '.join(LATENCY_CHOICES)})")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        y, x = np.mgrid[0:32, 0:48]
        Image.fromarray(np.stack([x * 5, y * 7, (x + y) * 3], axis=-1).astype(np.uint8)).save(workdir / "start.png")
        (workdir / "mesh").mkdir()
        config = MeshConfig(workdir=workdir / "mesh", workers=1, worker_threads=args.threads, model=Path(args.model))
        config.compile = args.compile
        config.capacity_probe, config.realtime_streams, config.lookahead = 0, 64, 0
        step = "compiled" if args.compile else "eager"
        print(f"mesh: 1 worker serving {args.model} ({args.threads} torch thread(s), {step}); {args.presses} presses "
              f"per mode {modes} ...", flush=True)  # fmt: skip
        mesh = start_mesh(config)
        runs: list[Run] = []
        motion: list[MotionRun] = []
        try:
            if args.model == MODEL:
                warm_up(mesh, workdir / "start.png")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_FLAGS)
                for mode in modes:
                    lookahead = args.smooth_lookahead if mode == "smooth" else 0
                    started = time.monotonic()
                    if args.model == MODEL:
                        runs.append(play(mesh, browser, workdir, mode, lookahead, args.presses, rng))
                    else:
                        motion.append(play_motion(mesh, browser, args.model, mode, lookahead, args.presses, rng))
                    print(f"{label(mode, lookahead)}: done in {time.monotonic() - started:.0f} s", flush=True)
                browser.close()
        finally:
            mesh.stop()
    if runs:
        report(runs)
    if motion:
        report_motion(args.model, float(load_preset(args.model).video.fps), motion)


if __name__ == "__main__":
    main()
