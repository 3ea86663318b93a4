"""The dispatch table: the apply function of every message type.

The functions live in ``fsm.apply``, one module per kind of object; this
table is the one place that says which runs for which entry type (a new
type without one fails at import). Each gets the entry's ``StateWriter``
and its decoded payload, and returns a small result map; a deterministic
rejection raises ``ApplyRejected`` and the FSM undoes the entry's writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsm import messages as m
from fsm.apply.acl import (
    acl_policy_delete,
    acl_policy_upsert,
    acl_token_bootstrap,
    acl_token_delete,
    acl_token_upsert,
)
from fsm.apply.allocs import alloc_client_update, alloc_desired_transition
from fsm.apply.clients import client_gc
from fsm.apply.deployments import (
    deployment_promote,
    deployment_status_update,
    deployment_upsert,
)
from fsm.apply.evals import eval_upsert
from fsm.apply.jobs import job_deregister, job_register
from fsm.apply.nodes import (
    node_batch_update_status,
    node_register,
    node_update_drain,
    node_update_eligibility,
    node_update_status,
)
from fsm.apply.plans import plan_apply
from fsm.apply.queues import (
    priority_class_delete,
    priority_class_upsert,
    queue_admission,
    queue_delete,
    queue_upsert,
)
from fsm.apply.reaps import deployment_reap, eval_reap, job_batch_deregister, node_reap
from fsm.apply.scheduler_config import scheduler_config_set
from fsm.apply.summaries import reconcile_summaries
from fsm.errors import ApplyRejected
from fsm.messages import MessageType
from fsm.writer import StateWriter

__all__ = ["HANDLERS", "Handler", "barrier", "nested_batch"]

Handler = Callable[[StateWriter, Any], dict[str, Any]]


def barrier(w: StateWriter, msg: m.Barrier) -> dict[str, Any]:
    """Changes nothing: once it is applied, so is every entry before it (a read barrier)."""
    return {}


def nested_batch(w: StateWriter, msg: m.Batch) -> dict[str, Any]:
    """Only reached for a batch inside a batch: the FSM unpacks top-level batches itself."""
    raise ApplyRejected("bad_request", "a batch cannot contain another batch")


HANDLERS: dict[MessageType, Handler] = {
    MessageType.JOB_REGISTER: job_register,
    MessageType.JOB_DEREGISTER: job_deregister,
    MessageType.JOB_BATCH_DEREGISTER: job_batch_deregister,
    MessageType.EVAL_UPSERT: eval_upsert,
    MessageType.EVAL_REAP: eval_reap,
    MessageType.PLAN_APPLY: plan_apply,
    MessageType.ALLOC_CLIENT_UPDATE: alloc_client_update,
    MessageType.ALLOC_DESIRED_TRANSITION: alloc_desired_transition,
    MessageType.DEPLOYMENT_UPSERT: deployment_upsert,
    MessageType.DEPLOYMENT_STATUS_UPDATE: deployment_status_update,
    MessageType.DEPLOYMENT_REAP: deployment_reap,
    MessageType.DEPLOYMENT_PROMOTE: deployment_promote,
    MessageType.NODE_REGISTER: node_register,
    MessageType.NODE_UPDATE_STATUS: node_update_status,
    MessageType.NODE_BATCH_UPDATE_STATUS: node_batch_update_status,
    MessageType.NODE_UPDATE_ELIGIBILITY: node_update_eligibility,
    MessageType.NODE_UPDATE_DRAIN: node_update_drain,
    MessageType.NODE_REAP: node_reap,
    MessageType.ACL_TOKEN_BOOTSTRAP: acl_token_bootstrap,
    MessageType.ACL_TOKEN_UPSERT: acl_token_upsert,
    MessageType.ACL_TOKEN_DELETE: acl_token_delete,
    MessageType.BARRIER: barrier,
    MessageType.RECONCILE_SUMMARIES: reconcile_summaries,
    MessageType.BATCH: nested_batch,
    MessageType.SCHEDULER_CONFIG_SET: scheduler_config_set,
    MessageType.ACL_POLICY_UPSERT: acl_policy_upsert,
    MessageType.ACL_POLICY_DELETE: acl_policy_delete,
    MessageType.QUEUE_UPSERT: queue_upsert,
    MessageType.QUEUE_DELETE: queue_delete,
    MessageType.PRIORITY_CLASS_UPSERT: priority_class_upsert,
    MessageType.PRIORITY_CLASS_DELETE: priority_class_delete,
    MessageType.QUEUE_ADMISSION: queue_admission,
    MessageType.CLIENT_GC: client_gc,
}
assert set(HANDLERS) == set(MessageType), "every message type needs a handler"
