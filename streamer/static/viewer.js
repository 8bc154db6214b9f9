// Inferix viewer page: plays one session over WebRTC (WHEP) and steers it through the streamer's JSON API.
// Standard APIs only (RTCPeerConnection, fetch, getStats), so it runs in current Chromium and Firefox.
"use strict";

const sessionId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop() || "");
// The viewer token comes in the URL fragment, which browsers never send to a server.
const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
const $ = (id) => document.getElementById(id);
const text = (id, value) => { $(id).textContent = value; };

// Exposed for debugging and for the end-to-end tests.
const viewer = {
  sessionId, pc: null, resource: null, codec: null, framesDecoded: 0, fps: 0,
  pageStart: performance.now(), firstFrameMs: null, status: null, ended: false, error: null,
};
window.inferixViewer = viewer;

function auth(headers = {}) {
  return { Authorization: `Bearer ${token}`, ...headers };
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: auth(options.headers) });
  const body = await response.text();
  let data;
  try { data = JSON.parse(body); } catch { data = { error: body.trim() }; }
  if (!response.ok) {
    const error = new Error(data.error || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function iceGatheringDone(pc, timeoutMs) {
  return new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    const timer = setTimeout(resolve, timeoutMs);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { clearTimeout(timer); resolve(); }
    });
  });
}

function watchFirstFrame(video) {
  const first = () => {
    if (viewer.firstFrameMs === null) {
      viewer.firstFrameMs = performance.now() - viewer.pageStart;
      text("stat-ttff-page", `${viewer.firstFrameMs.toFixed(0)} ms`);
    }
  };
  if ("requestVideoFrameCallback" in video) video.requestVideoFrameCallback(first);
  else video.addEventListener("loadeddata", first, { once: true });
}

async function connect() {
  const pc = new RTCPeerConnection();
  viewer.pc = pc;
  pc.addTransceiver("video", { direction: "recvonly" });
  pc.addEventListener("track", (event) => {
    const video = $("video");
    video.srcObject = event.streams[0] || new MediaStream([event.track]);
    watchFirstFrame(video);
  });
  pc.addEventListener("connectionstatechange", () => {
    text("stat-connection", pc.connectionState);
    if (pc.connectionState === "failed" && !viewer.ended) retry("connection failed", 1000);
  });
  await pc.setLocalDescription(await pc.createOffer());
  await iceGatheringDone(pc, 2000); // no trickle ICE: the offer carries its candidates
  const response = await fetch(`/whep/${encodeURIComponent(sessionId)}`, {
    method: "POST",
    headers: auth({ "Content-Type": "application/sdp" }),
    body: pc.localDescription.sdp,
  });
  const body = await response.text();
  if (response.status !== 201) {
    pc.close();
    const error = new Error(body.trim() || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  viewer.resource = response.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: body });
  text("message", "");
}

let retryTimer = null;
function retry(reason, delayMs) {
  if (retryTimer !== null) return;
  text("message", `${reason}; retrying…`);
  if (viewer.pc) viewer.pc.close();
  retryTimer = setTimeout(() => { retryTimer = null; start(); }, delayMs);
}

async function start() {
  try {
    await connect();
  } catch (error) {
    viewer.error = error.message;
    if (error.status === 403) text("message", `Not allowed: ${error.message}`);
    else if (error.status === 410) { viewer.ended = true; text("message", "This session has ended."); }
    else retry(error.message, error.status === 404 ? 1000 : 2000);
  }
}

async function pollStats() {
  const pc = viewer.pc;
  if (!pc) return;
  const report = await pc.getStats();
  report.forEach((stat) => {
    if (stat.type === "inbound-rtp" && stat.kind === "video") {
      viewer.framesDecoded = stat.framesDecoded || 0;
      viewer.fps = stat.framesPerSecond || 0;
      const codec = stat.codecId && report.get(stat.codecId);
      if (codec) viewer.codec = codec.mimeType;
    }
  });
  text("stat-fps", viewer.fps ? viewer.fps.toFixed(1) : "–");
  text("stat-decoded", String(viewer.framesDecoded));
  text("stat-codec", viewer.codec || "–");
}

const ms = (value) => (value === null || value === undefined ? "–" : `${Math.round(value)} ms`);

async function pollStatus() {
  try {
    const status = await api(`/api/sessions/${encodeURIComponent(sessionId)}`);
    viewer.status = status;
    const session = status.session || {};
    const stream = status.stream || {};
    text("state", session.state || "unknown");
    if (session.prompt !== undefined) text("current-prompt", session.prompt || "…");
    const block = session.block_latency_ms || {};
    text("stat-block", `${ms(block.last)} / ${ms(block.p50)}`);
    text("stat-blocks", String(session.blocks_done ?? "–"));
    text("stat-ttff-session", ms(stream.time_to_first_frame_ms));
    text("stat-fps-out", stream.fps_out ? stream.fps_out.toFixed(1) : "–");
    text("stat-underruns", `${stream.underruns ?? 0} (${(stream.underrun_s ?? 0).toFixed(1)} s held)`);
    text("stat-viewers", String(stream.viewers ?? "–"));
    text("stat-rtmp", stream.rtmp ? stream.rtmp.state + (stream.rtmp.error ? ` – ${stream.rtmp.error}` : "") : "–");
    if (session.last_error) text("message", session.last_error);
    if (stream.ended) viewer.ended = true;
  } catch (error) {
    text("message", error.message);
  }
}

async function command(name, body) {
  const options = { method: "POST" };
  if (body !== undefined) {
    options.body = JSON.stringify(body);
    options.headers = { "Content-Type": "application/json" };
  }
  try {
    const result = await api(`/api/sessions/${encodeURIComponent(sessionId)}/${name}`, options);
    text("command-result", `${name}: applies at block ${result.applies_at_block}`);
    return result;
  } catch (error) {
    text("command-result", `${name}: ${error.message}`);
    throw error;
  }
}
viewer.command = command;

$("prompt-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const prompt = $("prompt-input").value.trim();
  if (prompt) command("prompt", { text: prompt }).catch(() => {});
});
$("pause").addEventListener("click", () => command("pause").catch(() => {}));
$("resume").addEventListener("click", () => command("resume").catch(() => {}));
$("stop").addEventListener("click", () => command("stop").catch(() => {}));
window.addEventListener("pagehide", () => {
  if (viewer.resource) fetch(viewer.resource, { method: "DELETE", headers: auth(), keepalive: true });
});

text("session", sessionId);
if (!token) {
  text("message", "This link has no viewer token (#token=…); open the session's webrtc_page URL.");
} else {
  start();
  pollStatus();
  setInterval(pollStats, 1000);
  setInterval(pollStatus, 1000);
}
