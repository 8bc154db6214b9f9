"""An internal channel over mutual TLS that follows its certificate files.

gRPC fixes a channel's credentials when the channel is made, and a stub binds its methods to a
channel. `RotatingChannel` is the channel the stubs hold: each call goes to the current inner channel,
and when the mesh TLS files changed (checked at most once per `CHECK_INTERVAL_S`), a new inner
channel with the new certificate takes the new calls. Calls in flight stay on the old one, which is
not closed (a frame stream may last as long as its session); with no call left it goes idle and gRPC
drops its connection.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from inferix.mesh_tls import MeshTls, Stamp

log = logging.getLogger("inferix.server")

CHECK_INTERVAL_S = 1.0

ChannelFactory = Callable[[grpc.ChannelCredentials], grpc.aio.Channel]


class _Method:
    """A stub's method: asks the channel for its current multicallable at each call."""

    def __init__(self, owner: RotatingChannel, kind: str, method: str, kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self._kind = kind
        self._method = method
        self._kwargs = kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._owner.multicallable(self._kind, self._method, self._kwargs)(*args, **kwargs)


class RotatingChannel(grpc.aio.Channel):
    """A grpc.aio channel presenting `mesh`'s certificate, made again by `factory` when the files change."""

    def __init__(self, mesh: MeshTls, factory: ChannelFactory) -> None:
        self._mesh = mesh
        self._factory = factory
        self._stamp: Stamp = mesh.stamp()
        self._checked = time.monotonic()
        self._inner = factory(mesh.channel_credentials())
        self._retired: list[grpc.aio.Channel] = []
        self._calls: dict[tuple[str, str], Any] = {}

    def _current(self) -> grpc.aio.Channel:
        now = time.monotonic()
        if now - self._checked < CHECK_INTERVAL_S:
            return self._inner
        self._checked = now
        try:
            stamp = self._mesh.stamp()
            if stamp == self._stamp:
                return self._inner
            self._stamp = stamp  # tried once per change: a half-written set is retried at the next change
            credentials = self._mesh.channel_credentials()
            ssl.create_default_context().load_cert_chain(self._mesh.cert, self._mesh.key)  # the pair matches
        except (OSError, ssl.SSLError) as exc:
            log.warning("mesh TLS certificate %s not reloaded (keeping the current one): %s", self._mesh.cert, exc)
            return self._inner
        log.info("mesh TLS certificate reloaded from %s for new calls", self._mesh.cert)
        self._retired.append(self._inner)
        self._inner = self._factory(credentials)
        self._calls.clear()
        return self._inner

    def multicallable(self, kind: str, method: str, kwargs: dict[str, Any]) -> Any:
        inner = self._current()
        key = (kind, method)
        if key not in self._calls:
            self._calls[key] = getattr(inner, kind)(method, **kwargs)
        return self._calls[key]

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Method(self, "unary_unary", method, _named(args, kwargs))

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Method(self, "unary_stream", method, _named(args, kwargs))

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Method(self, "stream_unary", method, _named(args, kwargs))

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Method(self, "stream_stream", method, _named(args, kwargs))

    async def close(self, grace: float | None = None) -> None:
        for channel in (*self._retired, self._inner):
            await channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._current().get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._inner.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._current().channel_ready()

    async def __aenter__(self) -> RotatingChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(None)


_ARG_NAMES: Sequence[str] = ("request_serializer", "response_deserializer", "_registered_method")


def _named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A multicallable's arguments by name (stubs pass them by name; positional ones are named here)."""
    return {**dict(zip(_ARG_NAMES, args, strict=False)), **kwargs}
