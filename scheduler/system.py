"""The system scheduler: one allocation per task group on every feasible node.

For each node that passes the static validation rules (ready, eligible,
datacenter, drivers, constraints) a group has exactly one live allocation:
missing ones are placed (if the node still has room), extras stopped. Allocs
on down nodes are marked lost and not replaced elsewhere; one the drainer
marked (after the node's other work has moved) is stopped, and the rest on
a draining node are left as they are; on nodes that no longer match the job
they are stopped.
A new job version replaces allocs in place or destructively, node by node.
System jobs have no reschedule policy and no deployments.
"""

from __future__ import annotations

import copy
import random
from collections import Counter, defaultdict

from fsm.ids import new_uuid
from fsm.messages import AllocStop
from fsm.structs import (
    CLIENT_LOST,
    CLIENT_PENDING,
    DESIRED_RUN,
    DESIRED_STOP,
    NODE_DOWN,
    Allocation,
    TaskGroup,
)
from scheduler.evals import finish_eval
from scheduler.feasibility import (
    Constraints,
    HasDrivers,
    InDatacenter,
    PlacementContext,
    PlacementFailure,
    ask_for,
    check_dynamic,
    check_static,
)
from scheduler.plan import Plan
from scheduler.reconcile import (
    STOP_GROUP,
    STOP_JOB,
    STOP_LOST,
    STOP_UPDATE,
    alloc_name,
    can_update_in_place,
)
from scheduler.state import Snapshot

STOP_NOT_MATCHING = "alloc not needed as node no longer matches the job"
STOP_TAINTED = "alloc not needed as node is tainted"  # Nomad's words for a system alloc a drain moves
# Rules whose failure means "this node is not for this job" (rather than "not now").
_MATCH_RULES = (InDatacenter(), HasDrivers(), Constraints())


def schedule_system(snap: Snapshot, *, rng: random.Random | None = None) -> Plan:
    ev, job = snap.eval, snap.job
    plan = Plan(eval_id=ev.id, job_id=ev.job_id, snapshot_index=snap.index)
    stopped = job is None or job.stop
    # As Nomad: a group with count 0 is switched off (its allocs stop as not needed).
    groups: dict[str, TaskGroup] = {} if stopped or job is None else {g.name: g for g in job.task_groups if g.count > 0}
    ctx = PlacementContext(usage={k: v.copy() for k, v in snap.usage.items()}, job_allocs=Counter())
    keep: dict[tuple[str, str], Allocation] = {}
    stops: list[tuple[Allocation, str, str]] = []
    live: dict[tuple[str, str], list[Allocation]] = defaultdict(list)
    for alloc in sorted(snap.allocs, key=lambda a: (a.create_index, a.id)):
        if not alloc.terminal():
            live[(alloc.task_group, alloc.node_id)].append(alloc)
    for (group_name, node_id), allocs in sorted(live.items()):
        node = snap.nodes.get(node_id)
        group = groups.get(group_name)
        if node is None or node.status == NODE_DOWN:
            stops += [(a, STOP_LOST, CLIENT_LOST) for a in allocs]
            continue
        if group is None:
            stops += [(a, STOP_JOB if stopped else STOP_GROUP, "") for a in allocs]
            continue
        # What the drainer marked stops, even if the drain has ended since (Nomad's diffSystemAllocsForNode).
        stops += [(a, STOP_TAINTED, "") for a in allocs if a.desired_transition.migrate]
        allocs = [a for a in allocs if not a.desired_transition.migrate]
        if not allocs:
            continue
        if node.drain:  # the rest keeps running until it is marked
            keep[(group_name, node_id)] = max(allocs, key=lambda a: (a.create_index, a.id))
            stops += [(a, STOP_GROUP, "") for a in allocs if a is not keep[(group_name, node_id)]]
            continue
        assert job is not None
        if check_static(node, ask_for(job, group), ctx, _MATCH_RULES) is not None:
            stops += [(a, STOP_NOT_MATCHING, "") for a in allocs]
            continue
        # Keep the newest current-version alloc (else the newest); stop the rest.
        best = max(allocs, key=lambda a: (a.job_version == job.version, a.create_index, a.id))
        keep[(group_name, node_id)] = best
        stops += [(a, STOP_GROUP, "") for a in allocs if a is not best]
    for alloc, why, status in stops:
        plan.stop.append(AllocStop(id=alloc.id, desired_status=DESIRED_STOP, desired_description=why, client_status=status))
        ctx.used(alloc.node_id).subtract(alloc.resources)

    failures: dict[str, str] = {}
    queued: dict[str, int] = {}
    for group_name, group in sorted(groups.items()):
        assert job is not None
        ask = ask_for(job, group)
        failure = PlacementFailure(nodes_evaluated=len(snap.nodes))
        queued[group_name] = 0
        for node_id in sorted(snap.nodes):
            node = snap.nodes[node_id]
            if node.drain:
                continue  # what runs there stays as it is until the drainer marks it
            kept = keep.get((group_name, node_id))
            previous = ""
            if kept is not None:
                if kept.job_version == job.version:
                    continue
                if can_update_in_place(job, group, snap.versions.get(kept.job_version)):
                    updated = copy.deepcopy(kept)
                    updated.job_version = job.version
                    updated.eval_id = ev.id
                    plan.place.append(updated)
                    plan.inplace.add(updated.id)
                    continue
                plan.stop.append(AllocStop(id=kept.id, desired_status=DESIRED_STOP, desired_description=STOP_UPDATE))
                ctx.used(node_id).subtract(kept.resources)
                previous = kept.id
            elif check_static(node, ask, ctx) is not None:
                continue
            reason = check_dynamic(node, ask, ctx)
            if reason is not None:
                failure.unplaced += 1
                failure.exhausted[reason.split(": ", 1)[-1]] += 1
                continue
            ctx.used(node_id).add(ask.resources)
            plan.place.append(
                Allocation(
                    id=new_uuid(),
                    eval_id=ev.id,
                    job_id=job.id,
                    node_id=node_id,
                    task_group=group_name,
                    name=alloc_name(job.id, group_name, 0),
                    namespace=job.namespace,
                    job_version=job.version,
                    resources=ask.resources.copy(),
                    desired_status=DESIRED_RUN,
                    client_status=CLIENT_PENDING,
                    previous_allocation=previous,
                )
            )
        if failure.unplaced:
            failures[group_name] = failure.describe()
            queued[group_name] = failure.unplaced
            plan.failed[group_name] = failure.unplaced
    finish_eval(plan, snap, failures, queued)
    return plan
