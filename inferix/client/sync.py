"""`Client`: the blocking SDK (the same API as `AsyncClient`, for scripts and the CLI)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from inferix.api.v1 import scheduler_pb2, scheduler_pb2_grpc, streamer_pb2, streamer_pb2_grpc
from inferix.client.channel import CHANNEL_OPTIONS, metadata, recording_address, sync_channel
from inferix.client.reconnect import EventCursor
from inferix.client.recordings import download_http, is_http
from inferix.client.retry import DEFAULT_RETRY_S, ReconnectPolicy, Waiting, retry_call
from inferix.client.tls import Target, resolve, translate
from inferix.client.types import (
    Event,
    PromptChange,
    SessionInfo,
    action_request,
    event_from_proto,
    session_spec,
    state_value,
)
from inferix.telemetry import TraceContextInterceptor


class Interaction:
    """An open Interact stream (blocking): iterate `events()`; commands may come from any thread."""

    def __init__(
        self,
        stub: scheduler_pb2_grpc.SchedulerServiceStub,
        session_id: str,
        from_block: int,
        md: tuple,
        target: Target | None = None,
    ) -> None:
        self._target = target
        self._outgoing: queue.Queue[scheduler_pb2.InteractRequest | None] = queue.Queue()
        self._outgoing.put(
            scheduler_pb2.InteractRequest(attach=scheduler_pb2.Attach(session_id=session_id, from_block=from_block))
        )
        self._call = stub.Interact(iter(self._outgoing.get, None), metadata=md)

    def events(self) -> Iterator[Event]:
        try:
            for response in self._call:
                yield event_from_proto(response)
        except grpc.RpcError as exc:
            if self._target is None:
                raise
            raise translate(exc, self._target) from None

    def set_prompt(self, text: str, recache: bool = False) -> None:
        self._outgoing.put(
            scheduler_pb2.InteractRequest(set_prompt=scheduler_pb2.SetPrompt(text=text, recache=recache))
        )

    def act(self, keys: list[str] | tuple[str, ...] = (), mouse: list[float] | tuple[float, ...] = ()) -> None:
        """Hold these keys (by key or name, e.g. "W" or "forward") and mouse values (one per axis of
        the session's `action_schema`; empty: still) from the next block boundary on; several before
        one boundary: the latest wins. Answered by `CommandAccepted` (with the block) or `SessionError`."""
        self._outgoing.put(action_request(keys, mouse))

    def pause(self) -> None:
        self._outgoing.put(scheduler_pb2.InteractRequest(pause=scheduler_pb2.Pause()))

    def resume(self) -> None:
        self._outgoing.put(scheduler_pb2.InteractRequest(resume=scheduler_pb2.Resume()))

    def stop(self) -> None:
        self._outgoing.put(scheduler_pb2.InteractRequest(stop=scheduler_pb2.Stop()))

    def close(self) -> None:
        self._outgoing.put(None)
        self._call.cancel()

    def __enter__(self) -> Interaction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """Blocking client of the Scheduler API. Calls carry a deadline and wait for a restarting scheduler
    or streamer for up to `retry.reconnect_s` (default 30 s), calling `on_wait` once per outage
    (default: a logged warning); see `inferix.client.retry` for what is retried.

    TLS: a `grpcs://host:port` address, `tls=True`, or a `ca` (PEM file or bytes; default: the system's
    roots). A handshake that fails raises `TlsError` (a `grpc.RpcError`, UNAVAILABLE) saying why.
    """

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        tls: bool | None = None,
        ca: Path | str | bytes | None = None,
        retry: ReconnectPolicy | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.target = resolve(address, tls, ca)
        self.address = self.target.address
        self.timeout = timeout
        self.retry = retry or ReconnectPolicy(DEFAULT_RETRY_S)
        self.on_wait = on_wait
        self._metadata = metadata(api_key)
        self._channel = sync_channel(self.target)
        # Propagates the caller's trace context (a no-op without a tracer provider).
        traced = grpc.intercept_channel(self._channel, TraceContextInterceptor())
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(traced)

    def create_session(
        self,
        prompt: str | list[PromptChange] | None = None,
        *,
        model: str = "toyworld",
        width: int = 0,
        height: int = 0,
        seed: int = 0,
        num_blocks: int = 0,
        lookahead: int = 0,
        wait_for_capacity: bool = False,
        rtmp: bool = False,
        image: bytes | str | Path | None = None,
        latency: str = "smooth",
    ) -> SessionInfo:
        """Create a session (width/height 0 = the model's native size; num_blocks 0 = unbounded).

        `rtmp=True` also pushes it to the server's RTMP relay (`SessionInfo.rtmp_url`). Image-to-world
        models (Matrix-Game 2.0) take no prompt but a start `image` (PNG or JPEG: bytes or a path) and
        need `num_blocks`. `latency="interactive"` is for a session that is played: the smallest safe
        lookahead, an adaptive jitter buffer and no browser playout delay (leave `lookahead` 0);
        "smooth" (default) is for one that is watched. The mode never changes the frames.
        """
        spec = session_spec(
            prompt,
            model=model,
            width=width,
            height=height,
            seed=seed,
            num_blocks=num_blocks,
            lookahead=lookahead,
            wait_for_capacity=wait_for_capacity,
            rtmp=rtmp,
            image=image,
            latency=latency,
        )
        # Not idempotent: retried only when it cannot have reached the scheduler.
        request = scheduler_pb2.CreateSessionRequest(spec=spec)
        reply = self._unary(self._stub.CreateSession, request, idempotent=False)
        return SessionInfo.from_proto(reply.session)

    def get_session(self, session_id: str) -> SessionInfo:
        reply = self._unary(self._stub.GetSession, scheduler_pb2.GetSessionRequest(session_id=session_id))
        return SessionInfo.from_proto(reply.session)

    def list_sessions(self, states: list[str] | None = None) -> list[SessionInfo]:
        request = scheduler_pb2.ListSessionsRequest(states=[state_value(s) for s in states or []])  # type: ignore[misc]
        reply = self._unary(self._stub.ListSessions, request)
        return [SessionInfo.from_proto(s) for s in reply.sessions]

    def cancel_session(self, session_id: str) -> SessionInfo:
        reply = self._unary(self._stub.CancelSession, scheduler_pb2.CancelSessionRequest(session_id=session_id))
        return SessionInfo.from_proto(reply.session)

    def interact(self, session_id: str, from_block: int = 0) -> Interaction:
        return Interaction(self._stub, session_id, from_block, self._metadata, self.target)

    def waiting(self, what: str = "") -> Waiting:
        """A retry clock for one call to a restarting server (`what`: default the scheduler)."""
        return Waiting(what or f"the scheduler at {self.address}", self.retry, self.on_wait)

    def _unary(self, method: Any, request: Any, idempotent: bool = True) -> Any:
        """One unary call with the deadline and credentials, retried while the scheduler restarts;
        a TLS failure becomes a `TlsError`."""

        def attempt() -> Any:
            try:
                return method(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                raise translate(exc, self.target) from None

        return retry_call(attempt, self.waiting(), idempotent=idempotent)

    def events(self, session_id: str, from_block: int = 0, reconnect: ReconnectPolicy | None = None) -> Iterator[Event]:
        """Watch a session: every event from `from_block` until it ends. If the scheduler restarts,
        re-attach by itself and continue after the last block seen (see `ReconnectPolicy`)."""
        waiting = Waiting(f"the scheduler at {self.address}", reconnect or ReconnectPolicy(), self.on_wait)
        cursor = EventCursor(from_block, waiting)
        while True:
            try:
                with self.interact(session_id, cursor.next_block) as interaction:
                    for event in interaction.events():
                        if cursor.admit(event):
                            yield event
                return
            except grpc.RpcError as exc:
                delay = cursor.retry_after(exc)
                if delay is None:
                    raise
                time.sleep(delay)

    def download_recording(self, session: SessionInfo, path: str | Path) -> Path:
        """Save the session's MP4 (available once the session has ended; `RecordingError` over HTTP(S))."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        mp4_url = session.mp4_url
        if is_http(mp4_url):
            waiting = self.waiting(f"the streamer at {mp4_url.partition('/recordings/')[0]}")
            return retry_call(
                lambda: download_http(mp4_url, path, self.target.ca, self.timeout), waiting, idempotent=True
            )
        address, session_id = recording_address(mp4_url)
        return retry_call(
            lambda: self._download_grpc(address, session_id, path),
            self.waiting(f"the streamer at {address}"),
            idempotent=True,
        )

    def _download_grpc(self, address: str, session_id: str, path: Path) -> Path:
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = streamer_pb2_grpc.StreamerServiceStub(channel)
            tmp = path.with_suffix(path.suffix + ".part")
            with tmp.open("wb") as out:
                for chunk in stub.GetRecording(
                    streamer_pb2.GetRecordingRequest(session_id=session_id), timeout=self.timeout
                ):
                    out.write(chunk.chunk)
            tmp.replace(path)
        return path

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
