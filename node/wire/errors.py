"""Errors that cross the RPC boundary.

Codes are stable strings: clients (the CLI, jepsen_like, forwarding
followers) branch on them, so a code is never renamed or reused. The message
is for a human: one line saying what was wrong and what to do. Details are
extra machine-readable fields (``leader``, ``oldest_index``, ...) that travel
next to the message in the error map. Neither may carry a secret: errors are
logged and shown on terminals.
"""

from __future__ import annotations

from typing import Any

BAD_REQUEST = "bad_request"
MALFORMED = "malformed"
FRAME_TOO_LARGE = "frame_too_large"
UNKNOWN_METHOD = "unknown_method"
PERMISSION_DENIED = "permission_denied"
NOT_FOUND = "not_found"
CONFLICT = "conflict"
NOT_LEADER = "not_leader"
NO_LEADER = "no_leader"
TIMEOUT = "timeout"
UNKNOWN_OUTCOME = "unknown_outcome"
RESET_REQUIRED = "reset_required"
UNAVAILABLE = "unavailable"
INTERNAL = "internal"

CODES: frozenset[str] = frozenset(
    {
        BAD_REQUEST,
        MALFORMED,
        FRAME_TOO_LARGE,
        UNKNOWN_METHOD,
        PERMISSION_DENIED,
        NOT_FOUND,
        CONFLICT,
        NOT_LEADER,
        NO_LEADER,
        TIMEOUT,
        UNKNOWN_OUTCOME,
        RESET_REQUIRED,
        UNAVAILABLE,
        INTERNAL,
    }
)

#: Detail of an error that a (different) token would fix: each client adds
#: where its users put one (the CLI: --token / CARAVAN_TOKEN; HTTP: X-Nomad-Token).
TOKEN_HINT = "token_hint"

# Codes whose request was certainly not executed: a client may resend them
# (to another server) without risking a double write.
NOT_EXECUTED: frozenset[str] = frozenset({NOT_LEADER, NO_LEADER, UNAVAILABLE})


class RPCError(Exception):
    """An error answer: raised by handlers, re-raised by clients.

    ``code`` must be one of ``CODES``; an unknown code from a newer server is
    kept as is by ``from_wire`` so an old client still shows its message.
    """

    def __init__(self, code: str, message: str, **details: Any) -> None:
        if "\n" in message:
            message = " ".join(message.split())
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"RPCError({self.code!r}, {self.message!r}, **{self.details!r})"

    def to_wire(self) -> dict[str, Any]:
        """The ``error`` map of a response. ``code``/``message`` win over details."""
        return {**self.details, "code": self.code, "message": self.message}

    @classmethod
    def from_wire(cls, error: Any) -> RPCError:
        """Rebuild from a response's ``error`` map, tolerating a broken one.

        A server that answers garbage must still yield an RPCError, not a
        KeyError deep inside the client.
        """
        if not isinstance(error, dict):
            return cls(INTERNAL, f"server sent an invalid error value {error!r}")
        details = {k: v for k, v in error.items() if k not in ("code", "message")}
        code = error.get("code")
        message = error.get("message")
        return cls(
            code if isinstance(code, str) else INTERNAL,
            message if isinstance(message, str) else "server sent an error without a message",
            **{str(k): v for k, v in details.items()},
        )

    # Constructors for the codes that carry required details, so every
    # raiser spells the detail the same way.

    @classmethod
    def not_leader(cls, leader: str | None) -> RPCError:
        if leader:
            return cls(
                NOT_LEADER,
                f"this server is not the leader; send the request to {leader}",
                leader=leader,
            )
        return cls(
            NOT_LEADER, "this server is not the leader; retry on another server", leader=None
        )

    @classmethod
    def reset_required(cls, requested: int, oldest_index: int) -> RPCError:
        return cls(
            RESET_REQUIRED,
            f"index {requested} is older than the oldest retained index {oldest_index}; "
            f"reload the full state and resume from its index",
            requested_index=requested,
            oldest_index=oldest_index,
        )
