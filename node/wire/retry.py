"""The retry policy both RPC clients follow, kept free of I/O so it exists once.

The rules, so the CLI and a forwarding follower behave the same way:

- A connection that cannot be opened sent nothing: try the next address.
- ``not_leader``, ``no_leader`` and ``unavailable`` mean the server did not
  execute the request: resend it (to the named leader if there is one).
- A connection lost after the request went out, or an ``unknown_outcome``
  answer, leaves the request possibly executed. If the call is idempotent
  (reads, and writes, which servers deduplicate by request id) it is resent
  with the *same* request id, to the next server (the one that could not
  tell may be a leader cut off from its cluster); otherwise the caller gets
  ``unknown_outcome`` carrying the request id, so it can decide and retry
  with that id itself.
- Everything stops at the call's deadline. Every other error is final.

``Attempt`` keeps one call's bookkeeping (which address next, when, whether
to go on); ``plan`` is the retry loop itself, written as a generator of
steps (connect, exchange, pause). The blocking client and the asyncio client
perform those steps with their own I/O and send back what happened
(``resume``), so one loop decides for both and the two cannot drift apart.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from node.wire.errors import (
    NO_LEADER,
    NOT_EXECUTED,
    NOT_LEADER,
    TIMEOUT,
    UNAVAILABLE,
    UNKNOWN_OUTCOME,
    RPCError,
)
from node.wire.framing import parse_address

DEFAULT_TIMEOUT = 10.0
BACKOFF_FIRST = 0.02
BACKOFF_MAX = 1.0


def describe(exc: BaseException) -> str:
    """A failed connection or exchange in a few words, for error messages."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__


def is_address(address: str) -> bool:
    """Whether ``address`` parses as host:port (a leader named by a server may not)."""
    try:
        parse_address(address)
    except ValueError:
        return False
    return True


@dataclass
class Attempt:
    """Retry bookkeeping of one call: which address next, when, and whether to go on."""

    method: str
    request_id: str
    idempotent: bool
    timeout: float
    order: list[str]
    deadline: float = 0.0
    maybe_executed: bool = False  # some try may have run on a server
    position: int = 0
    wait: bool = False  # pause before the next try
    backoff: float = BACKOFF_FIRST
    failures: dict[str, str] = field(default_factory=dict)
    last_error: RPCError | None = None
    # A server's no_leader answer this pass (it already waited for an
    # election); final unless a later server in the pass does better.
    no_leader: RPCError | None = None
    # Give up once every try for this long was a refused connection (nothing
    # listens: a cluster not started, a wrong address); None: retry to the deadline.
    refused_grace: float | None = None
    only_refused: bool = True

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout
        if not self.order:
            raise RPCError(UNAVAILABLE, "no server address given; pass at least one host:port")

    @property
    def address(self) -> str:
        """The server to try now; once a call succeeded, the one that answered it."""
        return self.order[self.position % len(self.order)]

    def remaining(self) -> float:
        """Seconds left before the call's deadline (negative once past it)."""
        return self.deadline - time.monotonic()

    def _next_address(self) -> None:
        # Failing over to an untried server is immediate; starting another
        # pass over all of them waits, so a down cluster is not hammered.
        self.position += 1
        self.wait = self.position % len(self.order) == 0
        if self.wait and self.no_leader is not None:
            raise self._after_maybe(self.no_leader)

    def _after_maybe(self, err: RPCError) -> RPCError:
        """``err`` says "not executed" of the last try only: after a try that may have run, the outcome is unknown."""
        if not self.maybe_executed:
            return err
        return RPCError(
            UNKNOWN_OUTCOME,
            f"{self.method} may or may not have been applied: an earlier try's outcome is unknown and now "
            f"{err.message}; check, or retry with request id {self.request_id}",
            request_id=self.request_id,
        )

    def pause(self) -> float:
        """Seconds to sleep before the next try."""
        if not self.wait:
            return 0.0
        self.wait = False
        pause, self.backoff = self.backoff, min(self.backoff * 2, BACKOFF_MAX)
        return max(0.0, min(pause, self.remaining()))

    def connect_failed(self, exc: BaseException) -> None:
        """No connection, so nothing was sent: move on, or give up if nothing listens anywhere."""
        self.failures[self.address] = describe(exc)
        if not isinstance(exc, ConnectionRefusedError):
            self.only_refused = False
        self._next_address()
        if (
            self.wait
            and self.only_refused
            and self.refused_grace is not None
            and time.monotonic() - self.started >= self.refused_grace
        ):
            raise RPCError(
                UNAVAILABLE,
                f"no server is listening at {', '.join(self.order)} (connection refused): start the cluster "
                "('make run' or 'caravan cluster up') or check --address / CARAVAN_ADDRESS",
            )

    def lost(self, exc: BaseException) -> None:
        """The exchange broke after the request went out: resend if idempotent, else raise."""
        self.failures[self.address] = describe(exc)
        self.only_refused = False
        self.maybe_executed = True
        self.no_leader = None  # this server may yet answer otherwise
        if not self.idempotent:
            raise RPCError(
                UNKNOWN_OUTCOME,
                f"connection to {self.address} was lost before {self.method} was answered; it may or may "
                f"not have been applied: check, or retry with request id {self.request_id}",
                request_id=self.request_id,
            )
        self._next_address()

    def answered(self, err: RPCError) -> None:
        """Decide on an error answer: return to retry, raise to give up."""
        self.only_refused = False
        if err.code == UNKNOWN_OUTCOME and self.idempotent:
            # Resend with the same request id, to the next server: the one that
            # answered may be a deposed leader cut off from the cluster, which
            # would learn nothing, and the cluster applies each id once
            # wherever it arrives.
            self.maybe_executed = True
            self.last_error = err
            self.no_leader = None
            self._next_address()
            return
        if err.code not in NOT_EXECUTED:
            raise err
        self.last_error = err
        self.no_leader = err if err.code == NO_LEADER else None
        leader = err.details.get("leader") if err.code == NOT_LEADER else None
        if isinstance(leader, str) and leader and leader != self.address and is_address(leader):
            if leader in self.order:
                self.order.remove(leader)
            self.order.insert(0, leader)
            self.position = 0
            return
        self._next_address()

    def give_up(self) -> RPCError:
        """The error that ends the call at its deadline, saying what was tried."""
        if self.maybe_executed:
            last = f" (a server's last answer: {self.last_error.message})" if self.last_error else ""
            return RPCError(
                TIMEOUT,
                f"no answer to {self.method} within {self.timeout:g}s{last}; if it changes state it may or "
                f"may not have been applied: check, or retry with request id {self.request_id}",
                request_id=self.request_id,
            )
        if self.last_error is not None:
            return self.last_error
        tried = (
            "; ".join(f"{addr}: {why}" for addr, why in self.failures.items())
            or "no attempt in time"
        )
        return RPCError(
            UNAVAILABLE,
            f"could not reach any server within {self.timeout:g}s ({tried}); check that the servers are "
            f"running and the addresses are right",
        )


# ---- the loop, as steps a client performs ---------------------------------------------------------


@dataclass(slots=True)
class Connect:
    """Open (or reuse) a connection to ``address``; send back the connection."""

    address: str


@dataclass(slots=True)
class Exchange:
    """Send the request on ``conn``; send back the answer's result, or throw its error."""

    conn: Any


@dataclass(slots=True)
class Pause:
    """Sleep ``seconds`` before the next try."""

    seconds: float


@dataclass(slots=True)
class Done:
    """The plan finished: ``value`` is the call's result (or the stream's connection)."""

    value: Any


Step = Connect | Exchange | Pause
Plan = Generator[Step, Any, Any]


def plan(attempt: Attempt, *, exchange: bool = True, one_pass: bool = False) -> Plan:
    """The retry loop of one call, deciding through ``attempt``; the client does the I/O.

    A failed step comes back as the exception it raised: ``OSError`` from a
    connect or an exchange (timeouts and lost connections included), or the
    server's ``RPCError`` answer. ``exchange=False`` stops at the first
    connection opened (a stream sends its request itself). ``one_pass``
    gives up after one pass over the addresses instead of pausing and
    trying them again until the deadline.
    """
    while attempt.remaining() > 0:
        try:
            conn = yield Connect(attempt.address)
        except OSError as exc:
            attempt.connect_failed(exc)
        else:
            if not exchange:
                return conn
            try:
                return (yield Exchange(conn))
            except RPCError as err:
                attempt.answered(err)
            except OSError as exc:
                attempt.lost(exc)
        if one_pass and attempt.wait:
            break
        yield Pause(attempt.pause())
    raise attempt.give_up()


def resume(steps: Plan, reply: Any = None, error: Exception | None = None) -> Step | Done:
    """Hand the plan what the last step gave (or raised); its next step, or ``Done``.

    Call it outside any ``except`` block, so the error that ends a call is
    not chained to the last failure of a step.
    """
    try:
        return steps.send(reply) if error is None else steps.throw(error)
    except StopIteration as done:
        return Done(done.value)
