// Inferix viewer page: plays one session over WebRTC (WHEP) and steers it through the streamer's JSON API.
// Standard APIs only (RTCPeerConnection, fetch, getStats), so it runs in current Chromium and Firefox.
"use strict";

const sessionId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop() || "");
// The viewer token comes in the URL fragment, which browsers never send to a server.
const fragment = new URLSearchParams(location.hash.slice(1));
const token = fragment.get("token") || "";
// "#...&transport=relay" takes only TURN-relayed paths: checks that the TURN server works for this viewer.
const relayOnly = fragment.get("transport") === "relay";
const $ = (id) => document.getElementById(id);
const text = (id, value) => { $(id).textContent = value; };

// Exposed for debugging and for the end-to-end tests.
const viewer = {
  sessionId, pc: null, resource: null, codec: null, framesDecoded: 0, fps: 0,
  pageStart: performance.now(), firstFrameMs: null, status: null, ended: false, error: null,
  iceServers: 0, path: null, // STUN / TURN servers the streamer offered; the media path: "direct" or "relay"
  play: null, // the play panel's state, for models that take actions
  // The session's latency mode (from the status API) and, per presented frame, how long it took from
  // its last packet received to its expected display time: the browser's own delay, as shown.
  latency: null, displayDelays: [],
  get displayDelayMs() { // the median, worked out when read (the stats panel, once a second), not per frame
    if (this.displayDelays.length === 0) return null;
    const sorted = [...this.displayDelays].sort((a, b) => a - b);
    return sorted[Math.floor(sorted.length / 2)];
  },
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

// Interactive sessions: ask the browser to play each frame as soon as it is decoded. The streamer's
// pacer already smooths the stream; a playout delay of the browser's own would add to every key press.
function applyLatency() {
  if (viewer.latency !== "interactive" || !viewer.pc) return;
  for (const receiver of viewer.pc.getReceivers()) {
    if (receiver.track.kind !== "video") continue;
    if ("jitterBufferTarget" in receiver) receiver.jitterBufferTarget = 0; // ms (the standard)
    if ("playoutDelayHint" in receiver) receiver.playoutDelayHint = 0; // seconds (Chromium's older hint)
  }
}

const DISPLAY_DELAYS_KEPT = 64;
let measuringDisplay = false; // one callback chain per page: a reconnect keeps the same video element
function measureDisplay(video) {
  if (measuringDisplay || !("requestVideoFrameCallback" in video)) return;
  measuringDisplay = true;
  const onFrame = (now, meta) => {
    if (meta.receiveTime !== undefined) { // WebRTC frames only
      viewer.displayDelays.push(meta.expectedDisplayTime - meta.receiveTime);
      if (viewer.displayDelays.length > DISPLAY_DELAYS_KEPT) viewer.displayDelays.shift();
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
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

// WHEP's ICE server discovery (RFC 9725): `Link: <turn:...>; rel="ice-server"; username=...; credential=...`.
function parseIceLinks(headers) {
  const servers = [];
  for (const link of (headers.get("Link") || "").split(/,(?=\s*<)/)) {
    const match = /^\s*<([^>]+)>(.*)$/.exec(link);
    if (!match || !/;\s*rel="?ice-server"?/.test(match[2])) continue;
    const server = { urls: match[1] };
    for (const [, name, value] of match[2].matchAll(/;\s*([\w-]+)="([^"]*)"/g)) {
      if (name === "username" || name === "credential") server[name] = value;
    }
    servers.push(server);
  }
  return servers;
}

async function iceServers() {
  const response = await fetch(`/whep/${encodeURIComponent(sessionId)}`, { method: "OPTIONS", headers: auth() });
  if (!response.ok) {
    const error = new Error((await response.text()).trim() || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return parseIceLinks(response.headers);
}

async function connect() {
  const servers = await iceServers();
  viewer.iceServers = servers.length;
  const pc = new RTCPeerConnection({ iceServers: servers, iceTransportPolicy: relayOnly ? "relay" : "all" });
  viewer.pc = pc;
  pc.addTransceiver("video", { direction: "recvonly" });
  pc.addEventListener("track", (event) => {
    const video = $("video");
    video.srcObject = event.streams[0] || new MediaStream([event.track]);
    watchFirstFrame(video);
    measureDisplay(video);
    applyLatency();
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
    if (stat.type === "candidate-pair" && stat.nominated && stat.state === "succeeded") {
      const local = report.get(stat.localCandidateId);
      if (local) viewer.path = local.candidateType === "relay" ? "relay" : "direct";
    }
    if (stat.type === "inbound-rtp" && stat.kind === "video") {
      viewer.framesDecoded = stat.framesDecoded || 0;
      viewer.fps = stat.framesPerSecond || 0;
      const codec = stat.codecId && report.get(stat.codecId);
      if (codec) viewer.codec = codec.mimeType;
    }
  });
  text("stat-fps", viewer.fps ? viewer.fps.toFixed(1) : "–");
  text("stat-path", viewer.path === "relay" ? "relayed (TURN)" : viewer.path || "–");
  text("stat-decoded", String(viewer.framesDecoded));
  text("stat-codec", viewer.codec || "–");
  text("stat-display", viewer.displayDelayMs === null ? "–" : `${Math.round(viewer.displayDelayMs)} ms`);
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
    if (stream.latency && stream.latency !== viewer.latency) {
      viewer.latency = stream.latency;
      applyLatency();
    }
    text("stat-latency", stream.latency ? `${stream.latency}; jitter buffer ${ms(stream.jitter_buffer_ms)}` : "–");
    if (session.action_schema && !viewer.play) viewer.play = setUpPlay(session.action_schema);
    if (viewer.play) markApplied(viewer.play, session.recent_blocks || []);
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

// ---- Play: keyboard (and mouse) actions for models that take them ---------------------------------
// The held action is sent through the streamer (POST .../action) whenever it changes, one request at a
// time and at most one per SEND_INTERVAL_MS, so a page stays under the scheduler's limit (30 per second,
// bursts of 60); the answer names the block the action applies at, and the block events tell whether
// that block was made under it (a later action before the same boundary wins).
const SEND_INTERVAL_MS = 50; // at most 20 sends per second
const RETRY_MS = 1000; // after a refusal other than an invalid action (e.g. too many actions)
const REFUSAL_SHOWN_MS = 5000;
// The mouse is sampled every SEND_INTERVAL_MS: MOUSE_FULL_SCALE_PX of pointer movement within one sample
// gives an axis its full range (40 px per 50 ms = 800 px/s), less moves it proportionally, no movement
// is a still camera. Right moves yaw (or steer) towards its maximum, up moves pitch towards its maximum.
const MOUSE_FULL_SCALE_PX = 40;
const SENT_KEEP = 256;

function describeAction(play, action) {
  const keys = action.keys.length ? action.keys.join(" + ") : play.schema.one_hot ? "no-op" : "no key";
  if (!play.schema.mouse.length) return keys;
  const value = (v) => (typeof v === "number" ? v.toFixed(3) : "–");
  const axes = play.schema.mouse.map((axis, i) => `${axis.name} ${value(action.mouse[i])}`);
  return `${keys}; mouse ${axes.join(", ")}`;
}

function axisSources(schema) {
  // Which pointer movement drives each axis: by name, else by position (first x, then y).
  return schema.mouse.map((axis, i) => {
    if (/yaw|steer/i.test(axis.name)) return "x";
    if (/pitch/i.test(axis.name)) return "y";
    return i === 0 ? "x" : i === 1 ? "y" : null;
  });
}

function setUpPlay(schema) {
  const bindings = new Map(); // lower-cased KeyboardEvent.key -> the schema's key
  for (const key of schema.keys) if (key.key) bindings.set(key.key.toLowerCase(), key.key);
  const still = schema.mouse.map(() => 0);
  const neutral = { keys: [], mouse: still };
  const play = {
    schema, bindings, held: [], mouse: still, sources: axisSources(schema),
    move: { x: 0, y: 0 }, sampler: null, timer: null, inFlight: false, lastSendAt: -Infinity,
    requested: neutral, accepted: neutral, inputAt: null, sent: [], refused: [], request: null, forced: null,
    refusalTimer: null,
  };
  const screen = $("screen");
  screen.classList.add("playable");
  screen.tabIndex = 0;
  screen.setAttribute("role", "application");
  screen.setAttribute("aria-label", "Game view: click it to play");
  screen.setAttribute("aria-describedby", "play-hint");
  text("play-hint", hint(schema));
  $("play").hidden = false;

  screen.addEventListener("keydown", (event) => {
    const key = bindings.get(event.key.toLowerCase());
    if (key === undefined) return;
    event.preventDefault();
    if (event.repeat || play.held.includes(key)) return;
    play.held.push(key); // in press order: a one-hot model gets the latest
    inputChanged(play, event.timeStamp);
  });
  screen.addEventListener("keyup", (event) => {
    const key = bindings.get(event.key.toLowerCase());
    if (key === undefined) return;
    event.preventDefault();
    play.held = play.held.filter((k) => k !== key);
    inputChanged(play, event.timeStamp);
  });
  screen.addEventListener("blur", () => release(play));
  document.addEventListener("visibilitychange", () => { if (document.hidden) release(play); });
  screen.addEventListener("click", () => {
    screen.focus();
    if (schema.mouse.length && document.pointerLockElement !== screen && screen.requestPointerLock) {
      Promise.resolve(screen.requestPointerLock()).catch(() => {}); // refused, e.g. headless: keys still work
    }
  });
  if (schema.mouse.length) {
    document.addEventListener("pointerlockchange", () => {
      if (document.pointerLockElement === screen) {
        play.sampler = setInterval(() => sampleMouse(play, performance.now()), SEND_INTERVAL_MS);
      } else if (play.sampler !== null) { // the pointer was freed (Esc): release everything
        clearInterval(play.sampler);
        play.sampler = null;
        play.move = { x: 0, y: 0 };
        release(play);
      }
    });
    screen.addEventListener("mousemove", (event) => {
      if (document.pointerLockElement !== screen) return;
      play.move.x += event.movementX;
      play.move.y += event.movementY;
    });
  }
  // For tests and scripts: send an action as if it were held (it is checked by the scheduler, not here).
  play.request = (action) => { play.forced = { keys: action.keys || [], mouse: action.mouse || still }; pump(play); };
  return play;
}

function hint(schema) {
  const keys = schema.keys.filter((k) => k.key).map((k) => `${k.key} (${k.name})`);
  const parts = [`Click the video, then use ${keys.join(", ")}`];
  if (schema.one_hot) parts.push("one key at a time: the latest held key counts");
  if (schema.mouse.length) parts.push(`move the mouse for ${schema.mouse.map((a) => a.name).join(", ")} (Esc frees the pointer)`);
  return `${parts.join("; ")}. Keys count while the video has focus; clicking elsewhere releases them.`;
}

function sampleMouse(play, at) {
  const { x, y } = play.move;
  play.move = { x: 0, y: 0 };
  play.mouse = play.schema.mouse.map((axis, i) => {
    const source = play.sources[i];
    const pixels = source === "x" ? x : source === "y" ? -y : 0; // screen y grows downwards
    const value = (pixels / MOUSE_FULL_SCALE_PX) * (pixels >= 0 ? axis.maximum : -axis.minimum);
    return Math.round(Math.min(axis.maximum, Math.max(axis.minimum, value)) * 1000) / 1000 + 0; // + 0: no -0
  });
  inputChanged(play, at);
}

function release(play) {
  play.held = [];
  play.mouse = play.schema.mouse.map(() => 0);
  inputChanged(play, performance.now());
}

function heldAction(play) {
  const keys = play.schema.one_hot ? play.held.slice(-1) : play.schema.keys.map((k) => k.key).filter((k) => play.held.includes(k));
  return { keys, mouse: play.mouse };
}

const sameAction = (a, b) => JSON.stringify(a) === JSON.stringify(b);

function inputChanged(play, at) {
  text("play-held", play.held.length ? play.held.join(" + ") : "nothing");
  if (!sameAction(heldAction(play), play.requested)) play.inputAt = play.inputAt ?? at;
  pump(play);
}

// Send the held action if it differs from the last one sent, one request at a time, SEND_INTERVAL_MS apart.
function pump(play) {
  if (play.inFlight || play.timer !== null) return;
  const action = play.forced || heldAction(play);
  if (sameAction(action, play.requested)) { play.inputAt = null; play.forced = null; return; }
  const wait = play.lastSendAt + SEND_INTERVAL_MS - performance.now();
  if (wait > 0) {
    play.timer = setTimeout(() => { play.timer = null; pump(play); }, wait);
    return;
  }
  const forced = play.forced !== null;
  play.forced = null;
  sendAction(play, action, forced);
}

async function sendAction(play, action, forced) {
  const entry = { keys: action.keys, mouse: action.mouse, inputAt: play.inputAt, sentAt: performance.now(),
    answeredAt: null, appliesAt: null, state: "sending", error: null };
  play.inputAt = null;
  play.inFlight = true;
  play.lastSendAt = entry.sentAt;
  play.requested = action;
  play.sent.push(entry);
  if (play.sent.length > SENT_KEEP) play.sent.shift();
  text("play-sent", describeAction(play, action));
  let retryAfter = 0;
  try {
    const result = await api(`/api/sessions/${encodeURIComponent(sessionId)}/action`, {
      method: "POST", body: JSON.stringify(action), headers: { "Content-Type": "application/json" },
    });
    entry.answeredAt = performance.now();
    entry.appliesAt = result.applies_at_block;
    entry.state = "pending";
    play.accepted = action;
    for (const earlier of play.sent) {
      if (earlier !== entry && earlier.state === "pending" && earlier.appliesAt === entry.appliesAt) earlier.state = "superseded";
    }
    showBlock(entry);
  } catch (error) {
    entry.state = "refused";
    entry.error = error.message;
    play.refused.push(entry);
    text("play-refused", `Refused: ${error.message}`);
    clearTimeout(play.refusalTimer);
    play.refusalTimer = setTimeout(() => text("play-refused", ""), REFUSAL_SHOWN_MS);
    // The scheduler still holds the last accepted action. A held action found invalid is not retried;
    // anything else (too many actions, a hiccup) is: the held action goes out again after a pause.
    if (forced || error.status !== 400) play.requested = play.accepted;
    if (error.status !== 400) retryAfter = RETRY_MS;
  } finally {
    play.inFlight = false;
    play.lastSendAt = Math.max(play.lastSendAt, performance.now() + retryAfter - SEND_INTERVAL_MS);
    pump(play);
  }
}

function showBlock(entry) {
  const node = $("play-block");
  node.classList.toggle("applied", entry.state === "applied");
  if (entry.state === "pending") node.textContent = `applies at block ${entry.appliesAt}`;
  else if (entry.state === "applied") node.textContent = `applied at block ${entry.appliesAt}`;
  else if (entry.state === "superseded") node.textContent = `block ${entry.appliesAt} got a later action`;
}

// Canonical form of keys for comparing an action with a block's: the schema's key, named by key or by action name.
function canonicalKeys(schema, keys) {
  const index = (name) => schema.keys.findIndex((k) => k.key.toLowerCase() === name.toLowerCase() || k.name.toLowerCase() === name.toLowerCase());
  return keys.map(index).sort((a, b) => a - b);
}

function sameAsBlock(schema, entry, action) {
  const mouse = entry.mouse.length ? entry.mouse : schema.mouse.map(() => 0);
  const blockMouse = action.mouse.length ? action.mouse : schema.mouse.map(() => 0);
  const keys = schema.one_hot && !entry.keys.length ? [schema.keys.find((k) => !k.key)?.name ?? ""] : entry.keys;
  return sameAction(canonicalKeys(schema, keys), canonicalKeys(schema, action.keys))
    && mouse.every((v, i) => Math.abs(v - blockMouse[i]) < 1e-9);
}

function markApplied(play, blocks) {
  const byIndex = new Map(blocks.map((b) => [b.block, b]));
  let latest = null;
  for (const entry of play.sent) {
    if (entry.state === "pending" && byIndex.has(entry.appliesAt)) {
      const block = byIndex.get(entry.appliesAt);
      entry.state = block.action && sameAsBlock(play.schema, entry, block.action) ? "applied" : "superseded";
    }
    if (entry.appliesAt !== null) latest = entry;
  }
  if (latest) showBlock(latest);
}

text("session", sessionId);
if (!token) {
  text("message", "This link has no viewer token (#token=…); open the session's webrtc_page URL.");
} else {
  start();
  // The status (and so whether an action reached its block) is polled faster while playing.
  const poll = async () => { await pollStatus(); setTimeout(poll, viewer.play ? 250 : 1000); };
  poll();
  setInterval(pollStats, 1000);
}
