"""Evaluations: the one factory for a new one, and how a processed one ends.

Every place that makes an eval (the scheduler's follow-up and blocked evals,
the servers' register, deregister, node, drain, deployment and failed-eval
follow-up evals) goes through ``new_eval``, so the fields copied from the job
(namespace, priority, type, job modify index) are chosen in one place and a
new one is added once. It lives in ``scheduler`` because the scheduler makes
evals and may import only ``fsm``; the servers in ``node/`` import it from here.

``finish_eval`` is shared by the generic and the system scheduler; it is
here rather than in either so that neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Mapping

from fsm.ids import new_uuid
from fsm.record import copy_record
from fsm.structs import EVAL_BLOCKED, EVAL_COMPLETE, EVAL_PENDING, Evaluation, Job
from scheduler.plan import Plan
from scheduler.state import Snapshot

TRIGGER_QUEUED = "queued-allocs"
TRIGGER_FOLLOWUP = "alloc-failure"
BLOCKED_DESCRIPTION = "created to place remaining allocations"


def new_eval(
    origin: Job | Evaluation,
    triggered_by: str,
    *,
    status: str = EVAL_PENDING,
    status_description: str = "",
    node_id: str = "",
    deployment_id: str = "",
    wait_until: int = 0,
    previous_eval: str = "",
    failed_tg_allocs: Mapping[str, str] | None = None,
    job_modify_index: int | None = None,
) -> Evaluation:
    """A new evaluation of ``origin``'s job, with a fresh time-ordered id (``fsm.ids``).

    ``origin`` is the job, or an earlier eval of it (a follow-up of a failed
    eval): namespace, priority, type and job modify index come from it, so an
    eval is queued and ordered as its job is. ``job_modify_index`` overrides
    the latter: the register and deregister endpoints leave it 0 (the FSM
    stamps a registration's own).
    """
    return Evaluation(
        id=new_uuid(),
        job_id=origin.id if isinstance(origin, Job) else origin.job_id,
        namespace=origin.namespace,
        priority=origin.priority,
        type=origin.type,
        triggered_by=triggered_by,
        job_modify_index=origin.job_modify_index if job_modify_index is None else job_modify_index,
        node_id=node_id,
        deployment_id=deployment_id,
        status=status,
        status_description=status_description,
        wait_until=wait_until,
        previous_eval=previous_eval,
        failed_tg_allocs=dict(failed_tg_allocs) if failed_tg_allocs else {},
    )


def finish_eval(
    plan: Plan,
    snap: Snapshot,
    failures: dict[str, str],
    queued: dict[str, int],
    next_eval: str = "",
    deployment_id: str = "",
) -> None:
    """Put the processed eval's new status first in ``plan.evals``, plus a blocked eval when placements are missing.

    A blocked eval that still cannot place everything is written back as
    blocked instead of spawning another, so one job never has a chain of them.
    """
    ev, job = snap.eval, snap.job
    # A shallow copy suffices: every field but the two maps is immutable, and both maps are
    # replaced below (a deep copy was about a tenth of planning a one-alloc eval at 30,000 nodes).
    done = copy_record(ev)
    if deployment_id:
        done.deployment_id = deployment_id
    if next_eval:
        done.next_eval = next_eval
    done.queued_allocations = dict(queued)
    done.failed_tg_allocs = dict(failures)
    if job is not None:
        done.job_modify_index = job.job_modify_index or done.job_modify_index
    if failures and ev.status == EVAL_BLOCKED:
        done.status = EVAL_BLOCKED
        done.status_description = "blocked: waiting for capacity to place " + ", ".join(
            f"{n} {g}" for g, n in sorted(queued.items()) if n
        )
        plan.blocked_eval_id = done.id
    else:
        done.status = EVAL_COMPLETE
        done.status_description = ""
        if failures and job is not None:
            blocked = new_eval(
                job,
                TRIGGER_QUEUED,
                status=EVAL_BLOCKED,
                status_description=BLOCKED_DESCRIPTION,
                previous_eval=ev.id,
                failed_tg_allocs=failures,
            )
            done.blocked_eval = blocked.id
            plan.evals.append(blocked)
            plan.blocked_eval_id = blocked.id
    plan.evals.insert(0, done)
