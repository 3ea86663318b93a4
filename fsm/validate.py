"""The checks apply makes on every replica before an entry may touch state.

The leader checks requests before they reach the log, but an entry may come
from a buggy leader, a leader of another version, or a hostile peer. These
checks run again inside apply so that such an entry is refused in the same way
on every replica, and again on every replay (an ``ApplyRejected``, which
apply rolls back and turns into the entry's error result), instead of
corrupting state.

Each one guards an invariant the store, the summaries or the scheduler rely
on, which is why it must live here and not only on the leader:

* ``check_job`` (JobRegister): the job ID is a valid key; the type names a
  scheduler; the priority is 1..100 (the broker orders by it); at least one
  group, with unique valid names (summaries are keyed by group name); counts
  and canaries >= 0; at least one task per group; resources >= 0 (placement
  arithmetic); device asks well named and >= 1; queue and priority class names.
* ``check_eval`` (EvalUpsert and the evals of other entries): valid IDs and a
  known status.
* ``check_alloc``, ``check_desired_status``, ``check_client_status``
  (PlanApply, AllocClientUpdate): valid IDs and known statuses.
* ``check_deployment``, ``check_deployment_status`` (PlanApply,
  DeploymentUpsert, DeploymentStatusUpdate): valid IDs and a known status.
* ``check_node``, ``check_node_status``, ``check_eligibility`` (NodeRegister,
  NodeUpdateStatus, NodeUpdateEligibility): valid ID, known status and
  eligibility, resources >= 0, device names that each name one pool.
* ``check_id``, ``check_token_type`` (JobDeregister, ACL tokens).

What an operator is told about a bad jobspec is ``node.spec.validate``: it
runs ``check_job`` first (so a spec it accepts is never refused here, and the
operator reads the very message apply would give) and adds Nomad's rules for
scheduling and rollouts (reschedule, update, migrate, a system group's count),
which cannot corrupt state and so are not repeated in apply. The leader's plan
path runs ``check_eval`` and ``check_alloc`` too, to refuse a bad plan before
it is logged.
"""

from __future__ import annotations

from fsm.errors import ApplyRejected
from fsm.keys import MAX_ID_BYTES, valid_id
from fsm.structs import (
    CLIENT_STATUSES,
    DEPLOYMENT_STATUSES,
    DESIRED_STATUSES,
    EVAL_STATUSES,
    JOB_TYPES,
    NODE_ELIGIBLE,
    NODE_INELIGIBLE,
    NODE_STATUSES,
    TOKEN_CLIENT,
    TOKEN_MANAGEMENT,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    Node,
)


def bad(message: str) -> ApplyRejected:
    """A deterministic refusal of the entry: the same result on every replica and every replay."""
    return ApplyRejected("bad_request", message)


def check_id(value: str, what: str) -> None:
    """An ID must be usable as a key part (LMDB composite keys are bounded)."""
    if not valid_id(value):
        raise bad_id(what)


def bad_id(what: str) -> ApplyRejected:
    """The rejection of an invalid id. Callers whose ``what`` is an f-string
    check ``valid_id`` themselves and build it only on failure (apply's hot path)."""
    return bad(f"{what} must be a non-empty string of at most {MAX_ID_BYTES} bytes without NUL")


def check_job(job: Job) -> None:
    check_id(job.id, "job ID")
    if job.type not in JOB_TYPES:
        raise bad(f"job {job.id}: type {job.type!r} is not one of {', '.join(JOB_TYPES)}")
    if not 1 <= job.priority <= 100:
        raise bad(f"job {job.id}: priority {job.priority} must be between 1 and 100")
    if not job.task_groups:
        raise bad(f"job {job.id}: at least one task group is required")
    names = set()
    for group in job.task_groups:
        if not valid_id(group.name):
            raise bad_id(f"job {job.id}: task group name")
        if group.name in names:
            raise bad(f"job {job.id}: duplicate task group {group.name!r}")
        names.add(group.name)
        if group.count < 0:
            raise bad(f"job {job.id}: group {group.name}: count {group.count} must be >= 0")
        if group.update is not None and group.update.canary < 0:
            raise bad(f"job {job.id}: group {group.name}: update canary {group.update.canary} must be >= 0")
        if not group.tasks:
            raise bad(f"job {job.id}: group {group.name}: at least one task is required")
        for task in group.tasks:
            res = task.resources
            if res.cpu < 0 or res.memory_mb < 0 or res.disk_mb < 0:
                raise bad(f"job {job.id}: task {task.name}: resources must be >= 0")
            if res.devices:
                check_device_asks(f"job {job.id}: task {task.name}", res.devices)
    _check_job_names(job)


def valid_name(value: str) -> bool:
    """A queue's or priority class's name: a valid ID without whitespace or slashes (it appears in
    paths such as Kueue's ``/cohort/queue`` and in CLI arguments)."""
    return valid_id(value) and "/" not in value and not any(ch.isspace() for ch in value)


def _check_job_names(job: Job) -> None:
    """The job's queue and priority class, when it names them, are names (``valid_name``)."""
    for what, value in (("queue", job.queue), ("priority class", job.priority_class)):
        if value and not valid_name(value):
            raise bad(f"job {job.id}: {what} {value!r} must be a name of at most {MAX_ID_BYTES} bytes "
                      "without spaces or slashes")


def check_device_asks(where: str, asks: dict[str, int]) -> None:
    """Each device ask names ``type``, ``vendor/type`` or ``vendor/type/model`` and asks for at least one
    (``fsm.structs.device_matches`` reads the names; a zero count would claim nothing yet match)."""
    for name, count in asks.items():
        if not name:
            raise bad(f"{where}: a device name is empty: name it type, vendor/type or vendor/type/model")
        parts = name.split("/")
        if len(parts) > 3 or not all(parts) or any(ch.isspace() for ch in name):
            raise bad(f"{where}: device {name!r} must be named type, vendor/type or vendor/type/model")
        if count < 1:
            raise bad(f"{where}: device {name!r}: count {count} must be >= 1")


def check_node_devices(node_id: str, devices: dict[str, int]) -> None:
    """A node names each device ``vendor/type`` or ``vendor/type/model``, with a count >= 0, and never
    both ``vendor/type`` and a model of it: then every name is one pool (``fsm.structs.Resources``)."""
    for name, count in devices.items():
        parts = name.split("/")
        if len(parts) not in (2, 3) or not all(parts) or any(ch.isspace() for ch in name):
            raise bad(f"node {node_id}: device {name!r} must be named vendor/type or vendor/type/model")
        if count < 0:
            raise bad(f"node {node_id}: device {name!r}: count {count} must be >= 0")
        if len(parts) == 3 and "/".join(parts[:2]) in devices:
            raise bad(f"node {node_id}: device {name!r} and {'/'.join(parts[:2])!r}: name each model, or none")


def check_eval(ev: Evaluation) -> None:
    check_id(ev.id, "evaluation ID")
    if not valid_id(ev.job_id):
        raise bad_id(f"evaluation {ev.id}: job ID")
    if ev.status not in EVAL_STATUSES:
        raise bad(f"evaluation {ev.id}: status {ev.status!r} is not one of {', '.join(EVAL_STATUSES)}")


def check_alloc(alloc: Allocation) -> None:
    check_id(alloc.id, "allocation ID")
    if not valid_id(alloc.eval_id):
        raise bad_id(f"allocation {alloc.id}: eval ID")
    if not valid_id(alloc.job_id):
        raise bad_id(f"allocation {alloc.id}: job ID")
    if not valid_id(alloc.node_id):
        raise bad_id(f"allocation {alloc.id}: node ID")
    check_desired_status(alloc.id, alloc.desired_status)
    check_client_status(alloc.id, alloc.client_status)


def check_desired_status(alloc_id: str, status: str) -> None:
    if status not in DESIRED_STATUSES:
        raise bad(
            f"allocation {alloc_id}: desired status {status!r} is not one of {', '.join(DESIRED_STATUSES)}"
        )


def check_client_status(alloc_id: str, status: str) -> None:
    if status not in CLIENT_STATUSES:
        raise bad(
            f"allocation {alloc_id}: client status {status!r} is not one of {', '.join(CLIENT_STATUSES)}"
        )


def check_deployment(dep: Deployment) -> None:
    check_id(dep.id, "deployment ID")
    if not valid_id(dep.job_id):
        raise bad_id(f"deployment {dep.id}: job ID")
    check_deployment_status(dep.id, dep.status)


def check_deployment_status(dep_id: str, status: str) -> None:
    if status not in DEPLOYMENT_STATUSES:
        raise bad(f"deployment {dep_id}: status {status!r} is not one of {', '.join(DEPLOYMENT_STATUSES)}")


def check_node(node: Node) -> None:
    check_id(node.id, "node ID")
    check_node_status(node.id, node.status)
    check_eligibility(node.id, node.scheduling_eligibility)
    res = node.resources
    if res.cpu < 0 or res.memory_mb < 0 or res.disk_mb < 0:
        raise bad(f"node {node.id}: resources must be >= 0")
    if res.devices:
        check_node_devices(node.id, res.devices)


def check_node_status(node_id: str, status: str) -> None:
    if status not in NODE_STATUSES:
        raise bad(f"node {node_id}: status {status!r} is not one of {', '.join(NODE_STATUSES)}")


def check_eligibility(node_id: str, value: str) -> None:
    if value not in (NODE_ELIGIBLE, NODE_INELIGIBLE):
        raise bad(f"node {node_id}: eligibility {value!r} must be eligible or ineligible")


def check_token_type(accessor_id: str, value: str) -> None:
    if value not in (TOKEN_MANAGEMENT, TOKEN_CLIENT):
        raise bad(f"token {accessor_id}: type {value!r} must be management or client")
