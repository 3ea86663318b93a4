"""Plan results: the allocs a scheduler's plan stops and places, and the rollouts they join.

A plan was decided on the leader's view of the state; apply checks again
what may have changed since (the job, node or eval gone) and rejects the
whole plan rather than place an alloc nothing owns.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

from fsm import messages as m
from fsm.apply.evals import upsert_evals
from fsm.apply.rejects import conflict
from fsm.apply.summaries import count_alloc, move_count, move_statuses
from fsm.record import copy_record
from fsm.structs import CLIENT_PENDING, Allocation, Deployment, alloc_map_terminal
from fsm.validate import (
    bad,
    check_alloc,
    check_client_status,
    check_deployment,
    check_desired_status,
)
from fsm.writer import StateWriter

# (deployment id, task group) -> the plan's allocs new to that rollout.
Joined = dict[tuple[str, str], list[Allocation]]


def plan_apply(w: StateWriter, msg: m.PlanApply) -> dict[str, Any]:
    """Apply a plan: stops first, then placements, then rollouts and the plan's evals."""
    _check_plan(msg)
    stopped = _stop_allocs(w, msg.allocs_to_stop)
    joined: Joined = defaultdict(list)
    plan_evals = {ev.id: ev.job_id for ev in msg.evals}
    placed = []
    for alloc in msg.allocs_to_place:
        _place_alloc(w, alloc, plan_evals, joined)
        placed.append(alloc.id)
    _put_rollouts(w, msg.deployment, joined)
    eval_ids = upsert_evals(w, msg.evals)
    return {"placed": placed, "stopped": stopped, "eval_ids": eval_ids}


def _check_plan(msg: m.PlanApply) -> None:
    """Refuse a malformed plan before it writes anything."""
    for alloc in msg.allocs_to_place:
        check_alloc(alloc)
    for stop in msg.allocs_to_stop:
        check_desired_status(stop.id, stop.desired_status)
        if stop.client_status:
            check_client_status(stop.id, stop.client_status)
    if msg.deployment is not None:
        check_deployment(msg.deployment)


def _stop_allocs(w: StateWriter, stops: list[m.AllocStop]) -> list[str]:
    """Set the desired status of each alloc to stop; returns the ids of those that exist.

    A node-loss storm stops hundreds of thousands of allocs on every replica,
    so this works on each alloc's stored map, as client updates do
    (fsm/apply/allocs.py): a stop changes only the desired status and its
    description, the follow-up eval and perhaps the client status, and
    ``update_alloc_map`` stores the bytes and index rows ``put_alloc`` would
    (tests/fsm/test_plan_stops.py), without building the alloc and encoding
    it again. Each job's summary is read and written once for all its
    stops.
    """
    stopped = []
    moves = []  # summary counters, moved once per job after the loop
    for stop in stops:
        data = w.alloc_map(stop.id)
        if data is None:
            continue
        status = data["client_status"]
        was_terminal = alloc_map_terminal(data)
        data["desired_status"] = stop.desired_status
        data["desired_description"] = stop.desired_description
        if stop.followup_eval_id:
            data["followup_eval_id"] = stop.followup_eval_id
        if stop.client_status and stop.client_status != status:
            moves.append((data["job_id"], data["task_group"], status, stop.client_status))
            data["client_status"] = stop.client_status
        data["alloc_modify_index"] = w.index
        w.update_alloc_map(data, was_terminal, "PlanResult")
        stopped.append(stop.id)
    move_statuses(w, moves)
    return stopped


def _place_alloc(w: StateWriter, alloc: Allocation, plan_evals: dict[str, str], joined: Joined) -> None:
    """Store a placed alloc (new, or an in-place update) and count it where it belongs.

    ``plan_evals``: eval id -> job id of the plan's own evals (stored after
    the placements). ``joined`` gains the alloc if it joins a rollout.
    """
    _check_placement(w, alloc, plan_evals)
    old = w.alloc(alloc.id)
    if old is not None:
        # An in-place update keeps what the client reported.
        alloc.client_status = old.client_status
        alloc.client_description = old.client_description
        alloc.task_states = old.task_states
        if alloc.deployment_id == old.deployment_id:
            alloc.deployment_status = old.deployment_status
    if alloc.deployment_id and (old is None or old.deployment_id != alloc.deployment_id):
        joined[alloc.deployment_id, alloc.task_group].append(alloc)
    alloc.alloc_modify_index = w.index
    w.put_alloc(alloc, old, "PlanResult")
    if old is None:
        count_alloc(w, alloc, +1, placed=alloc.client_status == CLIENT_PENDING)
        if alloc.previous_allocation:
            _link_previous(w, alloc)
    elif (old.job_id, old.task_group) != (alloc.job_id, alloc.task_group):
        # The summaries count allocs per job and group: move this one.
        move_count(w, old, alloc)


def _check_placement(w: StateWriter, alloc: Allocation, plan_evals: dict[str, str]) -> None:
    """Refuse an alloc whose job, node or eval is gone, whose eval is another job's, or whose job
    waits in its queue.

    Every alloc's eval exists and is of the alloc's job: reaps take an eval
    only with its allocs, and a job's GC purge takes the job's evals and
    allocs together, so neither can leave an alloc orphaned.
    """
    job = w.job(alloc.job_id)
    if job is None:
        raise conflict(f"allocation {alloc.id}: job {alloc.job_id} no longer exists")
    if job.queue and w.waits_in_queue(job.id):
        # Planned before an eviction (or on a state before admission): quota was never granted.
        raise conflict(f"allocation {alloc.id}: job {job.id} waits in queue {job.queue}; it is not admitted")
    if w.node(alloc.node_id) is None:
        raise conflict(f"allocation {alloc.id}: node {alloc.node_id} does not exist")
    eval_job = plan_evals.get(alloc.eval_id)
    if eval_job is None:
        ev = w.eval(alloc.eval_id)
        if ev is None:
            raise conflict(f"allocation {alloc.id}: evaluation {alloc.eval_id} does not exist")
        eval_job = ev.job_id
    if eval_job != alloc.job_id:
        raise bad(
            f"allocation {alloc.id} is for job {alloc.job_id} but its evaluation "
            f"{alloc.eval_id} is for job {eval_job}"
        )


def _put_rollouts(w: StateWriter, new: Deployment | None, joined: Joined) -> None:
    """Store the plan's new deployment and count the allocs each rollout gained (Nomad's PlacedAllocs, PlacedCanaries).

    An alloc joins a rollout when it is placed with its id, or when an
    in-place update moves it there from an older one.
    """
    rollouts: dict[str, tuple[Deployment, Deployment | None]] = {}
    if new is not None:
        rollouts[new.id] = (new, w.deployment(new.id))
    for dep_id in sorted({dep_id for dep_id, _ in joined} - set(rollouts)):
        stored = w.deployment(dep_id)
        if stored is not None:
            rollouts[dep_id] = (copy.deepcopy(stored), stored)
    for dep_id, (dep, old) in rollouts.items():
        for (of, group), allocs in sorted(joined.items()):
            if of == dep_id and group in dep.task_groups:
                state = dep.task_groups[group]
                state.placed_allocs += len(allocs)
                state.placed_canaries += [a.id for a in allocs if a.deployment_status is not None and a.deployment_status.canary]
        if dep != old:
            w.put_deployment(dep, old, "DeploymentStatusUpdate")


def _link_previous(w: StateWriter, alloc: Allocation) -> None:
    """Point the alloc this one replaces at it (``next_allocation``), as Nomad does."""
    prev = w.alloc(alloc.previous_allocation)
    if prev is not None and prev.next_allocation != alloc.id:
        old = copy_record(prev)
        prev.next_allocation = alloc.id
        w.put_alloc(prev, old, "AllocationUpdated")
