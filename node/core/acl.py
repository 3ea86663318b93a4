"""ACL tokens: secrets, hashing and authorization.

Only a SHA-256 of a secret ever enters the log or the store; the leader
hands the secret to the caller once. Before ACLs are bootstrapped every call
is allowed (as in Nomad); afterwards writes need a write or management
token, reads a read token, and admin calls a management token.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from enum import Enum
from typing import Any

from fsm.store import StateReader
from fsm.structs import TOKEN_MANAGEMENT, ACLToken
from node.wire.errors import PERMISSION_DENIED, TOKEN_HINT, RPCError

POLICY_READ, POLICY_WRITE = "read", "write"
POLICIES = (POLICY_READ, POLICY_WRITE)


class Need(Enum):
    NONE = 0  # open even with ACLs on (status, bootstrap)
    READ = 1
    WRITE = 2
    MANAGEMENT = 3


def new_secret() -> str:
    return str(uuid.uuid4())


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _denied(message: str, **details: Any) -> RPCError:
    return RPCError(PERMISSION_DENIED, message, **details)


def authorize(reader: StateReader, secret: str | None, need: Need, now: int) -> ACLToken | None:
    """The caller's token if it may do ``need``; raises ``permission_denied`` otherwise."""
    if need is Need.NONE or not reader.acl_bootstrap_index():
        return None
    if not secret:
        raise _denied("ACLs are enabled: pass a token", **{TOKEN_HINT: True})
    token = reader.token_by_secret_hash(hash_secret(secret))
    if token is None or not hmac.compare_digest(token.secret_hash, hash_secret(secret)):
        raise _denied("token not found: no token has this secret", **{TOKEN_HINT: True})
    if token.expired(now):
        raise _denied(f"token {token.accessor_id} has expired; create a new one")
    if token.type == TOKEN_MANAGEMENT:
        return token
    if need is Need.MANAGEMENT:
        raise _denied("this call needs a management token")
    if need is Need.WRITE and POLICY_WRITE not in token.policies:
        raise _denied(f"token {token.accessor_id} has no write policy")
    if need is Need.READ and not set(token.policies) & set(POLICIES):
        raise _denied(f"token {token.accessor_id} has no read policy")
    return token
