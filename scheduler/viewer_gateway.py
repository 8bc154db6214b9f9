"""Viewer tokens as credentials for one session: a gRPC server interceptor in front of the scheduler.

The viewer page cannot hold an API key (it is a link that gets shared), so the streamer forwards
its commands with the session's viewer token (metadata `x-inferix-viewer-token`) instead. This
interceptor is the only place that accepts one, and it narrows what the token can do:

- only `GetSession` and `Interact` (watch, prompt, pause, resume, stop); any other method with a
  viewer token is PERMISSION_DENIED, whatever else the call carries;
- only the session the token was minted for (the GetSession id, the Interact attach; a second
  attach in the stream is dropped); a token for another session, expired or forged, is
  PERMISSION_DENIED;
- the call then runs as the session's owner (the servicer's principal is the owner's), so
  ownership checks, rate limits, quotas and command semantics are exactly those of an SDK client.

Calls without a viewer token pass through untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from inferix.api.v1 import scheduler_pb2
from inferix.viewer_token import METADATA_KEY, InvalidViewerToken, ViewerTokens
from scheduler.auth import ApiKeys
from scheduler.sessions import SessionRecord

_SERVICE = "/inferix.v1.SchedulerService/"
GET_SESSION = _SERVICE + "GetSession"
INTERACT = _SERVICE + "Interact"


class _AsOwner:
    """The servicer context of a viewer call: it runs as `acting_principal`, the session's owner (the
    servicer takes the principal from here, never from metadata, which a client could forge)."""

    def __init__(
        self, context: grpc.aio.ServicerContext, metadata: tuple[tuple[str, str], ...], principal: str
    ) -> None:
        self._context = context
        self._metadata = metadata
        self.acting_principal = principal

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class ViewerGateway(grpc.aio.ServerInterceptor):
    """Lets a viewer token act as its session's owner for GetSession and Interact on that session only."""

    def __init__(self, tokens: ViewerTokens | None) -> None:
        self.tokens = tokens
        self.sessions: dict[str, SessionRecord] = {}
        self.api_keys = ApiKeys({})

        async def deny(request: object, context: grpc.aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, "a viewer token allows only GetSession and Interact on its session"
            )

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_unary_rpc_method_handler(deny)

    def bind(self, sessions: dict[str, SessionRecord], api_keys: ApiKeys) -> None:
        """Attach the scheduler's session table and keys (the servicer is built after the server)."""
        self.sessions = sessions
        self.api_keys = api_keys

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        metadata = tuple(details.invocation_metadata or ())
        token = next((str(v) for k, v in metadata if k == METADATA_KEY), None)
        if token is None:
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return None
        if details.method == GET_SESSION:
            return self._get_session(handler, token)
        if details.method == INTERACT:
            return self._interact(handler, token)
        return self._deny_stream if handler.request_streaming else self._deny_unary

    async def _as_owner(self, token: str, session_id: str, context: grpc.aio.ServicerContext) -> _AsOwner:
        """Check the token for `session_id`; a context in which the call runs as the session's owner."""
        if self.tokens is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "viewer tokens are not enabled on this scheduler")
        assert self.tokens is not None
        try:
            self.tokens.verify(token, session_id)
        except InvalidViewerToken as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"viewer token: {exc}")
        record = self.sessions.get(session_id)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session_id: no session {session_id[:64]!r}")
        assert record is not None
        metadata = tuple(
            (k, str(v)) for k, v in context.invocation_metadata() or () if k not in ("authorization", METADATA_KEY)
        )
        if self.api_keys.enabled and record.owner not in self.api_keys.principals:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, "the session owner's API key is no longer configured"
            )
        return _AsOwner(context, metadata, record.owner)

    def _get_session(self, handler: grpc.RpcMethodHandler, token: str) -> grpc.RpcMethodHandler:
        async def get_session(request: scheduler_pb2.GetSessionRequest, context: grpc.aio.ServicerContext) -> Any:
            return await handler.unary_unary(request, await self._as_owner(token, request.session_id, context))

        return grpc.unary_unary_rpc_method_handler(
            get_session,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _interact(self, handler: grpc.RpcMethodHandler, token: str) -> grpc.RpcMethodHandler:
        async def interact(
            requests: AsyncIterator[scheduler_pb2.InteractRequest], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[scheduler_pb2.InteractResponse]:
            first = await anext(aiter(requests), None)
            if first is None:
                return
            if first.WhichOneof("command") != "attach":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command: the first message must be `attach`")
            owner = await self._as_owner(token, first.attach.session_id, context)

            async def commands() -> AsyncIterator[scheduler_pb2.InteractRequest]:
                yield first
                async for request in requests:
                    if request.WhichOneof("command") != "attach":  # the token is for this session only
                        yield request

            async for response in handler.stream_stream(commands(), owner):
                yield response

        return grpc.stream_stream_rpc_method_handler(
            interact,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
