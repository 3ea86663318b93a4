"""Garbage-collection rules and reap planning (Nomad's core scheduler, after v1.9.2).

Everything here is pure: a function of a ``StateReader`` snapshot, ``now``
and the thresholds (integer nanoseconds). The leader calls the planners and
puts the resulting ``Reap`` lists on the log; ``fsm.apply.reaps`` calls
``alloc_reapable`` again at apply time, because an alloc's eligibility also
depends on its job, which may change between the leader's read and the
reap's apply (a job re-registered, a reschedule policy changed) without
changing the alloc's own ``modify_index``.

A planner reads only the GC-mark index up to ``now - threshold`` and the
objects those marks name (plus their children), so a sweep's cost grows
with the garbage, not with the live state. A mark is written when an object
becomes eligible, so the mark time is never later than the time the rules
compare (eval/alloc/deployment modify time, node status time, token
expiry); scanning marks up to the cutoff therefore misses nothing the rules
would accept. Jobs are the one exception Nomad's rule allows: a job is
compared by submit time but marked when it became dead, so a job is
collected no earlier than ``threshold`` after it died, which is the more
conservative of the two.

Rules (``shared/reference/nomad-gc.md``):

- alloc: terminal, not running on the client, modified at or before the
  cutoff, and one of: job gone / stopped / dead; desired stop; client status
  not failed; failed with no reschedule left. A failed alloc that may still
  be rescheduled is kept.
- eval: terminal, modified at or before its cutoff (batch evals use the
  batch threshold) and every alloc of it eligible. For a batch eval whose job
  is alive (exists and is not dead-and-stopped; the job collector also
  accepts plain dead), only terminal allocs of older job versions may go, and
  the eval only when all its allocs may.
- job: periodic/parameterized parents only when stopped; otherwise dead and
  (stopped or batch), as Nomad's ``jobIsGCable``; submitted at or before the
  cutoff; every eval eligible under the job cutoff (and every alloc of the
  job eligible, since the reap cascades to all of them).
- deployment: not active, modified at or before the cutoff, every alloc that
  references it terminal.
- node: down, status updated at or before the cutoff, every alloc on it
  terminal. Forced GC runs it last.
- ACL token: expired at ``now`` and created at or before the cutoff; at most
  ``token_limit`` per run.

One deliberate addition: the eval collector never removes the last eval of
a job that is not stopped when that would leave the job with no evals and
no allocs. Our FSM derives a job with no history as ``pending`` (Nomad keeps
it ``dead`` through its evalDelete flag), which would unmark it and leak it
forever; leaving one eval keeps it ``dead`` until the job collector takes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from fsm.keys import SEP, from_u64, key, prefix
from fsm.messages import Reap
from fsm.store import StateReader
from fsm.structs import (
    CLIENT_FAILED,
    CLIENT_RUNNING,
    DESIRED_STOP,
    EVAL_TERMINAL,
    HOUR,
    JOB_DEAD,
    NODE_DOWN,
    ACLToken,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    Node,
    ReschedulePolicy,
)
from fsm.writer import GC_DEPLOYMENT, GC_EVAL, GC_JOB, GC_NODE, GC_TOKEN

# The order of a forced GC: jobs first (their cascade takes most evals and
# allocs), node GC last so that the allocs that kept nodes are gone (Nomad's
# forceGC order).
FORCE_ORDER = (GC_JOB, GC_EVAL, GC_DEPLOYMENT, GC_TOKEN, GC_NODE)

TOKEN_LIMIT = 4096  # Nomad's ACLMaxExpiredBatchSize: expired tokens per run


@dataclass(frozen=True)
class Thresholds:
    """How long (ns) an object must have been eligible before it is collected."""

    eval: int = HOUR
    batch_eval: int = 24 * HOUR
    job: int = 4 * HOUR
    deployment: int = HOUR
    node: int = 24 * HOUR
    token: int = HOUR

    @classmethod
    def zero(cls) -> Thresholds:
        """Forced GC: every time threshold is zero, every other condition stays."""
        return cls(eval=0, batch_eval=0, job=0, deployment=0, node=0, token=0)


# -- the rules ------------------------------------------------------------------
def _group_policy(job: Job, group: str) -> ReschedulePolicy | None:
    for tg in job.task_groups:
        if tg.name == group:
            return tg.reschedule_policy
    return None


def reschedule_pending(alloc: Allocation, job: Job, now: int) -> bool:
    """A failed alloc that its group's reschedule policy may still replace (Nomad's tail of allocGCEligible)."""
    policy = _group_policy(job, alloc.task_group)
    if policy is None or (not policy.unlimited and policy.attempts == 0):
        return False
    if alloc.next_allocation:  # already replaced: the tracker moved on
        return False
    if policy.unlimited:
        return True
    events = alloc.reschedule_tracker.events if alloc.reschedule_tracker else []
    if not events:  # no reschedule attempted yet
        return True
    return now - events[-1].reschedule_time <= policy.interval


def alloc_collectable(alloc: Allocation, job: Job | None, now: int) -> bool:
    """Every condition of Nomad's allocGCEligible except the age."""
    if not alloc.terminal() or alloc.client_status == CLIENT_RUNNING:
        return False
    if job is None or job.stop or job.status == JOB_DEAD:
        return True
    if alloc.desired_status == DESIRED_STOP:
        return True
    if alloc.client_status != CLIENT_FAILED:
        return True
    return not reschedule_pending(alloc, job, now)


def alloc_gc_eligible(alloc: Allocation, job: Job | None, now: int, cutoff: int) -> bool:
    """Nomad's allocGCEligible with times: collectable and modified at or before ``cutoff``."""
    return alloc.modify_time <= cutoff and alloc_collectable(alloc, job, now)


def older_version_alloc(alloc: Allocation, job: Job) -> bool:
    """A terminal alloc placed before the job's current version (may go while a batch job lives)."""
    return (
        alloc.create_index < job.job_modify_index
        and alloc.terminal()
        and alloc.client_status != CLIENT_RUNNING
    )


def batch_job_alive(eval_type: str, job: Job | None, allow_batch: bool) -> bool:
    """Whether a batch eval's job still protects its current allocs (Nomad's ``!collect``)."""
    if eval_type != "batch" or job is None:
        return False
    return not (job.status == JOB_DEAD and (job.stop or allow_batch))


def alloc_reapable(alloc: Allocation, job: Job | None, eval_type: str, now: int) -> bool:
    """What apply re-checks before an eval reap deletes ``alloc`` (no ages: those are the leader's)."""
    if batch_job_alive(eval_type, job, allow_batch=False):
        assert job is not None
        return older_version_alloc(alloc, job)
    return alloc_collectable(alloc, job, now)


def eval_gc(
    ev: Evaluation,
    job: Job | None,
    allocs: list[Allocation],
    now: int,
    cutoff: int,
    *,
    allow_batch: bool,
) -> tuple[bool, list[Allocation]]:
    """Nomad's gcEval: (may the eval go, which of its allocs may go)."""
    if ev.status not in EVAL_TERMINAL or ev.modify_time > cutoff:
        return False, []
    if batch_job_alive(ev.type, job, allow_batch):
        assert job is not None
        old = [a for a in allocs if older_version_alloc(a, job) and a.modify_time <= cutoff]
        return len(old) == len(allocs), old
    ok = [a for a in allocs if alloc_gc_eligible(a, job, now, cutoff)]
    return len(ok) == len(allocs), ok


def job_gc_candidate(job: Job) -> bool:
    """Nomad's jobIsGCable: which jobs the job collector considers at all."""
    if job.periodic or job.parameterized:
        return job.stop
    if job.status != JOB_DEAD:
        return False
    return job.stop or job.type == "batch"


def deployment_gc_eligible(dep: Deployment, allocs: Iterable[Allocation], cutoff: int) -> bool:
    return not dep.active() and dep.modify_time <= cutoff and all(a.terminal() for a in allocs)


def node_gc_eligible(node: Node, live_allocs: int, cutoff: int) -> bool:
    return node.status == NODE_DOWN and node.status_updated_at <= cutoff and live_allocs == 0


def token_gc_eligible(token: ACLToken, now: int, cutoff: int) -> bool:
    return token.expired(now) and token.create_time <= cutoff


# -- plans ------------------------------------------------------------------------
@dataclass
class EvalUnit:
    """One eval to reap with its allocs, or (eval None) allocs reaped while their eval stays."""

    job_id: str
    eval: Reap | None
    allocs: list[Reap] = field(default_factory=list)

    def ids(self) -> int:
        return len(self.allocs) + (1 if self.eval is not None else 0)


@dataclass
class Cascade:
    """What reaping one job also removes (the FSM deletes them with the job)."""

    evals: list[str] = field(default_factory=list)
    allocs: list[str] = field(default_factory=list)
    deployments: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """What one collector would reap. ``reads`` counts marks scanned plus objects loaded."""

    kind: str
    now: int
    cutoff: int
    reaps: list[Reap] = field(default_factory=list)  # jobs, deployments, nodes or tokens
    units: list[EvalUnit] = field(default_factory=list)  # evals (and their allocs)
    cascade: dict[str, Cascade] = field(default_factory=dict)  # job id -> cascade
    marks: int = 0
    reads: int = 0
    resume: tuple[int, str] | None = None  # the last mark scanned, when a window's limit cut the scan


    def empty(self) -> bool:
        return not self.reaps and not self.units

    def ids(self) -> dict[str, list[str]]:
        """Every object id this plan removes, by table name."""
        out: dict[str, list[str]] = defaultdict(list)
        if self.kind == GC_EVAL:
            for unit in self.units:
                if unit.eval is not None:
                    out["evals"].append(unit.eval.id)
                out["allocs"].extend(r.id for r in unit.allocs)
        else:
            out[TABLE_OF[self.kind]].extend(r.id for r in self.reaps)
            for reap in self.reaps:
                c = self.cascade.get(reap.id)
                if c is not None:
                    out["evals"].extend(c.evals)
                    out["allocs"].extend(c.allocs)
                    out["deployments"].extend(c.deployments)
        return dict(out)

    def counts(self) -> dict[str, int]:
        return {table: len(ids) for table, ids in self.ids().items()}


TABLE_OF = {
    GC_JOB: "jobs",
    GC_EVAL: "evals",
    GC_DEPLOYMENT: "deployments",
    GC_NODE: "nodes",
    GC_TOKEN: "acl_tokens",
}


@dataclass
class Exclude:
    """Objects an earlier collector of the same (dry) run already takes."""

    jobs: set[str] = field(default_factory=set)
    evals: set[str] = field(default_factory=set)
    allocs: set[str] = field(default_factory=set)
    deployments: set[str] = field(default_factory=set)

    def add(self, plan: Plan) -> None:
        for table, ids in plan.ids().items():
            target = getattr(self, table, None)
            if target is not None:
                target.update(ids)


@dataclass(frozen=True)
class Window:
    """Which marks one plan scans: those strictly after ``start``, at most ``limit`` of them.

    The leader plans a large sweep in windows, proposing each window's reaps
    before planning the next, so that no single plan holds a core (and the
    GIL) for long and the first reaps commit early.
    """

    start: tuple[int, str] | None = None
    limit: int | None = None


def _marks(r: StateReader, kind: str, until: int, plan: Plan, window: Window | None) -> list[str]:
    """Ids of ``kind`` marked at or before ``until`` (in mark order), within ``window``."""
    if window is None or (window.start is None and window.limit is None):
        found = r.gc_marks(kind, until)
    else:
        found = []
        head = prefix(kind)
        seek = head if window.start is None else key(kind, window.start[0], window.start[1]) + SEP
        cursor = r.txn.cursor(db=r.dbs["gc_marks"])
        if cursor.set_range(seek):
            for k, _ in cursor:
                if not k.startswith(head):
                    break
                since = from_u64(k[len(head) : len(head) + 8])
                if since > until:
                    break
                found.append((since, k[len(head) + 9 :].decode()))
                if window.limit is not None and len(found) >= window.limit:
                    plan.resume = found[-1]
                    break
    plan.marks += len(found)
    return [obj_id for _, obj_id in found]


def plan_jobs(r: StateReader, now: int, th: Thresholds, window: Window | None = None) -> Plan:
    cutoff = now - th.job
    plan = Plan(GC_JOB, now, cutoff)
    for job_id in _marks(r, GC_JOB, cutoff, plan, window):
        job = r.job(job_id)
        plan.reads += 1
        if job is None or not job_gc_candidate(job) or job.submit_time > cutoff:
            continue
        evals = r.evals_by_job(job_id)
        allocs = r.allocs_by_job(job_id)
        plan.reads += len(evals) + len(allocs)
        by_eval: dict[str, list[Allocation]] = defaultdict(list)
        for a in allocs:
            by_eval[a.eval_id].append(a)
        ok = all(eval_gc(ev, job, by_eval.get(ev.id, []), now, cutoff, allow_batch=True)[0] for ev in evals)
        # The reap cascades to every alloc of the job, including any whose eval is elsewhere.
        ok = ok and all(alloc_gc_eligible(a, job, now, cutoff) for a in allocs)
        if not ok:
            continue
        deps = r.deployments_by_job(job_id)
        plan.reads += len(deps)
        if any(d.active() for d in deps):
            continue
        plan.reaps.append(Reap(id=job.id, modify_index=job.modify_index))
        plan.cascade[job.id] = Cascade(
            evals=[e.id for e in evals], allocs=[a.id for a in allocs], deployments=[d.id for d in deps]
        )
    return plan


def plan_evals(
    r: StateReader, now: int, th: Thresholds, exclude: Exclude | None = None, window: Window | None = None
) -> Plan:
    cutoff, batch_cutoff = now - th.eval, now - th.batch_eval
    plan = Plan(GC_EVAL, now, max(cutoff, batch_cutoff))
    exclude = exclude or Exclude()
    jobs: dict[str, Job | None] = {}
    for eval_id in _marks(r, GC_EVAL, plan.cutoff, plan, window):
        if eval_id in exclude.evals:
            continue
        ev = r.eval(eval_id)
        plan.reads += 1
        if ev is None or ev.job_id in exclude.jobs:
            continue
        if ev.job_id not in jobs:
            jobs[ev.job_id] = r.job(ev.job_id)
            plan.reads += 1
        job = jobs[ev.job_id]
        allocs = [a for a in r.allocs_by_eval(ev.id) if a.id not in exclude.allocs]
        plan.reads += len(allocs)
        gc, gone = eval_gc(
            ev, job, allocs, now, batch_cutoff if ev.type == "batch" else cutoff, allow_batch=False
        )
        if not gc and not gone:
            continue
        unit = EvalUnit(
            job_id=ev.job_id,
            eval=Reap(id=ev.id, modify_index=ev.modify_index) if gc else None,
            allocs=[Reap(id=a.id, modify_index=a.modify_index) for a in gone],
        )
        plan.units.append(unit)
    _keep_last_history(r, plan, jobs)
    return plan


def _keep_last_history(r: StateReader, plan: Plan, jobs: dict[str, Job | None]) -> None:
    """Never empty a job that is not stopped of every eval and alloc (see the module docstring)."""
    units_of: dict[str, list[EvalUnit]] = defaultdict(list)
    for unit in plan.units:
        units_of[unit.job_id].append(unit)
    for job_id, units in units_of.items():
        job = jobs.get(job_id)
        if job is None or job.stop:
            continue
        reaped_evals = [u for u in units if u.eval is not None]
        if not reaped_evals:
            continue
        if len(reaped_evals) < len(r.eval_ids_by_job(job_id)):
            continue
        planned_allocs = {a.id for u in units for a in u.allocs}
        if not planned_allocs.issuperset(r.alloc_ids_by_job(job_id)):
            continue
        newest = max(reaped_evals, key=lambda u: _create_index(r, u.eval.id if u.eval else ""))
        newest.eval = None  # its allocs may still go; the eval stays as the job's history
    plan.units = [u for u in plan.units if u.ids()]


def _create_index(r: StateReader, eval_id: str) -> int:
    ev = r.eval(eval_id)
    return ev.create_index if ev is not None else 0


def plan_deployments(
    r: StateReader, now: int, th: Thresholds, exclude: Exclude | None = None, window: Window | None = None
) -> Plan:
    cutoff = now - th.deployment
    plan = Plan(GC_DEPLOYMENT, now, cutoff)
    exclude = exclude or Exclude()
    for dep_id in _marks(r, GC_DEPLOYMENT, cutoff, plan, window):
        if dep_id in exclude.deployments:
            continue
        dep = r.deployment(dep_id)
        plan.reads += 1
        if dep is None or dep.job_id in exclude.jobs:
            continue
        allocs = r.allocs_by_deployment(dep_id)
        plan.reads += len(allocs)
        if deployment_gc_eligible(dep, allocs, cutoff):
            plan.reaps.append(Reap(id=dep.id, modify_index=dep.modify_index))
    return plan


def plan_nodes(r: StateReader, now: int, th: Thresholds, window: Window | None = None) -> Plan:
    cutoff = now - th.node
    plan = Plan(GC_NODE, now, cutoff)
    for node_id in _marks(r, GC_NODE, cutoff, plan, window):
        node = r.node(node_id)
        plan.reads += 1
        if node is None:
            continue
        live = len(r.allocs_by_node(node_id, terminal=False))
        plan.reads += live
        if node_gc_eligible(node, live, cutoff):
            plan.reaps.append(Reap(id=node.id, modify_index=node.modify_index))
    return plan


def plan_tokens(
    r: StateReader, now: int, th: Thresholds, limit: int = TOKEN_LIMIT, window: Window | None = None
) -> Plan:
    """Expired tokens (marks are keyed by expiry, so scan up to ``now``), at most ``limit``."""
    cutoff = now - th.token
    plan = Plan(GC_TOKEN, now, cutoff)
    for accessor in _marks(r, GC_TOKEN, now, plan, window):
        token = r.token(accessor)
        plan.reads += 1
        if token is not None and token_gc_eligible(token, now, cutoff):
            plan.reaps.append(Reap(id=token.accessor_id, modify_index=token.modify_index))
            if len(plan.reaps) >= limit:
                plan.resume = None  # the per-run limit is reached: this run is done
                break
    return plan


def plan_kind(
    r: StateReader,
    kind: str,
    now: int,
    th: Thresholds,
    *,
    token_limit: int = TOKEN_LIMIT,
    exclude: Exclude | None = None,
    window: Window | None = None,
) -> Plan:
    """The plan of one collector (``kind`` is one of ``fsm.writer.GC_KINDS``)."""
    if kind == GC_JOB:
        return plan_jobs(r, now, th, window)
    if kind == GC_EVAL:
        return plan_evals(r, now, th, exclude, window)
    if kind == GC_DEPLOYMENT:
        return plan_deployments(r, now, th, exclude, window)
    if kind == GC_NODE:
        return plan_nodes(r, now, th, window)
    if kind == GC_TOKEN:
        return plan_tokens(r, now, th, token_limit, window)
    raise ValueError(f"unknown GC kind {kind!r}")


def plan_all(
    r: StateReader,
    now: int,
    th: Thresholds,
    *,
    kinds: Iterable[str] = FORCE_ORDER,
    token_limit: int = TOKEN_LIMIT,
) -> list[Plan]:
    """Every collector in order on one snapshot, each skipping what an earlier one takes (dry runs)."""
    exclude = Exclude()
    plans = []
    for kind in kinds:
        plan = plan_kind(r, kind, now, th, token_limit=token_limit, exclude=exclude)
        exclude.add(plan)
        plans.append(plan)
    return plans
