"""ACL tokens and policies: the one-time bootstrap, upserts, and deletes (by an operator, or GC of expired tokens).

The state keeps only a token's secret hash; the journal never shows even
that (``fsm.topics.public_token``).
"""

from __future__ import annotations

from typing import Any

from fsm import codec
from fsm import messages as m
from fsm.apply.rejects import conflict, not_found
from fsm.keys import u64
from fsm.store import META_ACL_BOOTSTRAP
from fsm.structs import ACL_LEVELS, ACL_POLICY_WORDS, TOKEN_MANAGEMENT, ACLPolicy, ACLToken
from fsm.validate import bad, check_id, check_token_type
from fsm.writer import StateWriter

#: Tokens of older versions carry these fixed words; they act as built-in policies
#: (``node.core.acl``), so no stored policy may take their names.
BUILTIN_POLICIES = ("read", "write")
POLICY_TABLE = "acl_policies"
#: Nomad's event topic for policy changes; a subscription without the management-only
#: ACLToken topic is filtered by topic, so it never carries these either.
TOPIC_ACL_POLICY = "ACLPolicy"
MAX_POLICY_NAME = 128


def _upsert_token(w: StateWriter, token: ACLToken) -> None:
    check_id(token.accessor_id, "token accessor ID")
    check_token_type(token.accessor_id, token.type)
    if len(token.secret_hash) != 64:
        raise bad(f"token {token.accessor_id}: secret_hash must be a SHA-256 hex digest")
    if token.expiration_time < 0:
        raise bad(f"token {token.accessor_id}: expiration_time must be >= 0 (0: never expires)")
    for name in token.policies:
        if name not in BUILTIN_POLICIES and w.acl_policy(name) is None:
            raise bad(f"token {token.accessor_id}: ACL policy {name!r} does not exist; create it first")
    holder = w.token_by_secret_hash(token.secret_hash)
    if holder is not None and holder.accessor_id != token.accessor_id:
        raise conflict(f"token {token.accessor_id}: secret already belongs to another token")
    w.put_token(token, w.token(token.accessor_id))


def acl_token_bootstrap(w: StateWriter, msg: m.ACLTokenBootstrap) -> dict[str, Any]:
    """The first management token; allowed once, and the index it happened at is kept."""
    done = w.acl_bootstrap_index()
    if done:
        raise conflict(f"ACL bootstrap already done (at index {done}); use an existing management token")
    if msg.token.type != TOKEN_MANAGEMENT:
        raise bad("the bootstrap token must be a management token")
    _upsert_token(w, msg.token)
    w.txn.put(META_ACL_BOOTSTRAP, u64(w.index), db=w.dbs["meta"])
    return {"accessor_id": msg.token.accessor_id}


def acl_token_upsert(w: StateWriter, msg: m.ACLTokenUpsert) -> dict[str, Any]:
    """Create or replace tokens; a secret may belong to one token only."""
    for token in msg.tokens:
        _upsert_token(w, token)
    return {"accessor_ids": [t.accessor_id for t in msg.tokens]}


def acl_token_delete(w: StateWriter, msg: m.ACLTokenDelete) -> dict[str, Any]:
    """Delete tokens by id (every one must exist), and reap expired ones still as GC saw them."""
    deleted, skipped = [], []
    for accessor_id in msg.accessor_ids:
        token = w.token(accessor_id)
        if token is None:
            raise not_found(f"token {accessor_id} not found")
        w.delete_token(token)
        deleted.append(accessor_id)
    for reap in msg.reaps:
        token = w.token(reap.id)
        if token is None or token.modify_index != reap.modify_index or not token.expired(w.now):
            skipped.append(reap.id)
            continue
        w.delete_token(token)
        deleted.append(reap.id)
    return {"deleted": deleted, "skipped": skipped}


def _check_policy(policy: ACLPolicy) -> None:
    """The shape the leader's parser guarantees, checked again so a bad entry cannot store a bad policy."""
    name = policy.name
    if not name or len(name) > MAX_POLICY_NAME or not all(c.isalnum() or c in "-_" for c in name):
        raise bad(f"ACL policy name {name!r} must be 1-{MAX_POLICY_NAME} letters, digits, '-' or '_'")
    if name in BUILTIN_POLICIES:
        raise bad(f"ACL policy name {name!r} is reserved for the built-in policy of older tokens; choose another")
    for rule in policy.namespaces:
        if not rule.name:
            raise bad(f"ACL policy {name}: a namespace rule needs a name (or a '*' glob)")
        if rule.policy and rule.policy not in ACL_POLICY_WORDS:
            raise bad(f"ACL policy {name}: namespace {rule.name!r} policy must be one of {', '.join(ACL_POLICY_WORDS)}")
    for scope in ("node", "agent", "operator"):
        level = getattr(policy, scope)
        if level and level not in ACL_LEVELS:
            raise bad(f"ACL policy {name}: {scope} policy must be one of {', '.join(ACL_LEVELS)}")


def _put_policy(w: StateWriter, policy: ACLPolicy, old: ACLPolicy | None) -> None:
    """Store a policy and journal it (as a map, like tokens: the event stream keeps it for management)."""
    policy.create_index = old.create_index if old is not None else w.index
    policy.modify_index = w.index
    w.txn.put(policy.name.encode(), codec.encode(policy), db=w.dbs[POLICY_TABLE])
    w.touched.add(POLICY_TABLE)
    w.record(TOPIC_ACL_POLICY, "ACLPolicyUpserted", policy.name, codec.to_wire(policy))


def acl_policy_upsert(w: StateWriter, msg: m.ACLPolicyUpsert) -> dict[str, Any]:
    """Create or replace policies by name; tokens pick up the new rules at once (they hold names)."""
    for policy in msg.policies:
        _check_policy(policy)
        _put_policy(w, policy, w.acl_policy(policy.name))
    return {"names": [p.name for p in msg.policies]}


def acl_policy_delete(w: StateWriter, msg: m.ACLPolicyDelete) -> dict[str, Any]:
    """Delete policies by name (every one must exist); tokens naming one just lose its rules."""
    for name in msg.names:
        policy = w.acl_policy(name)
        if policy is None:
            raise not_found(f"ACL policy {name!r} not found")
        w.txn.delete(name.encode(), db=w.dbs[POLICY_TABLE])
        w.touched.add(POLICY_TABLE)
        w.record(TOPIC_ACL_POLICY, "ACLPolicyDeleted", name, None)
    return {"deleted": list(msg.names)}
