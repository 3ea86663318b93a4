"""Queues with cohorts, after Kueue: the replicated records.

A ``Queue`` is Kueue's ClusterQueue: a nominal quota per resource, with
optional borrowing and lending limits, in a cohort of queues that lend each
other what they do not use. A ``PriorityClass`` is Kueue's
WorkloadPriorityClass: it orders admission and preemption only (placement
on nodes does not see it). A ``Workload`` is a job that names a queue: the
whole job's ask, admitted all-or-nothing, and where it stands.

These records change only through the log: the leader's admission service
decides, the FSM re-checks every decision against the ledger as it applies
it (``fsm.quota``), so a stale decision (a leader that lost its term in the
middle of a reclaim) can never over-admit.
"""

from __future__ import annotations

from fsm.record import CompactRecord, Record, field

# Kueue's words, as its API spells them.
NEVER, LOWER_PRIORITY, ANY = "Never", "LowerPriority", "Any"
LOWER_OR_NEWER_EQUAL = "LowerOrNewerEqualPriority"
RECLAIM_POLICIES = (NEVER, LOWER_PRIORITY, ANY)
WITHIN_QUEUE_POLICIES = (NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL)
STRICT_FIFO, BEST_EFFORT_FIFO = "StrictFIFO", "BestEffortFIFO"
QUEUEING_STRATEGIES = (STRICT_FIFO, BEST_EFFORT_FIFO)
STOP_NONE, STOP_HOLD, STOP_HOLD_AND_DRAIN = "None", "Hold", "HoldAndDrain"
STOP_POLICIES = (STOP_NONE, STOP_HOLD, STOP_HOLD_AND_DRAIN)

# Where a workload stands.
WL_PENDING, WL_ADMITTED, WL_FINISHED = "pending", "admitted", "finished"

# Why a workload was evicted (Kueue's condition reasons), and the preemption reasons' words.
REASON_RECLAIM = "InCohortReclamation"
REASON_PRIORITY = "InClusterQueue"
REASON_DRAIN = "ClusterQueueStopped"
REASON_CHANGED = "WorkloadChanged"

# Resource names a quota may limit besides devices ("vendor/type" names).
CPU, MEMORY = "cpu", "memory"

#: Evictions kept on a workload (the newest), for ``job status`` and ``queue pending``.
EVICTIONS_KEPT = 8


class QuotaLimit(CompactRecord):
    """One resource of a queue: its nominal quota and optional limits (None: Kueue's unset)."""

    name: str
    nominal: int = 0
    borrowing_limit: int | None = None  # at most this much above nominal (None: no limit)
    lending_limit: int | None = None  # at most this much of nominal lent out (None: all of it)


class Queue(Record):
    """Kueue's ClusterQueue. Resources a queue does not list are not limited by it."""

    name: str
    cohort: str = ""
    resources: list[QuotaLimit] = field(default_factory=list)
    reclaim_within_cohort: str = NEVER
    within_queue: str = NEVER
    queueing_strategy: str = BEST_EFFORT_FIFO
    stop_policy: str = STOP_NONE
    description: str = ""
    create_index: int = 0
    modify_index: int = 0

    def limit(self, resource: str) -> QuotaLimit | None:
        """The queue's quota of ``resource`` (None: not limited)."""
        for q in self.resources:
            if q.name == resource:
                return q
        return None


class PriorityClass(Record):
    """Kueue's WorkloadPriorityClass: a name and a value (higher goes first)."""

    name: str
    value: int = 0
    description: str = ""
    create_index: int = 0
    modify_index: int = 0


class Eviction(CompactRecord):
    """Who evicted a workload, and why, in Kueue's words."""

    reason: str  # REASON_*
    message: str
    preemptor: str = ""  # the preempting job's id ("" for a drain)
    index: int = 0
    time: int = 0


class Workload(Record):
    """A job in a queue: its whole ask, and where it stands.

    ``create_index`` is when this submission entered the queue; an evicted
    workload keeps it, so it returns to its place in line.
    """

    job_id: str
    namespace: str = "default"
    queue: str = ""
    priority_class: str = ""
    priority: int = 0
    usage: dict[str, int] = field(default_factory=dict)  # resource -> amount, the whole job's
    state: str = WL_PENDING
    admitted_index: int = 0
    admitted_time: int = 0  # when it was last admitted (the entry's time, ns)
    evictions: list[Eviction] = field(default_factory=list)
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    def last_eviction(self) -> Eviction | None:
        return self.evictions[-1] if self.evictions else None


class QueueUsage(Record):
    """The ledger row of a queue: what its admitted workloads use, kept as they come and go."""

    queue: str
    used: dict[str, int] = field(default_factory=dict)
    create_index: int = 0
    modify_index: int = 0
