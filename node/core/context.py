"""What a request's handler gets: its id, method, token and peer, and ways to wait off-loop.

The rest of a server process lives on other threads (pysyncobj's tick
thread applies entries and fires callbacks), so handlers get helpers on
their context to wait, without blocking the loop, for a result another
thread produces: ``ctx.completion()`` and ``ctx.wait_future()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any

from node.wire.errors import (
    TIMEOUT,
    RPCError,
)

#: The RPC method of the request this task serves: set when its context is made, so
#: that the ACL check (``node.core.acl.authorize``) finds the method's row without
#: every endpoint passing it. Each request runs in a task of its own (RPC server,
#: HTTP API), and a task's context variables are its own.
_METHOD: contextvars.ContextVar[str | None] = contextvars.ContextVar("caravan_rpc_method", default=None)


def current_method() -> str | None:
    """The RPC method of the request being served on this task, if any."""
    return _METHOD.get()


async def _wait(
    future: asyncio.Future[Any], timeout: float | None, on_timeout: RPCError | None
) -> Any:
    # shield: a caller that gives up must not cancel the source, whose
    # producer on another thread would then fail when it sets the result.
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        raise on_timeout or RPCError(
            TIMEOUT, f"no result within {timeout:g}s; retry later"
        ) from None


class Completion:
    """A one-shot result that another thread fills and a handler awaits.

    Filling it never raises in the filling thread (a second fill, or a fill
    after the waiter gave up, is ignored): an exception there could be
    pysyncobj's tick thread, where it would wedge the node.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[Any] = loop.create_future()

    def set_result(self, value: Any) -> None:
        self._post(self._settle, value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._post(self._settle, None, exc)

    def callback(self, result: Any, error: Any) -> None:
        """pysyncobj's ``callback(result, fail_reason)`` shape; resolves to the pair."""
        self.set_result((result, error))

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        # The loop may be gone if the server stopped meanwhile; nobody waits then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _settle(self, value: Any, exc: BaseException | None) -> None:
        if self._future.done():
            return
        if exc is not None:
            self._future.set_exception(exc)
        else:
            self._future.set_result(value)

    async def wait(
        self, timeout: float | None = None, *, on_timeout: RPCError | None = None
    ) -> Any:
        """The value (or raised exception); ``on_timeout`` (default: a ``timeout`` error) after ``timeout`` s."""
        return await _wait(self._future, timeout, on_timeout)


class RequestContext:
    """What a handler knows about the request besides its args.

    ``token`` is the caller's secret: check it, never log it or put it in an
    error. ``log`` is bound with the request id, method and peer on first
    use: most requests never log, and binding a structlog logger for each
    showed in the leader's profile.
    """

    __slots__ = ("request_id", "method", "token", "peer", "loop", "_base_log", "_log", "_transport")

    def __init__(
        self,
        request_id: str,
        method: str,
        token: str | None,
        peer: str,
        loop: asyncio.AbstractEventLoop,
        log: Any,
        transport: asyncio.BaseTransport,
    ) -> None:
        self.request_id = request_id
        self.method = method
        self.token = token
        self.peer = peer
        self.loop = loop
        self._base_log = log
        self._log: Any = None
        self._transport = transport
        _METHOD.set(method)

    def __repr__(self) -> str:  # never the token
        return f"RequestContext(request_id={self.request_id!r}, method={self.method!r}, peer={self.peer!r})"

    @property
    def log(self) -> Any:
        if self._log is None:
            self._log = self._base_log.bind(request_id=self.request_id, method=self.method, peer=self.peer)
        return self._log

    def completion(self) -> Completion:
        return Completion(self.loop)

    async def wait_future(
        self,
        future: concurrent.futures.Future[Any],
        timeout: float | None = None,
        *,
        on_timeout: RPCError | None = None,
    ) -> Any:
        """Await a ``concurrent.futures.Future`` completed by another thread.

        Giving up (timeout, or the connection closing) leaves ``future``
        untouched, so its producer can still complete it safely.
        """
        return await _wait(asyncio.wrap_future(future, loop=self.loop), timeout, on_timeout)

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking work (an LMDB read, a file) off the loop thread."""
        return await self.loop.run_in_executor(None, functools.partial(fn, *args))

    def abort_connection(self) -> None:
        """Drop this request's connection without an answer.

        For fault injection (jepsen_like) and tests: it produces exactly what
        a client sees when a reply is lost. The handler's task is cancelled
        at its next await.
        """
        self._transport.abort()  # type: ignore[attr-defined]
