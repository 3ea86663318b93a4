"""ACL tokens and node secrets: hashing, and who may make which call.

Only a SHA-256 of a secret ever enters the log or the store; the leader
hands a token's secret to the caller once, and a client node chooses its
own. Before ACLs are bootstrapped every call is allowed (as in Nomad);
afterwards a call needs what ``METHOD_NEEDS`` (the one table of RPC
methods to capabilities; HTTP routes call these RPCs) says it needs, and
the caller's token's policies must grant it. Management tokens need no
policy. Client nodes authenticate with their node secret, not a token
(``check_node_secret``); a node secret also reads what a client needs.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from enum import Enum
from typing import Any

from fsm.store import StateReader
from fsm.structs import TOKEN_MANAGEMENT, ACLPolicy, ACLToken, Node
from node.core import acl_rules as r
from node.core.context import current_method
from node.wire.errors import PERMISSION_DENIED, TOKEN_HINT, RPCError

#: The fixed words of tokens made before named policies; they name built-in policies now.
POLICY_READ, POLICY_WRITE = "read", "write"
POLICIES = (POLICY_READ, POLICY_WRITE)
DEFAULT_NAMESPACE = "default"  # Caravan has one namespace, Nomad's default


class Need(Enum):
    """What a call needs: a generic word an endpoint passes, or a capability.

    ``READ``, ``WRITE`` and ``MANAGEMENT`` are what endpoints pass; the
    method's row in ``METHOD_NEEDS`` turns them into the capability.
    The others are capabilities (scope, name), as Nomad's policies grant them.
    """

    NONE = ("open", "")  # open even with ACLs on (status, bootstrap)
    READ = ("generic", "read")
    WRITE = ("generic", "write")
    MANAGEMENT = ("management", "")
    LIST_JOBS = ("namespace", r.LIST_JOBS)
    READ_JOB = ("namespace", r.READ_JOB)
    SUBMIT_JOB = ("namespace", r.SUBMIT_JOB)
    DISPATCH_JOB = ("namespace", r.DISPATCH_JOB)
    READ_LOGS = ("namespace", r.READ_LOGS)
    ALLOC_LIFECYCLE = ("namespace", r.ALLOC_LIFECYCLE)
    NODE_READ = ("node", "read")
    NODE_WRITE = ("node", "write")
    AGENT_READ = ("agent", "read")
    AGENT_WRITE = ("agent", "write")
    OPERATOR_READ = ("operator", "read")
    OPERATOR_WRITE = ("operator", "write")

    def describe(self) -> str:
        scope, name = self.value
        if scope == "namespace":
            word = next((w for w in ("read", "scale", "write") if name in r.POLICY_CAPABILITIES[w]), "")
            granted = f' (policy = "{word}" grants it)' if word else ""
            return f"capability {name} on namespace {DEFAULT_NAMESPACE}{granted}"
        return "a management token" if self is Need.MANAGEMENT else f"{scope} policy {name}"


#: Every RPC method and the capability it needs (HTTP routes call these RPCs).
#: Nomad's dispatch-job, read-logs, alloc-lifecycle and agent rules are ``Need``s
#: and policies grant them; Caravan has no RPC needing them yet.
#: It replaces the generic word the endpoint passes; an endpoint that passes a
#: capability itself (the event stream, per topic) is not listed.
METHOD_NEEDS: dict[str, Need] = {
    "job.register": Need.SUBMIT_JOB,
    "job.stop": Need.SUBMIT_JOB,
    "job.revert": Need.SUBMIT_JOB,
    "job.get": Need.READ_JOB,
    "job.versions": Need.READ_JOB,
    "job.summary": Need.READ_JOB,
    "job.list": Need.LIST_JOBS,
    "eval.get": Need.READ_JOB,
    "eval.list": Need.READ_JOB,
    "alloc.get": Need.READ_JOB,
    "alloc.list": Need.READ_JOB,
    "deployment.get": Need.READ_JOB,
    "deployment.list": Need.READ_JOB,
    "deployment.fail": Need.SUBMIT_JOB,
    "deployment.pause": Need.SUBMIT_JOB,
    "deployment.promote": Need.SUBMIT_JOB,
    # Scheduler workers' writes; as before policies, what a job writer may do.
    "eval.update": Need.SUBMIT_JOB,
    "plan.submit": Need.SUBMIT_JOB,
    "node.get": Need.NODE_READ,
    "node.list": Need.NODE_READ,
    "node.eligibility": Need.NODE_WRITE,
    "node.drain": Need.NODE_WRITE,
    # Client calls: a node secret; an ACL token only for nodes registered without one.
    "node.register": Need.NODE_WRITE,
    "node.status": Need.NODE_WRITE,
    "node.heartbeat": Need.NODE_WRITE,
    "alloc.update": Need.NODE_WRITE,
    # Forced client GC: Nomad's /v1/client/gc needs node:write, /v1/client/allocation/:id/gc
    # submit-job on the alloc's namespace.
    "client.gc": Need.NODE_WRITE,
    "client.allocation.gc": Need.SUBMIT_JOB,
    "operator.scheduler.get_config": Need.OPERATOR_READ,
    "operator.scheduler.set_config": Need.OPERATOR_WRITE,
    "operator.raft.peers": Need.OPERATOR_READ,
    "operator.raft.transfer": Need.OPERATOR_WRITE,
    "operator.raft.add_peer": Need.OPERATOR_WRITE,
    "operator.raft.remove_peer": Need.OPERATOR_WRITE,
    "agent.join": Need.AGENT_WRITE,
    "scheduler.stats": Need.OPERATOR_READ,
    "debug.digest": Need.OPERATOR_READ,
    "operator.snapshot.save": Need.MANAGEMENT,
    "system.gc": Need.MANAGEMENT,
    "system.reconcile_summaries": Need.MANAGEMENT,
    "acl.token.create": Need.MANAGEMENT,
    "acl.token.list": Need.MANAGEMENT,
    "acl.token.get": Need.MANAGEMENT,
    "acl.token.delete": Need.MANAGEMENT,
    "acl.policy.upsert": Need.MANAGEMENT,
    "acl.policy.delete": Need.MANAGEMENT,
    "acl.policy.list": Need.MANAGEMENT,
    "acl.policy.get": Need.MANAGEMENT,
    # Queues are cluster-wide (as Kueue's ClusterQueues): operators change them; job readers see lines.
    "queue.upsert": Need.MANAGEMENT,
    "queue.delete": Need.MANAGEMENT,
    "queue.stop": Need.MANAGEMENT,
    "queue.get": Need.READ_JOB,
    "queue.list": Need.READ_JOB,
    "queue.pending": Need.READ_JOB,
    "queue.workload": Need.READ_JOB,
    "priority_class.upsert": Need.MANAGEMENT,
    "priority_class.delete": Need.MANAGEMENT,
    "priority_class.list": Need.READ_JOB,
}
#: Without a row: the generic word's own meaning.
GENERIC_NEEDS = {Need.READ: Need.READ_JOB, Need.WRITE: Need.SUBMIT_JOB}
#: What a node secret may do besides its own client calls: read the jobs and allocs it runs.
NODE_SECRET_NEEDS = frozenset((Need.READ_JOB, Need.NODE_READ))


def resolve_need(need: Need, method: str | None) -> Need:
    """The capability a call needs: the method's row for a generic word, else the need itself."""
    if need.value[0] in ("generic", "management") and method in METHOD_NEEDS:
        return METHOD_NEEDS[method]
    return GENERIC_NEEDS.get(need, need)


def new_secret() -> str:
    return str(uuid.uuid4())


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _denied(message: str, **details: Any) -> RPCError:
    return RPCError(PERMISSION_DENIED, message, **details)


def token_policies(reader: StateReader, token: ACLToken) -> list[ACLPolicy]:
    """The policies a token names that exist (a deleted one grants nothing, as in Nomad)."""
    found = (r.BUILTIN_POLICIES.get(name) or reader.acl_policy(name) for name in token.policies)
    return [p for p in found if p is not None]


def allows(reader: StateReader, token: ACLToken, need: Need) -> bool:
    """Whether ``token`` may do ``need`` (a capability, not a generic word)."""
    if token.type == TOKEN_MANAGEMENT or need is Need.NONE:
        return True
    if need is Need.MANAGEMENT:
        return False
    grants = r.Grants.of(token_policies(reader, token))
    scope, name = need.value
    if scope == "namespace":
        return grants.allows_namespace(DEFAULT_NAMESPACE, name)
    return grants.allows_level(scope, name)


def authorize(
    reader: StateReader, secret: str | None, need: Need, now: int, method: str | None = None
) -> ACLToken | None:
    """The caller's token if it may do ``need``; raises ``permission_denied`` otherwise.

    ``method`` (default: the running request's) picks the row of ``METHOD_NEEDS``.
    A known node secret passes for what a client reads (``NODE_SECRET_NEEDS``).
    """
    if need is Need.NONE or not reader.acl_bootstrap_index():
        return None
    method = method or current_method()
    need = resolve_need(need, method)
    if not secret:
        raise _denied("ACLs are enabled: pass a token", **{TOKEN_HINT: True})
    hashed = hash_secret(secret)
    token = reader.token_by_secret_hash(hashed)
    if token is None or not hmac.compare_digest(token.secret_hash, hashed):
        if need in NODE_SECRET_NEEDS and reader.node_secret_known(hashed):
            return None
        raise _denied("token not found: no token has this secret", **{TOKEN_HINT: True})
    if token.expired(now):
        raise _denied(f"token {token.accessor_id} has expired; create a new one")
    if not allows(reader, token, need):
        call = f"{method} " if method else ""
        raise _denied(f"token {token.accessor_id} may not make this call: {call}needs {need.describe()}; "
                      "grant it in one of the token's policies")
    return token


def check_node_secret(node: Node, secret: str | None) -> None:
    """Refuse a client call for ``node`` unless ``secret`` is the one it registered with."""
    if not secret:
        raise _denied(f"node {node.id} has a node secret: pass it as the request's token (its SecretID)")
    if not hmac.compare_digest(node.secret_hash, hash_secret(secret)):
        raise _denied(f"node {node.id}: wrong node secret; pass the SecretID the node registered with")
