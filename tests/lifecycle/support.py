"""Builders for scheduler tests: nodes, jobs, allocs and snapshots by hand."""

from __future__ import annotations

from typing import Any

from fsm import messages as m
from fsm.structs import (
    SECOND,
    Allocation,
    Evaluation,
    Job,
    Node,
    Resources,
    Task,
    TaskGroup,
)
from scheduler.generic import schedule
from scheduler.plan import Plan, approx_size, to_entries
from scheduler.reconcile import alloc_name
from scheduler.state import Snapshot, load_snapshot
from tests.fsm.support import Harness

NOW = 1_700_000_000 * SECOND


def node(node_id: str, *, cpu: int = 4000, mem: int = 8192, status: str = "ready", dc: str = "dc1", **attrs: str) -> Node:
    return Node(
        id=node_id,
        name=node_id,
        datacenter=dc,
        status=status,
        attributes={"driver.sim": "1", **attrs},
        resources=Resources(cpu=cpu, memory_mb=mem, disk_mb=0),
    )


def job(
    job_id: str = "j",
    *,
    type: str = "service",
    count: int = 3,
    cpu: int = 100,
    mem: int = 64,
    version: int = 0,
    config: dict[str, Any] | None = None,
    **kw: Any,
) -> Job:
    group = TaskGroup(
        name="g",
        count=count,
        tasks=[Task(name="t", config=config or {}, resources=Resources(cpu=cpu, memory_mb=mem))],
    )
    for key in ("update", "reschedule_policy", "constraints"):
        if key in kw:
            setattr(group, key, kw.pop(key))
    j = Job(id=job_id, type=type, task_groups=[group], version=version, job_modify_index=10 + version, **kw)
    return j


def alloc(
    j: Job,
    index: int,
    node_id: str,
    *,
    client: str = "running",
    desired: str = "run",
    version: int | None = None,
    alloc_id: str | None = None,
    **kw: Any,
) -> Allocation:
    group = j.task_groups[0]
    res = Resources(cpu=sum(t.resources.cpu for t in group.tasks), memory_mb=sum(t.resources.memory_mb for t in group.tasks))
    return Allocation(
        id=alloc_id or f"a{index}-{node_id}-{version if version is not None else j.version}",
        eval_id="e0",
        job_id=j.id,
        node_id=node_id,
        task_group=group.name,
        name=alloc_name(j.id, group.name, index),
        job_version=j.version if version is None else version,
        resources=res,
        desired_status=desired,
        client_status=client,
        create_index=index + 1,
        modify_time=NOW - 60 * SECOND,
        **kw,
    )


def snapshot(
    j: Job | None,
    nodes: list[Node],
    allocs: list[Allocation] | None = None,
    *,
    eval_id: str = "e1",
    status: str = "pending",
    job_id: str = "j",
    versions: dict[int, Job] | None = None,
    **kw: Any,
) -> Snapshot:
    allocs = allocs or []
    usage: dict[str, Resources] = {}
    for a in allocs:
        if not a.terminal():
            u = usage.setdefault(a.node_id, Resources(cpu=0, memory_mb=0, disk_mb=0))
            u.cpu += a.resources.cpu
            u.memory_mb += a.resources.memory_mb
    ev = Evaluation(id=eval_id, job_id=j.id if j else job_id, status=status, type=j.type if j else "service")
    return Snapshot(
        index=100,
        now=NOW,
        eval=ev,
        job=j,
        allocs=allocs,
        nodes={n.id: n for n in nodes},
        usage=usage,
        versions=versions or ({j.version: j} if j else {}),
        **kw,
    )


# -- over a real FSM (tests.fsm.support.Harness) ---------------------------------------------
def register(h: Harness, j: Job) -> Evaluation:
    """Register ``j`` with a pending eval, as job.register does."""
    ev = Evaluation(id=f"ev-{h.index + 1}", job_id=j.id, type=j.type, status="pending")
    h.ok(m.JobRegister(job=j, eval=ev))
    return ev


def run_eval(h: Harness, ev: Evaluation, *, max_bytes: int = 48 * 1024) -> Plan:
    """Schedule ``ev`` on the current state (system jobs go to their own scheduler) and apply the plan."""
    with h.reader() as r:
        current = r.eval(ev.id)
        plan = schedule(load_snapshot(r, current, h.time + SECOND))
    for body in to_entries(plan, max_bytes, approx_size):
        h.ok(body)
    return plan


def live(h: Harness, job_id: str) -> list[Allocation]:
    """The job's non-terminal allocs."""
    with h.reader() as r:
        return [a for a in r.allocs_by_job(job_id) if not a.terminal()]
