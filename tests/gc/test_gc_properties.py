"""Property tests of the GC rules against states built through the real FSM.

Hypothesis draws a world (nodes, jobs of both types with reschedule policies,
versions, evals, allocs in every desired/client status, reschedule trackers,
deployments, stops, ACL tokens with expiries) and the gaps between entries;
the world is applied to an FSM entry by entry, with the leader's clock moving
by the drawn gaps. Then, for a drawn ``now`` and drawn thresholds (defaults,
all zero, or arbitrary), the collectors run in the forced order, each planned
on the state the previous one left, with their reaps split into small entries.

Checked for every example:

* what was removed equals an independent reference written from
  ``shared/reference/nomad-gc.md`` (which also pins down that scanning the
  GC-mark index up to the cutoff misses nothing the rules accept), and equals
  the dry run (``plan_all`` on the state before);
* never collected: running/pending jobs, non-terminal evals/allocs, allocs
  running on a client, failed allocs that may still be rescheduled, active
  deployments, nodes that are not down, unexpired tokens;
* after GC: no orphan (every alloc's eval and job, every eval's, deployment's,
  version's and summary's job exist);
* replicas converge: replaying the whole log (build + reaps) into a fresh FSM
  gives the same digest; applying the same reaps again deletes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.gc import FORCE_ORDER, Thresholds, plan_all
from fsm.keys import from_u64, key
from fsm.structs import (
    HOUR,
    MINUTE,
    SECOND,
    DeploymentState,
    Node,
    RescheduleEvent,
    ReschedulePolicy,
    RescheduleTracker,
)
from fsm.structs import Deployment as DeploymentRec
from node.leader.gc import Limits, reap_bodies
from tests.gc.support import (
    GCHarness,
    alloc,
    check_no_orphans,
    collect,
    evaluation,
    ids_of,
    job,
    token,
)

GAPS = [SECOND, 10 * MINUTE, HOUR, 5 * HOUR, 30 * HOUR]
POLICIES = [
    None,
    ReschedulePolicy(attempts=0, interval=0, unlimited=False),
    ReschedulePolicy(unlimited=True),
    ReschedulePolicy(attempts=2, interval=HOUR, delay=5 * SECOND, unlimited=False),
]
TERMINAL_CLIENT = ("complete", "failed", "lost")


@dataclass
class AllocSpec:
    node: int
    desired: str
    client: str
    next_alloc: bool
    tracker_age: int | None
    in_deployment: bool


@dataclass
class EvalSpec:
    status: str
    allocs: list[AllocSpec]
    new_version: bool


@dataclass
class JobSpec:
    type: str
    periodic: bool
    policy: ReschedulePolicy | None
    evals: list[EvalSpec]
    stop: str | None
    deployment: str | None


@dataclass
class World:
    nodes: list[bool]  # down at the end?
    jobs: list[JobSpec]
    tokens: list[int | None]  # expiry relative to creation
    gaps: list[int]
    now_gap: int
    thresholds: Thresholds
    window: int | None = None  # GC marks per plan (the leader's windows)


alloc_specs = st.builds(
    AllocSpec,
    node=st.integers(0, 2),
    desired=st.sampled_from(["run", "run", "stop", "evict"]),
    client=st.sampled_from(
        ["pending", "running", "complete", "complete", "failed", "failed", "lost"]
    ),
    next_alloc=st.booleans(),
    tracker_age=st.none() | st.sampled_from(GAPS),
    in_deployment=st.booleans(),
)
eval_specs = st.builds(
    EvalSpec,
    status=st.sampled_from(["pending", "blocked", "complete", "complete", "failed", "canceled"]),
    allocs=st.lists(alloc_specs, max_size=3),
    new_version=st.booleans(),
)
job_specs = st.builds(
    JobSpec,
    type=st.sampled_from(["service", "batch"]),
    periodic=st.sampled_from([False, False, False, True]),
    policy=st.sampled_from(POLICIES),
    evals=st.lists(eval_specs, min_size=1, max_size=3),
    stop=st.none() | st.sampled_from(["pending", "complete", "complete"]),
    deployment=st.none() | st.sampled_from(["running", "successful", "failed", "cancelled"]),
)
threshold_values = st.sampled_from([0, *GAPS])
thresholds = st.one_of(
    st.just(Thresholds()),
    st.just(Thresholds.zero()),
    st.just(Thresholds.zero()),
    st.builds(
        Thresholds,
        eval=threshold_values,
        batch_eval=threshold_values,
        job=threshold_values,
        deployment=threshold_values,
        node=threshold_values,
        token=threshold_values,
    ),
)
worlds = st.builds(
    World,
    nodes=st.lists(st.booleans(), min_size=1, max_size=3),
    jobs=st.lists(job_specs, max_size=4),
    tokens=st.lists(st.none() | st.sampled_from([-HOUR, SECOND, 2 * HOUR, 40 * HOUR]), max_size=3),
    gaps=st.lists(st.sampled_from(GAPS), min_size=5, max_size=5),
    now_gap=st.sampled_from([0, *GAPS, 100 * HOUR]),
    thresholds=thresholds,
    window=st.sampled_from([None, None, 1, 3]),
)


# -- building the world through the FSM ------------------------------------------
class Clock:
    def __init__(self, gaps: list[int]) -> None:
        self.gaps, self.i = gaps, 0

    def step(self) -> int:
        self.i += 1
        return self.gaps[self.i % len(self.gaps)]


def build(h: GCHarness, w: World) -> None:
    clock = Clock(w.gaps)
    nodes = [f"n{i}" for i in range(len(w.nodes))]
    for node_id in nodes:
        h.apply(m.NodeRegister(node=Node(id=node_id, status="ready")))
    for j, spec in enumerate(w.jobs):
        jid = f"j{j}"
        kind = spec.type
        base = job(jid, kind, policy=spec.policy, periodic=spec.periodic)
        dep_id = f"{jid}-d"
        if spec.periodic:
            h.apply(m.JobRegister(job=base), step=clock.step())
        else:
            for k, es in enumerate(spec.evals):
                eid = f"{jid}-e{k}"
                ev = evaluation(eid, jid, kind)
                if k == 0 or es.new_version:
                    spec_k = job(jid, kind, policy=spec.policy, meta={"v": str(k)})
                    h.apply(m.JobRegister(job=spec_k, eval=ev), step=clock.step())
                else:
                    h.apply(m.EvalUpsert(evals=[ev]), step=clock.step())
                if k == 0 and spec.deployment is not None:
                    dep = DeploymentRec(
                        id=dep_id, job_id=jid, task_groups={"g": DeploymentState(desired_total=1)}
                    )
                    h.apply(m.DeploymentUpsert(deployment=dep))
                placed = []
                for i, a in enumerate(es.allocs):
                    tracker = None
                    if a.tracker_age is not None:
                        tracker = RescheduleTracker(
                            events=[
                                RescheduleEvent(
                                    reschedule_time=h.time - a.tracker_age,
                                    prev_alloc_id="prev",
                                    prev_node_id="n0",
                                    delay=5 * SECOND,
                                )
                            ]
                        )
                    placed.append(
                        alloc(
                            f"{eid}-a{i}",
                            eid,
                            jid,
                            nodes[a.node % len(nodes)],
                            desired_status=a.desired,
                            next_allocation="next" if a.next_alloc else "",
                            reschedule_tracker=tracker,
                            deployment_id=dep_id
                            if a.in_deployment and spec.deployment is not None
                            else "",
                        )
                    )
                if placed:
                    h.apply(
                        m.PlanApply(eval_id=eid, job_id=jid, allocs_to_place=placed),
                        step=clock.step(),
                    )
                h.apply(
                    m.EvalUpsert(evals=[evaluation(eid, jid, kind, es.status)]), step=clock.step()
                )
                updates = [
                    m.AllocClientState(id=p.id, client_status=a.client)
                    for p, a in zip(placed, es.allocs, strict=True)
                    if a.client != "pending"
                ]
                if updates:
                    h.apply(m.AllocClientUpdate(allocs=updates), step=clock.step())
        if spec.deployment is not None and not spec.periodic:
            h.apply(
                m.DeploymentStatusUpdate(deployment_id=dep_id, status=spec.deployment),
                step=clock.step(),
            )
        if spec.stop is not None:
            stop_eval = evaluation(f"{jid}-stop", jid, kind)
            h.apply(m.JobDeregister(job_id=jid, eval=stop_eval), step=clock.step())
            h.apply(
                m.EvalUpsert(evals=[evaluation(stop_eval.id, jid, kind, spec.stop)]),
                step=clock.step(),
            )
    for t, expiry in enumerate(w.tokens):
        created = h.time + clock.step()
        exp = 0 if expiry is None else created + expiry
        h.apply(m.ACLTokenUpsert(tokens=[token(f"t{t}", exp)]), at=created)
    for node_id, down in zip(nodes, w.nodes, strict=True):
        if down:
            h.apply(m.NodeUpdateStatus(node_id=node_id, status="down"), step=clock.step())


# -- the reference, written from nomad-gc.md --------------------------------------
def alloc_terminal(a) -> bool:
    return a.desired_status in ("stop", "evict") or a.client_status in TERMINAL_CLIENT


def may_reschedule(a, jb, now) -> bool:
    policy = next((g.reschedule_policy for g in jb.task_groups if g.name == a.task_group), None)
    if policy is None or a.next_allocation:
        return False
    if policy.unlimited:
        return True
    if policy.attempts == 0:
        return False
    events = a.reschedule_tracker.events if a.reschedule_tracker else []
    return not events or now - events[-1].reschedule_time <= policy.interval


def alloc_ok(a, jb, now, cutoff) -> bool:
    if not alloc_terminal(a) or a.client_status == "running" or a.modify_time > cutoff:
        return False
    if jb is None or jb.stop or jb.status == "dead":
        return True
    if a.desired_status == "stop" or a.client_status != "failed":
        return True
    return not may_reschedule(a, jb, now)


def eval_ok(ev, jb, allocs, now, cutoff, allow_batch) -> tuple[bool, set[str]]:
    if ev.status not in ("complete", "failed", "canceled") or ev.modify_time > cutoff:
        return False, set()
    if (
        ev.type == "batch"
        and jb is not None
        and not (jb.status == "dead" and (jb.stop or allow_batch))
    ):
        ok = {
            a.id
            for a in allocs
            if a.create_index < jb.job_modify_index
            and alloc_terminal(a)
            and a.client_status != "running"
            and a.modify_time <= cutoff
        }
    else:
        ok = {a.id for a in allocs if alloc_ok(a, jb, now, cutoff)}
    return len(ok) == len(allocs), ok


def reference(r, now: int, th: Thresholds) -> dict[str, set[str]]:
    jobs = {j.id: j for j in r.jobs()}
    evals = {e.id: e for e in r.evals()}
    allocs = {a.id: a for a in r.allocs()}
    deps = {d.id: d for d in r.deployments()}
    out: dict[str, set[str]] = {
        t: set() for t in ("jobs", "evals", "allocs", "deployments", "nodes", "acl_tokens")
    }

    # jobs (and their cascade)
    cutoff = now - th.job
    for jb in jobs.values():
        if jb.periodic or jb.parameterized:
            candidate = jb.stop
        else:
            candidate = jb.status == "dead" and (jb.stop or jb.type == "batch")
        raw = r.txn.get(key("job", jb.id), db=r.dbs["gc_mark_of"])
        dead_since = None if raw is None else from_u64(raw)
        if not candidate or dead_since is None or dead_since > cutoff or jb.submit_time > cutoff:
            continue
        mine = [a for a in allocs.values() if a.job_id == jb.id]
        if not all(
            eval_ok(e, jb, [a for a in mine if a.eval_id == e.id], now, cutoff, True)[0]
            for e in evals.values()
            if e.job_id == jb.id
        ):
            continue
        if not all(alloc_ok(a, jb, now, cutoff) for a in mine):
            continue
        if any(d.active() for d in deps.values() if d.job_id == jb.id):
            continue
        out["jobs"].add(jb.id)
        out["evals"] |= {e.id for e in evals.values() if e.job_id == jb.id}
        out["allocs"] |= {a.id for a in mine}
        out["deployments"] |= {d.id for d in deps.values() if d.job_id == jb.id}

    # evals (of the jobs left)
    took_evals: dict[str, list[str]] = {}
    for ev in evals.values():
        if ev.id in out["evals"]:
            continue
        jb = jobs.get(ev.job_id)
        cut = now - (th.batch_eval if ev.type == "batch" else th.eval)
        mine = [a for a in allocs.values() if a.eval_id == ev.id]
        gc, ok = eval_ok(ev, jb, mine, now, cut, False)
        if gc:
            took_evals.setdefault(ev.job_id, []).append(ev.id)
        out["allocs"] |= ok
    for job_id, taken in took_evals.items():
        jb = jobs.get(job_id)
        all_evals = [e for e in evals.values() if e.job_id == job_id]
        job_allocs = {a.id for a in allocs.values() if a.job_id == job_id}
        if (
            jb is not None
            and not jb.stop
            and len(taken) == len(all_evals)
            and job_allocs <= out["allocs"]
        ):
            taken.remove(
                max(taken, key=lambda e: evals[e].create_index)
            )  # the job keeps its history
        out["evals"] |= set(taken)

    # deployments
    cutoff = now - th.deployment
    for d in deps.values():
        if d.id in out["deployments"] or d.active() or d.modify_time > cutoff:
            continue
        if all(alloc_terminal(a) for a in allocs.values() if a.deployment_id == d.id):
            out["deployments"].add(d.id)

    # tokens
    cutoff = now - th.token
    for t in r.tokens():
        if t.expiration_time and t.expiration_time <= now and t.create_time <= cutoff:
            out["acl_tokens"].add(t.accessor_id)

    # nodes
    cutoff = now - th.node
    for n in r.nodes():
        if n.status == "down" and n.status_updated_at <= cutoff:
            if all(alloc_terminal(a) for a in allocs.values() if a.node_id == n.id):
                out["nodes"].add(n.id)
    return out


@dataclass
class Snapshot:
    jobs: list
    evals: list
    allocs: list
    deployments: list
    nodes: list
    tokens: list

    @classmethod
    def of(cls, r) -> Snapshot:
        return cls(r.jobs(), r.evals(), r.allocs(), r.deployments(), r.nodes(), r.tokens())


def never_collected(r: Snapshot, removed: dict[str, set[str]], now: int) -> None:
    """Whatever the thresholds, these objects (as they were before GC) are never removed."""
    jobs = {j.id: j for j in r.jobs}
    for jb in jobs.values():
        if jb.status in ("running", "pending"):
            assert jb.id not in removed["jobs"], f"{jb.status} job {jb.id} collected"
    for ev in r.evals:
        if ev.status in ("pending", "blocked"):
            assert ev.id not in removed["evals"], f"non-terminal eval {ev.id} collected"
    for a in r.allocs:
        if a.id not in removed["allocs"]:
            continue
        assert alloc_terminal(a), f"non-terminal alloc {a.id} collected"
        assert a.client_status != "running", f"alloc {a.id} running on its client collected"
        jb = jobs.get(a.job_id)
        if a.job_id not in removed["jobs"] and jb is not None and a.client_status == "failed":
            old_version = a.create_index < jb.job_modify_index
            live = not (jb.stop or jb.status == "dead") and a.desired_status != "stop"
            if live and not old_version:
                assert not may_reschedule(a, jb, now), (
                    f"reschedulable failed alloc {a.id} collected"
                )
    for d in r.deployments:
        if d.active():
            assert d.id not in removed["deployments"], f"active deployment {d.id} collected"
    for n in r.nodes:
        if n.status != "down":
            assert n.id not in removed["nodes"], f"node {n.id} ({n.status}) collected"
    for t in r.tokens:
        if not t.expired(now):
            assert t.accessor_id not in removed["acl_tokens"], (
                f"unexpired token {t.accessor_id} collected"
            )


SMALL_ENTRIES = Limits(reap_batch=5, job_batch=2, token_batch=4096, max_entry_bytes=1024, objects_per_entry=6)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds)
def test_collectors_follow_the_rules(world: World) -> None:
    h = GCHarness()
    try:
        build(h, world)
        now = h.time + world.now_gap
        th = world.thresholds
        note(f"now=+{world.now_gap // SECOND}s thresholds={th}")
        with h.read() as r:
            before = ids_of(r)
            snapshot = Snapshot.of(r)
            expected = reference(r, now, th)
            dry: dict[str, set[str]] = {t: set() for t in before}
            for plan in plan_all(r, now, th):
                for table, found in plan.ids().items():
                    dry[table] |= set(found)
        plans, results = collect(h, FORCE_ORDER, now, th, SMALL_ENTRIES, window=world.window)
        for result in results:
            assert result.ok and not result.value.get("skipped"), result.value
        with h.read() as r:
            after = ids_of(r)
            removed = {t: before[t] - after[t] for t in before}
            check_no_orphans(r)
        note(f"removed={removed}")
        for table, gone in removed.items():
            event(
                f"{table} removed: {'none' if not gone else 'some' if gone != before[table] else 'all'}"
            )
        assert removed == expected, f"removed {removed}\nexpected {expected}"
        assert dry == removed, f"dry run {dry} != removed {removed}"
        never_collected(snapshot, removed, now)
        # Replicas converge, and a reap applied twice deletes nothing more.
        digest = h.digest()
        assert h.replay_digest() == digest
        for plan in plans:
            for body in reap_bodies(plan, SMALL_ENTRIES):
                result = h.apply(body, at=now)
                deleted = result.value.get("reaped") or result.value.get("deleted") or []
                deleted += result.value.get("evals", []) + result.value.get("allocs", [])
                assert not deleted, f"second apply deleted {deleted}"
        with h.read() as r:
            assert ids_of(r) == after
    finally:
        h.close()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds, pick=st.integers(0, 3), changed=st.booleans())
def test_job_registered_between_plan_and_reap_survives(
    world: World, pick: int, changed: bool
) -> None:
    """The re-registration race: a forced plan read, then the job is registered again, then the reaps."""
    h = GCHarness()
    try:
        build(h, world)
        if not world.jobs:
            return
        jid = f"j{pick % len(world.jobs)}"
        now = h.time + world.now_gap
        with h.read() as r:
            plans = plan_all(r, now, Thresholds.zero())
            old = r.job(jid)
        assert old is not None
        spec = world.jobs[pick % len(world.jobs)]
        again = job(
            jid,
            spec.type,
            policy=spec.policy,
            periodic=spec.periodic,
            meta={"v": "again" if changed else old.meta.get("v", "")}
            if changed or old.meta
            else {},
        )
        new_eval = None if spec.periodic else evaluation(f"{jid}-again", jid, spec.type)
        h.apply(m.JobRegister(job=again, eval=new_eval), at=now)
        for plan in plans:
            for body in reap_bodies(plan, SMALL_ENTRIES):
                assert h.apply(body, at=now).ok
        with h.read() as r:
            assert r.job(jid) is not None, "a job registered after the sweep read was reaped"
            if new_eval is not None:
                assert r.eval(new_eval.id) is not None
            check_no_orphans(r)
        assert h.replay_digest() == h.digest()
    finally:
        h.close()
