"""Queues through the FSM: the leader's decisions applied, re-checked, and identical on every replica.

A hypothesis property drives generated queues, priority classes and queued
jobs through real entries: admission passes are what the leader's service
decides on the state (``node.leader.admission.decide``); jobs stop and
queues are held, drained and resumed between them; and a decision taken
earlier (a leader that lost its term mid-reclaim) is applied again late.
After every entry the FSM's invariants hold (the ledger equals a recount of
the admitted workloads and keeps every quota); a fresh decision is never
skipped; and a second replica fed the same entries holds the same state.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.queues import (
    ANY,
    LOWER_PRIORITY,
    NEVER,
    STOP_HOLD,
    STOP_HOLD_AND_DRAIN,
    STOP_NONE,
    WL_ADMITTED,
    WL_FINISHED,
    WL_PENDING,
    PriorityClass,
    Queue,
    QuotaLimit,
)
from fsm.structs import Resources, Task, TaskGroup
from node.leader.admission import decide
from scheduler.queueing import load_line, plan
from tests.fsm.support import Harness, check_invariants, dump, make_eval, make_job

GPU = "nvidia/gpu"


def gpu_job(job_id: str, queue: str, gpus: int, *, count: int = 1, pclass: str = "") -> object:
    task = Task(name="t", resources=Resources(cpu=100, memory_mb=64, devices={GPU: gpus}))
    job = make_job(job_id, type="batch", queue=queue, priority_class=pclass)
    job.task_groups = [TaskGroup(name="g", count=count, tasks=[task])]
    return job


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


def lab(h: Harness) -> None:
    queues = [Queue(name=n, cohort="lab", resources=[QuotaLimit(GPU, nominal=2)], reclaim_within_cohort=ANY,
                    within_queue=LOWER_PRIORITY) for n in ("team-a", "team-b")]  # fmt: skip
    h.ok(m.QueueUpsert(queues=queues))
    h.ok(m.PriorityClassUpsert(classes=[PriorityClass(name="low", value=0), PriorityClass(name="high", value=100)]))


def admit_pass(h: Harness) -> dict[str, list[str]]:
    with h.reader() as r:
        body = decide(r)
    return {} if body is None else h.ok(body)


def test_reclaim_evicts_one_borrower_which_waits_again_with_its_record(h: Harness) -> None:
    lab(h)
    for i in (1, 2, 3):
        h.ok(m.JobRegister(job=gpu_job(f"a{i}", "team-a", 1, pclass="low"), eval=make_eval(f"ea{i}", f"a{i}")))
    assert admit_pass(h)["admitted"] == ["a1", "a2", "a3"]
    with h.reader() as r:
        assert r.queue_usage("team-a") == {GPU: 3, "cpu": 300, "memory": 192}
        assert [j for j in r.pending_ids("team-a")] == []
    h.ok(m.JobRegister(job=gpu_job("b1", "team-b", 2, pclass="low"), eval=make_eval("eb1", "b1")))
    result = admit_pass(h)
    assert result["evicted"] == ["a3"] and result["admitted"] == ["b1"]
    with h.reader() as r:
        a3 = r.workload("a3")
        assert a3.state == WL_PENDING and r.pending_ids("team-a") == ["a3"]
        assert a3.last_eviction().message == (
            "Preempted to accommodate a workload (UID: default/b1) due to reclamation within the cohort; "
            "preemptor path: /lab/team-b; preemptee path: /lab/team-a"
        )
        assert r.job("a3").status == "pending", "an evicted job waits; it has not ended"
        check_invariants(r)


def test_a_stale_admission_is_skipped_not_over_admitted(h: Harness) -> None:
    lab(h)
    h.ok(m.JobRegister(job=gpu_job("a1", "team-a", 2)))
    h.ok(m.JobRegister(job=gpu_job("b1", "team-b", 2)))
    h.ok(m.JobRegister(job=gpu_job("a2", "team-a", 2)))
    with h.reader() as r:
        stale = decide(r)  # what the old leader decided: a1 and b1 (a2 finds nothing left to borrow)
    assert {a.job_id for a in stale.admits} == {"a1", "b1"}
    h.ok(m.JobRegister(job=gpu_job("a0", "team-b", 2)))
    assert admit_pass(h)["admitted"] == ["a1", "b1"]
    # The old leader's entry arrives after the new leader's: every admission in it is skipped.
    assert h.ok(stale)["skipped"] == ["a1", "b1"]
    with h.reader() as r:
        check_invariants(r)


def test_hold_keeps_new_work_pending_and_drain_evicts_what_runs(h: Harness) -> None:
    lab(h)
    h.ok(m.JobRegister(job=gpu_job("a1", "team-a", 1)))
    admit_pass(h)
    with h.reader() as r:
        held = r.queue("team-a")
    held.stop_policy = STOP_HOLD
    h.ok(m.QueueUpsert(queues=[held]))
    h.ok(m.JobRegister(job=gpu_job("a2", "team-a", 1)))
    assert not admit_pass(h)
    with h.reader() as r:
        assert r.workload("a1").state == WL_ADMITTED and r.workload("a2").state == WL_PENDING
    held.stop_policy = STOP_HOLD_AND_DRAIN
    h.ok(m.QueueUpsert(queues=[held]))
    assert admit_pass(h)["evicted"] == ["a1"]
    with h.reader() as r:
        assert r.pending_ids("team-a") == ["a1", "a2"], "drained work returns to its place in line"
        assert r.queue_usage("team-a") == {}
    held.stop_policy = STOP_NONE
    h.ok(m.QueueUpsert(queues=[held]))
    assert admit_pass(h)["admitted"] == ["a1", "a2"]


def test_a_stopped_job_releases_its_quota_and_a_purge_forgets_it(h: Harness) -> None:
    lab(h)
    h.ok(m.JobRegister(job=gpu_job("a1", "team-a", 2)))
    admit_pass(h)
    h.ok(m.JobDeregister(job_id="a1"))
    with h.reader() as r:
        evals = r.evals_by_job("a1")
        assert r.workload("a1").state == WL_ADMITTED, "quota is held until the job has stopped"
    for ev in evals:
        ev.status = "complete"
    h.ok(m.EvalUpsert(evals=evals))
    with h.reader() as r:
        assert r.job("a1").status == "dead"
        assert r.workload("a1").state == WL_FINISHED and r.queue_usage("team-a") == {}
    h.ok(m.JobDeregister(job_id="a1", purge=True))
    with h.reader() as r:
        assert r.workload("a1") is None
    result = h.apply(m.JobRegister(job=gpu_job("x", "team-a", 1, pclass="nope")))
    assert not result.ok and "priority class 'nope' does not exist" in result.error


# -- the property ----------------------------------------------------------------------
QUEUE_NAMES = ("qa", "qb", "qc")


@st.composite
def queue_defs(draw: st.DrawFn) -> list[Queue]:
    out = []
    for name in QUEUE_NAMES[: draw(st.integers(1, 3))]:
        cohort = draw(st.sampled_from(["", "lab"]))
        nominal = draw(st.integers(0, 4))
        limit = QuotaLimit(
            GPU, nominal,
            draw(st.one_of(st.none(), st.integers(0, 3))) if cohort else None,
            draw(st.one_of(st.none(), st.integers(0, nominal))) if cohort else None,
        )  # fmt: skip
        out.append(Queue(name=name, cohort=cohort, resources=[limit],
                         reclaim_within_cohort=draw(st.sampled_from([NEVER, LOWER_PRIORITY, ANY])),
                         within_queue=draw(st.sampled_from([NEVER, LOWER_PRIORITY]))))  # fmt: skip
    return out


ACTIONS = st.lists(
    st.tuples(st.sampled_from(["submit", "submit", "admit", "admit", "stop", "stale", "hold", "drain", "resume"]),
              st.integers(0, 50), st.integers(1, 3), st.sampled_from(["", "low", "high"])),
    min_size=1, max_size=25,
)  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue_defs(), ACTIONS)
def test_the_ledger_holds_and_replicas_agree(queues: list[Queue], actions: list[tuple[str, int, int, str]]) -> None:
    h, replica = Harness.temp(), Harness.temp()
    try:
        _run(h, replica, queues, actions)
    finally:
        h.destroy()
        replica.destroy()


def _run(h: Harness, replica: Harness, queues: list[Queue], actions: list[tuple[str, int, int, str]]) -> None:
    bodies: list[object] = [m.QueueUpsert(queues=queues),
                            m.PriorityClassUpsert(classes=[PriorityClass("low", 0), PriorityClass("high", 10)])]
    stale: list[m.QueueAdmission] = []
    jobs: list[str] = []
    for body in bodies:
        h.ok(body)
    for n, (kind, pick, gpus, pclass) in enumerate(actions):
        if kind == "submit":
            job_id = f"j{n}"
            jobs.append(job_id)
            h.ok(m.JobRegister(job=gpu_job(job_id, queues[pick % len(queues)].name, gpus, pclass=pclass)))
        elif kind == "admit":
            with h.reader() as r:
                body = decide(r)
                line = load_line(r)
            if body is None:
                continue
            expected = plan(line)
            result = h.ok(body)
            assert result["skipped"] == [], "a fresh decision is never skipped"
            assert result["admitted"] == [w.job_id for w in expected.admits]
            stale.append(body)
        elif kind == "stale" and stale:
            h.ok(stale[pick % len(stale)])  # applied late: what no longer holds is skipped
        elif kind == "stop" and jobs:
            h.apply(m.JobDeregister(job_id=jobs[pick % len(jobs)]))
        elif kind in ("hold", "drain", "resume"):
            q = queues[pick % len(queues)]
            q.stop_policy = {"hold": STOP_HOLD, "drain": STOP_HOLD_AND_DRAIN, "resume": STOP_NONE}[kind]
            h.ok(m.QueueUpsert(queues=[q]))
        with h.reader() as r:
            check_invariants(r)
            for job_id in jobs:
                job, wl = r.job(job_id), r.workload(job_id)
                if job is not None and not job.stop:
                    assert wl is not None and wl.state in (WL_PENDING, WL_ADMITTED), f"{job_id} was lost"
    for _, entry in h.entries:
        replica.raw(entry)
    mine, theirs = dump(h.fsm), dump(replica.fsm)
    for db in ("workloads", "queue_usage", "workloads_pending", "workloads_admitted", "queues"):
        assert mine[db] == theirs[db], f"replicas disagree on {db}"


def test_a_pass_never_exceeds_the_entry_limit_and_the_rest_follows(h: Harness) -> None:
    """A burst of admissions (and their evals) is cut to fit the raft entry limit; what is cut
    is admitted by the next passes (an entry too large was refused and the service wedged)."""
    from node.core.writes import entry_size

    h.ok(m.QueueUpsert(queues=[Queue(name="big", resources=[QuotaLimit(GPU, nominal=1000)])]))
    for i in range(300):
        h.ok(m.JobRegister(job=gpu_job(f"j{i}", "big", 1)))
    limit = 16 * 1024
    passes = 0
    while True:
        with h.reader() as r:
            body = decide(r, max_admits=1000, max_entry_bytes=limit)
        if body is None:
            break
        assert entry_size(body) <= limit
        assert {ev.job_id for ev in body.evals} == {a.job_id for a in body.admits}
        h.ok(body)
        passes += 1
    assert passes > 1
    with h.reader() as r:
        assert r.admitted_count("big") == 300 and r.pending_count("big") == 0
