"""Workload writes: a queued job's place in line, its admission, and the queue ledger, kept in step.

``StateWriter`` takes these methods (it inherits ``WorkloadWrites``), so
every apply path that changes a workload (a job registered, stopped, dead
or purged; an admission cycle's decisions) goes through the one place that
keeps the line index, the admitted index and the ledger row in step with
the record. Nothing here reads a clock: times come from the entry.
"""

from __future__ import annotations

from typing import Any

from fsm import codec
from fsm.keys import SEP, u64
from fsm.queues import (
    EVICTIONS_KEPT,
    REASON_CHANGED,
    WL_ADMITTED,
    WL_FINISHED,
    WL_PENDING,
    Eviction,
    QueueUsage,
    Workload,
)
from fsm.structs import Job, count_sum
from fsm.topics import TOPIC_WORKLOAD

_PRIORITY_BASE = 1 << 62  # inverted priority in line keys: higher priority sorts first


def line_key(wl: Workload) -> bytes:
    """The workload's key in its queue's line: priority (highest first), then submission."""
    return (
        wl.queue.encode()
        + SEP
        + u64(_PRIORITY_BASE - wl.priority)
        + SEP
        + u64(wl.create_index)
        + SEP
        + wl.job_id.encode()
    )


def job_usage(job: Job) -> dict[str, int]:
    """The whole job's ask (every group's count times its tasks' resources): what admission weighs."""
    out: dict[str, int] = {}
    for group in job.task_groups:
        for task in group.tasks:
            res = task.resources
            ask = {"cpu": res.cpu, "memory": res.memory_mb}
            ask.update(getattr(res, "devices", None) or {})
            out = count_sum(out, {k: v * group.count for k, v in ask.items() if v})
    return out


class WorkloadWrites:
    """The workload half of ``StateWriter`` (see the module docstring)."""

    txn: Any
    dbs: dict[str, Any]
    index: int
    now: int
    touched: set[str]
    # Also used, from StateReader and StateWriter: ``workload(job_id)`` and ``record(...)``.

    def put_workload(self, wl: Workload, old: Workload | None) -> None:
        """Store ``wl`` (replacing ``old``), moving its index rows and the ledger with it."""
        if old is not None:
            self._unindex(old)
        wl.modify_index = self.index
        wl.modify_time = self.now
        self.txn.put(wl.job_id.encode(), codec.encode(wl), db=self.dbs["workloads"])
        self.touched.add("workloads")
        if wl.state == WL_PENDING:
            self.txn.put(line_key(wl), b"", db=self.dbs["workloads_pending"])
        elif wl.state == WL_ADMITTED:
            self.txn.put(
                wl.queue.encode() + SEP + wl.job_id.encode(), b"", db=self.dbs["workloads_admitted"]
            )
            self._charge(wl.queue, wl.usage, 1)
        self.record(TOPIC_WORKLOAD, "WorkloadUpdated", wl.job_id, codec.to_wire(wl))

    def drop_workload(self, job_id: str) -> None:
        """Forget a purged or collected job's workload, releasing what it held."""
        old = self.workload(job_id)
        if old is None:
            return
        self._unindex(old)
        self.txn.delete(job_id.encode(), db=self.dbs["workloads"])
        self.touched.add("workloads")
        self.record(TOPIC_WORKLOAD, "WorkloadDeleted", job_id, None)

    def _unindex(self, old: Workload) -> None:
        if old.state == WL_PENDING:
            self.txn.delete(line_key(old), db=self.dbs["workloads_pending"])
        elif old.state == WL_ADMITTED:
            self.txn.delete(
                old.queue.encode() + SEP + old.job_id.encode(), db=self.dbs["workloads_admitted"]
            )
            self._charge(old.queue, old.usage, -1)

    def _charge(self, queue: str, usage: dict[str, int], sign: int) -> None:
        k = queue.encode()
        raw = self.txn.get(k, db=self.dbs["queue_usage"])
        row = QueueUsage(queue=queue, create_index=self.index) if raw is None else codec.load(QueueUsage, raw)
        row.modify_index = self.index
        row.used = count_sum(row.used, usage, sign)
        if row.used:
            self.txn.put(k, codec.encode(row), db=self.dbs["queue_usage"])
        else:
            self.txn.delete(k, db=self.dbs["queue_usage"])
        self.touched.add("queue_usage")

    # -- what apply calls -------------------------------------------------------
    def submit_workload(self, job: Job, priority: int) -> None:
        """A queued job was registered: a new submission joins the line; a changed one is weighed again.

        A registration that changes neither the queue nor the ask keeps the
        workload as it stands (an admitted job stays admitted).
        """
        old = self.workload(job.id)
        usage = job_usage(job)
        if old is not None and old.state != WL_FINISHED:
            if old.queue == job.queue and old.usage == usage and old.priority == priority:
                return
            wl = codec.load(Workload, codec.encode(old))
            wl.queue, wl.usage, wl.priority, wl.priority_class = (
                job.queue,
                usage,
                priority,
                job.priority_class,
            )
            if wl.state == WL_ADMITTED:
                wl.state = WL_PENDING
                self._note_eviction(
                    wl,
                    Eviction(
                        REASON_CHANGED, "the job's queue or resources changed; it is weighed again"
                    ),
                )
            self.put_workload(wl, old)
            return
        wl = Workload(
            job_id=job.id,
            namespace=job.namespace,
            queue=job.queue,
            priority_class=job.priority_class,
            priority=priority,
            usage=usage,
            create_index=self.index,
            create_time=self.now,
            evictions=list(old.evictions) if old is not None else [],
        )
        self.put_workload(wl, old)

    def finish_workload(self, job_id: str) -> None:
        """The job stopped or ended: it leaves the line, or releases its quota."""
        old = self.workload(job_id)
        if old is None or old.state == WL_FINISHED:
            return
        wl = codec.load(Workload, codec.encode(old))
        wl.state = WL_FINISHED
        self.put_workload(wl, old)

    def waits_in_queue(self, job_id: str) -> bool:
        """Whether the job is a workload waiting for admission (its job status is then pending)."""
        raw = self.txn.get(job_id.encode(), db=self.dbs["workloads"])
        return raw is not None and codec.load(Workload, raw).state == WL_PENDING

    def _note_eviction(self, wl: Workload, eviction: Eviction) -> None:
        eviction.index, eviction.time = self.index, self.now
        wl.evictions = [*wl.evictions, eviction][-EVICTIONS_KEPT:]

    def admit_workload(self, wl: Workload) -> None:
        new = codec.load(Workload, codec.encode(wl))
        new.state, new.admitted_index, new.admitted_time = WL_ADMITTED, self.index, self.now
        self.put_workload(new, wl)

    def evict_workload(self, wl: Workload, eviction: Eviction) -> None:
        new = codec.load(Workload, codec.encode(wl))
        new.state = WL_PENDING
        self._note_eviction(new, eviction)
        self.put_workload(new, wl)
