"""Errors of the deterministic core.

Deterministic failures (bad input, a failed compare-and-set) never escape
``FSM.apply``: they become an error result. Only ``FatalApplyError`` means the
node must stop, because continuing could make it diverge from its peers.
"""


class FSMError(Exception):
    """Base class of every error raised by the fsm package."""


class CodecError(FSMError):
    """A payload could not be decoded into the expected shape."""


class ApplyRejected(FSMError):
    """A deterministic rejection of one entry; becomes an error result.

    ``code`` is one of the RPC error codes (bad_request, not_found, conflict,
    permission_denied) so the node can pass it to clients unchanged.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FatalApplyError(FSMError):
    """A non-deterministic failure (disk, map full) or an unknown entry type.

    The node must stop rather than diverge from replicas that did not fail.
    """
