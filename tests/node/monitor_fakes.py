"""Fakes around the leader's heartbeat monitor: a clock, a raft that records proposals, a state without allocs, a log."""

from __future__ import annotations

from typing import Any

from node.wire.errors import RPCError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Raft:
    """Records proposals; raises what it is told to."""

    def __init__(self) -> None:
        self.proposed: list[Any] = []
        self.fail: RPCError | None = None

    async def propose(self, body: Any, rid: str | None = None, **_lane: Any) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.proposed.append(body)
        return {"index": len(self.proposed), "value": None}


class NoAllocs:
    """A state with the nodes only: no allocs, so no jobs to evaluate."""

    applied_index = 0

    def alloc_statuses_by_node(self, node_id: str, terminal: bool = True) -> list[Any]:
        return []

    def job(self, job_id: str) -> None:
        return None


class State:
    async def local(self, fn: Any) -> Any:
        return fn(NoAllocs())

    def state_now(self) -> int:
        return 0


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def bind(self, **kw: Any) -> Log:
        return self

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event))

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event))
