"""scheduler.evals: the one eval factory, and the scheduler's import graph.

Each test of ``new_eval`` writes out, field for field, an eval one of the
places that used to build its own built (the scheduler's follow-up and
blocked evals; the servers' node, drain and deployment evals, the register
and deregister endpoints' and the failed-eval follow-up), and checks the
factory's call for that place gives the same record but for its fresh id.
"""

from __future__ import annotations

import uuid

from fsm import codec
from fsm.record import replace
from fsm.structs import EVAL_BLOCKED, EVAL_FAILED, EVAL_PENDING, Evaluation, Job
from scheduler.evals import BLOCKED_DESCRIPTION, TRIGGER_FOLLOWUP, TRIGGER_QUEUED, new_eval

JOB = Job(id="web", namespace="ops", type="batch", priority=70, job_modify_index=42, version=3)


def same_but_id(made: Evaluation, want: Evaluation) -> None:
    uuid.UUID(made.id)
    assert made.id != want.id
    assert replace(made, id=want.id) == want
    assert codec.encode(replace(made, id=want.id)) == codec.encode(want), "the same bytes on the log"


def test_node_and_drain_evals_as_the_heartbeat_built_them() -> None:
    want = Evaluation(
        id="x", job_id="web", namespace="ops", priority=70, type="batch", triggered_by="node-update",
        job_modify_index=42, node_id="n1", status=EVAL_PENDING,
    )
    same_but_id(new_eval(JOB, "node-update", node_id="n1"), want)
    same_but_id(new_eval(JOB, "node-update"), replace(want, node_id=""))


def test_a_deployment_eval_carries_its_rollout() -> None:
    want = Evaluation(
        id="x", job_id="web", namespace="ops", priority=70, type="batch", triggered_by="deployment-watcher",
        job_modify_index=42, deployment_id="d1", status=EVAL_PENDING,
    )
    same_but_id(new_eval(JOB, "deployment-watcher", deployment_id="d1"), want)


def test_register_and_deregister_evals_leave_the_job_modify_index_to_the_fsm() -> None:
    want = Evaluation(
        id="x", job_id="web", namespace="ops", priority=70, type="batch", triggered_by="job-deregister",
        status=EVAL_PENDING,
    )
    made = new_eval(JOB, "job-deregister", job_modify_index=0)
    same_but_id(made, want)
    assert made.job_modify_index == 0


def test_a_failed_evals_follow_up_copies_the_failed_eval() -> None:
    failed = Evaluation(
        id="e1", job_id="web", namespace="ops", priority=70, type="batch", triggered_by="job-register",
        job_modify_index=41, node_id="n1", status=EVAL_FAILED, status_description="too many nacks",
    )
    want = Evaluation(
        id="x", job_id="web", namespace="ops", priority=70, type="batch", triggered_by="failed-eval-follow-up",
        job_modify_index=41, status=EVAL_PENDING, wait_until=99, previous_eval="e1",
    )
    same_but_id(new_eval(failed, "failed-eval-follow-up", wait_until=99, previous_eval="e1"), want)


def test_the_schedulers_follow_up_and_blocked_evals() -> None:
    follow = Evaluation(
        id="x", job_id="web", namespace="ops", priority=70, type="batch", triggered_by=TRIGGER_FOLLOWUP,
        job_modify_index=42, status=EVAL_PENDING, status_description="created for delayed rescheduling",
        wait_until=7, previous_eval="e1",
    )
    made = new_eval(
        JOB, TRIGGER_FOLLOWUP, status_description="created for delayed rescheduling", wait_until=7, previous_eval="e1"
    )
    same_but_id(made, follow)
    failures = {"g": "1 allocation unplaced"}
    blocked = Evaluation(
        id="x", job_id="web", namespace="ops", priority=70, type="batch", triggered_by=TRIGGER_QUEUED,
        job_modify_index=42, status=EVAL_BLOCKED, status_description=BLOCKED_DESCRIPTION, previous_eval="e1",
        failed_tg_allocs=dict(failures),
    )
    made = new_eval(
        JOB, TRIGGER_QUEUED, status=EVAL_BLOCKED, status_description=BLOCKED_DESCRIPTION, previous_eval="e1",
        failed_tg_allocs=failures,
    )
    same_but_id(made, blocked)
    failures["g"] = "changed later"
    assert made.failed_tg_allocs == {"g": "1 allocation unplaced"}, "the eval keeps its own copy"


def test_every_new_eval_has_its_own_id() -> None:
    assert len({new_eval(JOB, "job-register").id for _ in range(1000)}) == 1000
