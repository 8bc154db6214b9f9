"""The streamer's HTTP face (aiohttp, `--http-port`): WHEP signalling, the viewer page and its JSON API.

    GET    /watch/<session>                 the viewer page (the token travels in the URL fragment)
    OPTIONS /whep/<session>                 with the viewer token: the STUN / TURN servers as `Link` headers
    POST   /whep/<session>                  SDP offer -> 201 + SDP answer, Location of the viewer (+ `Link`s)
    DELETE /whep/<session>/<viewer>         hang up
    GET    /recordings/<session>.mp4        the session's MP4 once it has ended (404 unknown, 409 still going);
                                            Range requests work (a browser seeks in it)
    GET    /api/sessions/<session>          status: scheduler view (state, prompt, action schema, current
                                            action, recent blocks, block latency) + live stats
    POST   /api/sessions/<session>/<cmd>    prompt {"text": ...} | action {"keys": [...], "mouse": [...]}
                                            | pause | resume | stop -> {"command", "applies_at_block"}
    GET    /healthz

Every session endpoint needs `Authorization: Bearer <viewer token>` (see `inferix.viewer_token`):
no or a bad token is 403, a session the streamer has never heard of is 404 (after waiting a
moment for the scheduler's announcement), a WHEP offer for a session whose video is over is 410,
a malformed SDP offer is 400 with the reason, a malformed command body 400 naming the field. A
command the scheduler refuses answers its error with the matching status (400 invalid, 429 too many,
409 the session ended). The page and its script are static files.

Hostile clients get bounded, named refusals (`streamer.limits.HttpLimits`): a body over --max-body-bytes
is 413, one not sent within --body-timeout-s 408, more than --commands-per-s commands or --offers-per-s
WHEP offers per session and token 429, a WHEP offer beyond --max-viewers 503, and a connection without
a whole request header within --idle-timeout-s is closed. With --tls-cert/--tls-key
the server speaks HTTPS only, following rotated files (`streamer.tls`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import MultiDict

from inferix.viewer_token import InvalidViewerToken, ViewerTokens, bearer_token
from streamer.control import ControlError, SchedulerControl
from streamer.errors import EncoderFailed, RecordingNotReady, SessionNotFound
from streamer.ingest import valid_session_id
from streamer.limits import COMMANDS, OFFERS, HttpLimits, RateLimiter
from streamer.live import LiveRegistry, LiveSession
from streamer.tls import ReloadingTls
from streamer.webrtc import BadOffer, TooManyViewers, parse_offer

log = logging.getLogger("inferix.streamer.web")

ANNOUNCE_WAIT_S = 1.0  # a page may open a session a moment before the scheduler's announcement lands
# An action body's limits: far above any model's schema, low enough to keep a bad page from sending junk.
MAX_ACTION_KEYS = 16
MAX_KEY_CHARS = 32
MAX_MOUSE_AXES = 8
ACTION_EXAMPLE = '{"keys": ["W"], "mouse": [0, 0.05]}'
_STATIC = {"viewer.js": "text/javascript", "viewer.css": "text/css"}
# The page runs only its own script and talks only to this server; the token in its URL is never sent on.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
_CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "POST, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type",
    "Access-Control-Expose-Headers": "Location, Link",
}


class HttpError(Exception):
    """A refused request: HTTP status and the reason (sent as the body)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def parse_action(payload: object) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The keys and mouse values of an action command's JSON body; HttpError(400) naming the field.

    The scheduler checks them against the model's schema; this only checks their shape.
    """
    if not isinstance(payload, dict):
        raise HttpError(400, f"action: the body must be a JSON object, e.g. {ACTION_EXAMPLE}")
    unknown = sorted(set(payload) - {"keys", "mouse"})
    if unknown:
        raise HttpError(400, f"action: unknown field(s) {', '.join(map(repr, unknown))}; send keys and mouse")
    keys = payload.get("keys", [])
    mouse = payload.get("mouse", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise HttpError(400, f'action: keys must be a list of strings (e.g. ["W", "A"]), got {json.dumps(keys)[:64]}')
    if len(keys) > MAX_ACTION_KEYS or any(not 0 < len(k) <= MAX_KEY_CHARS for k in keys):
        raise HttpError(400, f"action: keys: at most {MAX_ACTION_KEYS} keys of 1 to {MAX_KEY_CHARS} characters")
    if not isinstance(mouse, list) or not all(_finite(v) for v in mouse):
        raise HttpError(
            400, f"action: mouse must be a list of finite numbers (e.g. [0, 0.05]), got {json.dumps(mouse)[:64]}"
        )
    if len(mouse) > MAX_MOUSE_AXES:
        raise HttpError(400, f"action: mouse: at most {MAX_MOUSE_AXES} values, got {len(mouse)}")
    return tuple(keys), tuple(float(v) for v in mouse)


def _finite(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


async def read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """The request body within the size and time limits; HttpError(413 / 408) naming the limit."""
    too_large = HttpError(413, f"the request body is larger than {limits.max_body_bytes} bytes (--max-body-bytes)")
    if (request.content_length or 0) > limits.max_body_bytes:
        raise too_large  # refused before a byte of it is read
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:  # no or a false Content-Length: aiohttp stops at the limit
        raise too_large from exc
    except TimeoutError as exc:
        raise HttpError(
            408, f"the request body was not sent within {limits.body_timeout_s:g} s (--body-timeout-s)"
        ) from exc


async def _json_body(request: web.Request, limits: HttpLimits, example: str) -> object:
    try:
        return json.loads(await read_body(request, limits))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the body must be JSON {example}: {exc}") from exc


def _asset(name: str) -> bytes:
    return (resources.files("streamer") / "static" / name).read_bytes()


class ViewerServer:
    """The aiohttp application over the live registry and the scheduler control."""

    def __init__(
        self,
        registry: LiveRegistry,
        control: SchedulerControl,
        tokens: ViewerTokens | None,
        limits: HttpLimits | None = None,
        tls: ReloadingTls | None = None,
        recordings: Callable[[str], Path] | None = None,
    ) -> None:
        self.registry = registry
        self.recordings = recordings  # session id -> its finished MP4 (the streamer service's)
        self.control = control
        self.tokens = tokens
        self.limits = limits or HttpLimits()
        self.tls = tls
        self.rates = RateLimiter(self.limits)
        self.app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=[self._errors])
        self.app.add_routes(
            [
                web.get("/healthz", self._health),
                web.get("/watch/{session}", self._page),
                web.get("/static/{name}", self._static),
                web.post("/whep/{session}", self._whep_offer),
                web.options("/whep/{session}", self._preflight),
                web.delete("/whep/{session}/{viewer}", self._whep_delete),
                web.patch("/whep/{session}/{viewer}", self._whep_patch),
                web.options("/whep/{session}/{viewer}", self._preflight),
                web.get("/recordings/{session}.mp4", self._recording),
                web.get("/api/sessions/{session}", self._status),
                web.post("/api/sessions/{session}/{command}", self._command),
            ]
        )
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); returns the bound port."""
        # aiohttp's keep-alive timer runs from a connection's opening and closes it while no whole
        # request has arrived: the one deadline for slow headers and idle connections alike.
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, keepalive_timeout=self.limits.idle_timeout_s
        )
        await self._runner.setup()
        context = self.tls.context if self.tls is not None else None
        await web.TCPSite(self._runner, host, port, ssl_context=context).start()
        self.port = int(self._runner.addresses[0][1])
        scheme = "https" if context is not None else "http"
        log.info("viewer page and WHEP on %s://%s:%d/watch/<session>", scheme, host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- plumbing -------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
        except HttpError as error:
            if request.path.startswith("/api/"):
                response = web.json_response({"error": error.reason}, status=error.status)
            else:
                response = web.Response(status=error.status, text=error.reason + "\n")
        if request.path.startswith("/whep/"):
            response.headers.update(_CORS)
        return response

    def _authorize(self, request: web.Request) -> tuple[str, str]:
        """The session id and its viewer token; 403 unless the token is valid for that session."""
        session_id = request.match_info["session"]
        if not valid_session_id(session_id):
            raise HttpError(404, f"no session {session_id[:64]!r}")
        if self.tokens is None:
            raise HttpError(
                503, "viewer tokens are not configured on this streamer (--viewer-secret-file or INFERIX_VIEWER_SECRET)"
            )
        token = bearer_token(request.headers.get("Authorization"))
        try:
            self.tokens.verify(token, session_id)
        except InvalidViewerToken as exc:
            raise HttpError(403, str(exc)) from exc
        return session_id, token

    def _limit_rate(self, kind: str, session_id: str, token: str) -> None:
        if not self.rates.allow(kind, session_id, token):
            rate = self.limits.rate(kind)
            raise HttpError(
                429, f"too many {kind}: at most {rate:g} per second per viewer link ({self.limits.flag(kind)})"
            )

    async def _live(self, session_id: str) -> LiveSession:
        live = await self.registry.wait_for(session_id, ANNOUNCE_WAIT_S)
        if live is None:
            raise HttpError(404, f"no session {session_id!r} on this streamer (not announced, no frames)")
        return live

    # ---- handlers -------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _page(self, request: web.Request) -> web.Response:
        if not valid_session_id(request.match_info["session"]):
            raise HttpError(404, "no such session")
        return web.Response(
            body=_asset("viewer.html"), content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS
        )

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise HttpError(404, f"no file {name!r}")
        return web.Response(body=_asset(name), content_type=_STATIC[name], charset="utf-8")

    async def _preflight(self, request: web.Request) -> web.Response:
        """A CORS preflight, or (with the viewer token) WHEP's ask for ICE servers before the offer."""
        if "Authorization" not in request.headers:
            return web.Response(status=204)
        session_id, _ = self._authorize(request)
        return web.Response(status=204, headers=self._ice_links(session_id))

    def _ice_links(self, session_id: str) -> MultiDict[str]:
        """The session's STUN / TURN servers with fresh TURN credentials, one `Link` header each (RFC 9725)."""
        return MultiDict(("Link", server.link_header()) for server in self.registry.config.ice.issue(session_id))

    async def _whep_offer(self, request: web.Request) -> web.Response:
        session_id, token = self._authorize(request)
        live = await self._live(session_id)
        if live.ended:
            raise HttpError(410, f"session {session_id!r} has ended; its recording is the MP4")
        if request.content_type != "application/sdp":
            raise HttpError(415, f"the offer must be sent as Content-Type: application/sdp, got {request.content_type}")
        try:
            offer = (await read_body(request, self.limits)).decode()
        except UnicodeDecodeError as exc:
            raise HttpError(400, f"the SDP offer is not UTF-8 text: {exc}") from exc
        try:
            parse_offer(offer)  # a malformed offer is refused before it counts against the rate
        except BadOffer as exc:
            raise HttpError(400, str(exc)) from exc
        self._limit_rate(OFFERS, session_id, token)
        try:
            viewer, answer = await live.hub.add_viewer(offer)
        except BadOffer as exc:
            raise HttpError(400, str(exc)) from exc
        except TooManyViewers as exc:
            raise HttpError(503, str(exc)) from exc
        headers = self._ice_links(session_id)
        headers.update({"Location": f"/whep/{session_id}/{viewer.viewer_id}", "X-Inferix-Codec": viewer.codec})
        return web.Response(status=201, text=answer, content_type="application/sdp", headers=headers)

    async def _whep_delete(self, request: web.Request) -> web.Response:
        session_id, _ = self._authorize(request)
        live = await self._live(session_id)
        if not await live.hub.remove(request.match_info["viewer"]):
            raise HttpError(404, "no such viewer (already gone)")
        return web.Response(status=200, text="bye\n")

    async def _whep_patch(self, request: web.Request) -> web.Response:
        self._authorize(request)
        raise HttpError(405, "trickle ICE is not supported: send the offer with its candidates gathered")

    async def _recording(self, request: web.Request) -> web.StreamResponse:
        session_id, _ = self._authorize(request)
        if self.recordings is None:
            raise HttpError(404, "this server does not serve recordings")
        try:
            path = self.recordings(session_id)
        except SessionNotFound as exc:
            raise HttpError(404, str(exc)) from exc
        except RecordingNotReady:
            raise HttpError(
                409, f"session {session_id!r} is still going: its recording is ready once it ends"
            ) from None
        except EncoderFailed as exc:
            raise HttpError(500, str(exc)) from exc
        disposition = f'attachment; filename="{session_id}.mp4"'
        return web.FileResponse(path, headers={"Content-Type": "video/mp4", "Content-Disposition": disposition})

    async def _status(self, request: web.Request) -> web.Response:
        session_id, token = self._authorize(request)
        live = await self._live(session_id)
        body: dict[str, Any] = {"session_id": session_id, "stream": live.to_json()}
        try:
            body["session"] = (await self.control.view(session_id, token)).to_json()
        except ControlError as exc:
            if exc.http_status in (403, 404):
                raise HttpError(exc.http_status, str(exc)) from exc
            body["session"] = {"state": "unknown", "error": str(exc)}
        return web.json_response(body)

    async def _command(self, request: web.Request) -> web.Response:
        session_id, token = self._authorize(request)
        command = request.match_info["command"]
        text = ""
        keys: tuple[str, ...] = ()
        mouse: tuple[float, ...] = ()
        if command == "prompt":
            payload = await _json_body(request, self.limits, '{"text": "..."}')
            if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
                raise HttpError(400, 'the body must be JSON {"text": "<the new prompt>"}')
            text = payload["text"]
        elif command == "action":
            keys, mouse = parse_action(await _json_body(request, self.limits, ACTION_EXAMPLE))
        self._limit_rate(COMMANDS, session_id, token)  # well-formed ones: each would reach the scheduler
        try:
            applies_at = await self.control.command(session_id, token, command, text, keys, mouse)
        except ControlError as exc:
            raise HttpError(exc.http_status, str(exc)) from exc
        return web.json_response({"command": command, "applies_at_block": applies_at})
