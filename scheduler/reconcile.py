"""Reconcile one task group: desired count versus existing allocations (Nomad's reconciler).

Pure: the inputs are records and ``now``; the output says what to place,
what to stop (and why), what to update in place, and which failed allocs
wait for a follow-up evaluation. The generic scheduler turns that into a
plan; this module never picks nodes.

Classification of each alloc of the group:

- server-terminal (desired stop/evict): history; ignored, except a lost
  alloc stopped by an eval that could not place its replacement (no room):
  it is still replaced, even while a rollout is failed or paused.
- client complete: a batch alloc is done and keeps its slot; a service
  alloc's slot is free again (a fresh placement takes its name). A batch
  alloc of an older version that ended (complete, failed or lost) holds
  nothing: a new version of a batch job runs again, as in Nomad.
- client failed, not yet replaced: rescheduled now (replacement carries the
  reschedule tracker), later (a follow-up eval; the slot stays taken) or
  never (attempts used up; the slot stays taken).
- live (desired run, pending/running) on a down or missing node: lost —
  stopped with client status ``lost`` and replaced elsewhere; once the
  drainer marked it (``desired_transition.migrate``): migrated (stopped and
  replaced), even if the drain has ended since. Unmarked allocs on a
  draining node keep running.
- other live allocs count toward the group; the excess over ``count`` is
  stopped (old versions first, then highest name index); allocs of an
  older job version are updated in place when only count/update/reschedule
  settings changed, otherwise destructively (stop + place), at most
  ``limit`` at a time (a deployment's max_parallel).
- canaries (a group's ``update.canary``): while a new version's rollout
  awaits promotion, that many allocs of the new version run beside the old
  ones (outside ``count``) and nothing is replaced destructively. Once
  promoted they are ordinary allocs, and each old alloc whose name a canary
  took is stopped. A rollout that fails unpromoted stops its canaries. A
  failed canary is rescheduled by the group's policy as a canary (it keeps
  its canary slot while it waits).
- while canaries await promotion, a lost, failed or migrated old alloc is
  replaced with the newest version a rollout settled (promoted, or rolled
  out without canaries), not the version under test (Nomad's
  downgradedJobForPlacement; the generic scheduler picks that version).
- while the current version's rollout is paused, failed or awaiting
  promotion of its canaries (Nomad's deploymentPlaceReady), only lost and
  failed allocs are replaced (not a failed rollout's own): free slots are
  not filled with the version under test.
- the rollout's budget (Nomad's computeUnderProvisionedBy): placements take
  ``max_parallel`` slots first, and while any alloc the active rollout
  placed is unhealthy (running with failed checks, or failed and waiting
  for its reschedule delay), nothing more is replaced. A running unhealthy
  alloc is not rescheduled (only failed and lost ones are, as in Nomad):
  the rollout stalls until its progress deadline decides.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from fsm import codec
from fsm.structs import (
    CLIENT_COMPLETE,
    CLIENT_FAILED,
    CLIENT_LOST,
    NODE_DOWN,
    Allocation,
    Job,
    Node,
    ReschedulePolicy,
    TaskGroup,
)
from scheduler.reschedule import decide, policy_for

_NAME_INDEX = re.compile(r"\[(\d+)\]$")
UNLIMITED = 1 << 30

STOP_JOB = "alloc not needed since job was stopped"
STOP_GROUP = "alloc not needed due to job update"
STOP_EXCESS = "alloc not needed due to job update"
STOP_LOST = "alloc is lost since its node is down"
STOP_MIGRATE = "alloc is being migrated"
STOP_UPDATE = "alloc is being updated due to job update"
STOP_CANARY_REPLACED = "alloc not needed as it was replaced by a promoted canary"
STOP_CANARY_FAILED = "alloc not needed as its deployment failed before promotion"
STOP_CANARY_STALE = "alloc not needed as it is a canary of a replaced deployment"

# Group fields whose change is not destructive (Nomad updates these in place).
_INPLACE_FIELDS = ("count", "update", "reschedule_policy", "migrate")


def alloc_name(job_id: str, group: str, index: int) -> str:
    return f"{job_id}.{group}[{index}]"


def name_index(name: str) -> int:
    match = _NAME_INDEX.search(name)
    return int(match.group(1)) if match else -1


@dataclass
class Placement:
    name: str
    previous: Allocation | None = None
    reschedule: bool = False  # a failed alloc's replacement: tracker + avoid its node
    delay: int = 0  # the reschedule delay recorded in the tracker
    lost: bool = False  # replaces an alloc lost with its node
    destructive: bool = False  # replaces an older-version alloc stopped in the same plan
    canary: bool = False  # runs beside the old allocs until the rollout is promoted
    downgrade: bool = False  # while canaries await promotion: replaced with the last settled version


@dataclass
class Rollout:
    """Where the group's current rollout stands (from its deployment): canaries and unhealthy allocs."""

    wanted: int = 0  # canaries to run until promotion (0: the group has no canary phase now)
    promoted: bool = False  # promoted: the old allocs the canaries stand for go
    abandoned: bool = False  # the rollout ended unpromoted: its canaries go
    paused: bool = False  # the rollout is paused: no canary or fresh alloc is placed
    failed: str = ""  # the id of the current version's rollout if it failed: its failed allocs stay
    stale: frozenset[str] = frozenset()  # unpromoted canaries of older rollouts: they go (as Nomad)
    active: str = ""  # the id of the rollout under way, if one is

    def beside(self, alloc: Allocation, job: Job) -> bool:
        """An unpromoted canary of the current version: outside the group's count."""
        return not self.promoted and is_canary(alloc, job)

    def stalled_by(self, alloc: Allocation) -> bool:
        """An alloc the rollout under way placed and found unhealthy: nothing more is replaced."""
        health = alloc.deployment_status
        return bool(self.active) and alloc.deployment_id == self.active and health is not None and health.healthy is False


def is_canary(alloc: Allocation, job: Job) -> bool:
    """A canary placed for ``job``'s current version."""
    return alloc.job_version == job.version and alloc.deployment_status is not None and alloc.deployment_status.canary


@dataclass
class Stop:
    alloc: Allocation
    description: str
    client_status: str = ""


@dataclass
class Followup:
    alloc: Allocation
    at: int


@dataclass
class GroupPlan:
    group: str
    place: list[Placement] = field(default_factory=list)
    stop: list[Stop] = field(default_factory=list)
    inplace: list[Allocation] = field(default_factory=list)
    followups: list[Followup] = field(default_factory=list)
    pending_updates: int = 0  # destructive updates held back by max_parallel
    pending_places: int = 0  # new slots left empty while the rollout is paused, failed or canarying
    running: int = 0  # live allocs kept (for counts in tests and eval descriptions)

    @property
    def changes(self) -> int:
        return len(self.place) + len(self.stop) + len(self.inplace) + len(self.followups)


def _free_names(job_id: str, group: str, used: set[int], n: int) -> list[str]:
    """The ``n`` lowest alloc names whose indexes are not in ``used``."""
    names: list[str] = []
    index = 0
    while len(names) < n:
        if index not in used:
            names.append(alloc_name(job_id, group, index))
        index += 1
    return names


def _spec(job: Job, group: TaskGroup) -> dict:
    data = codec.to_wire(group)
    for name in _INPLACE_FIELDS:
        data.pop(name, None)
    return {"group": data, "constraints": codec.to_wire(job.constraints), "datacenters": list(job.datacenters)}


def can_update_in_place(job: Job, group: TaskGroup, old_job: Job | None) -> bool:
    """Whether allocs of ``old_job``'s version of the group may keep running under ``job``."""
    if old_job is None:
        return False
    old_group = next((g for g in old_job.task_groups if g.name == group.name), None)
    return old_group is not None and _spec(old_job, old_group) == _spec(job, group)


def updated_in_place(alloc: Allocation, job: Job, eval_id: str) -> Allocation:
    """A copy of ``alloc`` moved to ``job``'s version by ``eval_id``: an in-place update keeps its id and node."""
    updated = copy.deepcopy(alloc)
    updated.job_version = job.version
    updated.eval_id = eval_id
    return updated


def reconcile_group(
    job: Job | None,
    group: TaskGroup | None,
    group_name: str,
    allocs: list[Allocation],
    nodes: dict[str, Node],
    now: int,
    eval_id: str,
    *,
    versions: dict[int, Job] | None = None,
    limit: int = UNLIMITED,
    rollout: Rollout | None = None,
    skew: int = 0,
) -> GroupPlan:
    """What to do with one task group (``group`` is None when the job no longer has it).

    The steps run in this order because each works on what the one before left:
    sort the allocs, settle the canaries, hold the group to its count, then fill
    fresh slots, place canaries and replace outdated allocs within the budget.
    """
    plan = GroupPlan(group_name)
    job_stopped = job is None or job.stop
    stopped = job_stopped or group is None
    policy = policy_for(job, group) if not stopped and job is not None and group is not None else None
    rollout = rollout or Rollout()
    retry = _Retry(plan, policy, now, eval_id, skew)
    piles = _sort_allocs(plan, job, allocs, nodes, rollout, retry, job_stopped=job_stopped, stopped=stopped)
    if stopped or job is None or group is None:
        return plan
    mine = _settle_canaries(plan, piles, job, rollout)
    fresh = _hold_to_count(plan, piles, job, group.count)
    plan.place.extend(piles.replace)
    destructive = _outdated(plan, piles, job, group, versions or {}, eval_id)
    fresh = _defer_to_rollout(plan, piles.replace, rollout, destructive, fresh)
    _place_fresh(plan, piles, job.id, group.name, fresh)
    if rollout.wanted and destructive and not rollout.paused:
        _place_canaries(plan, piles, mine, destructive, job.id, group.name, rollout.wanted)
        limit = 0  # nothing is replaced before promotion
    _replace_outdated(plan, piles, rollout, destructive, limit)
    plan.running = len(piles.live)
    return plan


@dataclass
class _Piles:
    """The group's allocs as ``_sort_allocs`` finds them; the later steps move them on."""

    live: list[Allocation] = field(default_factory=list)  # running or starting: they count toward the group
    held: list[Allocation] = field(default_factory=list)  # terminal allocs that keep their slot (done, waiting, given up)
    replace: list[Placement] = field(default_factory=list)  # replacements of lost, migrated and rescheduled allocs
    waiting_canaries: list[Allocation] = field(default_factory=list)  # failed canaries that keep their canary slot
    canary_replace: list[Placement] = field(default_factory=list)  # failed canaries rescheduled now, as canaries


@dataclass
class _Retry:
    """What deciding a failed alloc's reschedule needs besides the alloc (its follow-ups go to ``plan``)."""

    plan: GroupPlan
    policy: ReschedulePolicy | None
    now: int
    eval_id: str
    skew: int

    def into(self, alloc: Allocation, waiting: list[Allocation], replace: list[Placement], *, canary: bool = False) -> None:
        """A failed alloc's replacement now goes to ``replace``; while it waits (a follow-up eval at
        its time, unless it has one) or for good, the alloc goes to ``waiting`` and keeps its slot."""
        decision = decide(self.policy, alloc, self.now, self.eval_id, self.skew)
        if decision.decision == "now":
            replace.append(Placement(alloc.name, previous=alloc, reschedule=True, delay=decision.delay, canary=canary))
            return
        if decision.decision == "later" and not alloc.followup_eval_id:
            self.plan.followups.append(Followup(alloc, decision.at))
        waiting.append(alloc)


def _sort_allocs(
    plan: GroupPlan,
    job: Job | None,
    allocs: list[Allocation],
    nodes: dict[str, Node],
    rollout: Rollout,
    retry: _Retry,
    *,
    job_stopped: bool,
    stopped: bool,
) -> _Piles:
    """Sort the group's allocs, oldest first, into piles, so the later steps see each one once.

    Server-terminal allocs are history; what ends now (lost, migrated, stopped with its
    job or group) goes to ``plan.stop``. Client-terminal allocs of a stopped group, an
    already replaced one, and stale canaries hold nothing.
    """
    piles = _Piles()
    for alloc in sorted(allocs, key=lambda a: (a.create_index, a.id)):
        if alloc.server_terminal():
            if not stopped and job is not None and _lost_unreplaced(alloc, job, rollout):
                piles.replace.append(Placement(alloc.name, previous=alloc, lost=True))
            continue
        if alloc.client_terminal():
            if not (stopped or job is None or alloc.next_allocation or alloc.id in rollout.stale):
                _sort_ended(piles, alloc, job, rollout, retry)
            continue
        _sort_live(plan, piles, alloc, nodes.get(alloc.node_id), job_stopped=job_stopped, stopped=stopped)
    return piles


def _lost_unreplaced(alloc: Allocation, job: Job, rollout: Rollout) -> bool:
    """A lost alloc an earlier eval stopped but could not replace (no node had room): still owed a replacement.

    Nomad replaces lost allocs even while a rollout is failed or paused ("to
    avoid odd user experiences"), but only in the eval that finds them lost;
    its blocked eval then sees a stopped alloc and, with the rollout failed,
    fills no slot: the group stays short for good although nodes are back.
    Here the debt survives the stop, bounded by the count like any replacement.
    """
    if alloc.client_status != CLIENT_LOST or alloc.next_allocation or alloc.id in rollout.stale:
        return False
    return not (job.type == "batch" and alloc.job_version != job.version)


def _sort_ended(piles: _Piles, alloc: Allocation, job: Job, rollout: Rollout, retry: _Retry) -> None:
    """A client-terminal alloc of a group that runs on: whether it keeps its slot, is replaced, or holds nothing."""
    batch = job.type == "batch"
    if batch and alloc.job_version != job.version:
        return  # Nomad's filterOldTerminalAllocs: a new version of a batch job runs again
    if rollout.beside(alloc, job):
        # An unpromoted canary: outside the count. A failed one of the rollout
        # under way is rescheduled as a canary; an abandoned rollout's holds nothing.
        if rollout.wanted and alloc.client_status == CLIENT_FAILED:
            retry.into(alloc, piles.waiting_canaries, piles.canary_replace, canary=True)
        return
    if alloc.client_status == CLIENT_COMPLETE:
        if batch:
            piles.held.append(alloc)
        return
    if alloc.client_status == CLIENT_FAILED:
        if rollout.failed and alloc.deployment_id == rollout.failed:
            piles.held.append(alloc)  # Nomad: a failed rollout's allocs are not rescheduled
        else:
            retry.into(alloc, piles.held, piles.replace)
        return
    if alloc.client_status == CLIENT_LOST:
        piles.replace.append(Placement(alloc.name, previous=alloc, lost=True))


def _sort_live(plan: GroupPlan, piles: _Piles, alloc: Allocation, node: Node | None, *, job_stopped: bool, stopped: bool) -> None:
    """A live alloc: lost with its node (replaced unless the group stops), stopped with its job
    or group, migrated once the drainer marked it, or kept running."""
    if node is None or node.status == NODE_DOWN:
        plan.stop.append(Stop(alloc, STOP_LOST, CLIENT_LOST))
        if not stopped:
            piles.replace.append(Placement(alloc.name, previous=alloc, lost=True))
    elif stopped:
        plan.stop.append(Stop(alloc, STOP_JOB if job_stopped else STOP_GROUP))
    elif alloc.desired_transition.migrate:  # the drainer's pick: it moves even if the drain ended (Nomad's filterByTainted)
        plan.stop.append(Stop(alloc, STOP_MIGRATE))
        piles.replace.append(Placement(alloc.name, previous=alloc))
    else:
        piles.live.append(alloc)


def _settle_canaries(plan: GroupPlan, piles: _Piles, job: Job, rollout: Rollout) -> list[Allocation]:
    """Stop the canaries that go and keep the rest out of the count; the current rollout's canaries that stand.

    Older rollouts' unpromoted canaries and an abandoned rollout's stop. While a
    rollout awaits promotion its canaries (and its failed ones, waiting or placed
    again now) run beside the group; once promoted, each old alloc whose name a
    canary took stops.
    """
    for alloc in [a for a in piles.live if a.id in rollout.stale]:
        plan.stop.append(Stop(alloc, STOP_CANARY_STALE))
        piles.live.remove(alloc)
    mine = [a for a in piles.live if is_canary(a, job)]
    if rollout.abandoned:
        for alloc in mine:
            plan.stop.append(Stop(alloc, STOP_CANARY_FAILED))
        piles.live = [a for a in piles.live if a not in mine]
        return []
    if rollout.wanted:
        piles.live = [a for a in piles.live if a not in mine]  # beside the group, not part of its count
        plan.place.extend(piles.canary_replace)  # as failed allocs, even while paused
        return mine + piles.waiting_canaries
    if rollout.promoted and mine:
        names = {a.name for a in mine}
        for alloc in [a for a in piles.live if a.job_version != job.version and a.name in names]:
            plan.stop.append(Stop(alloc, STOP_CANARY_REPLACED))
            piles.live.remove(alloc)
    return mine


def _hold_to_count(plan: GroupPlan, piles: _Piles, job: Job, count: int) -> int:
    """Hold the group to ``count``; how many fresh slots are left to fill.

    A group short of its count replaces what it can within it; a full one replaces
    nothing and stops its excess (old versions first, then the highest name index).
    """
    occupied = len(piles.live) + len(piles.held)
    if occupied < count:
        piles.replace = piles.replace[: count - occupied]
        return count - occupied - len(piles.replace)
    piles.replace = []
    excess = occupied - count
    if excess > 0:
        victims = sorted(piles.live, key=lambda a: (a.job_version == job.version, -name_index(a.name), a.id))[:excess]
        gone = {a.id for a in victims}
        for alloc in victims:
            plan.stop.append(Stop(alloc, STOP_EXCESS))
        piles.live = [a for a in piles.live if a.id not in gone]
    return 0


def _outdated(
    plan: GroupPlan, piles: _Piles, job: Job, group: TaskGroup, versions: dict[int, Job], eval_id: str
) -> list[Allocation]:
    """Update older versions' allocs in place where the spec allows; the rest, to replace destructively.

    As Nomad: a failed service alloc of an older version that keeps its slot
    (waiting for its reschedule delay, or out of attempts) is updated like a
    live one, so a new version replaces it now, first; a crash-looping
    service is fixed by a new version at once, not after its backoff.
    """
    destructive: list[Allocation] = []
    if job.type != "batch":
        for alloc in sorted(piles.held, key=lambda a: (name_index(a.name), a.id)):
            if (
                alloc.client_status == CLIENT_FAILED
                and alloc.job_version != job.version
                and not can_update_in_place(job, group, versions.get(alloc.job_version))
            ):
                destructive.append(alloc)
    for alloc in sorted(piles.live, key=lambda a: (name_index(a.name), a.id)):
        if alloc.job_version == job.version:
            continue
        if can_update_in_place(job, group, versions.get(alloc.job_version)):
            plan.inplace.append(updated_in_place(alloc, job, eval_id))
        else:
            destructive.append(alloc)
    return destructive


def _defer_to_rollout(plan: GroupPlan, replace: list[Placement], rollout: Rollout, destructive: list[Allocation], fresh: int) -> int:
    """How many of ``fresh`` slots to fill now, so a rollout that is not ready places no untested version.

    While canaries test a new version, replacements of lost, failed or migrated old
    allocs run the last settled version (Nomad's downgradeNonCanary). While the
    rollout canaries, is paused or failed, only those are placed (Nomad's
    deploymentPlaceReady): fresh slots wait in ``plan.pending_places``.
    """
    canarying = rollout.wanted > 0 and bool(destructive or rollout.active)
    for p in replace:
        p.downgrade = canarying
    if canarying or rollout.paused or rollout.failed:
        plan.pending_places = fresh
        return 0
    return fresh


def _place_fresh(plan: GroupPlan, piles: _Piles, job_id: str, group_name: str, fresh: int) -> None:
    """Fill ``fresh`` empty slots under the lowest names no alloc or replacement holds."""
    used = {name_index(a.name) for a in piles.live + piles.held} | {name_index(p.name) for p in piles.replace}
    for name in _free_names(job_id, group_name, used, fresh):
        plan.place.append(Placement(name))


def _place_canaries(
    plan: GroupPlan, piles: _Piles, mine: list[Allocation], destructive: list[Allocation], job_id: str, group_name: str, wanted: int
) -> None:
    """Place the canaries the rollout still lacks (Nomad's NextCanaries), under names nothing else holds.

    They take the names of allocs to replace first, then free ones, so a group
    runs all the canaries it asks for even when it has fewer allocs to replace.
    """
    taken = {a.name for a in mine} | {p.name for p in piles.canary_replace}
    want = max(0, wanted - (len(mine) + len(piles.canary_replace)))
    names = [a.name for a in destructive if a.name not in taken][:want]
    used = (
        {name_index(a.name) for a in piles.live + piles.held}
        | {name_index(n) for n in taken | set(names)}
        | {name_index(p.name) for p in plan.place}
    )
    names += _free_names(job_id, group_name, used, want - len(names))
    for name in names:
        plan.place.append(Placement(name, canary=True))


def _replace_outdated(plan: GroupPlan, piles: _Piles, rollout: Rollout, destructive: list[Allocation], limit: int) -> None:
    """Stop and replace as many outdated allocs as the budget allows; the rest wait (``pending_updates``).

    Nomad's budget: what this plan places takes max_parallel slots first, and an
    unhealthy alloc of the rollout under way stops it (its progress deadline
    decides). What is replaced now needs no later reschedule: its follow-up goes.
    """
    if any(rollout.stalled_by(a) for a in piles.live + piles.held):
        limit = 0
    limit -= sum(1 for p in plan.place if not p.canary)
    allowed = max(0, min(limit, len(destructive)))
    for alloc in destructive[:allowed]:
        plan.stop.append(Stop(alloc, STOP_UPDATE))
        plan.place.append(Placement(alloc.name, previous=alloc, destructive=True))
    replaced = {a.id for a in destructive[:allowed]}
    plan.followups = [f for f in plan.followups if f.alloc.id not in replaced]
    plan.pending_updates = len(destructive) - allowed
