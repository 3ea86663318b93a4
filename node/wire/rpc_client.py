"""RPC clients: a blocking one for the CLI and tests, an asyncio one for servers.

Both follow one retry policy (``_Attempt``), so the CLI and a forwarding
follower behave the same way:

- A connection that cannot be opened sent nothing: try the next address.
- ``not_leader``, ``no_leader`` and ``unavailable`` mean the server did not
  execute the request: resend it (to the named leader if there is one).
- A connection lost after the request went out, or an ``unknown_outcome``
  answer, leaves the request possibly executed. If the call is idempotent
  (reads, and writes, which servers deduplicate by request id) it is resent
  with the *same* request id; otherwise the caller gets ``unknown_outcome``
  carrying the request id, so it can decide and retry with that id itself.
- Everything stops at the call's deadline. Every other error is final.

Streams (``stream``) use a connection of their own, so a slow consumer
pushes back on its own stream only, and closing the iterator early simply
closes that connection. A stream is not resumed after it started: its
consumer knows where it stopped (the journal's index) and resubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsm.ids import new_request_id
from node.wire.errors import (
    BAD_REQUEST,
    INTERNAL,
    NO_LEADER,
    NOT_EXECUTED,
    NOT_LEADER,
    TIMEOUT,
    UNAVAILABLE,
    UNKNOWN_OUTCOME,
    RPCError,
)
from node.wire.framing import (
    DEFAULT_MAX_FRAME,
    HEADER,
    ConnectionLost,
    check_length,
    pack_frame,
    parse_address,
    read_frame,
    recv_frame,
    unpack_body,
)

DEFAULT_TIMEOUT = 10.0
BACKOFF_FIRST = 0.02
BACKOFF_MAX = 1.0


class _DefaultToken:
    """Marks "use the client's token" apart from an explicit None."""


DEFAULT_TOKEN: Any = _DefaultToken()


def _addresses(addresses: Sequence[str] | str) -> list[str]:
    found = [addresses] if isinstance(addresses, str) else list(addresses)
    for address in found:
        parse_address(address)
    return found


def _request(
    request_id: str, method: str, args: dict[str, Any] | None, token: str | None
) -> dict[str, Any]:
    return {"id": request_id, "method": method, "args": args or {}, "token": token}


def _response(body: bytes) -> dict[str, Any]:
    try:
        message = unpack_body(body)
    except RPCError:
        raise RPCError(
            INTERNAL,
            "server sent a frame that is not valid msgpack; check server and client versions",
        ) from None
    if not isinstance(message, dict) or "id" not in message:
        raise RPCError(
            INTERNAL,
            "server sent a response that is not a map with an id; check server and client versions",
        )
    return message


def _outcome(message: dict[str, Any]) -> Any:
    """The result of a final response, or its error raised."""
    if message.get("ok") is True:
        return message.get("result")
    raise RPCError.from_wire(message.get("error"))


@dataclass
class _Attempt:
    """Retry bookkeeping of one call: which address next, when, and whether to go on."""

    method: str
    request_id: str
    idempotent: bool
    timeout: float
    order: list[str]
    deadline: float = 0.0
    maybe_executed: bool = False  # some try may have run on a server
    position: int = 0
    wait: bool = False  # pause before the next try
    backoff: float = BACKOFF_FIRST
    failures: dict[str, str] = field(default_factory=dict)
    last_error: RPCError | None = None
    # A server's no_leader answer this pass (it already waited for an
    # election); final unless a later server in the pass does better.
    no_leader: RPCError | None = None
    # Give up once every try for this long was a refused connection (nothing
    # listens: a cluster not started, a wrong address); None: retry to the deadline.
    refused_grace: float | None = None
    only_refused: bool = True

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout
        if not self.order:
            raise RPCError(UNAVAILABLE, "no server address given; pass at least one host:port")

    @property
    def address(self) -> str:
        return self.order[self.position % len(self.order)]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _next_address(self) -> None:
        # Failing over to an untried server is immediate; starting another
        # pass over all of them waits, so a down cluster is not hammered.
        self.position += 1
        self.wait = self.position % len(self.order) == 0
        if self.wait and self.no_leader is not None:
            raise self.no_leader

    def pause(self) -> float:
        """Seconds to sleep before the next try."""
        if not self.wait:
            return 0.0
        self.wait = False
        pause, self.backoff = self.backoff, min(self.backoff * 2, BACKOFF_MAX)
        return max(0.0, min(pause, self.remaining()))

    def connect_failed(self, exc: BaseException) -> None:
        self.failures[self.address] = _describe(exc)
        if not isinstance(exc, ConnectionRefusedError):
            self.only_refused = False
        self._next_address()
        if (
            self.wait
            and self.only_refused
            and self.refused_grace is not None
            and time.monotonic() - self.started >= self.refused_grace
        ):
            raise RPCError(
                UNAVAILABLE,
                f"no server is listening at {', '.join(self.order)} (connection refused): start the cluster "
                "('make run' or 'caravan cluster up') or check --address / CARAVAN_ADDRESS",
            )

    def lost(self, exc: BaseException) -> None:
        """The exchange broke after the request went out: resend if idempotent, else raise."""
        self.failures[self.address] = _describe(exc)
        self.only_refused = False
        self.maybe_executed = True
        self.no_leader = None  # this server may yet answer otherwise
        if not self.idempotent:
            raise RPCError(
                UNKNOWN_OUTCOME,
                f"connection to {self.address} was lost before {self.method} was answered; it may or may "
                f"not have been applied: check, or retry with request id {self.request_id}",
                request_id=self.request_id,
            )
        self._next_address()

    def answered(self, err: RPCError) -> None:
        """Decide on an error answer: return to retry, raise to give up."""
        self.only_refused = False
        if err.code == UNKNOWN_OUTCOME and self.idempotent:
            # Ask the same server again: it may learn the outcome.
            self.maybe_executed = True
            self.last_error = err
            self.no_leader = None
            self.wait = True
            return
        if err.code not in NOT_EXECUTED:
            raise err
        self.last_error = err
        self.no_leader = err if err.code == NO_LEADER else None
        leader = err.details.get("leader") if err.code == NOT_LEADER else None
        if isinstance(leader, str) and leader and leader != self.address and _valid(leader):
            if leader in self.order:
                self.order.remove(leader)
            self.order.insert(0, leader)
            self.position = 0
            return
        self._next_address()

    def give_up(self) -> RPCError:
        if self.maybe_executed:
            last = f" (a server's last answer: {self.last_error.message})" if self.last_error else ""
            return RPCError(
                TIMEOUT,
                f"no answer to {self.method} within {self.timeout:g}s{last}; if it changes state it may or "
                f"may not have been applied: check, or retry with request id {self.request_id}",
                request_id=self.request_id,
            )
        if self.last_error is not None:
            return self.last_error
        tried = (
            "; ".join(f"{addr}: {why}" for addr, why in self.failures.items())
            or "no attempt in time"
        )
        return RPCError(
            UNAVAILABLE,
            f"could not reach any server within {self.timeout:g}s ({tried}); check that the servers are "
            f"running and the addresses are right",
        )


def _valid(address: str) -> bool:
    try:
        parse_address(address)
    except ValueError:
        return False
    return True


def _still_open(sock: socket.socket) -> bool:
    try:
        sock.setblocking(False)
        try:
            return (
                sock.recv(1, socket.MSG_PEEK) != b""
            )  # b"": the peer closed; data: a stale answer, still open
        finally:
            sock.setblocking(True)
    except BlockingIOError:
        return True
    except OSError:
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__


class _Client:
    """What both clients share: addresses, token, and how a call starts."""

    def __init__(
        self,
        addresses: Sequence[str] | str,
        token: str | None,
        timeout: float,
        max_frame: int,
        refused_grace: float | None = None,
    ) -> None:
        self.addresses = _addresses(addresses)
        self.token = token
        self.timeout = timeout
        self.max_frame = max_frame
        self.refused_grace = refused_grace
        self._preferred = 0

    def __repr__(self) -> str:  # keep the token out of reprs and tracebacks
        return f"{type(self).__name__}(addresses={self.addresses!r}, timeout={self.timeout!r})"

    def _start(
        self,
        method: str,
        args: dict[str, Any] | None,
        *,
        idempotent: bool,
        timeout: float | None,
        request_id: str | None,
        token: str | None,
        address: str | None,
    ) -> tuple[_Attempt, bytes]:
        """The call's retry state and its encoded request (oversize fails here, before any I/O)."""
        if address is not None:
            parse_address(address)
            order = [address]
        else:
            order = self.addresses[self._preferred :] + self.addresses[: self._preferred]
        attempt = _Attempt(
            method,
            request_id or new_request_id(),
            idempotent,
            self.timeout if timeout is None else timeout,
            order,
            refused_grace=self.refused_grace,
        )
        token = self.token if token is DEFAULT_TOKEN else token
        frame = pack_frame(
            _request(attempt.request_id, method, args, token), self.max_frame, "request"
        )
        return attempt, frame

    def _remember(self, address: str, pinned: bool) -> None:
        """Stick to the server that answered (unless the caller pinned one)."""
        if pinned:
            return
        if address not in self.addresses:
            self.addresses.append(address)  # a leader named by a not_leader answer
        self._preferred = self.addresses.index(address)


class RPCClient(_Client):
    """Blocking client; safe to share between threads (calls are serialized).

    ``addresses`` are the servers to try, in order; the client sticks to the
    last one that answered.
    """

    def __init__(
        self,
        addresses: Sequence[str] | str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        refused_grace: float | None = None,
    ) -> None:
        super().__init__(addresses, token, timeout, max_frame, refused_grace)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._sock_address: str | None = None

    def __enter__(self) -> RPCClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._sock_address = None

    def _open(self, address: str, timeout: float) -> socket.socket:
        host, port = parse_address(address)
        sock = socket.create_connection((host, port), timeout=max(timeout, 0.001))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def call(
        self,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        idempotent: bool = True,
        timeout: float | None = None,
        request_id: str | None = None,
        token: str | None = DEFAULT_TOKEN,
    ) -> Any:
        """Call ``method`` and return its result; raises ``RPCError``.

        ``idempotent=False`` turns a lost answer into ``unknown_outcome``
        instead of a resend. Pass ``request_id`` to retry an earlier call.
        """
        attempt, frame = self._start(
            method,
            args,
            idempotent=idempotent,
            timeout=timeout,
            request_id=request_id,
            token=token,
            address=None,
        )
        with self._lock:
            while attempt.remaining() > 0:
                address = attempt.address
                try:
                    sock = self._socket_to(address, attempt.remaining())
                except OSError as exc:
                    attempt.connect_failed(exc)
                else:
                    try:
                        result = self._exchange(sock, attempt, frame)
                        self._remember(address, pinned=False)
                        return result
                    except RPCError as err:
                        attempt.answered(err)
                    except (OSError, ConnectionLost) as exc:
                        self._drop()
                        attempt.lost(exc)
                time.sleep(attempt.pause())
            raise attempt.give_up()

    def _socket_to(self, address: str, timeout: float) -> socket.socket:
        """The kept connection if it is to ``address`` and still open, else a new one.

        A kept socket the server closed meanwhile (restart, idle timeout) is
        detected here, before sending: otherwise a non-idempotent call would
        report ``unknown_outcome`` for a request no server ever saw.
        """
        if self._sock is not None and (
            self._sock_address != address or not _still_open(self._sock)
        ):
            self._drop()
        if self._sock is None:
            self._sock = self._open(address, timeout)
            self._sock_address = address
        return self._sock

    def _exchange(self, sock: socket.socket, attempt: _Attempt, frame: bytes) -> Any:
        sock.settimeout(max(attempt.remaining(), 0.001))
        sock.sendall(frame)
        while True:
            sock.settimeout(max(attempt.remaining(), 0.001))
            try:
                body = recv_frame(sock, self.max_frame)
                if body is None:
                    raise ConnectionLost("server closed the connection")
                message = _response(body)
            except RPCError:
                self._drop()  # an oversized or garbled frame leaves the stream unusable
                raise
            if message["id"] != attempt.request_id and message["id"] is not None:
                continue  # a late answer to an earlier call on this connection
            if "stream" in message:
                self._drop()
                raise RPCError(
                    BAD_REQUEST,
                    f"{attempt.method} streams its result; use stream() instead of call()",
                )
            if message["id"] is None and message.get("ok") is not True:
                self._drop()  # the server could not tell which request failed: framing-level trouble
            return _outcome(message)

    def stream(
        self,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        idle_timeout: float | None = None,
        request_id: str | None = None,
        token: str | None = DEFAULT_TOKEN,
    ) -> Iterator[Any]:
        """Yield the items of a streaming method; raises its final error, if any.

        ``idle_timeout`` bounds the wait for each frame (default: the client
        timeout; ``math.inf`` waits forever).
        """
        idle = self.timeout if idle_timeout is None else idle_timeout
        attempt, frame = self._start(
            method,
            args,
            idempotent=True,
            timeout=None,
            request_id=request_id,
            token=token,
            address=None,
        )
        sock = None
        while sock is None:
            if attempt.remaining() <= 0:
                raise attempt.give_up()
            try:
                sock = self._open(attempt.address, attempt.remaining())
            except OSError as exc:
                attempt.connect_failed(exc)
                time.sleep(attempt.pause())
        try:
            sock.settimeout(None if idle == float("inf") else idle)
            sock.sendall(frame)
            while True:
                body = recv_frame(sock, self.max_frame)
                if body is None:
                    raise ConnectionLost("server closed the connection")
                message = _response(body)
                if "stream" in message:
                    yield message["stream"]
                    continue
                _outcome(message)
                return
        except (OSError, ConnectionLost) as exc:
            raise RPCError(
                UNAVAILABLE,
                f"stream {method} from {attempt.address} broke ({_describe(exc)}); resubscribe from the last item received",
            ) from None
        finally:
            with contextlib.suppress(OSError):
                sock.close()


_Waiter = tuple[float, "asyncio.Future[dict[str, Any]]"]  # (deadline on the loop clock, answer)


class _AsyncConnection(asyncio.Protocol):
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
            message = _response(chunk[start : start + length])
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


async def _open_connection(address: str, max_frame: int, timeout: float) -> _AsyncConnection:
    host, port = parse_address(address)
    loop = asyncio.get_running_loop()
    _, conn = await asyncio.wait_for(
        loop.create_connection(lambda: _AsyncConnection(address, max_frame, loop), host, port),
        max(timeout, 0.001),
    )
    return conn


async def _open_stream(
    address: str, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = parse_address(address)
    return await asyncio.wait_for(asyncio.open_connection(host, port), max(timeout, 0.001))


class AsyncRPCClient(_Client):
    """asyncio client keeping one pipelined connection per server.

    Followers use it to forward writes to the leader: pass the client's own
    request id and token through (``request_id=``, ``token=``) so the leader
    deduplicates a forwarded retry, and ``address=`` to target the leader.
    Use from one event loop.
    """

    def __init__(
        self,
        addresses: Sequence[str] | str = (),
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        super().__init__(addresses, token, timeout, max_frame)
        self._pool: dict[str, _AsyncConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    async def __aenter__(self) -> AsyncRPCClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        connections = list(self._pool.values())
        self._pool.clear()
        for conn in connections:
            conn.close()
        for conn in connections:
            with contextlib.suppress(Exception):
                await conn.finished

    async def _connection(self, address: str, timeout: float) -> _AsyncConnection:
        conn = self._pool.get(address)
        if conn is not None and not conn.closed:
            return conn  # the usual case: no lock to take
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self._pool.get(address)
            if conn is not None and not conn.closed:
                return conn
            conn = await _open_connection(address, self.max_frame, timeout)
            self._pool[address] = conn
            return conn

    async def call(
        self,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        idempotent: bool = True,
        timeout: float | None = None,
        request_id: str | None = None,
        token: str | None = DEFAULT_TOKEN,
        address: str | None = None,
        one_pass: bool = False,
    ) -> Any:
        """As ``RPCClient.call``; ``address`` pins the call to one server (plus any leader it names).

        ``one_pass``: give up after one pass over the addresses instead of
        pausing and trying them again until the timeout. A follower forwarding
        to a leader that just died wants that: it should look leadership up
        again within milliseconds, not retry a refused port for a whole second.
        """
        attempt, frame = self._start(
            method,
            args,
            idempotent=idempotent,
            timeout=timeout,
            request_id=request_id,
            token=token,
            address=address,
        )
        while attempt.remaining() > 0:
            target = attempt.address
            try:
                conn = await self._connection(target, attempt.remaining())
            except (OSError, TimeoutError) as exc:
                attempt.connect_failed(exc)
            else:
                try:
                    result = _outcome(
                        await conn.request(attempt.request_id, frame, attempt.remaining())
                    )
                    self._remember(target, pinned=address is not None)
                    return result
                except RPCError as err:
                    attempt.answered(err)
                except (OSError, ConnectionError) as exc:  # TimeoutError too: deadline passed
                    attempt.lost(exc)
            if one_pass and attempt.wait:
                break
            await asyncio.sleep(attempt.pause())
        raise attempt.give_up()

    async def stream(
        self,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        idle_timeout: float | None = None,
        request_id: str | None = None,
        token: str | None = DEFAULT_TOKEN,
        address: str | None = None,
    ) -> AsyncIterator[Any]:
        """As ``RPCClient.stream``; an async generator on a connection of its own."""
        idle = self.timeout if idle_timeout is None else idle_timeout
        attempt, frame = self._start(
            method,
            args,
            idempotent=True,
            timeout=None,
            request_id=request_id,
            token=token,
            address=address,
        )
        while True:
            if attempt.remaining() <= 0:
                raise attempt.give_up()
            try:
                reader, writer = await _open_stream(attempt.address, attempt.remaining())
                break
            except (OSError, TimeoutError) as exc:
                attempt.connect_failed(exc)
                await asyncio.sleep(attempt.pause())
        try:
            writer.write(frame)
            await writer.drain()
            while True:
                async with asyncio.timeout(None if idle == float("inf") else idle):
                    body = await read_frame(reader, self.max_frame)
                if body is None:
                    raise ConnectionLost("server closed the connection")
                message = _response(body)
                if "stream" in message:
                    yield message["stream"]
                    continue
                _outcome(message)
                return
        except (OSError, ConnectionError, TimeoutError) as exc:
            raise RPCError(
                UNAVAILABLE,
                f"stream {method} from {attempt.address} broke ({_describe(exc)}); resubscribe from the last item received",
            ) from None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
