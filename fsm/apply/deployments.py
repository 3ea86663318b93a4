"""Deployments (rollouts): their status, promotion of canaries, and the job versions they make stable.

A plan's new deployment and the allocs that join it are stored with the
plan (``fsm.apply.plans``); client health reports count into it with the
client update (``fsm.apply.allocs``).
"""

from __future__ import annotations

import copy
from typing import Any

from fsm import messages as m
from fsm.apply.evals import upsert_evals
from fsm.apply.jobs import job_register
from fsm.apply.rejects import conflict, not_found
from fsm.store import StateReader
from fsm.structs import (
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_PAUSED,
    DEPLOYMENT_RUNNING,
    DEPLOYMENT_SUCCESSFUL,
    Deployment,
)
from fsm.topics import TOPIC_JOB
from fsm.validate import bad, check_deployment, check_deployment_status
from fsm.writer import StateWriter


def deployment_upsert(w: StateWriter, msg: m.DeploymentUpsert) -> dict[str, Any]:
    """Store a deployment as the leader sent it."""
    check_deployment(msg.deployment)
    w.put_deployment(msg.deployment, w.deployment(msg.deployment.id), "DeploymentStatusUpdate")
    return {"deployment_id": msg.deployment.id}


def deployment_status_update(w: StateWriter, msg: m.DeploymentStatusUpdate) -> dict[str, Any]:
    """Pause, resume, fail or finish a rollout, with the rollback or eval that follows.

    ``expect_status`` makes it a compare-and-set on the status the caller
    decided on; ``job`` is the version to roll back to.
    """
    check_deployment_status(msg.deployment_id, msg.status)
    dep = w.deployment(msg.deployment_id)
    if dep is None:
        raise not_found(f"deployment {msg.deployment_id} not found")
    if not dep.active():
        # A finished rollout stays finished: a user's fail racing the watcher's
        # success must not turn a stable version's rollout into a failure.
        raise conflict(f"deployment {dep.id} is already {dep.status}: a finished deployment's status cannot change")
    if msg.expect_status and dep.status != msg.expect_status:
        raise conflict(f"deployment {dep.id} is {dep.status} now, not {msg.expect_status}: decide again")
    old = copy.deepcopy(dep)
    if dep.status == DEPLOYMENT_PAUSED and msg.status == DEPLOYMENT_RUNNING:
        _restart_deadlines(w, dep)
    dep.status = msg.status
    dep.status_description = msg.status_description
    w.put_deployment(dep, old, "DeploymentStatusUpdate")
    result: dict[str, Any] = {"deployment_id": dep.id}
    if msg.status == DEPLOYMENT_SUCCESSFUL:
        _mark_stable(w, dep.job_id, dep.job_version)
    if msg.job is not None:
        if msg.job.id != dep.job_id:
            raise bad(f"rollback job {msg.job.id} is not deployment {dep.id}'s job {dep.job_id}")
        if w.job(dep.job_id) is None:
            raise not_found(f"job {dep.job_id} of deployment {dep.id} no longer exists: nothing to roll back")
        # Only over the version that failed: a version registered since wins.
        rollback = job_register(w, m.JobRegister(job=msg.job, eval=msg.eval, enforce_index=dep.job_modify_index))
        result["rollback_version"] = rollback["version"]
        result["eval_ids"] = [rollback["eval_id"]] if "eval_id" in rollback else []
    elif msg.eval is not None:
        result["eval_ids"] = upsert_evals(w, [msg.eval])
    return result


def _restart_deadlines(w: StateWriter, dep: Deployment) -> None:
    """A resumed rollout gets its whole progress deadline again: time spent paused is not a lack of progress."""
    for state in dep.task_groups.values():
        if state.progress_deadline:
            state.require_progress_by = w.now + state.progress_deadline


def _mark_stable(w: StateWriter, job_id: str, version: int) -> None:
    """A successful rollout makes its job version stable: what auto-revert goes back to (as Nomad)."""
    kept = w.job_version(job_id, version)
    if kept is not None and not kept.stable:
        kept.stable = True
        kept.modify_index, kept.modify_time = w.index, w.now
        w.put_job_version(kept)
    job = w.job(job_id)
    if job is not None and job.version == version and not job.stable:
        job.stable = True
        job.modify_index, job.modify_time = w.index, w.now
        w.record_packed(TOPIC_JOB, "DeploymentStatusUpdate", job.id, w.put_job(job))


def healthy_canaries(view: StateReader, dep: Deployment, group: str) -> int:
    """How many of the group's canaries in ``dep`` are running and were reported healthy.

    A canary that died after its health check no longer vouches for the version.
    """
    ids = set(dep.task_groups[group].placed_canaries)
    return sum(1 for a in view.allocs_by_deployment(dep.id)
               if a.id in ids and not a.terminal() and a.deployment_status is not None and a.deployment_status.healthy)


def deployment_promote(w: StateWriter, msg: m.DeploymentPromote) -> dict[str, Any]:
    """Promote a rollout's canaries: the scheduler then replaces the old allocs (as Nomad).

    Refused unless every canary of each promoted group is healthy.
    """
    dep = w.deployment(msg.deployment_id)
    if dep is None:
        raise not_found(f"deployment {msg.deployment_id} not found")
    if dep.status != DEPLOYMENT_RUNNING:
        raise conflict(f"deployment {dep.id} is {dep.status}: only a running deployment can be promoted")
    with_canaries = sorted(g for g, s in dep.task_groups.items() if s.desired_canaries)
    waiting = [g for g in with_canaries if not dep.task_groups[g].promoted]
    for group in msg.groups:
        if group not in with_canaries:
            raise bad(f"deployment {dep.id}: task group {group!r} has no canaries to promote")
        if group not in waiting:  # promoted meanwhile (the watcher's auto-promote, another operator)
            raise conflict(f"deployment {dep.id}: task group {group!r} is already promoted")
    if not with_canaries:
        raise bad(f"deployment {dep.id} has no canaries to promote")
    chosen = sorted(set(msg.groups)) or waiting
    if not chosen:
        raise conflict(f"deployment {dep.id} is already promoted")
    old = copy.deepcopy(dep)
    for group in chosen:
        state = dep.task_groups[group]
        healthy = healthy_canaries(w, dep, group)
        if healthy < state.desired_canaries:
            raise bad(f"deployment {dep.id}: task group {group!r} has {healthy}/{state.desired_canaries} healthy canaries; "
                      "promote once every canary is healthy")
        state.promoted = True
        if state.progress_deadline:
            # As Nomad: the rest of the rollout gets a whole deadline from the promotion,
            # however long the healthy canaries waited for it.
            state.require_progress_by = w.now + state.progress_deadline
    dep.status_description = DEPLOYMENT_DESC_RUNNING  # no longer awaiting promotion
    w.put_deployment(dep, old, "DeploymentPromotion")
    return {"deployment_id": dep.id, "promoted": chosen, "eval_ids": upsert_evals(w, [msg.eval] if msg.eval else [])}
