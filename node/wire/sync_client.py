"""The blocking RPC client, for the CLI, tests and harnesses.

It keeps one socket to the server that last answered and performs the
retry plan of ``node.wire.retry`` with blocking I/O. A stream uses a
connection of its own, so closing the iterator early simply closes that
connection; it is not resumed once it started (its consumer knows where it
stopped and resubscribes).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from node.wire.client_base import DEFAULT_TOKEN, ClientBase
from node.wire.errors import BAD_REQUEST, RPCError
from node.wire.framing import DEFAULT_MAX_FRAME, ConnectionLost, parse_address, recv_frame
from node.wire.messages import STREAM_END, decode_response, outcome, stream_broken, stream_item
from node.wire.retry import (
    DEFAULT_TIMEOUT,
    Attempt,
    Connect,
    Done,
    Exchange,
    Plan,
    Step,
    plan,
    resume,
)


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


class RPCClient(ClientBase):
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
        """Close the kept connection; the client stays usable and reconnects on the next call."""
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
        attempt, frame = self.start_call(
            method,
            args,
            idempotent=idempotent,
            timeout=timeout,
            request_id=request_id,
            token=token,
            address=None,
        )
        with self._lock:
            result = self._drive(plan(attempt), attempt, frame, self._socket_to)
            self.remember(attempt.address, pinned=False)
            return result

    def pages(self, method: str, args: dict[str, Any] | None = None, **kw: Any) -> Iterator[list[Any]]:
        """The items of each page of a list ``method`` in turn, following ``next_token`` to the end.

        A list answers one bounded page at a time (``node.core.paging``), so a
        caller that wants a whole list reads it this way and never builds one
        giant answer on the server. ``kw`` goes to ``call``.
        """
        call = dict(args or {})
        while True:
            out = self.call(method, call, **kw)
            yield out["data"]
            token = out.get("next_token") or ""
            if not token:
                return
            call["next_token"] = token

    def list_all(self, method: str, args: dict[str, Any] | None = None, **kw: Any) -> list[Any]:
        """Every item of a list ``method``, page after page (for lists the caller can hold)."""
        return [item for page in self.pages(method, args, **kw) for item in page]

    def _drive(
        self,
        steps: Plan,
        attempt: Attempt,
        frame: bytes,
        connect: Callable[[str, float], socket.socket],
    ) -> Any:
        """Perform the plan's steps with blocking I/O until it returns (or raises)."""
        step = resume(steps)
        while not isinstance(step, Done):
            reply: Any = None
            error: Exception | None = None
            try:
                reply = self._perform(step, attempt, frame, connect)
            except Exception as exc:  # the plan decides what is final
                error = exc
            step = resume(steps, reply, error)
        return step.value

    def _perform(
        self,
        step: Step,
        attempt: Attempt,
        frame: bytes,
        connect: Callable[[str, float], socket.socket],
    ) -> Any:
        if isinstance(step, Connect):
            return connect(step.address, attempt.remaining())
        if isinstance(step, Exchange):
            return self._exchange(step.conn, attempt, frame)
        time.sleep(step.seconds)
        return None

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

    def _exchange(self, sock: socket.socket, attempt: Attempt, frame: bytes) -> Any:
        """Send the request and wait for its answer; a connection that broke is dropped."""
        try:
            return self._send_and_wait(sock, attempt, frame)
        except OSError:
            self._drop()
            raise

    def _send_and_wait(self, sock: socket.socket, attempt: Attempt, frame: bytes) -> Any:
        sock.settimeout(max(attempt.remaining(), 0.001))
        sock.sendall(frame)
        while True:
            sock.settimeout(max(attempt.remaining(), 0.001))
            try:
                body = recv_frame(sock, self.max_frame)
                if body is None:
                    raise ConnectionLost("server closed the connection")
                message = decode_response(body)
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
            return outcome(message)

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
        attempt, frame = self.start_stream(
            method, args, request_id=request_id, token=token, address=None
        )
        sock = self._drive(plan(attempt, exchange=False), attempt, frame, self._open)
        try:
            sock.settimeout(None if idle == float("inf") else idle)
            sock.sendall(frame)
            while (item := stream_item(recv_frame(sock, self.max_frame))) is not STREAM_END:
                yield item
        except OSError as exc:
            raise stream_broken(method, attempt.address, exc) from None
        finally:
            with contextlib.suppress(OSError):
                sock.close()
