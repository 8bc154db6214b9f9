#!/usr/bin/env bash
# System packages the test suite and the demo need (Debian/Ubuntu). Idempotent: skips what is there.
set -euo pipefail

# ffmpeg: ffprobe checks recordings and plays RTMP; chromium: the viewer-page tests and bench/streaming.py
# (driven by Playwright, never a downloaded browser); nginx + libnginx-mod-rtmp: the local RTMP server
# `inferix serve` and the RTMP tests start as a child process with a generated config; coturn: the TURN server
# the WebRTC relay test starts.
packages=(ffmpeg chromium redis-server nginx libnginx-mod-rtmp coturn)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages present: ${packages[*]}"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "installing system packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
