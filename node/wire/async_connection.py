"""The asyncio client's connections: one pipelined protocol per server, and stream openers.

``AsyncConnection`` carries many calls at once on one socket, matching
answers to callers by request id; ``AsyncRPCClient`` keeps one per server
and drives the retry plan over it. A stream gets a plain stream pair of its
own (``open_stream``), so a slow consumer pushes back on that stream only.
"""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

from node.wire.errors import RPCError
from node.wire.framing import HEADER, ConnectionLost, check_length, parse_address
from node.wire.messages import decode_response

_Waiter = tuple[float, "asyncio.Future[dict[str, Any]]"]  # (deadline on the loop clock, answer)


class AsyncConnection(asyncio.Protocol):
    """One pipelined connection: many requests in flight, answers matched by id.

    A protocol rather than a stream pair, because per call this is the hot
    path of pipelining clients and of followers forwarding writes:

    - requests made in one loop iteration leave in one socket write;
    - answers are parsed straight from each chunk the socket delivers, with
      no reader task and no await per frame;
    - deadlines are kept by one timer per connection, not one per call.
    """

    def __init__(self, address: str, max_frame: int, loop: asyncio.AbstractEventLoop) -> None:
        self.address = address
        self.max_frame = max_frame
        self.loop = loop
        self.pending: dict[str, list[_Waiter]] = {}
        self.closed = False
        self.finished: asyncio.Future[None] = loop.create_future()  # done once the socket is closed
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []  # frames waiting for this iteration's write
        self._buffer = bytearray()  # the start of an incomplete answer frame
        self._need = HEADER.size  # bytes to buffer before that frame can be complete
        self._paused = False  # the transport's write buffer is full
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    # ---- callers --------------------------------------------------------------------------------

    async def request(self, request_id: str, frame: bytes, timeout: float) -> dict[str, Any]:
        """Send ``frame`` and wait for the answer to ``request_id``; TimeoutError after ``timeout``."""
        if self.closed:
            raise ConnectionLost("connection closed")
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        waiter = (self.loop.time() + timeout, future)
        waiters = self.pending.get(request_id)
        if waiters is None:
            self.pending[request_id] = [waiter]
        else:
            waiters.append(waiter)  # the same id twice in flight: both get the answer
        self._arm(waiter[0])
        if not self._outgoing:
            self.loop.call_soon(self._flush)
        self._outgoing.append(frame)
        try:
            if self._paused:
                await self._drain()
            return await future
        except BaseException:
            self._forget(request_id, waiter)
            raise

    def close(self) -> None:
        """Close the socket; calls still waiting fail once the transport reports it lost."""
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    async def _drain(self) -> None:
        """Wait until the transport takes more data (a future of its own: cancelling it is harmless)."""
        future: asyncio.Future[None] = self.loop.create_future()
        self._drain_waiters.append(future)
        await future

    def _forget(self, request_id: str, waiter: _Waiter) -> None:
        waiters = self.pending.get(request_id)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self.pending[request_id]

    # ---- deadlines ------------------------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        """Make sure the timer fires by ``deadline``."""
        if deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(deadline, self._expire)
            self._timer_at = deadline

    def _expire(self) -> None:
        """Time out the waiters whose deadline passed; rearm for the soonest other one."""
        self._timer, self._timer_at = None, math.inf
        now = self.loop.time()
        soonest = math.inf
        for request_id, waiters in list(self.pending.items()):
            keep = []
            for waiter in waiters:
                deadline, future = waiter
                if future.done():
                    continue
                if deadline <= now:
                    future.set_exception(TimeoutError())
                    continue
                keep.append(waiter)
                soonest = min(soonest, deadline)
            if keep:
                self.pending[request_id] = keep
            else:
                del self.pending[request_id]
        if soonest < math.inf:
            self._arm(soonest)

    # ---- protocol callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        chunk: bytes | bytearray = data
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return  # a large frame arriving in pieces: no parse attempt per piece
            chunk, self._buffer = self._buffer, bytearray()
        try:
            end = self._deliver(chunk)
        except RPCError as err:  # oversized or garbled: the stream is unusable
            self._fail(ConnectionLost(str(err)))
            return
        if end < len(chunk):
            self._buffer = bytearray(chunk[end:])

    def _deliver(self, chunk: bytes | bytearray) -> int:
        """Resolve the waiters of every complete frame in ``chunk``; the end of the last one."""
        size = len(chunk)
        pos = 0
        pending = self.pending
        while size - pos >= HEADER.size:
            (length,) = HEADER.unpack_from(chunk, pos)
            if length > self.max_frame:
                check_length(chunk[pos : pos + HEADER.size], self.max_frame)  # raises: too large, or HTTP
            start = pos + HEADER.size
            if start + length > size:
                self._need = start + length - pos
                return pos
            message = decode_response(chunk[start : start + length])
            pos = start + length
            if "stream" in message or message["id"] is None:
                continue  # streams have connections of their own
            for _, future in pending.pop(message["id"], ()):
                if not future.done():
                    future.set_result(message)
        self._need = HEADER.size
        return pos

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost fails what is still pending

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            error: BaseException = (
                exc if isinstance(exc, ConnectionError) else ConnectionLost(str(exc))
            )
        elif self._buffer:
            where = "header" if len(self._buffer) < HEADER.size else "body"
            error = ConnectionLost(f"connection closed inside a frame {where}")
        else:
            error = ConnectionLost("server closed the connection")
        self._fail(error)
        self.resume_writing()
        if not self.finished.done():
            self.finished.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def _fail(self, error: BaseException) -> None:
        """Close the connection and pass ``error`` to every call still waiting on it."""
        self.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        pending, self.pending = self.pending, {}
        for waiters in pending.values():
            for _, future in waiters:
                if not future.done():
                    future.set_exception(error)


async def open_connection(address: str, max_frame: int, timeout: float) -> AsyncConnection:
    """A new pipelined connection to ``address``; ``TimeoutError`` after ``timeout`` seconds."""
    host, port = parse_address(address)
    loop = asyncio.get_running_loop()
    _, conn = await asyncio.wait_for(
        loop.create_connection(lambda: AsyncConnection(address, max_frame, loop), host, port),
        max(timeout, 0.001),
    )
    return conn


async def open_stream(
    address: str, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream pair of its own to ``address``, for one streaming call."""
    host, port = parse_address(address)
    return await asyncio.wait_for(asyncio.open_connection(host, port), max(timeout, 0.001))
