"""A worker whose plan was rejected for another plan's in-flight claims plans again only once that plan committed.

Nomad's plan applier answers a rejection with a RefreshIndex that the worker
waits for; planned again at once, on the same state, the plan would be
rejected the same way until the worker gave up on the eval.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import structlog

from fsm import messages as m
from fsm.structs import Evaluation
from node.leader.broker import BlockedEvals, EvalBroker
from node.leader.plan_apply import PlanApplier
from node.leader.workers import Worker, WorkerStats
from tests.fsm.support import Harness
from tests.lifecycle.support import job, node


class _HarnessServer:
    """What the worker and the applier use of Server, over a real FSM; proposals wait for ``gate``."""

    log = structlog.get_logger()

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.gate = asyncio.Event()
        self.raft = SimpleNamespace(max_entry_bytes=48 * 1024)

    async def local(self, fn: Any) -> Any:
        with self.h.reader() as r:
            return fn(r)

    async def propose(self, body: Any) -> dict[str, Any]:
        await self.gate.wait()
        value = self.h.ok(body)
        return {"index": self.h.index, "value": value}


def test_a_plan_rejected_for_in_flight_claims_is_planned_again_after_they_commit() -> None:
    h = Harness.temp()
    try:
        h.ok(m.NodeRegister(node=node("n", cpu=1000)))
        evals = {}
        for name in ("a", "b"):
            evals[name] = Evaluation(id=f"ev-{name}", job_id=name, type="batch", status="pending")
            # Batch: a rejected plan leaves nothing to commit (a service job's first plan still
            # commits its deployment, and that commit waits behind a's).
            h.ok(m.JobRegister(job=job(name, type="batch", count=1, cpu=600), eval=evals[name]))

        async def scenario() -> None:
            server = _HarnessServer(h)
            applier = PlanApplier(server, server, max_entry_bytes=server.raft.max_entry_bytes, log=server.log)  # type: ignore[arg-type]
            runner = asyncio.create_task(applier.run())

            def worker(name: str) -> Worker:
                return Worker(server, EvalBroker(), BlockedEvals(), applier, WorkerStats(), name, server.log)  # type: ignore[arg-type]

            first = asyncio.create_task(worker("w1").process(evals["a"]))
            while not applier.in_flight:  # a's plan is checked and committing (held at the gate)
                await asyncio.sleep(0)
            second = asyncio.create_task(worker("w2").process(evals["b"]))
            while applier.stats.partial < 1:  # b's plan met a's claim on the node
                await asyncio.sleep(0)
            for _ in range(200):  # time enough to plan again many times over
                if second.done():
                    break
                await asyncio.sleep(0)
            assert not second.done(), f"planned again before a's plan committed: {second}"
            server.gate.set()
            await asyncio.wait_for(asyncio.gather(first, second), 10)
            assert applier.stats.partial == 1, "planned again on the state with a's alloc: no second rejection"
            runner.cancel()

        asyncio.run(scenario())
        with h.reader() as r:
            live = [x for x in r.allocs() if not x.terminal()]
            assert [x.job_id for x in live] == ["a"]
            assert r.eval("ev-b").failed_tg_allocs, "b could not be placed: its eval says why"
    finally:
        h.destroy()
