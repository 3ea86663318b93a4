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
    Job,
    Node,
    Resources,
    TaskGroup,
)
from scheduler.evals import finish_eval
from scheduler.feasibility import (
    Ask,
    Constraints,
    HasDrivers,
    InDatacenter,
    PlacementContext,
    PlacementFailure,
    ValidationRule,
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
    updated_in_place,
)
from scheduler.state import Snapshot

STOP_NOT_MATCHING = "alloc not needed as node no longer matches the job"
STOP_TAINTED = "alloc not needed as node is tainted"  # Nomad's words for a system alloc a drain moves
# Rules whose failure means "this node is not for this job" (rather than "not now").
_MATCH_RULES = (InDatacenter(), HasDrivers(), Constraints())


_Stops = list[tuple[Allocation, str, str]]  # each alloc to stop, why (desired description) and its client status ("": as is)


def schedule_system(snap: Snapshot, *, rng: random.Random | None = None) -> Plan:
    """Plan a system job's evaluation: one alloc of each group on every node it fits.

    Every node's allocs are sorted out (one kept, the rest stopped) before any
    placement, so what the stops free is there to place on.
    """
    ev, job = snap.eval, snap.job
    plan = Plan(eval_id=ev.id, job_id=ev.job_id, snapshot_index=snap.index)
    stopped = job is None or job.stop
    # As Nomad: a group with count 0 is switched off (its allocs stop as not needed).
    groups: dict[str, TaskGroup] = {} if stopped or job is None else {g.name: g for g in job.task_groups if g.count > 0}
    # The snapshot's usage may be the placement index's own: the context copies what it changes.
    ctx = PlacementContext(usage={}, base=snap.usage, job_allocs=Counter())
    keep, stops = _keep_per_node(snap, groups, ctx, stopped)
    for alloc, why, status in stops:
        plan.stop.append(AllocStop(id=alloc.id, desired_status=DESIRED_STOP, desired_description=why, client_status=status))
        ctx.used(alloc.node_id).subtract(alloc.resources)
    failures: dict[str, str] = {}
    queued: dict[str, int] = {}
    for group_name, group in sorted(groups.items()):
        assert job is not None
        queued[group_name] = 0
        failure = _place_group(plan, snap, job, group, keep, ctx)
        if failure.unplaced:
            failures[group_name] = failure.describe()
            queued[group_name] = failure.unplaced
            plan.failed[group_name] = failure.unplaced
    finish_eval(plan, snap, failures, queued)
    return plan


def _keep_per_node(
    snap: Snapshot, groups: dict[str, TaskGroup], ctx: PlacementContext, stopped: bool
) -> tuple[dict[tuple[str, str], Allocation], _Stops]:
    """Per (group, node), the live alloc that stays; and every other live alloc, to stop."""
    live: dict[tuple[str, str], list[Allocation]] = defaultdict(list)
    for alloc in sorted(snap.allocs, key=lambda a: (a.create_index, a.id)):
        if not alloc.terminal():
            live[(alloc.task_group, alloc.node_id)].append(alloc)
    keep: dict[tuple[str, str], Allocation] = {}
    stops: _Stops = []
    for (group_name, node_id), allocs in sorted(live.items()):
        kept, gone = _keep_one(snap.job, groups.get(group_name), snap.nodes.get(node_id), allocs, ctx, stopped)
        if kept is not None:
            keep[(group_name, node_id)] = kept
        stops += gone
    return keep, stops


def _keep_one(
    job: Job | None, group: TaskGroup | None, node: Node | None, allocs: list[Allocation], ctx: PlacementContext, stopped: bool
) -> tuple[Allocation | None, _Stops]:
    """Of one group's live allocs on one node (oldest first), the one that stays, if any, and the rest.

    On a down or missing node they are lost; with their job or group gone, or on a
    node that no longer matches the job, they stop. What the drainer marked stops,
    even if the drain has ended since (Nomad's diffSystemAllocsForNode). Otherwise
    the newest stays: on a draining node as it is, else preferring the current version.
    """
    if node is None or node.status == NODE_DOWN:
        return None, [(a, STOP_LOST, CLIENT_LOST) for a in allocs]
    if group is None:
        return None, [(a, STOP_JOB if stopped else STOP_GROUP, "") for a in allocs]
    stops: _Stops = [(a, STOP_TAINTED, "") for a in allocs if a.desired_transition.migrate]
    allocs = [a for a in allocs if not a.desired_transition.migrate]
    if not allocs:
        return None, stops
    if node.drain:  # the rest keeps running until it is marked
        best = max(allocs, key=lambda a: (a.create_index, a.id))
    else:
        assert job is not None
        if check_static(node, ask_for(job, group), ctx, _MATCH_RULES) is not None:
            return None, stops + [(a, STOP_NOT_MATCHING, "") for a in allocs]
        best = max(allocs, key=lambda a: (a.job_version == job.version, a.create_index, a.id))
    return best, stops + [(a, STOP_GROUP, "") for a in allocs if a is not best]


def _place_group(
    plan: Plan, snap: Snapshot, job: Job, group: TaskGroup, keep: dict[tuple[str, str], Allocation], ctx: PlacementContext
) -> PlacementFailure:
    """Bring every node that is not draining to one alloc of the group's current version; what found no room."""
    ask = ask_for(job, group)
    # The policy's validation rules, in its order: the static ones per node, the dynamic ones on room.
    static = tuple(r for r in snap.policy.validation_rules() if not r.dynamic)
    dynamic = tuple(r for r in snap.policy.validation_rules() if r.dynamic)
    failure = PlacementFailure(nodes_evaluated=len(snap.nodes))
    for node_id in sorted(snap.nodes):
        node = snap.nodes[node_id]
        if node.drain:
            continue  # what runs there stays as it is until the drainer marks it
        previous = _make_room(plan, snap, job, group, keep.get((group.name, node_id)), node, ask, ctx, static)
        if previous is None:
            continue
        reason = check_dynamic(node, ask, ctx, dynamic)
        if reason is not None:
            failure.unplaced += 1
            failure.exhausted[reason.split(": ", 1)[-1]] += 1
            continue
        used = ctx.used(node_id)
        resources = ask.resources.bound(node.resources, used)  # devices named as the node names them
        used.add(resources)
        plan.place.append(_new_alloc(snap.eval.id, job, group.name, node_id, resources, previous))
    return failure


def _make_room(
    plan: Plan, snap: Snapshot, job: Job, group: TaskGroup, kept: Allocation | None, node: Node, ask: Ask, ctx: PlacementContext,
    static: tuple[ValidationRule, ...],
) -> str | None:
    """Whether the node takes a new alloc of the group: the id of the alloc it replaces ("" for none).

    None when the node's kept alloc runs the current version or is updated to it in
    place, and when a node without one fails the static rules. An outdated alloc
    that cannot be updated in place is stopped here, freeing its resources.
    """
    if kept is None:
        return "" if check_static(node, ask, ctx, static) is None else None
    if kept.job_version == job.version:
        return None
    if can_update_in_place(job, group, snap.versions.get(kept.job_version)):
        updated = updated_in_place(kept, job, snap.eval.id)
        plan.place.append(updated)
        plan.inplace.add(updated.id)
        return None
    plan.stop.append(AllocStop(id=kept.id, desired_status=DESIRED_STOP, desired_description=STOP_UPDATE))
    ctx.used(kept.node_id).subtract(kept.resources)
    return kept.id


def _new_alloc(eval_id: str, job: Job, group_name: str, node_id: str, resources: Resources, previous: str) -> Allocation:
    """A pending alloc of the group's current version on ``node_id`` (a system alloc's name has index 0)."""
    return Allocation(
        id=new_uuid(),
        eval_id=eval_id,
        job_id=job.id,
        node_id=node_id,
        task_group=group_name,
        name=alloc_name(job.id, group_name, 0),
        namespace=job.namespace,
        job_version=job.version,
        resources=resources,
        desired_status=DESIRED_RUN,
        client_status=CLIENT_PENDING,
        previous_allocation=previous,
    )
