#!/usr/bin/env bash
# `make demo`: the engine's parity with the reference, a video generated in-process, a playable toy
# world steered by a scripted action track, then the same video as step 2 through the whole mesh
# (scheduler, worker, kvcache_svc, streamer) on 127.0.0.1.
set -euo pipefail
mkdir -p out
echo "== 1/4 parity with the reference Self Forcing / CausVid code (golden vectors)"
inferix verify-golden tests/golden | tail -n 1
echo "== 2/4 inferix generate (built-in toyworld model) -> out/demo-generate.mp4"
inferix generate --prompt "a red ball bouncing to the right" --prompt-at '16:"the ball turns green"' \
  --blocks 32 --seed 1 --out out/demo-generate.mp4
echo "== 3/4 toyworld-play: the arrow keys of scripts/play_demo_track.json steer the ball -> out/demo-play.mp4"
inferix generate --model toyworld-play --prompt "a red ball steered by the arrow keys" \
  --actions scripts/play_demo_track.json --blocks 16 --seed 1 --quiet --out out/demo-play.mp4
echo "   where the ball is at the end of each block (x right, y down), under the keys held:"
python3 -m toyworld_lab.play_eval --track scripts/play_demo_track.json --blocks 16 --seed 1 \
  --prompt "a red ball steered by the arrow keys"
echo "== 4/4 inferix serve + a session with a prompt change -> out/demo-session.mp4"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
inferix serve --port "$port" --workdir out/demo-serve > out/demo-serve.log 2>&1 &
serve_pid=$!
trap 'kill -TERM $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null || true' EXIT
export INFERIX_SERVER="127.0.0.1:$port"
for _ in $(seq 1 120); do grep -q "Ctrl-C to stop" out/demo-serve.log 2>/dev/null && break; sleep 1; done
grep -q "Ctrl-C to stop" out/demo-serve.log || { cat out/demo-serve.log; exit 1; }
session=$(inferix session create --prompt "a red ball bouncing to the right" \
  --prompt-at '16:"the ball turns green"' --blocks 32 --seed 1)
inferix session watch "$session"
inferix session download "$session" out/demo-session.mp4
echo "done: out/demo-generate.mp4 and out/demo-session.mp4 (the same frames, generated two ways), out/demo-play.mp4"
