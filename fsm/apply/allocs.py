"""Alloc updates outside plans: what clients report, and the desired transitions servers set."""

from __future__ import annotations

import copy
from typing import Any

from fsm import codec
from fsm import messages as m
from fsm.apply.evals import upsert_evals
from fsm.apply.summaries import move_status
from fsm.record import copy_record
from fsm.structs import CLIENT_TERMINAL, alloc_map_terminal
from fsm.validate import check_client_status
from fsm.writer import StateWriter


def alloc_client_update(w: StateWriter, msg: m.AllocClientUpdate) -> dict[str, Any]:
    """Client-reported status of allocs.

    The hottest entry type, so it works on each alloc's stored map: only
    client-reported fields change, and ``update_alloc_map`` stores the map
    with the same bytes (and index rows) ``put_alloc`` would.
    """
    for state in msg.allocs:
        check_client_status(state.id, state.client_status)
    updated, ignored = [], []
    for state in msg.allocs:
        data = w.alloc_map(state.id)
        status = data["client_status"] if data is not None else ""
        # A terminal client status is final: a late report cannot revive an alloc.
        if data is None or (status in CLIENT_TERMINAL and state.client_status != status):
            ignored.append(state.id)
            continue
        was_terminal = alloc_map_terminal(data)
        if state.client_status != status:
            group = data["task_group"]
            move_status(w, data["job_id"], group, status, group, state.client_status)
            data["client_status"] = state.client_status
        data["client_description"] = state.client_description
        if state.task_states is not None:
            data["task_states"] = {k: codec.dump(v) for k, v in state.task_states.items()}
        if state.deployment_status is not None:
            before = data["deployment_status"]
            _deployment_health(
                w,
                data["deployment_id"],
                data["task_group"],
                before["healthy"] if before is not None else None,
                state.deployment_status.healthy,
            )
            reported = codec.dump(state.deployment_status)
            reported["canary"] = before is not None and bool(before.get("canary"))  # the scheduler's word, not the client's
            data["deployment_status"] = reported
        w.update_alloc_map(data, was_terminal, "AllocationUpdated")
        updated.append(state.id)
    eval_ids = upsert_evals(w, msg.evals)
    return {"updated": updated, "ignored": ignored, "eval_ids": eval_ids}


def _deployment_health(
    w: StateWriter, deployment_id: str, group: str, before: bool | None, healthy: bool | None
) -> None:
    """Count an alloc's first health report into its deployment."""
    if healthy is None or before is not None or not deployment_id:
        return
    dep = w.deployment(deployment_id)
    if dep is None or group not in dep.task_groups:
        return
    old = copy.deepcopy(dep)
    state = dep.task_groups[group]
    if healthy:
        state.healthy_allocs += 1
        if state.progress_deadline:  # progress: the next alloc has a whole deadline to turn healthy (as Nomad)
            state.require_progress_by = max(state.require_progress_by, w.now + state.progress_deadline)
    else:
        state.unhealthy_allocs += 1
    w.put_deployment(dep, old, "DeploymentAllocHealth")


def alloc_desired_transition(w: StateWriter, msg: m.AllocDesiredTransition) -> dict[str, Any]:
    """Mark allocs to migrate or reschedule (a drain, a forced reschedule); unknown ids are skipped."""
    updated = []
    for alloc_id, transition in sorted(msg.allocs.items()):
        alloc = w.alloc(alloc_id)
        if alloc is None:
            continue
        old = copy_record(alloc)
        alloc.desired_transition = transition
        alloc.alloc_modify_index = w.index
        w.put_alloc(alloc, old, "AllocationUpdateDesiredStatus")
        updated.append(alloc_id)
    return {"updated": updated, "eval_ids": upsert_evals(w, msg.evals)}
