"""ACL tokens: the one-time bootstrap, upserts, and deletes (by an operator, or GC of expired ones).

The state keeps only a token's secret hash; the journal never shows even
that (``fsm.topics.public_token``).
"""

from __future__ import annotations

from typing import Any

from fsm import messages as m
from fsm.apply.rejects import conflict, not_found
from fsm.keys import u64
from fsm.store import META_ACL_BOOTSTRAP
from fsm.structs import TOKEN_MANAGEMENT, ACLToken
from fsm.validate import bad, check_id, check_token_type
from fsm.writer import StateWriter


def _upsert_token(w: StateWriter, token: ACLToken) -> None:
    check_id(token.accessor_id, "token accessor ID")
    check_token_type(token.accessor_id, token.type)
    if len(token.secret_hash) != 64:
        raise bad(f"token {token.accessor_id}: secret_hash must be a SHA-256 hex digest")
    if token.expiration_time < 0:
        raise bad(f"token {token.accessor_id}: expiration_time must be >= 0 (0: never expires)")
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
