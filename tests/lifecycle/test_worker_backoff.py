"""A worker whose evals keep failing backs off instead of draining the broker.

A 3-server fault campaign (seed 672) logged 377 "evaluation failed" warnings
in 0.2 s on a server that had just lost its leadership: each of its workers
took eval after eval from the broker, failed each at once with not_leader
and nacked it, until the leader loops were cancelled. Nomad's worker backs
off after an error; so does ours, and says once, not per eval, that
leadership moved.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import structlog
from structlog.testing import capture_logs

from fsm import messages as m
from fsm.structs import Evaluation
from node.leader.broker import BlockedEvals, EvalBroker
from node.leader.plan_apply import PlanApplier
from node.leader.workers import BACKOFF_FIRST, BACKOFF_MAX, Worker, WorkerStats
from node.wire.errors import RPCError
from tests.conditions import wait_until_async
from tests.fsm.support import Harness
from tests.lifecycle.support import job, node

EVALS = 6


class _FailingServer:
    """What the worker and the applier use of Server, over a real FSM; every proposal fails with ``error``."""

    log = structlog.get_logger()

    def __init__(self, h: Harness, error: RPCError) -> None:
        self.h = h
        self.error = error
        self.proposals = 0
        self.raft = SimpleNamespace(max_entry_bytes=48 * 1024)

    async def local(self, fn: Any) -> Any:
        with self.h.reader() as r:
            return fn(r)

    async def propose(self, body: Any) -> dict[str, Any]:
        self.proposals += 1
        raise self.error


def _run(error: RPCError, releases: int) -> tuple[list[float], EvalBroker, int, list[dict[str, Any]]]:
    """Run one worker over EVALS placeable evals while every plan fails with ``error``.

    The worker's pause is held until the test lets it go ``releases`` times;
    returns (pauses asked for, broker, proposals, log lines).
    """
    h = Harness.temp()
    try:
        h.ok(m.NodeRegister(node=node("n")))
        evals = []
        for i in range(EVALS):
            ev = Evaluation(id=f"ev-{i}", job_id=f"j{i}", status="pending")
            h.ok(m.JobRegister(job=job(f"j{i}", count=1), eval=ev))
            evals.append(ev)
        server = _FailingServer(h, error)
        pauses: list[float] = []
        gate = asyncio.Semaphore(0)

        async def pause(seconds: float) -> None:
            pauses.append(seconds)
            await gate.acquire()

        async def scenario() -> tuple[EvalBroker, int]:
            broker = EvalBroker()
            for ev in evals:
                broker.enqueue(ev)
            applier = PlanApplier(server, server, max_entry_bytes=server.raft.max_entry_bytes, log=server.log)  # type: ignore[arg-type]
            runner = asyncio.create_task(applier.run())
            worker = Worker(server, broker, BlockedEvals(), applier, WorkerStats(), "w1", server.log, pause=pause)  # type: ignore[arg-type]
            task = asyncio.create_task(worker.run())
            for n in range(releases + 1):
                await wait_until_async(lambda n=n: len(pauses) > n, 10, "the worker pauses after a failed eval")
                if n < releases:
                    gate.release()
            proposals = server.proposals
            task.cancel()
            runner.cancel()
            await asyncio.gather(task, runner, return_exceptions=True)
            return broker, proposals

        with capture_logs() as logs:
            broker, proposals = asyncio.run(scenario())
        return pauses, broker, proposals, logs
    finally:
        h.destroy()


def test_a_worker_that_lost_leadership_hands_back_one_eval_and_pauses() -> None:
    pauses, broker, proposals, logs = _run(RPCError.not_leader(None), releases=0)
    assert pauses == [BACKOFF_FIRST]
    assert proposals == 1 and broker.stats.nacked == 1, "one eval tried and handed back, not the whole broker"
    assert broker.stats.delivered == 1, f"{EVALS - 1} evals stay in the broker for the next leader's restore"
    assert not [x for x in logs if x["log_level"] == "warning"], logs
    assert [x["event"] for x in logs if x["log_level"] == "info"] == [
        "this server is no longer the leader; evaluation handed back"
    ]


def test_repeated_failures_double_the_pause_up_to_its_limit() -> None:
    releases = EVALS - 1
    pauses, broker, proposals, logs = _run(RPCError.not_leader(None), releases=releases)
    expected = [min(BACKOFF_FIRST * 2**i, BACKOFF_MAX) for i in range(releases + 1)]
    assert pauses == expected
    assert proposals == broker.stats.nacked == releases + 1
    # Said once for the run of failures, not once per eval.
    assert len([x for x in logs if x["event"].startswith("this server is no longer the leader")]) == 1


def test_other_failures_still_warn_and_back_off() -> None:
    pauses, broker, _, logs = _run(RPCError("unavailable", "the store is being replaced; retry"), releases=1)
    assert pauses == [BACKOFF_FIRST, 2 * BACKOFF_FIRST]
    warnings = [x for x in logs if x["log_level"] == "warning"]
    assert [x["event"] for x in warnings] == ["evaluation failed; nacking it"] * 2
    assert [x["failures_in_a_row"] for x in warnings] == [1, 2]
