"""Helpers of the GC tests: an FSM harness, builders, reaping a plan, orphan checks.

The harness applies entries through the real ``FSM.apply`` (encoded exactly
as the leader encodes them) and keeps the log, so a test can replay the same
entries into a second FSM and compare digests.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fsm import messages as m
from fsm.gc import Plan, Thresholds, Window, plan_kind
from fsm.machine import FSM, ApplyResult
from fsm.messages import encode_entry
from fsm.store import StateReader
from fsm.structs import (
    SECOND,
    ACLToken,
    Allocation,
    Evaluation,
    Job,
    ReschedulePolicy,
    Task,
    TaskGroup,
)
from node.leader.gc import Limits, reap_bodies

T0 = 1_700_000_000 * SECOND
SMALL_MAP = 256 << 20


class ApplyFailed(AssertionError):
    pass


def _fatal(exc: BaseException) -> None:
    raise ApplyFailed(f"FSM asked to stop the node: {exc}") from exc


@dataclass
class GCHarness:
    """An FSM in a temporary directory; entries are numbered and timed by the test."""

    path: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="caravan-gc-"))
    index: int = 0
    time: int = T0
    entries: list[tuple[int, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fsm = FSM(self.path, map_size=SMALL_MAP, on_fatal=_fatal)

    def apply(
        self, body: Any, *, at: int | None = None, step: int = SECOND, check: bool = True
    ) -> ApplyResult:
        if at is None:
            self.time += step
        else:
            self.time = max(self.time, at)
        self.index += 1
        entry = encode_entry(body, time=self.time if at is None else at, rid="")
        self.entries.append((self.index, entry))
        result = self.fsm.apply(self.index, entry)
        self.fsm.commit()
        if check and not result.ok:
            raise ApplyFailed(f"{type(body).__name__} rejected: {result.code} {result.error}")
        assert result.code != "internal", result.error
        return result

    def read(self) -> Any:
        return self.fsm.read()

    def digest(self) -> str:
        return self.fsm.digest()[0]

    def replay_digest(self) -> str:
        """Apply this harness's whole log to a fresh FSM in one group; its digest."""
        other = tempfile.mkdtemp(prefix="caravan-gc-replay-")
        fsm = FSM(other, map_size=SMALL_MAP, on_fatal=_fatal)
        try:
            fsm.apply_batch(self.entries)
            return fsm.digest()[0]
        finally:
            fsm.close()
            shutil.rmtree(other, ignore_errors=True)

    def close(self) -> None:
        try:
            self.fsm.close()
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


# -- builders -------------------------------------------------------------------
def job(
    job_id: str,
    type: str = "batch",
    *,
    policy: ReschedulePolicy | None = None,
    groups: Iterable[str] = ("g",),
    **kw: Any,
) -> Job:
    tgs = [TaskGroup(name=g, tasks=[Task(name="t")], reschedule_policy=policy) for g in groups]
    return Job(id=job_id, name=job_id, type=type, task_groups=tgs, **kw)


def evaluation(
    eval_id: str, job_id: str, type: str = "batch", status: str = "pending", **kw: Any
) -> Evaluation:
    return Evaluation(id=eval_id, job_id=job_id, type=type, status=status, **kw)


def alloc(
    alloc_id: str, eval_id: str, job_id: str, node_id: str = "n1", group: str = "g", **kw: Any
) -> Allocation:
    return Allocation(
        id=alloc_id, eval_id=eval_id, job_id=job_id, node_id=node_id, task_group=group, **kw
    )


def token(accessor: str, expiration: int = 0, **kw: Any) -> ACLToken:
    import hashlib

    return ACLToken(
        accessor_id=accessor,
        secret_hash=hashlib.sha256(accessor.encode()).hexdigest(),
        expiration_time=expiration,
        policies=["read"],
        **kw,
    )


def finished_batch_job(
    h: GCHarness,
    job_id: str,
    *,
    allocs: int = 2,
    node: str = "n1",
    client: str = "complete",
    type: str = "batch",
) -> tuple[str, list[str]]:
    """Register a job, place allocs, complete its eval and allocs: a dead job. (eval id, alloc ids)"""
    eval_id = f"{job_id}-e0"
    h.apply(m.JobRegister(job=job(job_id, type), eval=evaluation(eval_id, job_id, type)))
    ids = [f"{job_id}-a{i}" for i in range(allocs)]
    if ids:
        h.apply(
            m.PlanApply(
                eval_id=eval_id,
                job_id=job_id,
                allocs_to_place=[alloc(a, eval_id, job_id, node) for a in ids],
            )
        )
    h.apply(m.EvalUpsert(evals=[evaluation(eval_id, job_id, type, "complete")]))
    if ids:
        h.apply(
            m.AllocClientUpdate(
                allocs=[m.AllocClientState(id=a, client_status=client) for a in ids]
            )
        )
    return eval_id, ids


# -- reaping --------------------------------------------------------------------
def ids_of(r: StateReader) -> dict[str, set[str]]:
    return {
        "jobs": {j.id for j in r.jobs()},
        "evals": {e.id for e in r.evals()},
        "allocs": {a.id for a in r.allocs()},
        "deployments": {d.id for d in r.deployments()},
        "nodes": {n.id for n in r.nodes()},
        "acl_tokens": {t.accessor_id for t in r.tokens()},
    }


def apply_plan(
    h: GCHarness, plan: Plan, limits: Limits | None = None, *, at: int | None = None
) -> list[ApplyResult]:
    """Put ``plan``'s reap entries on the harness's log (at ``at``, default the plan's now)."""
    results = []
    for body in reap_bodies(plan, limits or Limits()):
        results.append(h.apply(body, at=plan.now if at is None else at))
    return results


def collect(
    h: GCHarness,
    kinds: Iterable[str],
    now: int,
    th: Thresholds,
    limits: Limits | None = None,
    token_limit: int = 4096,
    window: int | None = None,
) -> tuple[list[Plan], list[ApplyResult]]:
    """What the leader does: each kind planned on the state after the previous kind's reaps,
    ``window`` marks at a time (None: one plan per kind), reaping between windows."""
    plans, results = [], []
    for kind in kinds:
        span = Window(None, window)
        left = token_limit
        while True:
            with h.read() as r:
                plan = plan_kind(r, kind, now, th, token_limit=left, window=span)
            plans.append(plan)
            results.extend(apply_plan(h, plan, limits, at=now))
            left -= len(plan.reaps) if kind == "token" else 0
            if plan.resume is None or left <= 0:
                break
            span = Window(plan.resume, window)
    return plans, results


def check_no_orphans(r: StateReader) -> None:
    """Every alloc's eval and job, every eval's, deployment's, version's and summary's job exist."""
    jobs = {j.id for j in r.jobs()}
    evals = {e.id: e for e in r.evals()}
    for a in r.allocs():
        assert a.eval_id in evals, f"alloc {a.id} names missing eval {a.eval_id}"
        assert a.job_id in jobs, f"alloc {a.id} names missing job {a.job_id}"
    for e in evals.values():
        assert e.job_id in jobs, f"eval {e.id} names missing job {e.job_id}"
    for d in r.deployments():
        assert d.job_id in jobs, f"deployment {d.id} names missing job {d.job_id}"
    for k, _ in r.iter_raw("job_versions"):
        job_id = k.split(b"\x00", 1)[0].decode()
        assert job_id in jobs, f"job version of missing job {job_id}"
    for k, _ in r.iter_raw("job_summary"):
        assert k.decode() in jobs, f"summary of missing job {k.decode()}"
