"""The route table: every ``/v1`` path Caravan answers and the handler that answers it.

Kept apart from the handlers so the whole API surface reads as one list,
as Nomad's ``http.go`` registers it. Writes accept PUT and POST alike, as
Nomad's do; reads answer GET only (no HEAD). The order is registration
order: a path's verbs are registered one after another, so they share one
aiohttp resource.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from node.http import (
    acl,
    acl_policies,
    allocations,
    clients,
    deployments,
    events,
    jobs,
    nodes,
    operator,
    queues,
    snapshots,
    system,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

GET = ("GET",)
WRITE = ("POST", "PUT")
DELETE = ("DELETE",)

ROUTES: tuple[tuple[tuple[str, ...], str, Handler], ...] = (
    (GET, "/v1/jobs", jobs.jobs_list),
    (WRITE, "/v1/jobs", jobs.jobs_register),
    (WRITE, "/v1/jobs/parse", jobs.jobs_parse),
    (GET, "/v1/job/{job_id}", jobs.job_get),
    (WRITE, "/v1/job/{job_id}", jobs.job_register),
    (DELETE, "/v1/job/{job_id}", jobs.job_deregister),
    (GET, "/v1/job/{job_id}/allocations", jobs.job_allocations),
    (GET, "/v1/job/{job_id}/evaluations", jobs.job_evaluations),
    (GET, "/v1/job/{job_id}/workload", queues.job_workload),
    (GET, "/v1/job/{job_id}/deployments", jobs.job_deployments),
    (GET, "/v1/job/{job_id}/deployment", jobs.job_latest_deployment),
    (GET, "/v1/job/{job_id}/summary", jobs.job_summary),
    (GET, "/v1/job/{job_id}/versions", jobs.job_versions),
    (WRITE, "/v1/job/{job_id}/revert", jobs.job_revert),
    (GET, "/v1/evaluations", allocations.evals_list),
    (GET, "/v1/evaluation/{eval_id}", allocations.eval_get),
    (GET, "/v1/evaluation/{eval_id}/allocations", allocations.eval_allocations),
    (GET, "/v1/allocations", allocations.allocs_list),
    (GET, "/v1/allocation/{alloc_id}", allocations.alloc_get),
    (GET, "/v1/deployments", deployments.deployments_list),
    (GET, "/v1/deployment/allocations/{deployment_id}", deployments.deployment_allocations),
    (GET, "/v1/deployment/{deployment_id}", deployments.deployment_get),
    (WRITE, "/v1/deployment/fail/{deployment_id}", deployments.deployment_fail),
    (WRITE, "/v1/deployment/pause/{deployment_id}", deployments.deployment_pause),
    (WRITE, "/v1/deployment/promote/{deployment_id}", deployments.deployment_promote),
    (GET, "/v1/nodes", nodes.nodes_list),
    (GET, "/v1/node/{node_id}", nodes.node_get),
    (GET, "/v1/node/{node_id}/allocations", nodes.node_allocations),
    (WRITE, "/v1/node/{node_id}/drain", nodes.node_drain),
    (WRITE, "/v1/node/{node_id}/eligibility", nodes.node_eligibility),
    (WRITE, "/v1/system/gc", system.system_gc),
    (WRITE, "/v1/client/gc", clients.client_gc),
    (WRITE, "/v1/client/allocation/{alloc_id}/gc", clients.client_allocation_gc),
    (WRITE, "/v1/system/reconcile/summaries", system.system_reconcile),
    (WRITE, "/v1/acl/bootstrap", acl.acl_bootstrap),
    (GET, "/v1/acl/tokens", acl.acl_tokens),
    (WRITE, "/v1/acl/token", acl.acl_token_create),
    (GET, "/v1/acl/token/self", acl.acl_token_self),
    (GET, "/v1/acl/token/{accessor_id}", acl.acl_token_get),
    (WRITE, "/v1/acl/token/{accessor_id}", acl.acl_token_update),
    (DELETE, "/v1/acl/token/{accessor_id}", acl.acl_token_delete),
    (GET, "/v1/acl/policies", acl_policies.acl_policies),
    (GET, "/v1/acl/policy/{name}", acl_policies.acl_policy_get),
    (WRITE, "/v1/acl/policy/{name}", acl_policies.acl_policy_upsert),
    (DELETE, "/v1/acl/policy/{name}", acl_policies.acl_policy_delete),
    (GET, "/v1/queues", queues.queues_list),
    (GET, "/v1/queue/{name}", queues.queue_get),
    (WRITE, "/v1/queue/{name}", queues.queue_upsert),
    (DELETE, "/v1/queue/{name}", queues.queue_delete),
    (GET, "/v1/queue/{name}/pending", queues.queue_pending),
    (WRITE, "/v1/queue/{name}/hold", queues.queue_hold),
    (WRITE, "/v1/queue/{name}/drain", queues.queue_drain),
    (WRITE, "/v1/queue/{name}/resume", queues.queue_resume),
    (GET, "/v1/priority-classes", queues.priority_classes_list),
    (GET, "/v1/priority-class/{name}", queues.priority_class_get),
    (WRITE, "/v1/priority-class/{name}", queues.priority_class_upsert),
    (DELETE, "/v1/priority-class/{name}", queues.priority_class_delete),
    (GET, "/v1/status/leader", system.status_leader),
    (GET, "/v1/status/peers", system.status_peers),
    (GET, "/v1/regions", system.regions),
    (GET, "/v1/operator/raft/configuration", system.raft_configuration),
    (DELETE, "/v1/operator/raft/peer", operator.raft_remove_peer),
    (WRITE, "/v1/agent/join", operator.agent_join),
    (GET, "/v1/operator/snapshot", snapshots.operator_snapshot),
    (GET, "/v1/operator/scheduler/configuration", operator.scheduler_configuration),
    (WRITE, "/v1/operator/scheduler/configuration", operator.scheduler_set_configuration),
    (GET, "/v1/event/stream", events.event_stream),
    (GET, "/v1/metrics", system.metrics),
)


def add_routes(app: web.Application) -> None:
    """Register every route of ``ROUTES`` on ``app``, in order."""
    for verbs, path, handler in ROUTES:
        for verb in verbs:
            app.router.add_route(verb, path, handler)
