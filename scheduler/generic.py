"""The scheduler for service and batch jobs (Nomad's generic scheduler), and the entry point.

``schedule(snapshot)`` reconciles every task group (a job waiting in its
queue, ``Snapshot.admitted`` false, wants nothing: its allocs stop), picks
nodes for the wanted placements with the selector, and returns a
``Plan`` whose evals say how the evaluation ended:

- everything placed: the eval is complete;
- some placements found no node: the eval is complete and a *blocked* eval
  (status ``blocked``, with the reasons per group) waits for capacity — or,
  when the eval being processed is itself that blocked eval, it is written
  back as blocked (re-blocked) rather than spawning another;
- failed allocs to reschedule later: follow-up evals with ``wait_until``.

Service jobs roll out a new version through a deployment: destructive
updates at most ``max_parallel`` at a time (allocs placed by the deployment
and not yet healthy count against it); placements carry the deployment id.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass

from fsm.ids import new_uuid
from fsm.messages import AllocStop
from fsm.structs import (
    CLIENT_PENDING,
    DEPLOYMENT_DESC_AUTO_PROMOTION,
    DEPLOYMENT_DESC_NEEDS_PROMOTION,
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_FAILED,
    DEPLOYMENT_PAUSED,
    DEPLOYMENT_RUNNING,
    DEPLOYMENT_SUCCESSFUL,
    DESIRED_RUN,
    DESIRED_STOP,
    Allocation,
    Deployment,
    DeploymentState,
    DeploymentStatus,
    Job,
    ReschedulePolicy,
    TaskGroup,
    UpdateStrategy,
)
from scheduler.evals import TRIGGER_FOLLOWUP, finish_eval, new_eval
from scheduler.feasibility import Ask, PlacementContext, ask_for
from scheduler.plan import Plan
from scheduler.ranking import Request, Selector
from scheduler.reconcile import UNLIMITED, GroupPlan, Placement, Rollout, reconcile_group
from scheduler.reschedule import batch_followups, next_tracker, penalty_nodes, policy_for
from scheduler.state import Snapshot
from scheduler.system import schedule_system

STOP_EVICTED = "alloc stopped: its workload was evicted and waits again in queue"


def update_strategy(job: Job, group: TaskGroup) -> UpdateStrategy | None:
    """The group's rolling-update settings: its own, else Nomad's default for service jobs."""
    if job.type != "service":
        return None
    return group.update if group.update is not None else UpdateStrategy()


def _current_deployment(snap: Snapshot) -> Deployment | None:
    dep, job = snap.deployment, snap.job
    if dep is None or job is None:
        return None
    if dep.job_version == job.version and dep.job_modify_index == job.job_modify_index:
        return dep
    return None


def _in_flight(allocs: list[Allocation], group: str, dep: Deployment) -> int:
    """Allocs placed by ``dep`` in ``group`` that are live and not yet healthy."""
    n = 0
    for a in allocs:
        if a.task_group != group or a.deployment_id != dep.id or a.terminal():
            continue
        if a.deployment_status is None or a.deployment_status.healthy is None:
            n += 1
    return n


def _limit(job: Job, group: TaskGroup, allocs: list[Allocation], dep: Deployment | None) -> int:
    strategy = update_strategy(job, group)
    if strategy is None or strategy.max_parallel <= 0:
        return UNLIMITED
    if dep is None:
        return strategy.max_parallel
    if not dep.active():
        # A failed or cancelled rollout stops; a successful one has nothing left to roll.
        return 0 if dep.status != DEPLOYMENT_SUCCESSFUL else strategy.max_parallel
    if dep.status == DEPLOYMENT_PAUSED:
        return 0  # held by the operator (`deployment pause`): nothing more is replaced
    return max(0, strategy.max_parallel - _in_flight(allocs, group.name, dep))


def _stale_canaries(snap: Snapshot, dep: Deployment | None) -> frozenset[str]:
    """Unpromoted canaries of every rollout but the current one."""
    return frozenset(i for dep_id, ids in snap.unpromoted_canaries.items() if dep is None or dep_id != dep.id for i in ids)


def _rollout(job: Job, group: TaskGroup, dep: Deployment | None, stale: frozenset[str]) -> Rollout:
    """The group's rollout as reconcile sees it: its canary phase, and the active rollout's id."""
    strategy = update_strategy(job, group)
    if dep is None:
        # A new version's rollout starts with canaries if it replaces anything destructively.
        return Rollout(wanted=strategy.canary if strategy is not None else 0, stale=stale)
    state = dep.task_groups.get(group.name)
    if state is None:
        return Rollout(stale=stale)
    active = dep.id if dep.active() else ""
    paused, failed = dep.status == DEPLOYMENT_PAUSED, dep.id if dep.status == DEPLOYMENT_FAILED else ""
    if not state.desired_canaries:
        return Rollout(stale=stale, active=active, paused=paused, failed=failed)
    if state.promoted:
        return Rollout(promoted=True, stale=stale, active=active, paused=paused, failed=failed)
    if not dep.active() and dep.status != DEPLOYMENT_SUCCESSFUL:
        return Rollout(abandoned=True, stale=stale, failed=failed)
    return Rollout(wanted=state.desired_canaries, paused=paused, stale=stale, active=active)


def schedule(
    snap: Snapshot, *, rng: random.Random | None = None, top_k: int = 1
) -> Plan:
    """Plan the evaluation in ``snap`` (dispatching system jobs to their own scheduler).

    ``top_k`` > 1 picks each node at random among the best ``top_k`` (the
    leader raises it while plans conflict).
    """
    if snap.job is not None and snap.job.type == "system":
        return schedule_system(snap, rng=rng)
    return schedule_generic(snap, rng=rng, top_k=top_k)


def schedule_generic(
    snap: Snapshot, *, rng: random.Random | None = None, top_k: int = 1
) -> Plan:
    """Plan a service or batch job's evaluation: reconcile its groups, stop, then place what they want.

    Stops go into the plan before any placement, so what they free is there to
    place on; the rollout (deployment) is settled before placing, as each new
    alloc records which rollout it belongs to.
    """
    ev, job = snap.eval, snap.job
    rng = rng or random.Random(ev.id)
    plan = Plan(eval_id=ev.id, job_id=ev.job_id, snapshot_index=snap.index)
    groups: dict[str, TaskGroup] = {}
    if job is not None and not job.stop and snap.admitted:
        groups = {g.name: g for g in job.task_groups}
    dep = _current_deployment(snap)
    plans = _reconcile_groups(snap, groups, dep)
    selector = _selector(snap, rng, top_k)
    _stop_and_update(plan, plans, selector)
    if not snap.admitted:
        for stop in plan.stop:  # the job waits in its queue: it was evicted, nothing of it runs
            stop.desired_description = f"{STOP_EVICTED} {snap.queue}"
    deployment = _deployment_for(snap, plans, groups, dep)
    if deployment is not None and deployment is not dep:
        plan.deployment = deployment
    dep_id = deployment.id if deployment is not None and deployment.active() else ""
    _join_rollout(plans, groups, job, dep_id)
    failures, queued = _place_groups(plan, plans, groups, _Placing(snap, selector, dep_id))
    if plan.deployment is not None and not any(a.deployment_id == plan.deployment.id for a in plan.place):
        plan.deployment = None  # nothing placed: the eval that places them later starts the rollout
    next_eval = _followups(plan, snap, plans)
    # As Nomad's eval.DeploymentID: the rollout this eval's placements belong to.
    within = plan.deployment.id if plan.deployment is not None else (dep.id if dep is not None and dep.active() else "")
    finish_eval(plan, snap, failures, queued, next_eval, within)
    return plan


def _reconcile_groups(snap: Snapshot, groups: dict[str, TaskGroup], dep: Deployment | None) -> dict[str, GroupPlan]:
    """Reconcile every group the job has or still has allocs of, in name order, each with its rollout and budget."""
    job = snap.job
    by_group: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in snap.allocs:
        by_group[alloc.task_group].append(alloc)
    stale = _stale_canaries(snap, dep)
    plans: dict[str, GroupPlan] = {}
    for name in sorted(set(groups) | set(by_group)):
        group = groups.get(name)
        limit, rollout = UNLIMITED, None
        if job is not None and group is not None:
            limit, rollout = _limit(job, group, snap.allocs, dep), _rollout(job, group, dep, stale)
        plans[name] = reconcile_group(
            job, group, name, by_group.get(name, []), snap.nodes, snap.now, snap.eval.id, versions=snap.versions,
            limit=limit, rollout=rollout, skew=snap.skew,
        )
    return plans


def _selector(snap: Snapshot, rng: random.Random, top_k: int) -> Selector:
    """A node selector for the snapshot's policy, knowing where the job's live allocs run (so
    placements spread), that this plan's stops and placements then update. It copies the
    usage of the nodes it touches only (the snapshot's may be the placement index's own), and
    takes its rankings from the index when the snapshot has one. What plans still committing
    hold (``snap.held``) counts as used from the start."""
    ctx = PlacementContext(usage={}, base=snap.usage, job_allocs=Counter())
    for alloc in snap.allocs:
        if not alloc.terminal():
            ctx.job_allocs[alloc.node_id] += 1
    policy = snap.policy
    selector = Selector(
        snap.nodes, ctx, rng=rng, top_k=min(top_k, policy.top_k_max), rules=policy.preference_rules(), validation=policy.validation_rules(),
        cluster_top=policy.cluster_top, source=snap.rankings, stats=snap.stats,
    )
    for node_id, resources in sorted(snap.held.items()):
        selector.hold(node_id, resources)
    return selector


def _stop_and_update(plan: Plan, plans: dict[str, GroupPlan], selector: Selector) -> None:
    """Put every group's stops (releasing what they hold, for this plan's placements) and in-place updates in ``plan``."""
    for gp in plans.values():
        for stop in gp.stop:
            plan.stop.append(
                AllocStop(id=stop.alloc.id, desired_status=DESIRED_STOP, desired_description=stop.description, client_status=stop.client_status)
            )
            selector.release(stop.alloc.node_id, stop.alloc.resources, same_job=True)
        for updated in gp.inplace:
            plan.place.append(updated)
            plan.inplace.add(updated.id)


@dataclass
class _Placing:
    """What placing any group's allocs needs that is the same for every group of the eval."""

    snap: Snapshot
    selector: Selector
    dep_id: str  # the active rollout new allocs join ("" if none)


def _place_groups(
    plan: Plan, plans: dict[str, GroupPlan], groups: dict[str, TaskGroup], placing: _Placing
) -> tuple[dict[str, str], dict[str, int]]:
    """Place what each group of the job wants; per group, why placements are missing and how many
    (the eval's failed_tg_allocs and queued_allocations)."""
    job = placing.snap.job
    failures: dict[str, str] = {}
    queued: dict[str, int] = {}
    for name, gp in plans.items():
        group = groups.get(name)
        if group is None or job is None:
            continue
        queued[name] = 0
        reasons, missing = _place_group(plan, job, group, gp.place, placing)
        if reasons:
            failures[name] = "; ".join(reasons)
            queued[name] = missing
            plan.failed[name] = missing
    return failures, queued


def _place_group(plan: Plan, job: Job, group: TaskGroup, wanted: list[Placement], placing: _Placing) -> tuple[list[str], int]:
    """Place the group's placements on the nodes the selector picks; why some are missing
    (nothing if none is), and how many. (Queue admission came before: a job waiting in its
    queue reaches here with nothing to place.)"""
    ask = ask_for(job, group)
    policy = policy_for(job, group)
    unplaced = 0
    for p in wanted:
        alloc = _place_one(job, group, ask, policy, p, placing)
        if alloc is None:
            unplaced += 1
        else:
            plan.place.append(alloc)
    reasons = [placing.selector.failure(ask, unplaced).describe()] if unplaced else []
    return reasons, unplaced


def _place_one(
    job: Job, group: TaskGroup, ask: Ask, policy: ReschedulePolicy | None, p: Placement, placing: _Placing
) -> Allocation | None:
    """The new alloc for one placement, on the node the selector picks for the version it runs
    (which then holds its resources); None if no node fits."""
    snap = placing.snap
    runs, runs_group = _version_to_place(snap, job, group, p)
    ask_p = ask if runs is job else ask_for(runs, runs_group)
    # Nomad's penalty nodes: where the replaced alloc failed and every node its tracker lists.
    request = Request(ask_p, penalty_nodes=penalty_nodes(p.previous) if p.previous is not None else frozenset())
    node = placing.selector.select(request)
    if node is None:
        return None
    # A device ask takes named devices of the node (Resources.bound); any other is the ask itself.
    asked = ask_p.resources
    resources = asked.bound(node.resources, placing.selector.ctx.used(node.id)) if asked.devices else asked.copy()
    placing.selector.claim(node, ask_p, resources)
    return Allocation(
        id=new_uuid(),
        eval_id=snap.eval.id,
        job_id=job.id,
        node_id=node.id,
        task_group=group.name,
        name=p.name,
        namespace=job.namespace,
        job_version=runs.version,
        resources=resources,
        desired_status=DESIRED_RUN,
        client_status=CLIENT_PENDING,
        previous_allocation=p.previous.id if p.previous is not None else "",
        reschedule_tracker=next_tracker(p.previous, snap.now, p.delay, policy if runs is job else policy_for(runs, runs_group))
        if p.reschedule and p.previous else None,
        # A downgraded replacement is an old version's alloc, outside the rollout under test.
        deployment_id=placing.dep_id if update_strategy(job, group) is not None and runs is job else "",
        deployment_status=DeploymentStatus(canary=True) if p.canary and placing.dep_id else None,
    )


def _version_to_place(snap: Snapshot, job: Job, group: TaskGroup, p: Placement) -> tuple[Job, TaskGroup]:
    """The job version a placement runs: the current one, or for a downgraded replacement the
    group's last settled version, if it is kept and not older than the alloc it replaces."""
    if not p.downgrade or group.name not in snap.settled:
        return job, group
    old = snap.versions.get(snap.settled[group.name])
    old_group = next((g for g in old.task_groups if g.name == group.name), None) if old is not None else None
    floor = p.previous.job_version if p.previous is not None else 0
    if old is None or old_group is None or old.version < floor or old.version == job.version:
        return job, group
    return old, old_group


def _deployment_for(
    snap: Snapshot, plans: dict[str, GroupPlan], groups: dict[str, TaskGroup], dep: Deployment | None
) -> Deployment | None:
    """The deployment placements join: the current one, or a new one for a new version."""
    job = snap.job
    if job is None or job.stop or job.type != "service":
        return None
    if dep is not None:
        return dep
    rolling = {}
    for name, group in groups.items():
        strategy = update_strategy(job, group)
        gp = plans.get(name)
        if strategy is None or strategy.max_parallel <= 0 or gp is None:
            continue
        if gp.place or gp.pending_updates or gp.inplace:
            rolling[name] = (strategy, gp)
    if not rolling:
        return None
    now = snap.now
    states = {}
    for name, (strategy, gp) in sorted(rolling.items()):
        canaries = sum(1 for p in gp.place if p.canary)
        states[name] = DeploymentState(
            desired_total=len(gp.place) - canaries + gp.pending_updates + gp.pending_places + len(gp.inplace),
            placed_allocs=0,
            desired_canaries=canaries,
            auto_promote=strategy.auto_promote,
            auto_revert=strategy.auto_revert,
            progress_deadline=strategy.progress_deadline,
            require_progress_by=now + strategy.progress_deadline if strategy.progress_deadline else 0,
        )
    return Deployment(
        id=new_uuid(),
        job_id=job.id,
        namespace=job.namespace,
        job_version=job.version,
        job_modify_index=job.job_modify_index,
        job_create_index=job.create_index,
        status=DEPLOYMENT_RUNNING,
        status_description=_first_description(states),
        task_groups=states,
    )


def _first_description(states: dict[str, DeploymentState]) -> str:
    """As Nomad's reconciler: a rollout with canaries says from the start who promotes it."""
    canaried = [s for s in states.values() if s.desired_canaries]
    if not canaried:
        return DEPLOYMENT_DESC_RUNNING
    return DEPLOYMENT_DESC_AUTO_PROMOTION if all(s.auto_promote for s in canaried) else DEPLOYMENT_DESC_NEEDS_PROMOTION


def _join_rollout(plans: dict[str, GroupPlan], groups: dict[str, TaskGroup], job: Job | None, dep_id: str) -> None:
    """Allocs updated in place join the rollout of their new version, health unknown again.

    As Nomad's scheduler: the deployment then counts every alloc of the
    version, and the client reports each one's health anew before the
    rollout can succeed.
    """
    if not dep_id or job is None:
        return
    for name, gp in plans.items():
        group = groups.get(name)
        if group is None or update_strategy(job, group) is None:
            continue
        for updated in gp.inplace:
            if updated.deployment_id != dep_id:
                updated.deployment_id = dep_id
                updated.deployment_status = None


def _followups(plan: Plan, snap: Snapshot, plans: dict[str, GroupPlan]) -> str:
    """Follow-up evals for failed allocs that reschedule later, and their annotations; the first one's id."""
    job = snap.job
    pending = [(f.alloc, f.at) for gp in plans.values() for f in gp.followups]
    if not pending or job is None:
        return ""
    allocs = {a.id: a for a, _ in pending}
    first = ""
    for at, ids in batch_followups([(a.id, at) for a, at in pending]):
        follow = new_eval(
            job,
            TRIGGER_FOLLOWUP,
            status_description="created for delayed rescheduling",
            wait_until=at,
            previous_eval=snap.eval.id,
        )
        plan.evals.append(follow)
        first = first or follow.id
        for alloc_id in ids:
            alloc = allocs[alloc_id]
            # An annotation, not a stop: desired status stays as it is.
            plan.stop.append(
                AllocStop(id=alloc_id, desired_status=alloc.desired_status, desired_description=alloc.desired_description, followup_eval_id=follow.id)
            )
    plan.evals.sort(key=lambda e: e.wait_until)
    return first
