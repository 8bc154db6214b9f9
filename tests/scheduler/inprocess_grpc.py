"""gRPC without sockets: our services' real servicers, reached in one event loop.

A `Network` holds servers by address. A server is filled by the generated `add_*_to_server`
functions, exactly as a `grpc.aio.Server` is, and a channel from `Network.channel` calls the
registered handlers through the generated stubs: each message is serialized and parsed again, as on
the wire; a handler's `context.abort` reaches the caller as the `grpc.aio.AioRpcError` it would
raise; deadlines become DEADLINE_EXCEEDED.

Each service is a "process" by its address: what it calls while it handles a call (or from a task
started there) is made on its behalf. `kill(address)` ends the process as SIGKILL does: calls in
flight to it fail with UNAVAILABLE, later ones too, and every call it would still make is refused
(its engine thread may finish a step, but nothing it made reaches anyone). `stop(address)` freezes
it as SIGSTOP does: calls to it (health checks included) and from it wait, so deadlines expire, until
`resume(address)`; `restart(address, ...)` serves a new process at a killed one's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

# The process a call is made by: the address of the server whose handler (or task) is running, or "" (the test).
PROCESS: contextvars.ContextVar[str] = contextvars.ContextVar("inprocess_grpc_process", default="")


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@dataclass(frozen=True)
class _CallDetails:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


class _Aborted(Exception):
    """A handler's `context.abort`: its status is what the caller gets."""

    def __init__(self, error: grpc.aio.AioRpcError) -> None:
        super().__init__(error.details())
        self.error = error


class HandlerContext:
    """What our servicers use of `grpc.aio.ServicerContext`: `abort`."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: object = ()) -> NoReturn:
        raise _Aborted(rpc_error(code, details))


@dataclass
class Server:
    """What `add_*Servicer_to_server` fills: the method handlers, by full method name."""

    handlers: list[grpc.GenericRpcHandler] = field(default_factory=list)

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        """The generic handlers added with them serve the same methods."""

    def handler(self, method: str) -> grpc.RpcMethodHandler | None:
        for generic in self.handlers:
            found = generic.service(_CallDetails(method))
            if found is not None:
                return found
        return None


class Network:
    """The servers of a test by address, and the processes that are dead or stopped."""

    def __init__(self) -> None:
        self.servers: dict[str, Server] = {}
        self.dead: set[str] = set()
        self.stopped: set[str] = set()
        self._calls: dict[str, set[asyncio.Task[Any]]] = {}
        self._cancelled: set[asyncio.Task[Any]] = set()  # by their server stopping (`cancel_calls`)
        self._resumed: dict[str, asyncio.Event] = {}

    def serve(self, address: str, add: Callable[[Server], object]) -> Server:
        """A process at `address` serving what `add` registers, and the health service (SERVING)."""
        server = self.servers.setdefault(address, Server())
        add(server)
        if server.handler("/grpc.health.v1.Health/Check") is None:
            servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
            asyncio.get_running_loop().create_task(servicer.set("", health_pb2.HealthCheckResponse.SERVING))
        return server

    @contextlib.contextmanager
    def process(self, address: str) -> Iterator[None]:
        """Run the block as the process at `address` (e.g. while building its service objects)."""
        token = PROCESS.set(address)
        try:
            yield
        finally:
            PROCESS.reset(token)

    def channel(self, address: str) -> Channel:
        """Stands in for `inferix.server.channel`: calls from the current process to `address`."""
        return Channel(self, address, PROCESS.get())

    def kill(self, address: str) -> None:
        self.dead.add(address)
        for task in self._calls.pop(address, set()):
            task.cancel()

    def restart(self, address: str, add: Callable[[Server], object]) -> None:
        """A new process at a killed one's address (as `inferix serve` restarts a service)."""
        self.servers.pop(address, None)
        self.dead.discard(address)
        self.stopped.discard(address)
        self._resumed.pop(address, None)
        self.serve(address, add)

    def cancel_calls(self, address: str) -> None:
        """A server that stops after its grace (grpc.aio `Server.stop`): the calls it is still
        handling, or that wait at it while it is stopped, end CANCELLED for their callers."""
        tasks = self._calls.pop(address, set())
        self._cancelled.update(tasks)
        for task in tasks:
            task.cancel()

    def calls_in_flight(self, address: str, method: str) -> int:
        """Calls of `method` (e.g. "/inferix.v1.StreamerService/PushFrames") that `address` has not answered."""
        return sum(task.get_name() == method for task in self._calls.get(address, set()))

    def stop(self, address: str) -> None:
        self.stopped.add(address)
        self._resumed[address] = asyncio.Event()

    def resume(self, address: str) -> None:
        """SIGCONT: what waited in the stopped process goes on."""
        self.stopped.discard(address)
        self._resumed.pop(address, asyncio.Event()).set()

    async def _while_stopped(self, address: str) -> None:
        if address in self.stopped:
            await self._resumed[address].wait()

    async def call(self, caller: str, address: str, method: str, request: Any, timeout: float | None) -> Any:
        """Run the handler of `method` at `address` for `request` (already through the wire format)."""
        if caller in self.dead:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{caller} is dead: it makes no calls")
        try:
            async with asyncio.timeout(timeout):
                await self._while_stopped(caller)
                return await self._answer(address, method, request)
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    async def _answer(self, address: str, method: str, request: Any) -> Any:
        server = self.servers.get(address)
        if server is None or address in self.dead:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {address}")
        handler = server.handler(method)
        if handler is None:
            raise rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"{address} does not serve {method}")
        context = contextvars.copy_context()
        context.run(PROCESS.set, address)
        # In flight from here, also while the process is stopped: a kill or a server stop ends it.
        task = asyncio.get_running_loop().create_task(
            self._handle(address, handler, request), name=method, context=context
        )
        self._calls.setdefault(address, set()).add(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task in self._cancelled:
                raise rpc_error(grpc.StatusCode.CANCELLED, "CANCELLED") from None
            if address in self.dead and task.cancelled():
                raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{address} died during the call") from None
            task.cancel()  # the caller went away: the handler sees its call cancelled, as over gRPC
            raise
        finally:
            self._calls.get(address, set()).discard(task)
            self._cancelled.discard(task)

    async def _handle(self, address: str, handler: grpc.RpcMethodHandler, request: Any) -> Any:
        await self._while_stopped(address)
        return await _run(handler, request)


async def _run(handler: grpc.RpcMethodHandler, request: Any) -> Any:
    """Call the handler in its own shape; a streamed response is collected (callers iterate it). An
    abort's status reaches the caller; any other exception, a status error of a call the handler
    made included, reaches it as UNKNOWN, as grpc.aio answers it."""
    try:
        return await _call_handler(handler, request)
    except _Aborted as aborted:
        raise aborted.error from None
    except Exception as exc:
        raise rpc_error(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}") from exc


async def _call_handler(handler: grpc.RpcMethodHandler, request: Any) -> Any:
    context = HandlerContext()
    if handler.unary_unary is not None:
        return await handler.unary_unary(request, context)
    if handler.stream_unary is not None:
        return await handler.stream_unary(_aiter(request), context)
    if handler.unary_stream is not None:
        return [message async for message in handler.unary_stream(request, context)]
    raise NotImplementedError("bidirectional streams are not used between our services in these tests")


async def _aiter(messages: list[Any]) -> AsyncIterator[Any]:
    for message in messages:
        yield message


def _wire(message: Any, serializer: Callable[[Any], bytes] | None, parser: Callable[[bytes], Any] | None) -> Any:
    return message if serializer is None or parser is None else parser(serializer(message))


class StreamCall:
    """A server-streaming call as our callers use it: iterated, or `read` message by message then `cancel`led."""

    def __init__(self, replies: Callable[[], Awaitable[list[Any]]]) -> None:
        self._replies = replies
        self._left: list[Any] | None = None

    async def read(self) -> Any:
        if self._left is None:
            self._left = await self._replies()
        return self._left.pop(0) if self._left else grpc.aio.EOF

    def cancel(self) -> bool:
        self._left = []
        return True

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not grpc.aio.EOF:
            yield message


class Channel:
    """The `grpc.aio.Channel` surface the generated stubs use."""

    def __init__(self, network: Network, address: str, caller: str) -> None:
        self.network = network
        self.address = address
        self.caller = caller

    def _method(self, method: str, request_serializer: Any, response_deserializer: Any, streams: str) -> Any:
        network, address, caller = self.network, self.address, self.caller

        def parse_request(message: Any) -> Any:
            handler = network.servers[address].handler(method) if address in network.servers else None
            parser = handler.request_deserializer if handler is not None else None
            return _wire(message, request_serializer, parser)

        def parse_response(message: Any) -> Any:
            handler = network.servers[address].handler(method)
            serializer = handler.response_serializer if handler is not None else None
            return _wire(message, serializer, response_deserializer)

        async def unary(request: Any, timeout: float | None = None, **_: object) -> Any:
            reply = await network.call(caller, address, method, parse_request(request), timeout)
            return parse_response(reply)

        async def client_stream(requests: Any, timeout: float | None = None, **_: object) -> Any:
            if hasattr(requests, "__aiter__"):
                messages = [parse_request(m) async for m in requests]
            else:
                messages = [parse_request(m) for m in requests]
            reply = await network.call(caller, address, method, messages, timeout)
            return parse_response(reply)

        def server_stream(request: Any, timeout: float | None = None, **_: object) -> StreamCall:
            async def replies() -> list[Any]:
                return [
                    parse_response(r)
                    for r in await network.call(caller, address, method, parse_request(request), timeout)
                ]

            return StreamCall(replies)

        shapes: dict[str, Any] = {"unary": unary, "client_stream": client_stream, "server_stream": server_stream}
        return shapes[streams]

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: object
    ) -> Any:
        return self._method(method, request_serializer, response_deserializer, "unary")

    def stream_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: object
    ) -> Any:
        return self._method(method, request_serializer, response_deserializer, "client_stream")

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: object
    ) -> Any:
        return self._method(method, request_serializer, response_deserializer, "server_stream")

    def stream_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: object
    ) -> Any:
        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise NotImplementedError(f"{method}: bidirectional streams are not carried in process")

        return refuse

    async def close(self, grace: float | None = None) -> None:
        return None
