"""Queues, priority classes, and admission cycles (Kueue's model): their entries applied.

The leader decides admissions and evictions; this re-checks each decision
against the ledger as it stands at this index, so a decision taken on a
state that has moved on (a new leader, a job stopped meanwhile) is skipped,
never over-admitted. Workload writes go through ``fsm.workloads``.
"""

from __future__ import annotations

from typing import Any

from fsm import codec
from fsm import messages as m
from fsm.apply.evals import upsert_evals
from fsm.apply.rejects import conflict, not_found
from fsm.queues import (
    QUEUEING_STRATEGIES,
    RECLAIM_POLICIES,
    STOP_HOLD,
    STOP_HOLD_AND_DRAIN,
    STOP_POLICIES,
    WITHIN_QUEUE_POLICIES,
    WL_ADMITTED,
    WL_PENDING,
    PriorityClass,
    Queue,
)
from fsm.quota import Ledger
from fsm.structs import Job
from fsm.topics import TOPIC_PRIORITY_CLASS, TOPIC_QUEUE
from fsm.validate import bad
from fsm.writer import StateWriter

MAX_NAME = 128


def _check_name(name: str, what: str) -> None:
    if not name or len(name) > MAX_NAME or not all(c.isalnum() or c in "-_./" for c in name):
        raise bad(f"{what} {name!r} must be 1-{MAX_NAME} letters, digits, '-', '_', '.' or '/'")


def check_queue(queue: Queue) -> None:
    """The shape the leader's reader guarantees, checked again so a bad entry cannot store a bad queue."""
    _check_name(queue.name, "queue name")
    if queue.cohort:
        _check_name(queue.cohort, "cohort name")
    for value, allowed, what in (
        (queue.reclaim_within_cohort, RECLAIM_POLICIES, "reclaim_within_cohort"),
        (queue.within_queue, WITHIN_QUEUE_POLICIES, "within_queue"),
        (queue.queueing_strategy, QUEUEING_STRATEGIES, "queueing_strategy"),
        (queue.stop_policy, STOP_POLICIES, "stop_policy"),
    ):
        if value not in allowed:
            raise bad(f"queue {queue.name}: {what} must be one of {', '.join(allowed)}")
    seen = set()
    for limit in queue.resources:
        _check_name(limit.name, f"queue {queue.name}: resource name")
        if limit.name in seen:
            raise bad(f"queue {queue.name}: resource {limit.name!r} is listed twice")
        seen.add(limit.name)
        for field_name in ("nominal", "borrowing_limit", "lending_limit"):
            value = getattr(limit, field_name)
            if value is not None and value < 0:
                raise bad(f"queue {queue.name}: resource {limit.name}: {field_name} must be >= 0")
        if (
            limit.borrowing_limit is not None or limit.lending_limit is not None
        ) and not queue.cohort:
            raise bad(
                f"queue {queue.name}: resource {limit.name}: borrowing and lending limits need a cohort"
            )


def _put_named(
    w: StateWriter, table: str, topic: str, obj: Queue | PriorityClass, old: Any
) -> None:
    """Store a named object (a queue, a priority class), stamped, and journal it."""
    obj.create_index = old.create_index if old is not None else w.index
    obj.modify_index = w.index
    w.txn.put(obj.name.encode(), codec.encode(obj), db=w.dbs[table])
    w.touched.add(table)
    w.record(topic, f"{topic}Upserted", obj.name, codec.to_wire(obj))


def _delete_named(w: StateWriter, tables: tuple[str, ...], topic: str, name: str) -> None:
    for table in tables:
        w.txn.delete(name.encode(), db=w.dbs[table])
    w.touched.update(tables)
    w.record(topic, f"{topic}Deleted", name, None)


def queue_upsert(w: StateWriter, msg: m.QueueUpsert) -> dict[str, Any]:
    """Create or replace queues; admitted work stays admitted under a smaller quota (as Kueue)."""
    for queue in msg.queues:
        check_queue(queue)
        _put_named(w, "queues", TOPIC_QUEUE, queue, w.queue(queue.name))
    return {"names": [q.name for q in msg.queues]}


def queue_delete(w: StateWriter, msg: m.QueueDelete) -> dict[str, Any]:
    """Delete queues that hold no workload (a queue with work would strand it)."""
    for name in msg.names:
        if w.queue(name) is None:
            raise not_found(f"queue {name!r} not found")
        held = w.admitted_count(name) + w.pending_count(name)
        if held:
            raise conflict(
                f"queue {name} still holds {held} workload(s); stop their jobs (or `caravan queue drain {name}` "
                "and stop them) before deleting it"
            )
        _delete_named(w, ("queues", "queue_usage"), TOPIC_QUEUE, name)
    return {"deleted": list(msg.names)}


def priority_class_upsert(w: StateWriter, msg: m.PriorityClassUpsert) -> dict[str, Any]:
    """Create or replace priority classes; workloads already submitted keep the value they were given."""
    for pc in msg.classes:
        _check_name(pc.name, "priority class name")
        _put_named(w, "priority_classes", TOPIC_PRIORITY_CLASS, pc, w.priority_class(pc.name))
    return {"names": [pc.name for pc in msg.classes]}


def priority_class_delete(w: StateWriter, msg: m.PriorityClassDelete) -> dict[str, Any]:
    """Delete priority classes; workloads keep the value they were given when submitted."""
    for name in msg.names:
        if w.priority_class(name) is None:
            raise not_found(f"priority class {name!r} not found")
        _delete_named(w, ("priority_classes",), TOPIC_PRIORITY_CLASS, name)
    return {"deleted": list(msg.names)}


def submit_job(w: StateWriter, job: Job) -> None:
    """A registration of a job that names a queue: the queue and class must exist; the workload follows."""
    if not job.queue:
        w.finish_workload(job.id)  # moved out of queueing: it runs as any job does
        return
    if w.queue(job.queue) is None:
        raise bad(
            f"job {job.id}: queue {job.queue!r} does not exist; create it with `caravan queue apply`"
        )
    priority = 0
    if job.priority_class:
        pc: PriorityClass | None = w.priority_class(job.priority_class)
        if pc is None:
            raise bad(
                f"job {job.id}: priority class {job.priority_class!r} does not exist; "
                "create it with `caravan priority-class apply`"
            )
        priority = pc.value
    if job.stop:
        w.finish_workload(job.id)
    else:
        w.submit_workload(job, priority)


def _ledger(w: StateWriter) -> Ledger:
    queues = w.queues()
    return Ledger.build(queues, ((q.name, w.queue_usage(q.name)) for q in queues))


def queue_admission(w: StateWriter, msg: m.QueueAdmission) -> dict[str, Any]:
    """Apply one admission cycle: evictions, then admissions that still fit; evals of what held."""
    evicted, admitted, skipped = [], [], []
    for ev in msg.evictions:
        wl = w.workload(ev.job_id)
        if wl is None or wl.state != WL_ADMITTED:
            skipped.append(ev.job_id)
            continue
        w.evict_workload(wl, ev.eviction)
        evicted.append(ev.job_id)
    ledger = _ledger(w) if msg.admits else None
    for adm in msg.admits:
        wl = w.workload(adm.job_id)
        queue = w.queue(wl.queue) if wl is not None else None
        if (
            wl is None
            or queue is None
            or wl.state != WL_PENDING
            or wl.create_index != adm.create_index
            or queue.stop_policy in (STOP_HOLD, STOP_HOLD_AND_DRAIN)
            or not ledger.fits(wl.queue, wl.usage)
        ):
            skipped.append(adm.job_id)
            continue
        ledger.add(wl.queue, wl.usage)
        w.admit_workload(wl)
        admitted.append(adm.job_id)
    done = set(evicted) | set(admitted)
    upsert_evals(w, [ev for ev in msg.evals if ev.job_id in done])
    return {"admitted": admitted, "evicted": evicted, "skipped": skipped}
