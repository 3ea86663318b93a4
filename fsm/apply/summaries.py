"""Job summaries: per task group, how many of a job's allocs are in each client status.

Every entry that places, stops, moves or deletes an alloc moves a counter
here, so the counters are updated on the stored map (no ``JobSummary``
round trip): alloc status changes are the hottest path of apply. The
``ReconcileSummaries`` entry recounts them from the allocs.
"""

from __future__ import annotations

from typing import Any

from fsm import codec
from fsm import messages as m
from fsm.structs import Allocation, Evaluation, Job, JobSummary, TaskGroupSummary
from fsm.writer import StateWriter

# The counter of each client status.
_SUMMARY_FIELD = {
    "pending": "starting",
    "running": "running",
    "complete": "complete",
    "failed": "failed",
    "lost": "lost",
}

_EMPTY_GROUP = codec.dump(TaskGroupSummary())


def ensure_summary(w: StateWriter, job: Job, new: bool = False) -> None:
    """Give every task group of ``job`` a summary row (a new job: a summary).

    Works on the stored map, as the alloc counters do, except for a new
    summary that must recount allocs left by a purge: ``put_summary_map``
    stores the same bytes ``store_summary`` would for the same summary.
    ``new``: the job did not exist, so it has no summary (``delete_job``
    removes it with the job) and none is read.
    """
    data = None if new else w.summary_map(job.id)
    if data is not None or not w.job_has_allocs(job.id):
        if data is None:  # field order of JobSummary, as ``encode`` packs it
            data = {
                "job_id": job.id,
                "namespace": job.namespace,
                "summary": {},
                "create_index": 0,
                "modify_index": 0,
            }
            changed = True
        else:
            changed = False
        groups = data["summary"]
        for group in job.task_groups:
            if group.name not in groups:
                groups[group.name] = dict(_EMPTY_GROUP)
                changed = True
        if changed:
            w.put_summary_map(job.id, data)
        return
    # A purge leaves the job's allocs until GC (as Nomad does); a job
    # registered again under that id starts from a recount of them, so the
    # summary always equals the allocs that name the job.
    summary = JobSummary(job_id=job.id, namespace=job.namespace)
    _count_allocs(w, job.id, summary)
    for group in job.task_groups:
        summary.summary.setdefault(group.name, TaskGroupSummary())
    store_summary(w, summary)


def _count_allocs(w: StateWriter, job_id: str, summary: JobSummary) -> None:
    """Count the job's allocs into ``summary``, each in its group's counter of its client status."""
    for alloc in w.allocs_by_job(job_id):
        group = summary.summary.setdefault(alloc.task_group, TaskGroupSummary())
        name = _SUMMARY_FIELD[alloc.client_status]
        setattr(group, name, getattr(group, name) + 1)


def store_summary(w: StateWriter, summary: JobSummary) -> None:
    """Store a summary stamped with the entry's index (created now, if it is new)."""
    if summary.create_index == 0:
        summary.create_index = w.index
    summary.modify_index = w.index
    w.put_summary(summary)


def _group_map(summary: dict[str, Any], name: str) -> dict[str, int]:
    groups = summary["summary"]
    group = groups.get(name)
    if group is None:
        group = groups[name] = dict(_EMPTY_GROUP)
    return group


def count_alloc(w: StateWriter, alloc: Allocation, delta: int, *, placed: bool = False) -> None:
    """Move an alloc in or out of its group's summary counter (by client status).

    ``placed``: the alloc fills one of the places its job's evals left
    queued, so the group's queued count drops.
    """
    summary = w.summary_map(alloc.job_id)
    if summary is None:
        return
    group = _group_map(summary, alloc.task_group)
    group[_SUMMARY_FIELD[alloc.client_status]] += delta
    if placed and group["queued"] > 0:
        group["queued"] -= 1
    w.put_summary_map(alloc.job_id, summary)


def move_count(w: StateWriter, old: Allocation, new: Allocation) -> None:
    """Move an alloc between summary counters (status or group changed), one read and write."""
    if old.job_id != new.job_id:
        count_alloc(w, old, -1)
        count_alloc(w, new, +1)
        return
    move_status(w, new.job_id, old.task_group, old.client_status, new.task_group, new.client_status)


def move_status(w: StateWriter, job_id: str, old_group: str, old: str, new_group: str, new: str) -> None:
    """Move one of a job's allocs from one (group, client status) counter to another.

    Takes the bare fields so that a client update, which works on the
    alloc's stored map, need not build an ``Allocation``.
    """
    summary = w.summary_map(job_id)
    if summary is None:
        return
    _move(summary, old_group, old, new_group, new)
    w.put_summary_map(job_id, summary)


def move_statuses(w: StateWriter, moves: list[tuple[str, str, str, str]]) -> None:
    """``move_status`` for many allocs, each job's summary read and written once.

    ``moves``: (job id, group, old status, new status), in order. A plan
    that stops a lost node's allocs moves dozens of one job's allocs to
    "lost"; the counts come out the same as moving them one by one.
    """
    by_job: dict[str, list[tuple[str, str, str]]] = {}
    for job_id, group, old, new in moves:
        by_job.setdefault(job_id, []).append((group, old, new))
    for job_id, job_moves in by_job.items():
        summary = w.summary_map(job_id)
        if summary is None:
            continue
        for group, old, new in job_moves:
            _move(summary, group, old, group, new)
        w.put_summary_map(job_id, summary)


def _move(summary: dict[str, Any], old_group: str, old: str, new_group: str, new: str) -> None:
    _group_map(summary, old_group)[_SUMMARY_FIELD[old]] -= 1
    _group_map(summary, new_group)[_SUMMARY_FIELD[new]] += 1


def set_queued(w: StateWriter, ev: Evaluation) -> None:
    """Take the queued counts an eval reports (the places its scheduler could not fill)."""
    if not ev.queued_allocations:
        return
    summary = w.job_summary(ev.job_id)
    if summary is None:
        return
    for group, queued in sorted(ev.queued_allocations.items()):
        summary.summary.setdefault(group, TaskGroupSummary()).queued = max(0, queued)
    store_summary(w, summary)


def reconcile_summaries(w: StateWriter, msg: m.ReconcileSummaries) -> dict[str, Any]:
    """Recount each job's summary counters from its allocs; queued counts are kept."""
    changed = []
    for job in w.jobs():
        old = w.job_summary(job.id)
        fresh = JobSummary(job_id=job.id, namespace=job.namespace)
        for group in job.task_groups:
            fresh.summary[group.name] = TaskGroupSummary()
        _count_allocs(w, job.id, fresh)
        if old is not None:
            for name, group in old.summary.items():
                fresh.summary.setdefault(name, TaskGroupSummary()).queued = group.queued
            fresh.create_index = old.create_index
            if codec.to_wire(old.summary) == codec.to_wire(fresh.summary):
                continue
        store_summary(w, fresh)
        changed.append(job.id)
    return {"reconciled": changed}
