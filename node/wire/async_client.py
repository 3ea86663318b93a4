"""The asyncio RPC client, for servers (a follower forwarding to its leader) and benchmarks.

It keeps one pipelined connection per server (``AsyncConnection``) and
performs the retry plan of ``node.wire.retry`` with asyncio I/O, so it
retries exactly as the blocking client does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from node.wire.async_connection import AsyncConnection, open_connection, open_stream
from node.wire.client_base import DEFAULT_TOKEN, ClientBase
from node.wire.framing import DEFAULT_MAX_FRAME, read_frame
from node.wire.messages import STREAM_END, outcome, stream_broken, stream_item
from node.wire.retry import DEFAULT_TIMEOUT, Attempt, Connect, Done, Exchange, Plan, plan, resume


class AsyncRPCClient(ClientBase):
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
        self._pool: dict[str, AsyncConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    async def __aenter__(self) -> AsyncRPCClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every pooled connection and wait until their sockets are closed."""
        connections = list(self._pool.values())
        self._pool.clear()
        for conn in connections:
            conn.close()
        for conn in connections:
            with contextlib.suppress(Exception):
                await conn.finished

    async def _connection(self, address: str, timeout: float) -> AsyncConnection:
        conn = self._pool.get(address)
        if conn is not None and not conn.closed:
            return conn  # the usual case: no lock to take
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self._pool.get(address)
            if conn is not None and not conn.closed:
                return conn
            conn = await open_connection(address, self.max_frame, timeout)
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
        attempt, frame = self.start_call(
            method,
            args,
            idempotent=idempotent,
            timeout=timeout,
            request_id=request_id,
            token=token,
            address=address,
        )
        steps = plan(attempt, one_pass=one_pass)
        result = await self._drive(steps, attempt, frame, self._connection)
        self.remember(attempt.address, pinned=address is not None)
        return result

    async def _drive(
        self,
        steps: Plan,
        attempt: Attempt,
        frame: bytes,
        connect: Callable[[str, float], Awaitable[Any]],
    ) -> Any:
        """Perform the plan's steps with asyncio I/O until it returns (or raises).

        The steps are performed inline, not in a helper coroutine: this is
        the per-call hot path of forwarding followers.
        """
        step = resume(steps)
        while not isinstance(step, Done):
            reply: Any = None
            error: Exception | None = None
            try:
                if isinstance(step, Connect):
                    reply = await connect(step.address, attempt.remaining())
                elif isinstance(step, Exchange):
                    answer = await step.conn.request(attempt.request_id, frame, attempt.remaining())
                    reply = outcome(answer)
                else:
                    await asyncio.sleep(step.seconds)
            except Exception as exc:  # the plan decides what is final
                error = exc
            step = resume(steps, reply, error)
        return step.value

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
        attempt, frame = self.start_stream(
            method, args, request_id=request_id, token=token, address=address
        )
        steps = plan(attempt, exchange=False)
        reader, writer = await self._drive(steps, attempt, frame, open_stream)
        try:
            writer.write(frame)
            await writer.drain()
            while True:
                async with asyncio.timeout(None if idle == float("inf") else idle):
                    item = stream_item(await read_frame(reader, self.max_frame))
                if item is STREAM_END:
                    return
                yield item
        except OSError as exc:
            raise stream_broken(method, attempt.address, exc) from None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
