"""Kueue's baseline generator config, and the queues, priority classes and jobs it makes.

From kubernetes-sigs/kueue ``test/performance/scheduler/configs/baseline/generator.yaml``:
5 cohorts of 6 ClusterQueues, each ``nominalQuota: 20``, ``borrowingLimit: 100``,
``reclaimWithinCohort: Any``, ``withinClusterQueue: LowerPriority`` (queueing
strategy: Kueue's default, BestEffortFIFO). Each queue gets three workload
sets, generated concurrently (``runner/generator/generator.go``: one
goroutine per set, each looping "wait ``creationIntervalMs``, then create
one workload", the create awaited before the next wait):

=======  =====  ========  =======  ========  ===========
class    count  interval  runtime  priority  request
=======  =====  ========  =======  ========  ===========
small      350    100 ms   200 ms        50   1 cpu
medium     100    500 ms   500 ms       100   5 cpu
large       50   1200 ms  1000 ms       200  20 cpu
=======  =====  ========  =======  ========  ===========

One unit of Kueue's cpu is ``UNIT_MHZ`` of Caravan's, the only resource
the queues limit. ``scale`` multiplies the counts (0.1: 1,500 workloads),
never the intervals, runtimes or quotas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

UNIT_MHZ = 1000  # one Kueue cpu
NOMINAL = 20
BORROWING_LIMIT = 100
COHORTS = 5
QUEUES_PER_COHORT = 6
PRIORITY_CLASS_PREFIX = "kueue-bench-"


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    count: int
    interval_s: float
    runtime_s: float
    priority: int
    units: int

    @property
    def run_for(self) -> str:
        return f"{round(self.runtime_s * 1000)}ms"


CLASSES = (
    WorkloadClass("small", 350, 0.1, 0.2, 50, 1),
    WorkloadClass("medium", 100, 0.5, 0.5, 100, 5),
    WorkloadClass("large", 50, 1.2, 1.0, 200, 20),
)


@dataclass(frozen=True)
class Plan:
    """The benchmark's shape at ``scale``."""

    scale: float = 1.0
    cohorts: int = COHORTS
    queues_per_cohort: int = QUEUES_PER_COHORT

    def classes(self) -> list[WorkloadClass]:
        return [
            WorkloadClass(c.name, max(1, round(c.count * self.scale)), c.interval_s, c.runtime_s,
                          c.priority, c.units)
            for c in CLASSES
        ]  # fmt: skip

    def queues(self) -> list[tuple[str, str]]:
        """(queue, cohort) pairs, named as Kueue's generator names them (``cq-0-<i>-cohort-<c>``)."""
        return [
            (f"cq-0-{i}-cohort-{c}", f"cohort-{c}")
            for c in range(self.cohorts)
            for i in range(self.queues_per_cohort)
        ]

    @property
    def workloads(self) -> int:
        return len(self.queues()) * sum(c.count for c in self.classes())

    @property
    def unit_seconds(self) -> float:
        """The work to do: every workload's request times its runtime."""
        return len(self.queues()) * sum(c.count * c.units * c.runtime_s for c in self.classes())

    @property
    def nominal_units(self) -> int:
        return len(self.queues()) * NOMINAL

    @property
    def ideal_wall_s(self) -> float:
        """The work over the total nominal quota (Kueue's ~66 s at scale 1)."""
        return self.unit_seconds / self.nominal_units

    @property
    def generation_s(self) -> float:
        """How long the slowest workload set takes to generate, at best."""
        return max(c.count * c.interval_s for c in self.classes())


def queue_def(name: str, cohort: str) -> dict[str, Any]:
    return {
        "name": name,
        "cohort": cohort,
        "resources": [{"name": "cpu", "nominal": NOMINAL * UNIT_MHZ,
                       "borrowing_limit": BORROWING_LIMIT * UNIT_MHZ}],
        "reclaim_within_cohort": "Any",
        "within_queue": "LowerPriority",
        "queueing_strategy": "BestEffortFIFO",
    }  # fmt: skip


def priority_class(cls: WorkloadClass) -> dict[str, Any]:
    return {"name": PRIORITY_CLASS_PREFIX + cls.name, "value": cls.priority}


def job_id(queue: str, cls: WorkloadClass, i: int) -> str:
    return f"{queue}-{cls.name}-{i}"


def class_of(job: str) -> str:
    """The class of a job id made by ``job_id``."""
    return job.rsplit("-", 2)[-2]


def job_spec(queue: str, cls: WorkloadClass, i: int, *, queued: bool) -> dict[str, Any]:
    """One workload as a batch job: one group of count 1, one sim task running ``runtime``."""
    task = {"Name": "t", "Driver": "sim", "Config": {"run_for": cls.run_for},
            "Resources": {"CPU": cls.units * UNIT_MHZ, "MemoryMB": 16}}  # fmt: skip
    spec: dict[str, Any] = {
        "ID": job_id(queue, cls, i),
        "Type": "batch",
        "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}],
    }
    if queued:
        spec["Queue"] = queue
        spec["PriorityClass"] = PRIORITY_CLASS_PREFIX + cls.name
    return spec


Register = Callable[[dict[str, Any]], Awaitable[Any]]


async def generate(
    plan: Plan, register: Register, *, queued: bool, submitted: dict[str, float]
) -> None:
    """Create every workload as Kueue's generator does: per queue and class, wait, create, repeat.

    ``submitted``: job id -> the wall time its registration was sent.
    """

    async def one_set(queue: str, cls: WorkloadClass) -> None:
        for i in range(cls.count):
            await asyncio.sleep(cls.interval_s)
            spec = job_spec(queue, cls, i, queued=queued)
            submitted[spec["ID"]] = time.time()
            await register(spec)

    await asyncio.gather(*(one_set(q, c) for q, _ in plan.queues() for c in plan.classes()))
