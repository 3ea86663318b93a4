"""GC at the FSM level, one scenario at a time: the rules Nomad users rely on,
the races the modify-index checks exist for, the journal, and entry sizes."""

from __future__ import annotations

import pytest

from fsm import messages as m
from fsm.gc import FORCE_ORDER, Thresholds, plan_all, plan_kind
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
from node.core.writes import entry_size
from node.leader.gc import ENTRY_MARGIN, UNIT_ALLOCS, Limits, reap_bodies
from tests.gc.support import (
    GCHarness,
    alloc,
    apply_plan,
    check_no_orphans,
    collect,
    evaluation,
    finished_batch_job,
    ids_of,
    job,
    token,
)

DEFAULTS = Thresholds()
ZERO = Thresholds.zero()


@pytest.fixture
def h():
    harness = GCHarness()
    harness.apply(m.NodeRegister(node=Node(id="n1", status="ready")))
    yield harness
    harness.close()


def journal_events(h: GCHarness, after: int) -> list[tuple[str, str]]:
    with h.read() as r:
        return [(rec[1], rec[2]) for _, batch in r.journal_batches(after) for rec in batch]


def test_batch_job_swept_with_its_evals_and_allocs_after_the_threshold(h: GCHarness) -> None:
    eval_id, allocs = finished_batch_job(h, "b1")
    dead_at = h.time
    # Not yet: the job threshold (4h) has not passed since it died.
    with h.read() as r:
        assert r.job("b1").status == "dead"
        assert plan_kind(r, "job", dead_at + 3 * HOUR, DEFAULTS).empty()
    mark = h.index
    plans, results = collect(h, ["job"], dead_at + 4 * HOUR + SECOND, DEFAULTS)
    assert [r.value for r in results] == [{"reaped": ["b1"], "skipped": []}]
    assert plans[0].counts() == {"jobs": 1, "evals": 1, "allocs": 2, "deployments": 0}
    with h.read() as r:
        assert ids_of(r)["jobs"] == set() and ids_of(r)["evals"] == set() and ids_of(r)["allocs"] == set()
        assert list(r.iter_raw("job_versions")) == [] and r.job_summary("b1") is None
        check_no_orphans(r)
    # The reap is in the change journal: one batch, a Deleted record per object.
    events = journal_events(h, mark)
    assert sorted(events) == sorted(
        [("JobDeleted", "b1"), ("EvaluationDeleted", eval_id)] + [("AllocationDeleted", a) for a in allocs]
    )
    assert h.replay_digest() == h.digest()


def test_force_gc_ignores_every_time_threshold(h: GCHarness) -> None:
    """Regression for Nomad #24455 (1.9.x force GC still honoured thresholds)."""
    finished_batch_job(h, "b1")
    h.apply(m.NodeRegister(node=Node(id="gone", status="ready")))
    h.apply(m.NodeUpdateStatus(node_id="gone", status="down"))
    h.apply(m.ACLTokenUpsert(tokens=[token("tok", expiration=h.time + SECOND)]))
    now = h.time + 2 * SECOND
    with h.read() as r:
        assert all(p.empty() for p in plan_all(r, now, DEFAULTS))
    collect(h, FORCE_ORDER, now, ZERO)
    with h.read() as r:
        left = ids_of(r)
    assert left["jobs"] == left["evals"] == left["allocs"] == set()
    assert left["nodes"] == {"n1"} and left["acl_tokens"] == set()


def test_running_job_beside_a_dead_one_is_untouched(h: GCHarness) -> None:
    finished_batch_job(h, "done")
    h.apply(m.JobRegister(job=job("web", "service"), eval=evaluation("w-e0", "web", "service")))
    h.apply(m.PlanApply(eval_id="w-e0", job_id="web", allocs_to_place=[alloc("w-a0", "w-e0", "web")]))
    h.apply(m.EvalUpsert(evals=[evaluation("w-e0", "web", "service", "complete")]))
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="w-a0", client_status="running")]))
    collect(h, FORCE_ORDER, h.time + 100 * HOUR, ZERO)
    with h.read() as r:
        assert r.job("done") is None
        assert r.job("web").status == "running"
        assert r.eval("w-e0") is not None and r.alloc("w-a0") is not None
        check_no_orphans(r)


@pytest.mark.parametrize("changed", [False, True])
def test_job_registered_again_between_plan_and_reap_survives(h: GCHarness, changed: bool) -> None:
    finished_batch_job(h, "b1")
    now = h.time + 5 * HOUR
    with h.read() as r:
        plan = plan_kind(r, "job", now, DEFAULTS)
    assert [x.id for x in plan.reaps] == ["b1"]
    spec = job("b1", meta={"v": "2"} if changed else {})
    h.apply(m.JobRegister(job=spec, eval=evaluation("b1-e1", "b1")))
    results = apply_plan(h, plan)
    assert results[0].value == {"reaped": [], "skipped": ["b1"]}
    with h.read() as r:
        assert r.job("b1") is not None and r.eval("b1-e1") is not None
        assert r.eval("b1-e0") is not None and len(r.allocs_by_job("b1")) == 2
        check_no_orphans(r)
    assert h.replay_digest() == h.digest()


def test_failed_alloc_made_reschedulable_by_a_registration_after_the_plan_is_kept(h: GCHarness) -> None:
    """Apply re-checks allocs against the job as it is now (regression for the eval-reap race).

    The job is stopped when the leader plans, so its failed alloc may go; the
    job is registered again before the reap applies. The alloc's own modify
    index did not change, but it may be rescheduled again, so it stays, and
    so does its eval.
    """
    policy = ReschedulePolicy(unlimited=True)
    h.apply(m.JobRegister(job=job("svc", "service", policy=policy), eval=evaluation("s-e0", "svc", "service")))
    h.apply(m.PlanApply(eval_id="s-e0", job_id="svc", allocs_to_place=[alloc("s-a0", "s-e0", "svc")]))
    h.apply(m.EvalUpsert(evals=[evaluation("s-e0", "svc", "service", "complete")]))
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="s-a0", client_status="failed")]))
    # Another alloc keeps the job running.
    h.apply(m.EvalUpsert(evals=[evaluation("s-e9", "svc", "service")]))
    h.apply(m.PlanApply(eval_id="s-e9", job_id="svc", allocs_to_place=[alloc("s-run", "s-e9", "svc")]))
    h.apply(m.EvalUpsert(evals=[evaluation("s-e9", "svc", "service", "complete")]))
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="s-run", client_status="running")]))
    with h.read() as r:  # a live job: the failed alloc may be rescheduled, nothing to collect
        assert r.job("svc").status == "running"
        assert plan_kind(r, "eval", h.time + HOUR, ZERO).empty()
    h.apply(m.JobDeregister(job_id="svc", eval=evaluation("s-stop", "svc", "service", "complete")))
    now = h.time + HOUR
    with h.read() as r:
        assert r.job("svc").stop
        plan = plan_kind(r, "eval", now, ZERO)
    assert sorted(plan.ids()["evals"]) == ["s-e0", "s-stop"] and plan.ids()["allocs"] == ["s-a0"]
    h.apply(m.JobRegister(job=job("svc", "service", policy=policy), eval=evaluation("s-e1", "svc", "service")))
    results = apply_plan(h, plan)
    value = results[0].value
    assert "s-a0" not in value["allocs"] and "s-e0" in value["skipped"]
    with h.read() as r:
        assert r.alloc("s-a0") is not None and r.eval("s-e0") is not None
        check_no_orphans(r)


def test_a_reap_applied_twice_deletes_nothing_the_second_time(h: GCHarness) -> None:
    finished_batch_job(h, "b1")
    finished_batch_job(h, "b2", type="service")
    now = h.time + HOUR
    with h.read() as r:
        plans = plan_all(r, now, ZERO)
    bodies = [b for p in plans for b in reap_bodies(p, Limits())]
    for body in bodies:
        h.apply(body, at=now)
    mark = h.index
    before = h.digest()
    for body in bodies:
        value = h.apply(body, at=now).value
        assert not (value.get("reaped") or value.get("evals") or value.get("allocs") or value.get("deleted"))
    assert journal_events(h, mark) == []
    with h.read() as r:
        assert ids_of(r)["jobs"] == {"b2"} or ids_of(r)["jobs"] == set()
    assert h.replay_digest() == h.digest() and before != ""


def test_live_batch_job_loses_only_allocs_of_older_versions(h: GCHarness) -> None:
    finished_batch_job(h, "b1")  # version 0: b1-e0 with b1-a0, b1-a1
    h.apply(m.JobRegister(job=job("b1", meta={"v": "1"}), eval=evaluation("b1-e1", "b1")))
    h.apply(m.PlanApply(eval_id="b1-e1", job_id="b1", allocs_to_place=[alloc("b1-new", "b1-e1", "b1")]))
    h.apply(m.EvalUpsert(evals=[evaluation("b1-e1", "b1", "batch", "complete")]))
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="b1-new", client_status="running")]))
    collect(h, ["eval"], h.time + 100 * HOUR, ZERO)
    with h.read() as r:
        assert r.job("b1").status == "running"
        assert r.eval("b1-e0") is None and r.alloc("b1-a0") is None and r.alloc("b1-a1") is None
        assert r.eval("b1-e1") is not None and r.alloc("b1-new") is not None
        check_no_orphans(r)
    # Once the current version completes, its alloc stays while the job lives (it is not stopped) ...
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="b1-new", client_status="complete")]))
    collect(h, ["eval"], h.time + 100 * HOUR, ZERO)
    with h.read() as r:
        assert r.job("b1").status == "dead" and r.alloc("b1-new") is not None
    # ... and goes with the job.
    collect(h, ["job"], h.time + 100 * HOUR, ZERO)
    with h.read() as r:
        assert ids_of(r)["jobs"] == ids_of(r)["evals"] == ids_of(r)["allocs"] == set()


def test_batch_evals_use_the_batch_threshold(h: GCHarness) -> None:
    th = Thresholds(eval=HOUR, batch_eval=24 * HOUR, job=1000 * HOUR)
    # A stopped batch job (collectable by the eval GC) and a stopped service job.
    for jid, kind in (("b", "batch"), ("s", "service")):
        finished_batch_job(h, jid, type=kind)
        h.apply(m.JobDeregister(job_id=jid, eval=evaluation(f"{jid}-stop", jid, kind, "complete")))
    done = h.time
    with h.read() as r:
        evals = plan_kind(r, "eval", done + 2 * HOUR, th).ids().get("evals", [])
        assert sorted(evals) == ["s-e0", "s-stop"]
        evals = plan_kind(r, "eval", done + 25 * HOUR, th).ids().get("evals", [])
        assert sorted(evals) == ["b-e0", "b-stop", "s-e0", "s-stop"]


def test_last_eval_of_a_job_that_is_not_stopped_is_kept(h: GCHarness) -> None:
    """Emptying a dead job of all history would flip it to pending and leak it: one eval stays."""
    th = Thresholds(eval=HOUR, batch_eval=HOUR, job=1000 * HOUR)
    h.apply(m.JobRegister(job=job("b1"), eval=evaluation("b1-e0", "b1")))
    h.apply(m.EvalUpsert(evals=[evaluation("b1-e0", "b1", "batch", "complete")]))
    with h.read() as r:
        assert r.job("b1").status == "dead"
        assert plan_kind(r, "eval", h.time + 2 * HOUR, th).empty()
    collect(h, ["job"], h.time + 2000 * HOUR, th)
    with h.read() as r:
        assert r.job("b1") is None and r.eval("b1-e0") is None


@pytest.mark.parametrize(
    ("policy", "tracker_age", "next_alloc", "collected"),
    [
        (None, None, False, True),  # no policy
        (ReschedulePolicy(attempts=0, unlimited=False), None, False, True),  # rescheduling disabled
        (ReschedulePolicy(unlimited=True), None, False, False),  # unlimited, not replaced yet
        (ReschedulePolicy(unlimited=True), None, True, True),  # replaced already
        (ReschedulePolicy(attempts=2, interval=HOUR, unlimited=False), None, False, False),  # none attempted
        (ReschedulePolicy(attempts=2, interval=HOUR, unlimited=False), 30 * MINUTE, False, False),
        (ReschedulePolicy(attempts=2, interval=HOUR, unlimited=False), 2 * HOUR, False, True),
    ],
)
def test_failed_alloc_goes_only_when_no_reschedule_is_left(
    h: GCHarness, policy, tracker_age, next_alloc, collected: bool
) -> None:
    h.apply(m.JobRegister(job=job("svc", "service", policy=policy), eval=evaluation("e0", "svc", "service")))
    tracker = None
    if tracker_age is not None:
        tracker = RescheduleTracker(
            events=[RescheduleEvent(reschedule_time=h.time - tracker_age, prev_alloc_id="p", prev_node_id="n1", delay=0)]
        )
    placed = alloc("a0", "e0", "svc", reschedule_tracker=tracker, next_allocation="a1" if next_alloc else "")
    h.apply(m.PlanApply(eval_id="e0", job_id="svc", allocs_to_place=[placed]))
    h.apply(m.EvalUpsert(evals=[evaluation("e0", "svc", "service", "complete")]))
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="a0", client_status="failed")]))
    # A running alloc of another eval keeps the job alive (a dead job's allocs all go).
    h.apply(m.EvalUpsert(evals=[evaluation("e1", "svc", "service")]))
    h.apply(m.PlanApply(eval_id="e1", job_id="svc", allocs_to_place=[alloc("up", "e1", "svc")]))
    h.apply(m.EvalUpsert(evals=[evaluation("e1", "svc", "service", "complete")]))
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="up", client_status="running")]))
    collect(h, ["eval"], h.time + SECOND, ZERO)
    with h.read() as r:
        assert r.job("svc").status == "running"
        assert (r.alloc("a0") is None) is collected
        assert (r.eval("e0") is None) is collected
        check_no_orphans(r)


def test_deployment_rules(h: GCHarness) -> None:
    h.apply(m.JobRegister(job=job("svc", "service"), eval=evaluation("e0", "svc", "service")))
    for dep_id, status in (("active", "running"), ("busy", "successful"), ("old", "failed")):
        dep = DeploymentRec(id=dep_id, job_id="svc", status=status, task_groups={"g": DeploymentState()})
        h.apply(m.DeploymentUpsert(deployment=dep))
    h.apply(m.PlanApply(eval_id="e0", job_id="svc", allocs_to_place=[alloc("a0", "e0", "svc", deployment_id="busy")]))
    now = h.time + 2 * HOUR
    with h.read() as r:
        assert [x.id for x in plan_kind(r, "deployment", now, DEFAULTS).reaps] == ["old"]
        assert plan_kind(r, "deployment", h.time + 30 * MINUTE, DEFAULTS).empty()  # younger than 1h
    h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="a0", client_status="complete")]))
    mark = h.index
    collect(h, ["deployment"], h.time + 2 * HOUR, DEFAULTS)
    with h.read() as r:
        assert ids_of(r)["deployments"] == {"active"}
    assert sorted(journal_events(h, mark)) == [("DeploymentDeleted", "busy"), ("DeploymentDeleted", "old")]


def test_node_rules_and_node_gc_last(h: GCHarness) -> None:
    h.apply(m.NodeRegister(node=Node(id="down1", status="ready")))
    h.apply(m.NodeRegister(node=Node(id="down2", status="ready")))
    finished_batch_job(h, "b1", node="down1")  # terminal allocs only
    h.apply(m.JobRegister(job=job("svc", "service"), eval=evaluation("s-e0", "svc", "service")))
    h.apply(m.PlanApply(eval_id="s-e0", job_id="svc", allocs_to_place=[alloc("s-a0", "s-e0", "svc", "down2")]))
    for node_id in ("down1", "down2"):
        h.apply(m.NodeUpdateStatus(node_id=node_id, status="down"))
    with h.read() as r:
        assert plan_kind(r, "node", h.time + HOUR, DEFAULTS).empty()  # 24h threshold
        assert [x.id for x in plan_kind(r, "node", h.time + 25 * HOUR, DEFAULTS).reaps] == ["down1"]
    mark = h.index
    collect(h, FORCE_ORDER, h.time + SECOND, ZERO)
    with h.read() as r:
        assert ids_of(r)["nodes"] == {"n1", "down2"}  # down2 still has a live alloc; n1 is up
        assert r.job("b1") is None
        check_no_orphans(r)
    events = journal_events(h, mark)
    assert events[-1] == ("NodeDeregistration", "down1")  # node GC runs last


def test_token_rules_and_the_per_run_limit(h: GCHarness) -> None:
    created = h.time
    h.apply(
        m.ACLTokenUpsert(
            tokens=[token(f"exp{i}", expiration=created + MINUTE) for i in range(5)]
            + [token("later", expiration=created + 100 * HOUR), token("never")]
        )
    )
    with h.read() as r:
        assert plan_kind(r, "token", created + 30 * SECOND, ZERO).empty()  # not expired yet
        assert plan_kind(r, "token", created + 2 * MINUTE, DEFAULTS).empty()  # created < 1h ago
        assert len(plan_kind(r, "token", created + 2 * HOUR, DEFAULTS, token_limit=3).reaps) == 3
    mark = h.index
    collect(h, ["token"], created + 2 * HOUR, DEFAULTS)
    with h.read() as r:
        assert ids_of(r)["acl_tokens"] == {"later", "never"}
    assert sorted(journal_events(h, mark)) == [("ACLTokenDeleted", f"exp{i}") for i in range(5)]


def test_sweep_reads_only_marks_not_live_state(h: GCHarness) -> None:
    for i in range(50):
        h.apply(m.JobRegister(job=job(f"live{i}", "service"), eval=evaluation(f"live{i}-e", f"live{i}", "service")))
    finished_batch_job(h, "b1")
    with h.read() as r:
        plans = plan_all(r, h.time + HOUR, ZERO)
    assert sum(p.marks for p in plans) == 2  # the dead job and its eval; 50 live jobs cost nothing
    assert sum(p.reads for p in plans) <= 8


def test_reap_entries_respect_the_id_caps_and_the_entry_size() -> None:
    h = GCHarness()
    try:
        h.apply(m.NodeRegister(node=Node(id="n1", status="ready")))
        # 60 dead jobs with long ids, and one eval with more allocs than fit one unit.
        for i in range(60):
            jid = f"job-{i:04d}-" + "x" * 150
            h.apply(m.JobRegister(job=job(jid, "service"), eval=evaluation(f"{jid}-e", jid, "service", "complete")))
            h.apply(m.JobDeregister(job_id=jid, eval=evaluation(f"{jid}-s", jid, "service", "complete")))
        big = UNIT_ALLOCS + 50
        h.apply(m.JobRegister(job=job("wide", "service"), eval=evaluation("wide-e", "wide", "service")))
        for start in range(0, big, 100):
            places = [alloc(f"wide-a{i:04d}", "wide-e", "wide") for i in range(start, min(big, start + 100))]
            h.apply(m.PlanApply(eval_id="wide-e", job_id="wide", allocs_to_place=places))
        h.apply(m.EvalUpsert(evals=[evaluation("wide-e", "wide", "service", "complete")]))
        h.apply(m.EvalUpsert(evals=[evaluation("wide-next", "wide", "service")]))  # keeps "wide" alive
        h.apply(
            m.AllocClientUpdate(allocs=[m.AllocClientState(id=f"wide-a{i:04d}", client_status="complete") for i in range(big)])
        )
        now = h.time + HOUR
        limits = Limits(reap_batch=100, job_batch=25, max_entry_bytes=4096)
        with h.read() as r:
            jobs_plan = plan_kind(r, "job", now, ZERO)
        job_bodies = reap_bodies(jobs_plan, limits)
        assert len(jobs_plan.reaps) == 60
        for body in job_bodies:
            assert len(body.jobs) <= 25 and entry_size(body) <= 4096
        assert len(job_bodies) >= 60 * 170 // 4096
        assert [r.id for b in job_bodies for r in b.jobs] == [r.id for r in jobs_plan.reaps]
        for body in job_bodies:
            assert h.apply(body, at=now).value.get("skipped") == []
        with h.read() as r:
            evals_plan = plan_kind(r, "eval", now, ZERO)
        eval_bodies = reap_bodies(evals_plan, limits)
        for body in eval_bodies:
            assert len(body.evals) + len(body.allocs) <= 100 and entry_size(body) <= 4096
        # The wide eval goes last, after entries that hold only its allocs.
        assert eval_bodies[-1].evals == [m.Reap(id="wide-e", modify_index=evals_plan.units[0].eval.modify_index)]
        assert sum(len(b.allocs) for b in eval_bodies) == big
        for body in eval_bodies:
            assert h.apply(body, at=now).value.get("skipped") == []
        with h.read() as r:
            left = ids_of(r)
            assert "wide-e" not in left["evals"] and not any(a.startswith("wide-a") for a in left["allocs"])
            assert left["jobs"] == {"wide"}
            check_no_orphans(r)
        assert h.replay_digest() == h.digest()
    finally:
        h.close()


def test_entry_size_is_what_the_raft_adapter_checks() -> None:
    from fsm.messages import encode_entry
    from raft.node import encoded_entry_size

    body = m.EvalReap(evals=[m.Reap(id="\u00e9" * 40, modify_index=2**40)])
    raw = encode_entry(body, time=1, rid="r" * 32)
    # Only the envelope's time differs (a 9-byte wall-clock stamp here, 1 byte in raw):
    # well inside the margin every entry keeps free.
    assert 0 <= entry_size(body) - encoded_entry_size(raw) <= 16 < ENTRY_MARGIN
    assert len(raw) < encoded_entry_size(raw) <= len(raw) + 32  # pickle framing only


def test_windowed_sweep_removes_what_one_plan_would(h: GCHarness) -> None:
    """The leader plans big sweeps a window of marks at a time, reaping between windows."""
    from fsm.gc import Window

    for i in range(12):
        finished_batch_job(h, f"dead{i:02d}", allocs=1)
        # Marks that stay: a live batch job's evals (current version) interleaved with the dead ones.
        h.apply(m.JobRegister(job=job(f"live{i:02d}"), eval=evaluation(f"live{i:02d}-e", f"live{i:02d}")))
        h.apply(m.PlanApply(eval_id=f"live{i:02d}-e", job_id=f"live{i:02d}", allocs_to_place=[alloc(f"live{i:02d}-a", f"live{i:02d}-e", f"live{i:02d}")]))
        h.apply(m.EvalUpsert(evals=[evaluation(f"live{i:02d}-e", f"live{i:02d}", "batch", "complete")]))
        h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id=f"live{i:02d}-a", client_status="running")]))
    now = h.time + HOUR
    with h.read() as r:
        whole = {t: set(v) for p in plan_all(r, now, ZERO, kinds=["job", "eval"]) for t, v in p.ids().items()}
    for kind in ("job", "eval"):
        window = Window(None, 5)
        while True:
            with h.read() as r:
                plan = plan_kind(r, kind, now, ZERO, window=window)
            apply_plan(h, plan, Limits(objects_per_entry=7))
            if plan.resume is None:
                break
            window = Window(plan.resume, 5)
    with h.read() as r:
        left = ids_of(r)
        check_no_orphans(r)
    assert whole["jobs"] == {f"dead{i:02d}" for i in range(12)}
    assert left["jobs"] == {f"live{i:02d}" for i in range(12)}
    assert not (whole["evals"] & left["evals"]) and not (whole["allocs"] & left["allocs"])


def test_job_reap_entries_bound_the_objects_they_remove(h: GCHarness) -> None:
    for i in range(10):
        finished_batch_job(h, f"b{i}", allocs=3)  # 5 objects each
    with h.read() as r:
        plan = plan_kind(r, "job", h.time + HOUR, ZERO)
    bodies = reap_bodies(plan, Limits(objects_per_entry=12))
    assert [len(b.jobs) for b in bodies] == [2, 2, 2, 2, 2]
    bodies = reap_bodies(plan, Limits(objects_per_entry=3))  # one job is over the cap: it goes alone
    assert [len(b.jobs) for b in bodies] == [1] * 10
