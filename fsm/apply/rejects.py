"""The rejections apply functions raise besides ``fsm.validate.bad``.

Their codes are RPC error codes, passed to clients unchanged: ``not_found``
(the object the entry names is gone) and ``conflict`` (state moved on since
the entry was decided: read again and retry).
"""

from __future__ import annotations

from fsm.errors import ApplyRejected


def not_found(message: str) -> ApplyRejected:
    """The entry names an object the state does not have."""
    return ApplyRejected("not_found", message)


def conflict(message: str) -> ApplyRejected:
    """The entry was decided on a state that has changed since: the caller must decide again."""
    return ApplyRejected("conflict", message)
