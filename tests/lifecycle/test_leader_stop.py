"""Leader duties end when leadership is lost: nothing waits for them, and one that hangs is reported."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from node import server as server_mod
from node.leader.plan_apply import PlanApplier
from scheduler.plan import Plan


class _StuckServer:
    """Just what PlanApplier touches before a plan's check returns: the check never does."""

    log = structlog.get_logger()

    async def local(self, fn: Any) -> Any:
        await asyncio.Event().wait()


def test_stopping_cancels_the_plan_in_check_and_the_queued_ones() -> None:
    async def scenario() -> None:
        applier = PlanApplier(_StuckServer(), _StuckServer(), max_entry_bytes=48 * 1024, log=_StuckServer.log)  # type: ignore[arg-type]
        runner = asyncio.create_task(applier.run())
        checking = asyncio.create_task(applier.submit(Plan("e1", "j1")))
        queued = asyncio.create_task(applier.submit(Plan("e2", "j2")))
        while applier.queue.qsize() != 1:  # the first plan is in its check, the second waits
            await asyncio.sleep(0)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        _done, pending = await asyncio.wait({checking, queued}, timeout=5)
        assert not pending, "a plan the stopped applier will never commit is still waited for"
        assert checking.cancelled() and queued.cancelled()

    asyncio.run(scenario())


class _RetiringServer:
    """The parts of Server that ``_retire`` uses."""

    def __init__(self) -> None:
        self._retiring: set[asyncio.Task[Any]] = set()
        self.log = structlog.get_logger()


def test_a_leader_loop_that_does_not_stop_is_kept_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "LEADER_LOOP_STOP_WARN", 0.05)

    release = asyncio.Event()

    async def ignores_cancel() -> None:  # what a lost cancel looks like from outside
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def stops() -> None:
        await asyncio.Event().wait()

    async def scenario() -> list[dict[str, Any]]:
        srv = _RetiringServer()
        stuck, good = asyncio.create_task(ignores_cancel()), asyncio.create_task(stops())
        await asyncio.sleep(0)
        with structlog.testing.capture_logs() as logs:
            server_mod.Server._retire(srv, stuck)  # type: ignore[arg-type]
            server_mod.Server._retire(srv, good)  # type: ignore[arg-type]
            deadline = asyncio.get_running_loop().time() + 5
            while not logs and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
        assert srv._retiring == {stuck}  # held, not left to be collected unseen
        release.set()
        await stuck
        assert not srv._retiring
        return logs

    logs = asyncio.run(scenario())
    assert [e["event"] for e in logs] == [
        "leader loop did not stop after leadership was lost; it is a bug, please report it"
    ]
    assert "ignores_cancel" in logs[0]["task"] and logs[0]["log_level"] == "error"
