"""The retry plan both RPC clients drive, stepped by hand: no sockets, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from node.wire.errors import NO_LEADER, NOT_LEADER, UNKNOWN_OUTCOME, RPCError
from node.wire.retry import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    Attempt,
    Connect,
    Done,
    Exchange,
    Pause,
    plan,
    resume,
)

A, B, LEADER = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


def attempt(*order: str, idempotent: bool = True, timeout: float = 30.0) -> Attempt:
    return Attempt("job.register", "req-1", idempotent, timeout, list(order))


def test_a_call_that_connects_and_is_answered_is_done() -> None:
    steps = plan(attempt(A))
    assert resume(steps) == Connect(A)
    assert resume(steps, "conn") == Exchange("conn")
    assert resume(steps, {"ok": 1}) == Done({"ok": 1})


def test_a_refused_connection_fails_over_at_once_and_a_new_pass_backs_off() -> None:
    steps = plan(attempt(A, B))
    assert resume(steps) == Connect(A)
    assert resume(steps, error=ConnectionRefusedError()) == Pause(0.0)
    assert resume(steps) == Connect(B)
    assert resume(steps, error=ConnectionRefusedError()) == Pause(BACKOFF_FIRST)
    assert resume(steps) == Connect(A)
    assert resume(steps, error=ConnectionRefusedError()) == Pause(0.0)
    assert resume(steps) == Connect(B)
    assert resume(steps, error=ConnectionRefusedError()) == Pause(2 * BACKOFF_FIRST)


def test_backoff_stops_growing_at_its_cap() -> None:
    steps = plan(attempt(A, timeout=1000.0))
    resume(steps)
    pauses = []
    for _ in range(12):
        pause = resume(steps, error=ConnectionRefusedError())
        assert isinstance(pause, Pause)
        pauses.append(pause.seconds)
        assert resume(steps) == Connect(A)
    assert max(pauses) == BACKOFF_MAX


def test_not_leader_naming_a_leader_goes_there_next_without_pausing() -> None:
    steps = plan(attempt(A, B))
    resume(steps)
    resume(steps, "conn")
    redirect = RPCError(NOT_LEADER, "not the leader", leader=LEADER)
    assert resume(steps, error=redirect) == Pause(0.0)
    assert resume(steps) == Connect(LEADER)


def test_a_lost_answer_resends_an_idempotent_call_and_ends_a_non_idempotent_one() -> None:
    steps = plan(attempt(A, B))
    resume(steps)
    resume(steps, "conn")
    assert resume(steps, error=ConnectionResetError()) == Pause(0.0)
    assert resume(steps) == Connect(B)

    once = plan(attempt(A, B, idempotent=False))
    resume(once)
    resume(once, "conn")
    with pytest.raises(RPCError) as err:
        resume(once, error=ConnectionResetError())
    assert err.value.code == UNKNOWN_OUTCOME
    assert err.value.details["request_id"] == "req-1"


def test_no_leader_from_every_server_of_a_pass_is_the_answer() -> None:
    steps = plan(attempt(A))
    resume(steps)
    resume(steps, "conn")
    with pytest.raises(RPCError) as err:
        resume(steps, error=RPCError(NO_LEADER, "no leader elected"))
    assert err.value.code == NO_LEADER


def test_other_errors_are_final_and_unrelated_exceptions_pass_through() -> None:
    steps = plan(attempt(A))
    resume(steps)
    resume(steps, "conn")
    final = RPCError("bad_request", "no")
    with pytest.raises(RPCError) as err:
        resume(steps, error=final)
    assert err.value is final

    odd = plan(attempt(A))
    resume(odd)
    with pytest.raises(ZeroDivisionError):
        resume(odd, error=ZeroDivisionError())


def test_one_pass_ends_at_the_end_of_the_pass_instead_of_pausing() -> None:
    steps = plan(attempt(A, B), one_pass=True)
    resume(steps)
    assert resume(steps, error=ConnectionRefusedError()) == Pause(0.0)
    assert resume(steps) == Connect(B)
    with pytest.raises(RPCError) as err:
        resume(steps, error=ConnectionRefusedError())
    assert err.value.code == "unavailable"


def test_a_stream_plan_stops_at_the_first_connection() -> None:
    steps = plan(attempt(A, B), exchange=False)
    assert resume(steps) == Connect(A)
    assert resume(steps, error=ConnectionRefusedError()) == Pause(0.0)
    assert resume(steps) == Connect(B)
    conn: Any = object()
    assert resume(steps, conn) == Done(conn)


def test_the_error_ending_a_call_names_what_failed_and_is_not_chained_to_it() -> None:
    tries = attempt(A)
    steps = plan(tries)
    resume(steps)
    assert resume(steps, error=ConnectionRefusedError("refused")) == Pause(BACKOFF_FIRST)
    tries.deadline = 0.0  # the pause outlasted the deadline
    with pytest.raises(RPCError) as err:
        resume(steps)
    assert err.value.code == "unavailable"
    assert f"{A}: refused" in err.value.message
    assert err.value.__context__ is None


def test_no_leader_after_a_try_of_unknown_outcome_is_not_a_definite_failure() -> None:
    """A leader cut off mid-write answers unknown_outcome; the next server's no_leader speaks only for itself.

    Found by the fault harness: a write answered as certainly failed was applied.
    """
    steps = plan(attempt(A, B))
    resume(steps)
    resume(steps, "conn-a")
    assert resume(steps, error=RPCError(UNKNOWN_OUTCOME, "leadership changed")) == Pause(0.0)
    assert resume(steps) == Connect(B)
    resume(steps, "conn-b")
    with pytest.raises(RPCError) as err:
        resume(steps, error=RPCError(NO_LEADER, "no cluster leader"))
    assert err.value.code == UNKNOWN_OUTCOME
    assert "req-1" in err.value.message
