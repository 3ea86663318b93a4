"""What an operator is told about a bad jobspec: every check a registration must pass.

Two layers, in this order:

1. ``fsm.validate.check_job``: the checks apply makes again on replay (the
   job ID, type and priority; at least one group, unique group names,
   counts and canaries >= 0; at least one task per group; resources >= 0).
   They are run here first, on the leader, so a spec accepted here is never
   rejected by apply, and the operator reads the very message apply would
   give. Their text lives in the FSM because the FSM must not import node.
2. Nomad's rules for how the job will be scheduled and rolled out (a system
   group's count, the reschedule policy as ``node.spec.reschedule`` checks
   it, the update and migrate strategies).
   A job breaking them cannot corrupt the state store, so apply does not
   repeat them; they are checked only here.

Every failure is a one-line ``JobSpecError`` naming the field.
"""

from __future__ import annotations

from fsm.errors import ApplyRejected
from fsm.structs import Job, MigrateStrategy, ReschedulePolicy, UpdateStrategy
from fsm.validate import check_job
from node.spec import reschedule
from node.spec.errors import JobSpecError


def check_job_spec(job: Job) -> None:
    """Raise ``JobSpecError`` for the first rule ``job`` breaks (the FSM's checks first, then Nomad's)."""
    try:
        check_job(job)
    except ApplyRejected as exc:
        raise JobSpecError(exc.message) from None
    _check_groups(job)


def _check_groups(job: Job) -> None:
    """Nomad's rules for each group's count (system jobs), reschedule policy, update and migrate strategies.

    Each is a one-line error naming the field.
    """
    for group in job.task_groups:
        where = f"Job.TaskGroups[{group.name}]"
        if job.type == "system" and group.count > 1:
            raise JobSpecError(f"{where}.Count: cannot exceed 1 with the system scheduler (0 switches the group off)")
        if group.reschedule_policy is not None:
            _check_reschedule(job, group.reschedule_policy, f"{where}.ReschedulePolicy")
        if group.update is not None:
            _check_update(group.update, f"{where}.Update")
        if group.migrate is not None:
            if job.type != "service":  # Nomad's Job.Validate
                raise JobSpecError(f"{where}.Migrate: job type {job.type!r} does not allow a migrate block "
                                   "(only service jobs are migrated in steps)")
            _check_migrate(group.migrate, f"{where}.Migrate")


def _check_reschedule(job: Job, policy: ReschedulePolicy, where: str) -> None:
    """Nomad's ``Job.Validate`` for a group's policy: none for system jobs, else ``ReschedulePolicy.Validate``.

    Every rule broken is named, in Nomad's words, on one line (Nomad lists
    them as a multierror).
    """
    if job.type == "system":
        raise JobSpecError(f"{where}: System or sysbatch jobs should not have a reschedule policy")
    found = reschedule.problems(policy)
    if found:
        raise JobSpecError(f"{where}: " + "; ".join(found))


def _check_update(update: UpdateStrategy, where: str) -> None:
    """Deadlines that can be met in order, and canaries for AutoPromote."""
    if update.max_parallel < 0:
        raise JobSpecError(f"{where}.MaxParallel: must not be negative (0 replaces every alloc at once)")
    if update.min_healthy_time < 0:
        raise JobSpecError(f"{where}.MinHealthyTime: must not be negative")
    if update.healthy_deadline <= 0:
        raise JobSpecError(f"{where}.HealthyDeadline: must be greater than zero")
    if update.progress_deadline < 0:
        raise JobSpecError(f"{where}.ProgressDeadline: must not be negative (0: the first unhealthy alloc fails the rollout)")
    if update.min_healthy_time >= update.healthy_deadline:
        raise JobSpecError(f"{where}.MinHealthyTime: must be less than HealthyDeadline "
                           f"({update.min_healthy_time} >= {update.healthy_deadline} ns)")
    if update.progress_deadline and update.healthy_deadline >= update.progress_deadline:
        raise JobSpecError(f"{where}.HealthyDeadline: must be less than ProgressDeadline "
                           f"({update.healthy_deadline} >= {update.progress_deadline} ns), or set ProgressDeadline to 0")
    if update.auto_promote and update.canary == 0:
        raise JobSpecError(f"{where}.AutoPromote: needs a Canary count greater than zero")


def _check_migrate(migrate: MigrateStrategy, where: str) -> None:
    """Nomad's MigrateStrategy.Validate."""
    if migrate.max_parallel < 0:
        raise JobSpecError(f"{where}.MaxParallel: must not be negative")
    if migrate.health_check not in ("checks", "task_states"):
        raise JobSpecError(f"{where}.HealthCheck: must be checks or task_states, not {migrate.health_check!r}")
    if migrate.min_healthy_time < 0:
        raise JobSpecError(f"{where}.MinHealthyTime: must not be negative")
    if migrate.healthy_deadline < 0:
        raise JobSpecError(f"{where}.HealthyDeadline: must not be negative")
    if migrate.min_healthy_time > migrate.healthy_deadline:
        raise JobSpecError(f"{where}.MinHealthyTime: must be less than HealthyDeadline "
                           f"({migrate.min_healthy_time} > {migrate.healthy_deadline} ns)")
