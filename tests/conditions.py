"""Waiting on a condition with a deadline: the one way tests synchronise with servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from node.wire.errors import RPCError

# Errors that mean "not yet" while a cluster starts, elects or restarts.
TRANSIENT: tuple[type[BaseException], ...] = (RPCError, OSError)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.05,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except transient as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last error: {last!r})")


async def wait_until_async(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """``wait_until`` inside an event loop: yields to its other tasks between checks; an error in ``predicate`` fails at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
