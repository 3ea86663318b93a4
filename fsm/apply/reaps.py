"""GC reaps: the leader's collector decides what to delete, apply deletes what is still collectable.

Each reap names an object and the ``modify_index`` the collector saw. An
object changed since, or no longer collectable under the rules of
``fsm.gc``, is skipped (and listed as such), never deleted: the leader read
a state that apply may already have moved past. Expired ACL tokens are
reaped with ``ACLTokenDelete`` (``fsm.apply.acl``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsm import gc as gc_rules
from fsm import messages as m
from fsm.apply.summaries import count_alloc
from fsm.structs import (
    EVAL_TERMINAL,
    JOB_DEAD,
    NODE_DOWN,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    Node,
)
from fsm.topics import TOPIC_JOB
from fsm.writer import StateWriter


def _reap_each(
    reaps: list[m.Reap],
    load: Callable[[str], Any],
    collectable: Callable[[Any], bool],
    delete: Callable[[Any], None],
) -> dict[str, Any]:
    """Delete each reaped object that is unchanged since the collector saw it and still ``collectable``."""
    reaped, skipped = [], []
    for reap in reaps:
        obj = load(reap.id)
        if obj is None or obj.modify_index != reap.modify_index or not collectable(obj):
            skipped.append(reap.id)
            continue
        delete(obj)
        reaped.append(reap.id)
    return {"reaped": reaped, "skipped": skipped}


def job_batch_deregister(w: StateWriter, msg: m.JobBatchDeregister) -> dict[str, Any]:
    """GC purge: each unchanged, collectable job goes with everything it owns."""
    return _reap_each(msg.jobs, w.job, lambda job: _job_collectable(w, job), lambda job: _purge_job(w, job))


def _purge_job(w: StateWriter, job: Job) -> None:
    for alloc in w.allocs_by_job(job.id):
        w.delete_alloc(alloc)
    for ev in w.evals_by_job(job.id):
        w.delete_eval(ev)
    for dep in w.deployments_by_job(job.id):
        w.delete_deployment(dep)
    w.delete_job(job.id)
    w.record(TOPIC_JOB, "JobDeleted", job.id, None)


def _job_collectable(w: StateWriter, job: Job) -> bool:
    return (job.status == JOB_DEAD or job.stop) and not (
        w.job_has_live_allocs(job.id) or w.job_has_live_evals(job.id)
    )


def eval_reap(w: StateWriter, msg: m.EvalReap) -> dict[str, Any]:
    """Delete unchanged terminal allocs, then unchanged terminal evals with their terminal allocs.

    An eval that still has a non-terminal alloc stays, so no alloc is orphaned.
    Each alloc is also re-checked against its job as it is now
    (``fsm.gc.alloc_reapable``): a job re-registered after the leader planned
    the reap changes no alloc's modify index, yet may make a failed alloc
    reschedulable again or protect a live batch job's current allocs.
    """
    reaped_allocs, reaped_evals, skipped = [], [], []
    for reap in msg.allocs:
        alloc = w.alloc(reap.id)
        if (
            alloc is None
            or alloc.modify_index != reap.modify_index
            or not _alloc_reapable(w, alloc, None)
        ):
            skipped.append(reap.id)
            continue
        _delete_alloc(w, alloc)
        reaped_allocs.append(alloc.id)
    for reap in msg.evals:
        ev = w.eval(reap.id)
        if ev is None or ev.modify_index != reap.modify_index or ev.status not in EVAL_TERMINAL:
            skipped.append(reap.id)
            continue
        allocs = w.allocs_by_eval(ev.id)
        if any(not _alloc_reapable(w, a, ev) for a in allocs):
            skipped.append(reap.id)
            continue
        for alloc in allocs:
            _delete_alloc(w, alloc)
            reaped_allocs.append(alloc.id)
        w.delete_eval(ev)
        reaped_evals.append(ev.id)
    return {"evals": reaped_evals, "allocs": reaped_allocs, "skipped": skipped}


def _alloc_reapable(w: StateWriter, alloc: Allocation, ev: Evaluation | None) -> bool:
    if ev is None:
        ev = w.eval(alloc.eval_id)
    eval_type = ev.type if ev is not None else ""
    return gc_rules.alloc_reapable(alloc, w.job(alloc.job_id), eval_type, w.now)


def _delete_alloc(w: StateWriter, alloc: Allocation) -> None:
    """Delete an alloc whose job may live on: its summary stops counting it."""
    count_alloc(w, alloc, -1)
    w.delete_alloc(alloc)


def deployment_reap(w: StateWriter, msg: m.DeploymentReap) -> dict[str, Any]:
    """Delete unchanged finished deployments none of whose allocs still runs."""
    return _reap_each(msg.deployments, w.deployment, lambda dep: _deployment_collectable(w, dep), w.delete_deployment)


def _deployment_collectable(w: StateWriter, dep: Deployment) -> bool:
    return not dep.active() and all(a.terminal() for a in w.allocs_by_deployment(dep.id))


def node_reap(w: StateWriter, msg: m.NodeReap) -> dict[str, Any]:
    """Delete unchanged down nodes that hold no live alloc."""
    return _reap_each(msg.nodes, w.node, lambda node: _node_collectable(w, node), w.delete_node)


def _node_collectable(w: StateWriter, node: Node) -> bool:
    return node.status == NODE_DOWN and not w.allocs_by_node(node.id, terminal=False)
