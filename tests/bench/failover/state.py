"""The benchmark's state: about N objects built through the real FSM, on nodes the fleets will own.

``tests.bench.snapshot_bench.build`` sizes its nodes from the object count
(jobs / 4) and names them itself; here the node count is a flag (5,000 live
clients at 1M objects) and node ``i``'s id is ``node_id(i)``, which the fleet
processes heartbeat, so the restored nodes are live from the start instead of
all expiring. Otherwise the layout is snapshot_bench's: per job one job, one
version, one summary, one eval and ``ALLOCS_PER_JOB`` allocs, job ``j``'s
alloc ``a`` on node ``(j * ALLOCS_PER_JOB + a) % nodes``. Allocs are running
and evals complete, so a restored leader has no backlog of its own to work
off before the measurements start.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Any

from fsm import messages as m
from fsm.machine import FSM
from fsm.store import TABLES
from fsm.structs import SECOND, Allocation, Evaluation, Job, Node, Resources, Task, TaskGroup
from snapshot import save

T0 = 1_700_000_000 * SECOND
ALLOCS_PER_JOB = 100
COMMIT_EVERY = 20  # entries per group commit, as snapshot_bench
ALLOC_CPU = 250
ALLOC_MEMORY_MB = 256


def node_id(i: int) -> str:
    """The id of node ``i``: the same in the built state and in the fleet that heartbeats it."""
    return f"00000001-0000-4000-8000-{i:012x}"


def node_name(i: int) -> str:
    return f"fo-{i}"


@dataclass(frozen=True)
class Layout:
    """Where everything sits: enough to say, without asking a server, which jobs a lost node hurts."""

    objects: int
    nodes: int
    jobs: int
    allocs_per_job: int = ALLOCS_PER_JOB

    @classmethod
    def plan(cls, objects: int, nodes: int) -> Layout:
        jobs = max(1, objects // (4 + ALLOCS_PER_JOB))
        return cls(objects=objects, nodes=nodes, jobs=jobs)

    @property
    def allocs_per_node(self) -> int:
        return math.ceil(self.jobs * self.allocs_per_job / self.nodes)

    @property
    def node_cpu(self) -> int:
        """A node exactly as big as its share of allocs: lost allocs find no room (evals end blocked).

        Room for them would turn the storm into hundreds of thousands of
        placements, a scheduling benchmark rather than a node-loss one.
        """
        return max(1, self.allocs_per_node) * ALLOC_CPU

    @property
    def node_memory_mb(self) -> int:
        return max(1, self.allocs_per_node) * ALLOC_MEMORY_MB

    def node_of(self, job: int, alloc: int) -> int:
        return (job * self.allocs_per_job + alloc) % self.nodes

    def affected_jobs(self, lost: range) -> set[str]:
        """Ids of the jobs with an alloc on a node in ``lost``."""
        out = set()
        for j in range(self.jobs):
            if any(self.node_of(j, a) in lost for a in range(self.allocs_per_job)):
                out.add(job_id(j))
        return out

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "allocs_per_node": self.allocs_per_node}


def job_id(j: int) -> str:
    return f"job-{j:07d}"


def _uuid(kind: int, i: int) -> str:
    return f"{kind:08x}-0000-4000-8000-{i:012x}"


class _Writer:
    """Group-commits entries into the FSM as a server's tick would."""

    def __init__(self, fsm: FSM) -> None:
        self.fsm = fsm
        self.index = 0
        self.now = T0
        self.batch: list[tuple[int, bytes]] = []

    def submit(self, body: Any) -> None:
        self.index += 1
        self.now += 1_000_000
        self.batch.append((self.index, m.encode_entry(body, time=self.now, rid=f"failover-{self.index}")))
        if len(self.batch) >= COMMIT_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.batch:
            self.fsm.apply_batch(self.batch)
            self.batch.clear()


def _node(layout: Layout, i: int) -> Node:
    return Node(
        id=node_id(i), name=node_name(i), node_class="sim", status="ready",
        attributes={"driver.sim": "1", "kernel.name": "linux", "cpu.arch": "amd64", "unique.hostname": node_name(i)},
        resources=Resources(cpu=layout.node_cpu, memory_mb=layout.node_memory_mb, disk_mb=0),
    )


def _job_entries(layout: Layout, j: int) -> tuple[m.JobRegister, m.PlanApply]:
    jid, eval_id = job_id(j), _uuid(2, j)
    resources = Resources(cpu=ALLOC_CPU, memory_mb=ALLOC_MEMORY_MB)
    group = TaskGroup(name="web", count=layout.allocs_per_job,
                      tasks=[Task(name="server", driver="sim", config={}, resources=resources)])
    job = Job(id=jid, name=jid, task_groups=[group], meta={"team": f"t{j % 17}"})
    ev = Evaluation(id=eval_id, job_id=jid, status="complete")
    allocs = [
        Allocation(id=_uuid(3, j * layout.allocs_per_job + a), eval_id=eval_id, job_id=jid,
                   node_id=node_id(layout.node_of(j, a)), task_group="web", name=f"{jid}.web[{a}]",
                   resources=resources, client_status="running")
        for a in range(layout.allocs_per_job)
    ]
    return m.JobRegister(job=job, eval=ev), m.PlanApply(eval_id=eval_id, job_id=jid, allocs_to_place=allocs)


def build(fsm: FSM, layout: Layout) -> None:
    """Apply the layout's entries through the FSM (nodes first, then each job and its placement)."""
    w = _Writer(fsm)
    for i in range(layout.nodes):
        w.submit(m.NodeRegister(node=_node(layout, i)))
    for j in range(layout.jobs):
        for entry in _job_entries(layout, j):
            w.submit(entry)
    w.flush()
    fsm.commit()


def count_objects(fsm: FSM) -> int:
    with fsm.read() as r:
        return sum(r.count(t) for t in TABLES)


def build_snapshot(work: str, layout: Layout) -> tuple[str, int, float]:
    """Build the state in a scratch FSM under ``work`` and save it; (snapshot path, objects, seconds)."""
    t0 = time.monotonic()
    src = FSM(os.path.join(work, "src"))
    try:
        build(src, layout)
        objects = count_objects(src)
        path = os.path.join(work, "state.snap")
        save(src, path)
    finally:
        src.close()
        shutil.rmtree(os.path.join(work, "src"), ignore_errors=True)  # 1.2 GB at 1M objects
    return path, objects, time.monotonic() - t0
