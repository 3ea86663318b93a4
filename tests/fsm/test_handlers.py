"""Unit tests of every message type's apply function, good and bad input.

Each rejection test asserts the error result AND that no object table,
index, GC mark, journal batch or table index changed (only ``meta`` and the
request-id memory may). Tests that the property suite found bugs for are
marked "regression".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from fsm import codec
from fsm import messages as m
from fsm.journal import Retention
from fsm.keys import MAX_ID_BYTES
from fsm.machine import ApplyResult
from fsm.messages import encode_entry
from fsm.structs import (
    MINUTE,
    SECOND,
    DeploymentStatus,
    DesiredTransition,
    Evaluation,
    Job,
    Resources,
    Task,
    TaskGroup,
    TaskState,
)
from tests.fsm.support import (
    T0,
    FatalCalled,
    Harness,
    check_invariants,
    make_alloc,
    make_deployment,
    make_eval,
    make_job,
    make_node,
    make_token,
    secret_hash,
    without_bookkeeping,
)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


def rejected(h: Harness, body: Any, code: str, match: str = "", **kw: Any) -> ApplyResult:
    """Apply ``body``; it must fail with ``code`` and leave every table as it was."""
    before = without_bookkeeping(h.dump())
    result = h.apply(body, **kw)
    assert not result.ok, result
    assert result.code == code, (result.code, result.error)
    assert re.search(match, result.error), result.error
    assert without_bookkeeping(h.dump()) == before, "a rejected entry changed state"
    assert h.fsm.applied_index == h.index  # ...but it was consumed
    return result


def unchanged(h: Harness, body: Any) -> ApplyResult:
    """Apply ``body``; it must succeed and change nothing (a reap that skips everything)."""
    before = without_bookkeeping(h.dump())
    result = h.apply(body)
    assert result.ok, result
    assert without_bookkeeping(h.dump()) == before
    return result


def check(h: Harness, **kw: Any) -> None:
    with h.reader() as r:
        check_invariants(r, **kw)


def seed(h: Harness, *, job: Job | None = None, nodes: tuple[str, ...] = ("n1",)) -> Job:
    """Registered nodes and one job ``web`` (group g, count 2) with a pending eval e1."""
    for node_id in nodes:
        h.ok(m.NodeRegister(node=make_node(node_id, status="ready")))
    job = job or make_job("web", count=2)
    h.ok(m.JobRegister(job=job, eval=make_eval("e1", job.id)))
    return job


def place(h: Harness, *allocs: Any, eval_id: str = "e1", job_id: str = "web", **kw: Any) -> dict:
    """A plan placing ``allocs`` that also completes the plan's eval."""
    return h.ok(
        m.PlanApply(
            eval_id=eval_id,
            job_id=job_id,
            allocs_to_place=list(allocs),
            evals=[make_eval(eval_id, job_id, status="complete")],
            **kw,
        )
    )


def client(h: Harness, alloc_id: str, status: str, **kw: Any) -> dict:
    return h.ok(
        m.AllocClientUpdate(allocs=[m.AllocClientState(id=alloc_id, client_status=status, **kw)])
    )


def summary_counts(h: Harness, job_id: str = "web", group: str = "g") -> dict[str, int]:
    with h.reader() as r:
        s = r.job_summary(job_id)
        assert s is not None
        g = s.summary[group]
        return {
            k: getattr(g, k)
            for k in ("queued", "starting", "running", "complete", "failed", "lost")
        }


# == jobs ===================================================================
def test_register_new_job_stamps_indexes_status_summary_version(h: Harness) -> None:
    value = h.ok(m.JobRegister(job=make_job("web", groups=("a", "b"), status="dead", version=7)))
    assert value == {"job_modify_index": 1, "version": 0, "changed": True}
    with h.reader() as r:
        job = r.job("web")
        assert job is not None
        assert (job.create_index, job.modify_index, job.job_modify_index) == (1, 1, 1)
        assert job.create_time == job.modify_time == job.submit_time == T0 + SECOND
        # status and version are derived, never taken from the entry
        assert job.status == "pending" and job.version == 0
        assert [v.version for v in r.job_versions("web")] == [0]
        summary = r.job_summary("web")
        assert summary is not None and sorted(summary.summary) == ["a", "b"]
        assert (
            r.table_index("jobs")
            == r.table_index("job_versions")
            == r.table_index("job_summary")
            == 1
        )
        [(index, batch)] = list(r.journal_batches())
        assert index == 1 and [rec[:3] for rec in batch] == [["Job", "JobRegistered", "web"]]
    check(h, deleted_from=())


def test_register_with_eval_sets_eval_job_modify_index(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node()))
    value = h.ok(m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web")))
    assert value["eval_id"] == "e1" and value["eval_create_index"] == 2
    with h.reader() as r:
        ev = r.eval("e1")
        assert ev is not None and ev.job_modify_index == 2 and ev.create_index == 2
        assert r.eval_ids_by_status("pending") == ["e1"]
        assert r.job("web").status == "pending"  # a live eval
    check(h, deleted_from=())


def test_reregister_same_spec_keeps_version_changed_spec_bumps_it(h: Harness) -> None:
    h.ok(m.JobRegister(job=make_job("web")))
    same = h.ok(m.JobRegister(job=make_job("web")))
    assert same == {"job_modify_index": 1, "version": 0, "changed": False}
    bumped = h.ok(m.JobRegister(job=make_job("web", count=3)))
    assert bumped == {"job_modify_index": 3, "version": 1, "changed": True}
    with h.reader() as r:
        job = r.job("web")
        assert job.modify_index == 3 and job.create_index == 1 and job.version == 1
        assert [v.version for v in r.job_versions("web")] == [1, 0]


def test_job_versions_keep_the_last_six(h: Harness) -> None:
    for count in range(9):
        h.ok(m.JobRegister(job=make_job("web", count=count)))
    with h.reader() as r:
        versions = r.job_versions("web")
        assert [v.version for v in versions] == [8, 7, 6, 5, 4, 3]
        assert [v.task_groups[0].count for v in versions] == [8, 7, 6, 5, 4, 3]
        assert r.job("web").version == 8
    check(h, deleted_from={"job_versions"})


def bad_jobs() -> list[Any]:
    def job(**kw: Any) -> Job:
        return make_job("web", **kw)

    def groups(*tgs: TaskGroup) -> Job:
        j = job()
        j.task_groups = list(tgs)
        return j

    neg = groups(TaskGroup(name="g", count=-1, tasks=[Task(name="t")]))
    neg_res = groups(TaskGroup(name="g", tasks=[Task(name="t", resources=Resources(cpu=-1))]))
    return [
        pytest.param(neg, "count -1 must be >= 0", id="negative-count"),
        pytest.param(job(type="daemon"), "type 'daemon' is not one of", id="unknown-type"),
        pytest.param(groups(), "at least one task group", id="no-groups"),
        pytest.param(job(groups=("g", "g")), "duplicate task group 'g'", id="duplicate-groups"),
        pytest.param(make_job("we\x00b"), "job ID must be", id="nul-in-id"),
        pytest.param(make_job(""), "job ID must be", id="empty-id"),
        pytest.param(make_job("j" * (MAX_ID_BYTES + 1)), "job ID must be", id="id-too-long"),
        pytest.param(job(priority=0), "priority 0", id="priority-0"),
        pytest.param(job(priority=101), "priority 101", id="priority-101"),
        pytest.param(groups(TaskGroup(name="g")), "at least one task is required", id="no-tasks"),
        pytest.param(
            groups(TaskGroup(name="", tasks=[Task(name="t")])), "task group name", id="empty-group"
        ),
        pytest.param(neg_res, "resources must be >= 0", id="negative-resources"),
    ]


@pytest.mark.parametrize(("job", "message"), bad_jobs())
def test_invalid_job_spec_is_rejected_and_changes_nothing(
    h: Harness, job: Job, message: str
) -> None:
    seed(h)  # an existing job "web": a bad re-registration must not touch it either
    rejected(
        h, m.JobRegister(job=job, eval=make_eval("e9", job.id)), "bad_request", re.escape(message)
    )
    check(h)


def test_register_with_eval_of_another_job_is_rejected_whole(h: Harness) -> None:
    rejected(
        h,
        m.JobRegister(job=make_job("web"), eval=make_eval("e1", "api")),
        "bad_request",
        "is for job api",
    )


def test_job_id_of_max_length_is_accepted(h: Harness) -> None:
    long_job, long_node, long_alloc = "j" * MAX_ID_BYTES, "n" * MAX_ID_BYTES, "a" * MAX_ID_BYTES
    seed(h, job=make_job(long_job), nodes=(long_node,))
    # regression: 256-byte ids overflowed LMDB's 511-byte composite keys
    # (allocs_by_node = node NUL flag NUL alloc) and stopped every replica.
    h.ok(m.EvalUpsert(evals=[make_eval("e" * MAX_ID_BYTES, long_job)]))
    place(
        h,
        make_alloc(long_alloc, "e" * MAX_ID_BYTES, long_job, long_node),
        eval_id="e" * MAX_ID_BYTES,
        job_id=long_job,
    )
    client(h, long_alloc, "running")
    check(h)


@pytest.mark.parametrize(
    ("enforce", "exists", "ok"),
    [(0, False, True), (0, True, False), (1, True, True), (7, True, False), (5, False, False)],
)
def test_enforce_index_compare_and_set(h: Harness, enforce: int, exists: bool, ok: bool) -> None:
    if exists:
        h.ok(m.JobRegister(job=make_job("web")))  # job_modify_index 1
    msg = m.JobRegister(job=make_job("web", count=5), enforce_index=enforce)
    if ok:
        assert h.ok(msg)["changed"] is True
    else:
        rejected(h, msg, "conflict", "enforce index")


def test_deregister_stops_job_and_marks_it_for_gc(h: Harness) -> None:
    h.ok(m.JobRegister(job=make_job("web")))
    value = h.ok(m.JobDeregister(job_id="web", eval=make_eval("e2", "web", status="complete")))
    assert value["job_modify_index"] == 2 and value["eval_id"] == "e2"
    with h.reader() as r:
        job = r.job("web")
        assert job.stop and job.version == 1 and job.status == "dead"
        assert [v.version for v in r.job_versions("web")] == [1, 0]
        assert [obj_id for _, obj_id in r.gc_marks("job", until=2**63)] == ["web"]
        assert r.gc_marks("eval", until=2**63) == [(T0 + 2 * SECOND, "e2")]
    # registering it again (not stopped) clears the job's mark
    h.ok(m.JobRegister(job=make_job("web")))
    with h.reader() as r:
        assert r.job("web").status == "dead"  # its eval history is terminal
    h.ok(m.EvalUpsert(evals=[make_eval("e3", "web")]))
    with h.reader() as r:
        assert r.job("web").status == "pending"
        assert r.gc_marks("job", until=2**63) == []
    check(h)


def test_deregister_twice_does_not_bump_version_again(h: Harness) -> None:
    h.ok(m.JobRegister(job=make_job("web")))
    h.ok(m.JobDeregister(job_id="web"))
    again = h.ok(m.JobDeregister(job_id="web"))
    assert again == {"job_modify_index": 2}
    with h.reader() as r:
        assert r.job("web").version == 1


def test_deregister_missing_or_invalid(h: Harness) -> None:
    rejected(h, m.JobDeregister(job_id="nope"), "not_found", "job nope not found")
    rejected(h, m.JobDeregister(job_id=""), "bad_request", "job ID must be")
    h.ok(m.JobRegister(job=make_job("web")))
    rejected(
        h,
        m.JobDeregister(job_id="web", eval=make_eval("e1", "api")),
        "bad_request",
        "is for job api",
    )


def test_purge_removes_job_versions_summary_but_leaves_evals_and_allocs(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    h.ok(m.JobDeregister(job_id="web", purge=True))
    with h.reader() as r:
        assert r.job("web") is None and r.job_versions("web") == [] and r.job_summary("web") is None
        assert r.eval("e1") is not None and r.alloc("a1") is not None
        assert r.gc_marks("job", until=2**63) == []
        _, batch = list(r.journal_batches())[-1]
        assert batch == [["Job", "JobDeregistered", "web", None]]
    check(h, purged={"web"})


def test_reregister_after_purge_recounts_the_left_allocs(h: Harness) -> None:
    """Regression: the new summary started at zero while the purged job's allocs remained."""
    seed(h)
    place(h, make_alloc("a1"), make_alloc("a2"))
    client(h, "a1", "running")
    h.ok(m.JobDeregister(job_id="web", purge=True))
    client(h, "a2", "failed")  # the purged job's summary is gone; nothing to count into
    h.ok(m.JobRegister(job=make_job("web", count=2)))
    counts = summary_counts(h)
    assert (counts["running"], counts["failed"], counts["starting"]) == (1, 1, 0)
    with h.reader() as r:
        assert r.job("web").status == "running"  # adopts the live alloc
    check(h)


def test_batch_deregister_purges_collectable_job_with_everything_it_owns(h: Harness) -> None:
    seed(h)
    place(
        h,
        make_alloc("a1", deployment_id="d1"),
        deployment=make_deployment("d1", status="successful"),
    )
    client(h, "a1", "complete")
    h.ok(m.JobDeregister(job_id="web"))
    with h.reader() as r:
        job = r.job("web")
        assert job.status == "dead"
    wrong = unchanged(
        h, m.JobBatchDeregister(jobs=[m.Reap(id="web", modify_index=job.modify_index - 1)])
    )
    assert wrong.value == {"reaped": [], "skipped": ["web"]}
    value = h.ok(
        m.JobBatchDeregister(
            jobs=[m.Reap(id="web", modify_index=job.modify_index), m.Reap(id="x", modify_index=1)]
        )
    )
    assert value == {"reaped": ["web"], "skipped": ["x"]}
    state = h.dump()
    for table in ("jobs", "job_versions", "job_summary", "evals", "allocs", "deployments"):
        assert state[table] == {}, table
    assert state["gc_marks"] == {} or all(
        not k.startswith((b"job", b"eval", b"deployment")) for k in state["gc_marks"]
    )
    with h.reader() as r:
        assert r.allocs_by_node("n1") == []
    check(h, deleted_from={"jobs", "job_versions", "job_summary", "evals", "allocs", "deployments"})


def test_batch_deregister_skips_a_job_with_live_allocs(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    h.ok(m.JobDeregister(job_id="web"))  # stopped, but a1 still runs
    with h.reader() as r:
        mi = r.job("web").modify_index
    assert unchanged(h, m.JobBatchDeregister(jobs=[m.Reap(id="web", modify_index=mi)])).value[
        "skipped"
    ] == ["web"]


def test_batch_job_status_pending_running_dead(h: Harness) -> None:
    seed(h, job=make_job("etl", type="batch", count=1))

    def status() -> str:
        with h.reader() as r:
            return r.job("etl").status

    assert status() == "pending"  # eval e1 is pending
    place(h, make_alloc("a1", job_id="etl"), job_id="etl")  # e1 complete, a1 pending
    assert status() == "running"
    client(h, "a1", "running")
    assert status() == "running"
    client(h, "a1", "complete")
    assert status() == "dead"
    with h.reader() as r:
        assert [obj_id for _, obj_id in r.gc_marks("job", until=2**63)] == ["etl"]
    counts = summary_counts(h, "etl")
    assert (counts["complete"], counts["running"], counts["starting"]) == (1, 0, 0)
    check(h)


def test_system_and_periodic_jobs_are_running_until_stopped(h: Harness) -> None:
    h.ok(m.JobRegister(job=make_job("sys", type="system")))
    h.ok(m.JobRegister(job=make_job("cron", type="batch", periodic=True)))
    with h.reader() as r:
        assert r.job("sys").status == r.job("cron").status == "running"
    h.ok(m.JobDeregister(job_id="sys"))
    with h.reader() as r:
        assert r.job("sys").status == "dead"
    check(h)


# == evals ==================================================================
def test_eval_upsert_indexes_status_queued_and_gc_mark(h: Harness) -> None:
    seed(h)
    h.ok(
        m.EvalUpsert(evals=[make_eval("e2", "web", status="blocked", queued_allocations={"g": 2})])
    )
    assert summary_counts(h)["queued"] == 2
    with h.reader() as r:
        assert r.eval_ids_by_status("blocked") == ["e2"] and sorted(r.eval_ids_by_job("web")) == [
            "e1",
            "e2",
        ]
    h.ok(m.EvalUpsert(evals=[make_eval("e2", "web", status="failed")]))
    with h.reader() as r:
        assert r.eval_ids_by_status("blocked") == [] and r.eval_ids_by_status("failed") == ["e2"]
        assert r.gc_marks("eval", until=2**63) == [(h.time, "e2")]
        ev = r.eval("e2")
        assert ev.create_index == 3 and ev.modify_index == 4
    h.ok(m.EvalUpsert(evals=[make_eval("e2", "web", status="pending")]))
    with h.reader() as r:
        assert r.gc_marks("eval", until=2**63) == []
    check(h)


def test_eval_upsert_rejects_bad_evals_as_a_whole(h: Harness) -> None:
    seed(h)
    good = make_eval("e2", "web")
    rejected(
        h,
        m.EvalUpsert(evals=[good, make_eval("e3", "web", status="done")]),
        "bad_request",
        "status 'done'",
    )
    rejected(h, m.EvalUpsert(evals=[good, make_eval("", "web")]), "bad_request", "evaluation ID")
    rejected(h, m.EvalUpsert(evals=[make_eval("e4", "")]), "bad_request", "job ID")


def test_eval_cannot_move_to_another_job(h: Harness) -> None:
    """Regression: moving an eval orphaned its allocs when the new job was purged by GC."""
    seed(h)
    place(h, make_alloc("a1"))
    rejected(
        h,
        m.EvalUpsert(evals=[make_eval("e1", "api", status="complete")]),
        "bad_request",
        "cannot move to job api",
    )
    check(h)


def test_eval_reap(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"), make_alloc("a2"))
    client(h, "a1", "complete")
    with h.reader() as r:
        e1, a1, a2 = r.eval("e1"), r.alloc("a1"), r.alloc("a2")
    # wrong modify index / live alloc / non-terminal alloc reap: all skipped
    assert unchanged(h, m.EvalReap(evals=[m.Reap("e1", e1.modify_index)])).value["skipped"] == [
        "e1"
    ]
    assert unchanged(h, m.EvalReap(allocs=[m.Reap("a2", a2.modify_index)])).value["skipped"] == [
        "a2"
    ]
    assert unchanged(
        h, m.EvalReap(allocs=[m.Reap("a1", a1.modify_index + 1), m.Reap("", 1)])
    ).value["skipped"] == ["a1", ""]
    # a terminal alloc alone
    assert h.ok(m.EvalReap(allocs=[m.Reap("a1", a1.modify_index)]))["allocs"] == ["a1"]
    assert summary_counts(h)["complete"] == 0  # the summary follows the allocs
    # the eval goes with its (now terminal) allocs
    client(h, "a2", "failed")
    with h.reader() as r:
        e1 = r.eval("e1")
    value = h.ok(m.EvalReap(evals=[m.Reap("e1", e1.modify_index)]))
    assert value == {"evals": ["e1"], "allocs": ["a2"], "skipped": []}
    with h.reader() as r:
        assert r.evals() == [] and r.allocs() == [] and r.gc_marks("eval", until=2**63) == []
        assert r.job("web").status == "pending"  # no history left (see report)
    check(h, deleted_from={"evals", "allocs"})


def test_eval_reap_skips_pending_eval(h: Harness) -> None:
    seed(h)
    with h.reader() as r:
        mi = r.eval("e1").modify_index
    assert unchanged(h, m.EvalReap(evals=[m.Reap("e1", mi)])).value["skipped"] == ["e1"]


# == plans ==================================================================
def test_plan_places_allocs_counts_summary_and_indexes(h: Harness) -> None:
    seed(h, nodes=("n1", "n2"))
    h.ok(m.EvalUpsert(evals=[make_eval("e1", "web", queued_allocations={"g": 2})]))
    value = place(h, make_alloc("a1", node_id="n1"), make_alloc("a2", node_id="n2"))
    assert value == {"placed": ["a1", "a2"], "stopped": [], "eval_ids": ["e1"]}
    assert summary_counts(h) == {
        "queued": 0,
        "starting": 2,
        "running": 0,
        "complete": 0,
        "failed": 0,
        "lost": 0,
    }
    with h.reader() as r:
        assert r.job("web").status == "running"
        assert [a.id for a in r.allocs_by_node("n1", terminal=False)] == ["a1"]
        assert sorted(r.alloc_ids_by_eval("e1")) == ["a1", "a2"]
        a1 = r.alloc("a1")
        assert a1.create_index == a1.modify_index == a1.alloc_modify_index == h.index
    check(h)


@pytest.mark.parametrize(
    ("alloc", "code", "message"),
    [
        (make_alloc("a1", job_id="ghost"), "conflict", "job ghost no longer exists"),
        (make_alloc("a1", node_id="n9"), "conflict", "node n9 does not exist"),
        (make_alloc("a1", client="bogus"), "bad_request", "client status 'bogus'"),
        (make_alloc("a1", desired="halt"), "bad_request", "desired status 'halt'"),
        (
            make_alloc(
                "",
            ),
            "bad_request",
            "allocation ID",
        ),
        (make_alloc("a1", node_id="n\x001"), "bad_request", "node ID"),
    ],
)
def test_plan_with_bad_alloc_is_rejected_whole(
    h: Harness, alloc: Any, code: str, message: str
) -> None:
    seed(h)
    plan = m.PlanApply(
        eval_id="e1",
        job_id="web",
        allocs_to_place=[make_alloc("ok1"), alloc],
        evals=[make_eval("e1", "web", status="complete")],
    )
    rejected(h, plan, code, re.escape(message))


def test_plan_alloc_needs_an_existing_eval_of_its_job(h: Harness) -> None:
    """Regression: allocs were placed with a missing eval (orphans) or another job's eval."""
    seed(h)
    h.ok(m.JobRegister(job=make_job("api"), eval=make_eval("e2", "api")))
    missing = m.PlanApply(allocs_to_place=[make_alloc("a1", eval_id="e9")])
    rejected(h, missing, "conflict", "evaluation e9 does not exist")
    other_job = m.PlanApply(allocs_to_place=[make_alloc("a1", eval_id="e2")])
    rejected(h, other_job, "bad_request", "its evaluation e2 is for job api")
    in_plan = m.PlanApply(
        allocs_to_place=[make_alloc("a1", eval_id="e3")], evals=[make_eval("e3", "api")]
    )
    rejected(h, in_plan, "bad_request", "its evaluation e3 is for job api")
    # an eval that arrives with the plan is fine
    h.ok(
        m.PlanApply(
            allocs_to_place=[make_alloc("a1", eval_id="e4")],
            evals=[make_eval("e4", "web", status="complete")],
        )
    )
    check(h)


def test_plan_stop_validates_and_stops(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"), make_alloc("a2"))
    # regression: the stop's desired status was not validated
    rejected(
        h,
        m.PlanApply(allocs_to_stop=[m.AllocStop(id="a1", desired_status="halt")]),
        "bad_request",
        "desired status 'halt'",
    )
    rejected(
        h,
        m.PlanApply(allocs_to_stop=[m.AllocStop(id="a1", client_status="gone")]),
        "bad_request",
        "client status 'gone'",
    )
    value = h.ok(
        m.PlanApply(
            allocs_to_stop=[
                m.AllocStop(id="a1", desired_description="scaled down"),
                m.AllocStop(
                    id="a2", desired_status="evict", client_status="lost", followup_eval_id="e5"
                ),
                m.AllocStop(id="missing"),
            ]
        )
    )
    assert value["stopped"] == ["a1", "a2"]
    with h.reader() as r:
        a1, a2 = r.alloc("a1"), r.alloc("a2")
        assert a1.desired_status == "stop" and a1.client_status == "pending" and a1.terminal()
        assert a2.client_status == "lost" and a2.followup_eval_id == "e5"
        assert r.allocs_by_node("n1", terminal=False) == []
        assert r.job("web").status == "dead"
    counts = summary_counts(h)
    assert (counts["starting"], counts["lost"]) == (1, 1)
    check(h)


def test_plan_in_place_update_keeps_client_state_and_moves_group_count(h: Harness) -> None:
    seed(h, job=make_job("web", groups=("g", "h")))
    place(h, make_alloc("a1"))
    client(h, "a1", "running", task_states={"t": TaskState(state="running")})
    update = make_alloc("a1", group="h", client="pending")
    update.job_version = 1
    place(h, update)
    with h.reader() as r:
        a1 = r.alloc("a1")
        assert a1.client_status == "running" and a1.task_states["t"].state == "running"
        assert a1.task_group == "h" and a1.job_version == 1 and a1.create_index < a1.modify_index
    assert summary_counts(h, group="g")["running"] == 0
    assert summary_counts(h, group="h")["running"] == 1
    check(h)


def test_plan_in_place_update_to_another_job_reindexes(h: Harness) -> None:
    """Regression: allocs_by_job / allocs_live_by_job kept the old job's rows."""
    seed(h)
    h.ok(m.JobRegister(job=make_job("api"), eval=make_eval("e2", "api")))
    place(h, make_alloc("a1"))
    place(h, make_alloc("a1", eval_id="e2", job_id="api"), eval_id="e2", job_id="api")
    with h.reader() as r:
        assert r.alloc_ids_by_job("web") == [] and r.alloc_ids_by_job("api") == ["a1"]
        assert not r.job_has_live_allocs("web") and r.job_has_live_allocs("api")
        assert r.job("web").status == "dead" and r.job("api").status == "running"
    check(h)


def test_plan_links_previous_allocation_and_upserts_deployment(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    client(h, "a1", "failed")
    replacement = make_alloc("a2", previous_allocation="a1", deployment_id="d1")
    place(h, replacement, deployment=make_deployment("d1"))
    with h.reader() as r:
        assert r.alloc("a1").next_allocation == "a2"
        assert [a.id for a in r.allocs_by_deployment("d1")] == ["a2"]
        assert [d.id for d in r.deployments_by_job("web")] == ["d1"]
    check(h)


# == client updates =========================================================
def test_client_update_moves_summary_counters(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"), make_alloc("a2"))
    client(h, "a1", "running")
    value = h.ok(
        m.AllocClientUpdate(
            allocs=[
                m.AllocClientState(id="a2", client_status="failed", client_description="oom"),
                m.AllocClientState(id="ghost", client_status="running"),
            ],
            evals=[make_eval("e2", "web", triggered_by="alloc-failure")],
        )
    )
    assert value == {"updated": ["a2"], "ignored": ["ghost"], "eval_ids": ["e2"]}
    assert summary_counts(h) == {
        "queued": 0,
        "starting": 0,
        "running": 1,
        "complete": 0,
        "failed": 1,
        "lost": 0,
    }
    with h.reader() as r:
        assert r.alloc("a2").client_description == "oom"
        assert [a.id for a in r.allocs_by_node("n1", terminal=True)] == ["a2"]
    check(h)


def test_client_update_terminal_status_is_final(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    client(h, "a1", "complete")
    value = client(h, "a1", "running")
    assert value["ignored"] == ["a1"]
    with h.reader() as r:
        assert r.alloc("a1").client_status == "complete"


def test_client_update_invalid_status_or_missing_alloc(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    bad = m.AllocClientUpdate(
        allocs=[
            m.AllocClientState(id="a1", client_status="running"),
            m.AllocClientState(id="a1", client_status="exploded"),
        ]
    )
    rejected(h, bad, "bad_request", "client status 'exploded'")
    # regression: an empty id made LMDB raise, which apply treats as a fatal storage error
    value = h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id="", client_status="running")]))
    assert value["ignored"] == [""]


def test_client_update_with_task_states_encodes_and_applies(h: Harness) -> None:
    """Regression: encode_entry could not encode Optional[dict[str, TaskState]]."""
    seed(h)
    place(h, make_alloc("a1"))
    states = {"t": TaskState(state="running", restarts=2, started_at=5)}
    client(h, "a1", "running", task_states=states)
    with h.reader() as r:
        assert r.alloc("a1").task_states == states


def test_client_update_stores_what_a_full_record_write_would(h: Harness) -> None:
    """The map-based client-update path writes the bytes put_alloc would write."""
    seed(h)
    place(h, make_alloc("a1", deployment_id="d1"), deployment=make_deployment("d1"))
    with h.reader() as r:
        expected = r.alloc("a1")
    client(
        h,
        "a1",
        "running",
        client_description="up",
        task_states={"t": TaskState(state="running", started_at=7)},
        deployment_status=DeploymentStatus(healthy=True, timestamp=5),
    )
    expected.client_status, expected.client_description = "running", "up"
    expected.task_states = {"t": TaskState(state="running", started_at=7)}
    expected.deployment_status = DeploymentStatus(healthy=True, timestamp=5)
    expected.modify_index, expected.modify_time = h.index, h.time
    with h.reader() as r:
        assert r.txn.get(b"a1", db=r.dbs["allocs"]) == codec.encode(expected)
        _, batch = list(r.journal_batches())[-1]
        assert batch[-1] == ["Allocation", "AllocationUpdated", "a1", codec.to_wire(expected)]


def test_client_deployment_health_counts_once(h: Harness) -> None:
    seed(h)
    dep = make_deployment("d1")
    place(
        h,
        make_alloc("a1", deployment_id="d1"),
        make_alloc("a2", deployment_id="d1"),
        deployment=dep,
    )
    client(h, "a1", "running", deployment_status=DeploymentStatus(healthy=True))
    client(h, "a1", "running", deployment_status=DeploymentStatus(healthy=True))  # already reported
    client(h, "a2", "running", deployment_status=DeploymentStatus(healthy=False))
    with h.reader() as r:
        state = r.deployment("d1").task_groups["g"]
        assert (state.healthy_allocs, state.unhealthy_allocs) == (1, 1)
    check(h)


def test_desired_transition(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    value = h.ok(
        m.AllocDesiredTransition(
            allocs={
                "a1": DesiredTransition(migrate=True),
                "ghost": DesiredTransition(reschedule=True),
            },
            evals=[make_eval("e2", "web")],
        )
    )
    assert value == {"updated": ["a1"], "eval_ids": ["e2"]}
    with h.reader() as r:
        a1 = r.alloc("a1")
        assert a1.desired_transition.migrate and a1.alloc_modify_index == h.index
    rejected(
        h,
        m.AllocDesiredTransition(
            allocs={"a1": DesiredTransition()}, evals=[make_eval("e3", "web", status="?")]
        ),
        "bad_request",
        "status '\\?'",
    )


# == deployments ============================================================
def test_deployment_upsert_status_and_gc_mark(h: Harness) -> None:
    seed(h)
    h.ok(m.DeploymentUpsert(deployment=make_deployment("d1")))
    with h.reader() as r:
        assert r.job("web").status == "pending"  # the pending eval comes first
        assert r.latest_deployment("web").id == "d1"
    value = h.ok(
        m.DeploymentStatusUpdate(deployment_id="d1", status="failed", eval=make_eval("e2", "web"))
    )
    assert value == {"deployment_id": "d1", "eval_ids": ["e2"]}
    with h.reader() as r:
        assert r.deployment("d1").status == "failed"
        assert r.gc_marks("deployment", until=2**63) == [(h.time, "d1")]
    # Finished is final: a success (or a user's fail) arriving late changes nothing.
    for late in ("successful", "failed", "running"):
        rejected(h, m.DeploymentStatusUpdate(deployment_id="d1", status=late), "conflict", "already failed")
    rejected(
        h,
        m.DeploymentStatusUpdate(deployment_id="d1", status="exploded"),
        "bad_request",
        "status 'exploded'",
    )
    rejected(
        h,
        m.DeploymentStatusUpdate(deployment_id="d9", status="failed"),
        "not_found",
        "deployment d9",
    )
    rejected(
        h, m.DeploymentStatusUpdate(deployment_id="", status="failed"), "not_found", "deployment"
    )
    rejected(
        h,
        m.DeploymentUpsert(deployment=make_deployment("d2", status="weird")),
        "bad_request",
        "status 'weird'",
    )
    rejected(
        h, m.DeploymentUpsert(deployment=make_deployment("d2", job_id="")), "bad_request", "job ID"
    )
    check(h)


def test_deployment_moving_to_another_job_reindexes(h: Harness) -> None:
    """Regression: deployments_by_job kept the old job's row."""
    h.ok(m.DeploymentUpsert(deployment=make_deployment("d1", job_id="web")))
    h.ok(m.DeploymentUpsert(deployment=make_deployment("d1", job_id="api")))
    with h.reader() as r:
        assert r.deployments_by_job("web") == [] and [
            d.id for d in r.deployments_by_job("api")
        ] == ["d1"]
    check(h)


def test_deployment_reap(h: Harness) -> None:
    seed(h)
    place(
        h,
        make_alloc("a1", deployment_id="d1"),
        deployment=make_deployment("d1", status="successful"),
    )
    h.ok(m.DeploymentUpsert(deployment=make_deployment("d2")))
    with h.reader() as r:
        d1, d2 = r.deployment("d1"), r.deployment("d2")
    skipped = unchanged(
        h,
        m.DeploymentReap(
            deployments=[
                m.Reap("d1", d1.modify_index),  # a1 is not terminal
                m.Reap("d2", d2.modify_index),  # active
                m.Reap("d9", 1),
                m.Reap("", 1),
            ]
        ),
    )
    assert skipped.value == {"reaped": [], "skipped": ["d1", "d2", "d9", ""]}
    client(h, "a1", "complete")
    assert unchanged(h, m.DeploymentReap(deployments=[m.Reap("d1", d1.modify_index + 1)])).value[
        "skipped"
    ] == ["d1"]
    assert h.ok(m.DeploymentReap(deployments=[m.Reap("d1", d1.modify_index)]))["reaped"] == ["d1"]
    with h.reader() as r:
        assert r.deployment("d1") is None and r.gc_marks("deployment", until=2**63) == []
    check(h, deleted_from={"deployments"})


# == nodes ==================================================================
def test_node_register_status_and_gc_mark(h: Harness) -> None:
    node = make_node("n1", status="ready")
    node.status_updated_at = 42  # the leader's value is not trusted
    h.ok(m.NodeRegister(node=node))
    down_at = h.time + SECOND
    h.ok(m.NodeUpdateStatus(node_id="n1", status="down", evals=[make_eval("e1", "web")]))
    with h.reader() as r:
        assert r.node("n1").status_updated_at == down_at
        assert r.gc_marks("node", until=2**63) == [(down_at, "n1")]
    # regression: re-registering a down node took status_updated_at from the entry
    again = make_node("n1", status="down")
    again.status_updated_at = 42
    h.ok(m.NodeRegister(node=again))
    with h.reader() as r:
        assert r.node("n1").status_updated_at == down_at
        assert r.gc_marks("node", until=2**63) == [(down_at, "n1")]
    h.ok(m.NodeUpdateStatus(node_id="n1", status="ready"))
    with h.reader() as r:
        assert r.gc_marks("node", until=2**63) == []
    check(h)


def test_node_bad_input(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")))
    rejected(
        h,
        m.NodeRegister(node=make_node("n2", status="sleeping")),
        "bad_request",
        "status 'sleeping'",
    )
    rejected(h, m.NodeRegister(node=make_node("")), "bad_request", "node ID")
    neg = make_node("n2")
    neg.resources = Resources(cpu=-5)
    rejected(h, m.NodeRegister(node=neg), "bad_request", "resources")
    rejected(h, m.NodeUpdateStatus(node_id="n9", status="down"), "not_found", "node n9")
    rejected(h, m.NodeUpdateStatus(node_id="", status="down"), "not_found", "node")
    rejected(h, m.NodeUpdateStatus(node_id="n1", status="gone"), "bad_request", "status 'gone'")
    rejected(
        h,
        m.NodeUpdateEligibility(node_id="n1", eligibility="maybe"),
        "bad_request",
        "eligibility 'maybe'",
    )
    rejected(
        h, m.NodeUpdateEligibility(node_id="n9", eligibility="eligible"), "not_found", "node n9"
    )


def test_node_eligibility_and_drain(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")))
    h.ok(m.NodeUpdateEligibility(node_id="n1", eligibility="ineligible", drain=True))
    h.ok(m.NodeUpdateEligibility(node_id="n1", eligibility="ineligible"))  # drain unchanged
    with h.reader() as r:
        node = r.node("n1")
        assert node.scheduling_eligibility == "ineligible" and node.drain
    # As Nomad: a draining node cannot be made eligible, and a client registering again
    # (a restart sends "eligible") keeps what the operator set.
    rejected(h, m.NodeUpdateEligibility(node_id="n1", eligibility="eligible"), "bad_request", "draining")
    h.ok(m.NodeRegister(node=make_node("n1")))
    with h.reader() as r:
        node = r.node("n1")
        assert node.scheduling_eligibility == "ineligible" and node.drain
    h.ok(m.NodeUpdateEligibility(node_id="n1", eligibility="eligible", drain=False))  # the drain ends
    h.ok(m.NodeRegister(node=make_node("n1")))
    with h.reader() as r:
        assert r.node("n1").scheduling_eligibility == "eligible" and not r.node("n1").drain


def test_node_reap(h: Harness) -> None:
    seed(h)
    place(h, make_alloc("a1"))
    h.ok(m.NodeUpdateStatus(node_id="n1", status="down"))
    with h.reader() as r:
        mi = r.node("n1").modify_index
    assert unchanged(h, m.NodeReap(nodes=[m.Reap("n1", mi)])).value["skipped"] == ["n1"]  # a1 live
    client(h, "a1", "lost")
    assert unchanged(h, m.NodeReap(nodes=[m.Reap("n1", mi - 1), m.Reap("", 0)])).value[
        "skipped"
    ] == ["n1", ""]
    assert h.ok(m.NodeReap(nodes=[m.Reap("n1", mi)]))["reaped"] == ["n1"]
    with h.reader() as r:
        assert r.node("n1") is None and r.gc_marks("node", until=2**63) == []
    check(h, deleted_from={"nodes"})


def test_node_reap_skips_ready_node(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")))
    assert unchanged(h, m.NodeReap(nodes=[m.Reap("n1", 1)])).value["skipped"] == ["n1"]


# == ACL ====================================================================
def test_acl_bootstrap_once(h: Harness) -> None:
    value = h.ok(m.ACLTokenBootstrap(token=make_token("root", "s3cret", type="management")))
    assert value == {"accessor_id": "root"}
    with h.reader() as r:
        assert r.acl_bootstrap_index() == 1
        assert r.token_by_secret_hash(secret_hash("s3cret")).accessor_id == "root"
    rejected(
        h,
        m.ACLTokenBootstrap(token=make_token("root2", type="management")),
        "conflict",
        "already done",
    )
    check(h)


def test_acl_bootstrap_must_be_management(h: Harness) -> None:
    rejected(
        h,
        m.ACLTokenBootstrap(token=make_token("root", type="client")),
        "bad_request",
        "management token",
    )
    with h.reader() as r:
        assert r.acl_bootstrap_index() == 0


def test_acl_token_upsert_secret_collision_and_bad_tokens(h: Harness) -> None:
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t1", "s1")]))
    rejected(
        h, m.ACLTokenUpsert(tokens=[make_token("t2", "s1")]), "conflict", "secret already belongs"
    )
    # two new tokens with one secret in one entry
    rejected(
        h,
        m.ACLTokenUpsert(tokens=[make_token("t3", "s3"), make_token("t4", "s3")]),
        "conflict",
        "secret",
    )
    short = make_token("t2", "s2")
    short.secret_hash = "abc"
    rejected(h, m.ACLTokenUpsert(tokens=[short]), "bad_request", "SHA-256")
    rejected(
        h, m.ACLTokenUpsert(tokens=[make_token("t2", type="root")]), "bad_request", "type 'root'"
    )
    rejected(h, m.ACLTokenUpsert(tokens=[make_token("")]), "bad_request", "accessor ID")
    # regression: a negative expiry was an 'internal' OverflowError
    rejected(
        h,
        m.ACLTokenUpsert(tokens=[make_token("t2", expiration=-1)]),
        "bad_request",
        "expiration_time",
    )
    # the same accessor may rotate its secret; the old secret stops resolving
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t1", "s1-rotated")]))
    with h.reader() as r:
        assert r.token_by_secret_hash(secret_hash("s1")) is None
        assert r.token("t1").create_index == 1 and r.token("t1").modify_index == h.index
    check(h)


def test_acl_token_expiry_gc_mark_and_reap(h: Harness) -> None:
    expires = T0 + 3 * SECOND
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t1", expiration=expires), make_token("t2")]))
    with h.reader() as r:
        assert r.gc_marks("token", until=2**63) == [(expires, "t1")]
        assert r.gc_marks("token", until=expires - 1) == []
        mi = r.token("t1").modify_index
    # not expired yet at the entry's time (T0 + 2s)
    assert unchanged(h, m.ACLTokenDelete(reaps=[m.Reap("t1", mi)])).value["skipped"] == ["t1"]
    h.time = expires + MINUTE
    assert unchanged(h, m.ACLTokenDelete(reaps=[m.Reap("t1", mi + 1), m.Reap("t2", 1)])).value[
        "skipped"
    ] == ["t1", "t2"]
    assert h.ok(m.ACLTokenDelete(reaps=[m.Reap("t1", mi)])) == {"deleted": ["t1"], "skipped": []}
    with h.reader() as r:
        assert r.gc_marks("token", until=2**63) == [] and r.token("t1") is None
    check(h, deleted_from={"acl_tokens"})


def test_acl_token_delete(h: Harness) -> None:
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t1"), make_token("t2")]))
    rejected(h, m.ACLTokenDelete(accessor_ids=["t1", "t9"]), "not_found", "token t9 not found")
    assert h.ok(m.ACLTokenDelete(accessor_ids=["t1"]))["deleted"] == ["t1"]
    with h.reader() as r:
        assert r.token("t1") is None and r.token_by_secret_hash(secret_hash("secret-t1")) is None
    check(h, deleted_from={"acl_tokens"})


def test_token_secret_never_reaches_journal_or_results(h: Harness) -> None:
    h.ok(m.ACLTokenBootstrap(token=make_token("root", "boot-secret", type="management")))
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t1", "s1", expiration=T0 + MINUTE)]))
    rejected(h, m.ACLTokenUpsert(tokens=[make_token("t2", "s1")]), "conflict", "secret")
    h.ok(m.ACLTokenDelete(accessor_ids=["t1"]))
    state = h.dump()
    hashes = [secret_hash(s).encode() for s in ("boot-secret", "s1")]
    for db in ("journal", "requests", "meta"):
        for value in state[db].values():
            assert not any(s in value for s in hashes), db
    with h.reader() as r:
        records = [rec for _, batch in r.journal_batches() for rec in batch]
    assert [rec[:3] for rec in records] == [
        ["ACLToken", "ACLTokenUpserted", "root"],
        ["ACLToken", "ACLTokenUpserted", "t1"],
        ["ACLToken", "ACLTokenDeleted", "t1"],
    ]
    assert "secret_hash" not in records[0][3] and records[0][3]["accessor_id"] == "root"


# == barrier, journal, request ids, skipping ================================
def test_barrier_changes_only_the_applied_index(h: Harness) -> None:
    seed(h)
    before = without_bookkeeping(h.dump())
    result = h.apply(m.Barrier())
    assert result.ok and result.value == {}
    assert without_bookkeeping(h.dump()) == before
    with h.reader() as r:
        assert r.applied_index == h.index and r.journal_bounds()[1] == h.index - 1


def test_journal_batch_per_entry(h: Harness) -> None:
    seed(h)  # 1: node, 2: job + eval
    place(h, make_alloc("a1"))  # 3
    h.apply(m.Barrier())  # 4: no records, no batch
    rejected(h, m.JobDeregister(job_id="nope"), "not_found")  # 5: no batch
    client(h, "a1", "running")  # 6
    with h.reader() as r:
        batches = dict(r.journal_batches())
        assert sorted(batches) == [1, 2, 3, 6]
        assert [rec[:3] for rec in batches[1]] == [["Node", "NodeRegistration", "n1"]]
        assert [rec[:2] for rec in batches[2]] == [
            ["Job", "JobRegistered"],
            ["Evaluation", "EvaluationUpdated"],
        ]
        assert ["Allocation", "PlanResult", "a1"] in [rec[:3] for rec in batches[3]]
        assert ["Job", "JobStatusChanged", "web"] in [rec[:3] for rec in batches[3]]
        assert [rec[:3] for rec in batches[6]] == [["Allocation", "AllocationUpdated", "a1"]]
        assert batches[6][0][3]["client_status"] == "running"
        assert dict(r.journal_batches(after=3)) == {6: batches[6]}
        assert r.table_index("journal") == 6


def test_large_journal_batch_is_one_msgpack_array(h: Harness) -> None:
    """Records are packed one by one and joined; >15 of them need the array16 header."""
    seed(h, job=make_job("web", count=20))
    place(h, *[make_alloc(f"a{i:02d}") for i in range(20)])
    with h.reader() as r:
        index, batch = list(r.journal_batches())[-1]
        raw = dict(r.iter_raw("journal"))[index.to_bytes(8, "big")]
    assert raw[:3] == b"\xdc\x00\x16" and len(batch) == 22  # array16 of 22: 20 allocs, the eval, the job status
    assert [rec[2] for rec in batch if rec[0] == "Allocation"] == [f"a{i:02d}" for i in range(20)]


def test_journal_retention_trims_oldest_batches() -> None:
    h = Harness.temp(retention=Retention(max_batches=3, max_bytes=1 << 20))
    try:
        for i in range(6):
            h.ok(m.NodeRegister(node=make_node(f"n{i}")))
        with h.reader() as r:
            assert r.journal_bounds() == (4, 6)
            assert [i for i, _ in r.journal_batches()] == [4, 5, 6]
    finally:
        h.destroy()
    h = Harness.temp(retention=Retention(max_batches=100, max_bytes=1))
    try:
        for i in range(3):
            h.ok(m.NodeRegister(node=make_node(f"n{i}")))
        with h.reader() as r:
            assert r.journal_bounds() == (3, 3)  # the newest batch is always kept
    finally:
        h.destroy()


def test_request_id_dedupe_returns_first_result(h: Harness) -> None:
    first = h.apply(m.JobRegister(job=make_job("web")), rid="req-1")
    assert first.ok and not first.duplicate
    before = without_bookkeeping(h.dump())
    # a retry: same rid, even with a different body, returns the first result
    retry = h.apply(m.JobRegister(job=make_job("web", count=9)), rid="req-1")
    assert retry.duplicate and retry.to_wire() == first.to_wire() and retry.index == 1
    assert without_bookkeeping(h.dump()) == before
    # the first result of a rejected request is remembered too
    bad = h.apply(m.JobDeregister(job_id="nope"), rid="req-2")
    h.ok(m.JobRegister(job=make_job("nope")))
    again = h.apply(m.JobDeregister(job_id="nope"), rid="req-2")
    assert (
        again.duplicate and not again.ok and again.code == "not_found" and again.index == bad.index
    )
    with h.reader() as r:
        assert r.request_result("req-1")["value"]["version"] == 0


def test_request_id_is_forgotten_after_ttl() -> None:
    h = Harness.temp(request_ttl=MINUTE, request_min_entries=0)
    try:
        h.apply(m.JobRegister(job=make_job("web")), rid="r")
        h.time += 2 * MINUTE
        h.ok(m.Barrier(), rid="r2")  # remembering r2 trims what is older than the TTL
        with h.reader() as r:
            assert r.request_result("r") is None
        result = h.apply(m.JobRegister(job=make_job("web", count=3)), rid="r")
        assert result.ok and not result.duplicate and result.value["version"] == 1
    finally:
        h.destroy()


def test_a_leader_clock_step_past_the_ttl_does_not_forget_recent_request_ids() -> None:
    """Found by jepsen_like (seed 162): a write retried after a leader change was applied twice.

    The new leader's wall clock had jumped a day ahead; its first entry made
    every remembered id older than the TTL. Ids stay for at least
    ``request_min_entries`` indices, whatever the times say.
    """
    h = Harness.temp(request_ttl=MINUTE, request_min_entries=5)
    try:
        h.apply(m.JobRegister(job=make_job("web")), rid="before-the-step")
        h.time += 86_400 * SECOND  # the next leader's clock is a day ahead
        h.ok(m.Barrier(), rid="after-the-step")
        retry = h.apply(m.JobRegister(job=make_job("web")), rid="before-the-step")
        assert retry.duplicate and retry.value["version"] == 0, "the retry must not apply again"
        for k in range(5):  # once the id is more than 5 indices old too, it goes
            h.ok(m.Barrier(), rid=f"later-{k}")
        with h.reader() as r:
            assert r.request_result("before-the-step") is None
            assert r.request_result("after-the-step") is not None
    finally:
        h.destroy()


def test_request_expiry_after_a_rollback_brings_old_rows_back() -> None:
    """A rollback restores rows an undone entry had expired; the replay must expire them again."""
    h = Harness.temp(request_ttl=MINUTE, request_min_entries=0)
    try:
        h.ok(m.Barrier(), rid="old")
        h.time += 2 * MINUTE
        h.ok(m.Barrier(), rid="new", commit=False)  # expires "old" in the open group
        # rejected after it wrote: the group is rolled back and "new" applied again
        bad = h.apply(m.JobRegister(job=make_job("web"), eval=make_eval("e1", "other")), rid="bad")
        assert bad.code == "bad_request"
        with h.reader() as r:
            assert r.request_result("old") is None
            assert r.request_result("new") is not None
    finally:
        h.destroy()


def test_request_expiry_after_an_aborted_group() -> None:
    """An aborted group leaves the committed rows, which later requests still expire."""
    h = Harness.temp(request_ttl=MINUTE, request_min_entries=0)
    try:
        h.ok(m.Barrier(), rid="old")
        h.time += 2 * MINUTE
        h.ok(m.Barrier(), rid="new", commit=False)  # expires "old", uncommitted
        with pytest.raises(FatalCalled):
            h.raw(bytes([99]) + b"from a newer version")  # stops the node: the group is aborted
        h.index -= 1  # that entry was never applied
        h.ok(m.Barrier(), rid="newer")
        with h.reader() as r:
            assert r.request_result("old") is None
            assert r.request_result("new") is None
            assert r.request_result("newer") is not None
    finally:
        h.destroy()


def test_index_at_or_below_applied_is_skipped(h: Harness) -> None:
    seed(h)
    before = h.dump()
    entry = encode_entry(m.JobDeregister(job_id="web", purge=True), time=T0, rid="")
    for index in (1, 2):
        result = h.fsm.apply(index, entry)
        assert result.skipped and result.ok and result.index == index
    h.fsm.commit()
    assert h.dump() == before


def test_last_time_is_monotonic_and_stamps_objects(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")), time=T0 + 100)
    h.ok(m.NodeRegister(node=make_node("n2")), time=T0 + 50)  # a leader with a slow clock
    assert h.fsm.last_time == T0 + 100
    with h.reader() as r:
        assert r.node("n2").create_time == T0 + 100  # stamped with last_time, not the entry time
        assert r.last_time == T0 + 100
    h.ok(m.Barrier(), time=T0 + 200)
    assert h.fsm.last_time == T0 + 200


def test_apply_result_wire_form_round_trips(h: Harness) -> None:
    result = h.apply(m.JobRegister(job=make_job("web")), rid="x")
    wire = codec.unpack(codec.pack(result.to_wire()))
    assert wire == {"index": 1, "ok": True, "value": result.value, "code": "", "error": ""}


def test_register_stores_any_typed_config_with_odd_keys(h: Harness) -> None:
    """Regression: a task config map with integer keys failed to load ('internal')."""
    job = make_job("web")
    job.task_groups[0].tasks[0].config = {"ports": {1: "http", 2: [b"\x00", None]}}
    h.ok(m.JobRegister(job=job))
    with h.reader() as r:
        assert r.job("web").task_groups[0].tasks[0].config == {
            "ports": {1: "http", 2: [b"\x00", None]}
        }


def test_new_eval_for_missing_job_is_allowed(h: Harness) -> None:
    """As in Nomad: a deregistration eval may outlive its purged job."""
    h.ok(m.EvalUpsert(evals=[Evaluation(id="e1", job_id="gone", status="complete")]))
    check(h)
