"""The RPC server: msgpack frames over TCP, served by asyncio.

Each request runs in its own task, so a slow handler (a blocking query, a
write waiting for commit) never holds up the requests pipelined behind it on
the same connection; answers go back as they finish and the client matches
them by id. A bounded number of requests may be in flight per connection:
past it the server stops reading, and TCP pushes back on the client.

The rest of a server process lives on other threads (pysyncobj's tick thread
applies entries and fires callbacks). Handlers therefore get helpers on their
context to wait, without blocking the loop, for a result that another thread
produces: ``ctx.completion()`` and ``ctx.wait_future()``.

Bad input never takes the server down. Undecodable frames, requests of the
wrong shape and unknown methods get an error answer and the connection
carries on; a frame over the size limit is answered and the connection
closed, because its body is never read and the stream cannot be resynced.
A handler's ``RPCError`` is the answer; any other exception is logged with
its traceback and answered with a bare ``internal`` error, since a traceback
may hold data the caller must not see.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from node.core.context import RequestContext
from node.wire.errors import (
    BAD_REQUEST,
    FRAME_TOO_LARGE,
    INTERNAL,
    MALFORMED,
    UNKNOWN_METHOD,
    RPCError,
)
from node.wire.framing import (
    DEFAULT_MAX_FRAME,
    ConnectionLost,
    FrameBuffer,
    format_address,
    pack_frame,
    pack_stream_frame,
    parse_address,
    unpack_body,
)

MAX_REQUEST_ID_LENGTH = 128
FLUSH_BYTES = 64 * 1024  # answers queued on a connection past this go to the socket at once
READ_BYTES = 256 * 1024  # what one read takes from a connection (many pipelined requests)

Handler = Callable[["RequestContext", dict[str, Any]], Awaitable[Any]]
StreamHandler = Callable[["RequestContext", dict[str, Any]], AsyncIterator[Any]]








@dataclass(frozen=True)
class _Method:
    handler: Callable[..., Any]
    streaming: bool


class _Connection:
    """One client connection: its writer and the tasks of its requests.

    Answers finished in one loop iteration leave in one socket write: a
    pipelining client gets many per iteration, and a send() per answer
    cost the loop thread a system call and, worse, the GIL (the raft tick
    thread takes it while the loop is in the kernel).
    """

    def __init__(self, writer: asyncio.StreamWriter, peer: str, max_frame: int, max_inflight: int = 256) -> None:
        self.writer = writer
        self.peer = peer
        self.max_frame = max_frame
        self.max_inflight = max_inflight
        self.tasks: set[asyncio.Task[None]] = set()
        self._room: asyncio.Future[None] | None = None  # set while reading waits for a free slot
        self._out: list[bytes] = []
        self._out_bytes = 0

    async def wait_for_room(self) -> None:
        """Stop reading while ``max_inflight`` requests run (TCP then pushes back on the client).

        A counter and one future rather than an ``asyncio.Semaphore``, whose
        acquire/release scan their waiters on every request.
        """
        while len(self.tasks) >= self.max_inflight:
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    def request_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    async def send(self, message: dict[str, Any]) -> None:
        await self._write(pack_frame(message, self.max_frame, "response"))

    async def send_stream(self, request_id: str, item: Any) -> None:
        await self._write(pack_stream_frame(request_id, item, self.max_frame))

    async def _write(self, frame: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionLost("connection closed before the answer was sent")
        out = self._out
        out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes >= FLUSH_BYTES:
            # A handler that never yields to the loop (a stream of items
            # already at hand) must not pile answers up here: hand them to
            # the transport now, so that drain() below sees them.
            self.flush()
        elif len(out) == 1:
            asyncio.get_running_loop().call_soon(self.flush)
        # Backpressure as before: waits only while the transport's buffer is
        # over its high-water mark (a client that stopped reading).
        await self.writer.drain()

    def flush(self) -> None:
        """Write every answer queued since the last flush, in order, in one call."""
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_bytes = 0
        if not self.writer.is_closing():
            self.writer.write(data)


def _error(request_id: str | None, err: RPCError) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": err.to_wire()}


def _request_id(message: Any) -> str | None:
    """The request's id if it is a valid one; errors about the rest of the request carry it."""
    request_id = message.get("id") if isinstance(message, dict) else None
    if isinstance(request_id, str) and 0 < len(request_id) <= MAX_REQUEST_ID_LENGTH:
        return request_id
    return None


def _parse_request(message: Any) -> tuple[str, str, dict[str, Any], str | None]:
    """Check a request's shape; unknown extra keys are ignored for forward compatibility."""
    if not isinstance(message, dict):
        raise RPCError(
            MALFORMED,
            f"request must be a msgpack map with id, method, args and token, not {type(message).__name__}",
        )
    request_id = _request_id(message)
    if request_id is None:
        raise RPCError(
            BAD_REQUEST,
            f"request 'id' must be a non-empty string of at most {MAX_REQUEST_ID_LENGTH} characters; "
            f"give every request a unique id",
        )
    method = message.get("method")
    if not isinstance(method, str) or not method:
        raise RPCError(
            BAD_REQUEST, "request 'method' must be a non-empty string naming the method to call"
        )
    args = message.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RPCError(BAD_REQUEST, f"request 'args' must be a map, not {type(args).__name__}")
    token = message.get("token")
    if token is not None and not isinstance(token, str):
        raise RPCError(BAD_REQUEST, "request 'token' must be a string or nil")
    return request_id, method, args, token


class RPCServer:
    """Listens on ``bind`` ("host:port"; port 0 picks a free port) and serves registered methods.

    Runs on whichever event loop calls ``start``; see ``RPCServerThread`` to
    give it a loop of its own.
    """

    def __init__(
        self,
        bind: str = "127.0.0.1:0",
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_inflight_per_connection: int = 256,
        log: Any = None,
    ) -> None:
        self._host, self._port = parse_address(bind)
        self.max_frame = max_frame
        self.max_inflight_per_connection = max_inflight_per_connection
        self.log = log if log is not None else structlog.get_logger("caravan.rpc")
        self._debug = True  # whether per-request debug lines are wanted; settled in start()
        self._methods: dict[str, _Method] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._address: str | None = None
        # Optional ``observer(method, code, seconds)`` after each request
        # ("ok" or the error code): metrics hook in, the server does not depend on them.
        self.observer: Callable[[str, str, float], None] | None = None

    def register(
        self, method: str, handler: Handler | StreamHandler, *, streaming: bool = False
    ) -> None:
        """Serve ``method`` with ``async def handler(ctx, args)``.

        A streaming handler is an async generator (or returns an async
        iterator): each item it yields goes out as one ``stream`` frame,
        and its end as the final response.
        """
        if method in self._methods:
            raise ValueError(f"method {method!r} is already registered")
        if not callable(handler):
            raise TypeError(f"handler for {method!r} is not callable")
        self._methods[method] = _Method(handler, streaming)

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    def lookup(self, method: str) -> tuple[Handler | StreamHandler, bool] | None:
        """(handler, streaming) registered for ``method``, or None.

        For in-process front ends (the HTTP API): calling the registered
        handler runs exactly the code path of the RPC, forwarding included.
        """
        entry = self._methods.get(method)
        return None if entry is None else (entry.handler, entry.streaming)

    @property
    def address(self) -> str:
        """The bound "host:port" (with the real port when bound to port 0)."""
        if self._address is None:
            raise RuntimeError("server is not started")
        return self._address

    async def start(self) -> str:
        self._server = await asyncio.start_server(
            self._on_connect, self._host, self._port, reuse_address=True
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self._address = format_address(host, port)
        # Logging is configured by now; a debug call that the level drops
        # still runs structlog's processor chain, so skip it per request.
        is_enabled = getattr(self.log, "isEnabledFor", None)
        self._debug = bool(is_enabled(logging.DEBUG)) if callable(is_enabled) else True
        self.log.info("rpc server listening", address=self._address, methods=len(self._methods))
        return self._address

    async def close(self) -> None:
        """Stop accepting, drop every connection and cancel requests in flight."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
        self.log.info("rpc server stopped", address=self._address)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            # close() ends connections by cancelling them. Returning normally
            # matters: asyncio's stream callback calls task.exception() on this
            # task, which raises (and logs noise) if the task ends cancelled.
            pass
        finally:
            self._connections.discard(task)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peername = writer.get_extra_info("peername")
        peer = format_address(peername[0], peername[1]) if peername else "unknown"
        conn = _Connection(writer, peer, self.max_frame, self.max_inflight_per_connection)
        frames = FrameBuffer(self.max_frame)
        try:
            while True:
                try:
                    body = frames.next()
                    if body is None:
                        data = await reader.read(READ_BYTES)
                        if not data:  # end of stream (inside a frame: the client went away mid-request)
                            return
                        frames.feed(data)
                        continue
                except RPCError as err:  # too large, or HTTP on this port: answer, then close
                    self.log.warning("rpc frame rejected", peer=peer, code=err.code, error=err.message, **err.details)
                    with contextlib.suppress(ConnectionError, RPCError):
                        await conn.send(_error(None, err))
                    return
                except ConnectionError:
                    return
                await conn.wait_for_room()
                task = asyncio.create_task(self._handle(conn, body))
                conn.tasks.add(task)
                task.add_done_callback(conn.request_done)
        finally:
            for task in list(conn.tasks):
                task.cancel()
            await asyncio.gather(*conn.tasks, return_exceptions=True)
            conn.flush()
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _accept(self, conn: _Connection, body: bytes) -> tuple[str, str, Any, Any, Any] | None:
        """(request id, method, args, token, method entry) of a well-formed request for a known
        method; anything else is answered with its error here, logged, and None returned."""
        request_id: str | None = None
        try:
            message = unpack_body(body)
            request_id = _request_id(message)
            request_id, method, args, token = _parse_request(message)
            entry = self._methods.get(method)
            if entry is None:
                raise RPCError(
                    UNKNOWN_METHOD,
                    f"unknown method {method!r}; check the method name and the server version",
                )
        except RPCError as err:
            self.log.info(
                "rpc request rejected",
                peer=conn.peer,
                request_id=request_id,
                code=err.code,
                error=err.message,
            )
            with contextlib.suppress(ConnectionError):
                await conn.send(_error(request_id, err))
            return None
        return request_id, method, args, token, entry

    async def _handle(self, conn: _Connection, body: bytes) -> None:
        accepted = await self._accept(conn, body)
        if accepted is None:
            return
        request_id, method, args, token, entry = accepted
        ctx = RequestContext(
            request_id, method, token, conn.peer, asyncio.get_running_loop(), self.log, conn.writer.transport
        )
        started = time.monotonic()
        code = "cancelled"
        try:
            if entry.streaming:
                await self._run_stream(conn, ctx, entry.handler, args)
            else:
                result = entry.handler(ctx, args)
                if not inspect.isawaitable(result):
                    raise TypeError(f"handler for {method!r} must be an async function")
                result = await result
                await conn.send({"id": request_id, "ok": True, "result": result})
            code = "ok"
            if self._debug:
                ctx.log.debug("rpc request done", ms=round((time.monotonic() - started) * 1000, 3))
        except ConnectionError:
            code = "closed"
            if self._debug:
                ctx.log.debug("rpc connection closed before the answer was sent")
        except RPCError as err:
            code = err.code
            if self._debug:
                ctx.log.debug("rpc request failed", code=err.code, error=err.message)
            await self._send_error(conn, ctx, err)
        except Exception:
            code = INTERNAL
            ctx.log.exception("rpc handler crashed")
            err = RPCError(
                INTERNAL,
                f"internal error in {method}; the server logged the details under request id {request_id}",
            )
            await self._send_error(conn, ctx, err)
        finally:
            if self.observer is not None:
                with contextlib.suppress(Exception):  # a metrics fault must not fail a request
                    self.observer(method, code, time.monotonic() - started)

    async def _run_stream(
        self,
        conn: _Connection,
        ctx: RequestContext,
        handler: Callable[..., Any],
        args: dict[str, Any],
    ) -> None:
        items = handler(ctx, args)
        if inspect.isawaitable(items):
            items = await items
        if not hasattr(items, "__aiter__"):
            raise TypeError(f"streaming handler for {ctx.method!r} must return an async iterator")
        closing = (
            contextlib.aclosing(items)
            if hasattr(items, "aclose")
            else contextlib.nullcontext(items)
        )
        async with closing:
            async for item in items:
                await conn.send_stream(ctx.request_id, item)
        await conn.send({"id": ctx.request_id, "ok": True, "result": None})

    async def _send_error(self, conn: _Connection, ctx: RequestContext, err: RPCError) -> None:
        try:
            await conn.send(_error(ctx.request_id, err))
        except ConnectionError:
            pass
        except (TypeError, ValueError, RPCError):
            # The error's details could not be encoded: still answer.
            ctx.log.exception("rpc error answer could not be encoded", code=err.code)
            fallback = RPCError(err.code if err.code != FRAME_TOO_LARGE else INTERNAL, err.message)
            with contextlib.suppress(ConnectionError, TypeError, ValueError, RPCError):
                await conn.send(_error(ctx.request_id, fallback))


class RPCServerThread:
    """Runs an ``RPCServer`` on an event loop in a thread of its own.

    For a process whose main thread is busy elsewhere (the CLI, tests, or a
    server whose raft tick thread must not share a loop with the RPCs).
    """

    def __init__(self, server: RPCServer, *, name: str = "caravan-rpc") -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = concurrent.futures.Future[str]()

    def start(self, timeout: float = 10.0) -> str:
        """Start the loop and the server; returns the bound address or raises the bind error."""
        self._thread.start()
        return self._started.result(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            address = self.loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._started.set_exception(exc)
            self.loop.close()
            return
        self._started.set_result(address)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.server.close())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def run(self, coro: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        """Schedule a coroutine on the server's loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def stop(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"rpc server thread did not stop within {timeout:g}s")

    def __enter__(self) -> RPCServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
