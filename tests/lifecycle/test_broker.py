"""The eval broker and blocked-evals tracker, driven with a fake clock (no sleeps)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.structs import Evaluation
from node.leader.broker import HOLD_MAX_S, BlockedEvals, BrokerError, EvalBroker


class Clock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 10**18

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += int(seconds * 1e9)


def ev(eval_id: str, job: str = "j", *, priority: int = 50, index: int = 1, status: str = "pending", wait_until: int = 0) -> Evaluation:
    return Evaluation(id=eval_id, job_id=job, priority=priority, create_index=index, modify_index=index, status=status, wait_until=wait_until)


def broker(clock: Clock, **kw) -> EvalBroker:
    return EvalBroker(clock=lambda: clock.mono, state_clock=lambda: clock.wall, **kw)


def drain(b: EvalBroker) -> list[str]:
    out = []
    while (got := b.try_dequeue()) is not None:
        out.append(got[0].id)
    return out


def test_priority_then_oldest_first() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("low", "j1", priority=10, index=1))
    b.enqueue(ev("high-new", "j2", priority=90, index=5))
    b.enqueue(ev("high-old", "j3", priority=90, index=2))
    assert drain(b) == ["high-old", "high-new", "low"]


def test_one_eval_in_flight_per_job_and_older_waiters_are_canceled() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1", index=1))
    b.enqueue(ev("e2", index=2))
    b.enqueue(ev("e3", index=3))
    first, token = b.try_dequeue()
    assert first.id == "e1" and b.try_dequeue() is None  # e2, e3 wait behind e1
    assert b.has_queued("default", "j")
    b.ack("e1", token)
    got, token = b.try_dequeue()
    assert got.id == "e3"  # the newest goes on; e2 would repeat its work
    assert [e.id for e in b.take_cancelable()] == ["e2"]
    b.ack("e3", token)
    assert b.try_dequeue() is None and not b.has_queued("default", "j")


def test_duplicates_are_ignored_and_requeued_after_ack_when_out() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1"))
    b.enqueue(ev("e1"))
    got, token = b.try_dequeue()
    assert b.try_dequeue() is None
    b.enqueue(ev("e1", status="blocked"))  # unblocked while its worker still runs
    b.ack("e1", token)
    again, _ = b.try_dequeue()
    assert again.id == "e1" and again.status == "blocked"


def test_nack_redelivers_after_a_delay_until_the_delivery_limit() -> None:
    c = Clock()
    b = broker(c, delivery_limit=3, nack_delay=1.0, nack_delay_later=5.0)
    b.enqueue(ev("e1"))
    _, token = b.try_dequeue()
    b.nack("e1", token)
    assert b.try_dequeue() is None
    c.advance(1.01)
    _, token = b.try_dequeue()
    assert b.delivery_count("e1") == 2
    b.nack("e1", token)
    c.advance(1.01)
    assert b.try_dequeue() is None  # later redeliveries wait longer
    c.advance(4.0)
    _, token = b.try_dequeue()
    b.nack("e1", token)
    assert [e.id for e in b.take_failed()] == ["e1"]
    assert b.try_dequeue() is None and b.stats.failed == 1
    # The job is free again: its next eval is delivered.
    b.enqueue(ev("e2", index=9))
    assert b.try_dequeue()[0].id == "e2"


def test_unacked_evals_time_out_and_wrong_tokens_are_refused() -> None:
    c = Clock()
    b = broker(c, nack_timeout=30.0, nack_delay=0.0)
    b.enqueue(ev("e1"))
    _, token = b.try_dequeue()
    with pytest.raises(BrokerError):
        b.ack("e1", "not-the-token")
    c.advance(31)
    b.tick()
    assert b.stats.timeouts == 1
    got, new_token = b.try_dequeue()
    assert got.id == "e1" and new_token != token
    with pytest.raises(BrokerError):
        b.ack("e1", token)  # the old delivery's ack is too late
    b.ack("e1", new_token)


def test_wait_until_holds_an_eval_until_its_time() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("later", wait_until=c.wall + 5 * 10**9))
    b.enqueue(ev("now", "other"))
    assert drain(b) == ["now"]
    assert b.counts()["Delayed"] == 1
    c.advance(5.1)
    assert drain(b) == ["later"]


def test_a_wait_is_measured_from_the_state_time_it_was_set_in_not_a_skewed_wall_clock() -> None:
    """After a leader whose clock ran an hour ahead, the state's time is pinned an hour ahead of
    this leader's wall clock: an eval to run 5 s after a failure recorded in that time is held 5 s
    (of this server's monotonic clock), not an hour and 5 s."""
    c = Clock()
    pinned = c.wall + 3600 * 10**9  # the newest time the log recorded
    b = EvalBroker(clock=lambda: c.mono, state_clock=lambda: max(c.wall, pinned))
    b.enqueue(ev("later", wait_until=pinned + 5 * 10**9))
    assert drain(b) == [] and b.counts()["Delayed"] == 1
    c.advance(4.9)
    assert drain(b) == []
    c.advance(0.2)
    assert drain(b) == ["later"]


def test_dequeue_wakes_when_an_eval_arrives() -> None:
    async def main() -> str:
        b = EvalBroker()
        waiter = asyncio.create_task(b.dequeue(timeout=5.0))
        await asyncio.sleep(0)
        b.enqueue(ev("e1"))
        got = await waiter
        assert got is not None
        return got[0].id

    assert asyncio.run(main()) == "e1"


def test_disabled_broker_drops_everything() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1"))
    b.disable()
    b.enqueue(ev("e2", "k"))
    assert b.try_dequeue() is None


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["enq", "deq", "ack", "nack", "tick"]), st.integers(0, 4), st.integers(0, 9)), max_size=60))
def test_broker_never_hands_out_two_evals_of_one_job(ops) -> None:
    """Property: at any time at most one eval per job is out for delivery, and nothing is lost."""
    c = Clock()
    b = broker(c, delivery_limit=2, nack_delay=0.5, nack_delay_later=0.5, nack_timeout=1e9)
    out: dict[str, tuple[Evaluation, str]] = {}
    enqueued: set[str] = set()
    finished: set[str] = set()
    n = 0
    for op, job, k in ops:
        if op == "enq":
            n += 1
            e = ev(f"e{n}", f"j{job}", priority=10 * (k % 3), index=n)
            enqueued.add(e.id)
            b.enqueue(e)
        elif op == "deq":
            got = b.try_dequeue()
            if got is not None:
                assert got[0].id not in out
                out[got[0].id] = got
        elif op in ("ack", "nack") and out:
            eval_id = sorted(out)[k % len(out)]
            e, token = out.pop(eval_id)
            if op == "ack":
                b.ack(eval_id, token)
                finished.add(eval_id)
            else:
                b.nack(eval_id, token)
        else:
            c.advance(0.6)
            b.tick()
        jobs = [e.job_id for e, _ in out.values()]
        assert len(jobs) == len(set(jobs))
    finished |= {e.id for e in b.take_failed()} | {e.id for e in b.take_cancelable()}
    # Everything not finished is still held by the broker (or out).
    c.advance(100)
    while True:
        got = b.try_dequeue()
        if got is None:
            break
        b.ack(got[0].id, got[1])
        finished.add(got[0].id)
        finished |= {e.id for e in b.take_cancelable()}
    for e, token in list(out.values()):
        b.ack(e.id, token)
        finished.add(e.id)
        finished |= {x.id for x in b.take_cancelable()}
        while (got := b.try_dequeue()) is not None:
            b.ack(got[0].id, got[1])
            finished.add(got[0].id)
            finished |= {x.id for x in b.take_cancelable()}
    assert finished == enqueued


# -- blocked evals --------------------------------------------------------------------
def test_one_blocked_eval_per_job_newest_wins() -> None:
    t = BlockedEvals()
    assert t.block(ev("b1", status="blocked", index=5)) == []
    assert t.block(ev("b2", status="blocked", index=9)) == []
    assert [e.id for e in t.take_duplicates()] == ["b1"] and len(t) == 1
    t.block(ev("b0", status="blocked", index=1))  # an older one arriving late is the duplicate
    assert [e.id for e in t.take_duplicates()] == ["b0"]
    assert [e.id for e in t.capacity_changed(20)] == ["b2"] and len(t) == 0


def test_a_blocked_eval_that_missed_a_capacity_change_is_released_at_once() -> None:
    t = BlockedEvals()
    t.capacity_changed(50)
    t.expect("b1", 40)  # its plan was made on index 40, before the change at 50
    assert [e.id for e in t.block(ev("b1", status="blocked"))] == ["b1"]
    t.expect("b2", 60)
    assert t.block(ev("b2", "k", status="blocked")) == [] and t.job_ids() == ["k"]


def test_untrack_when_the_job_placed_everything() -> None:
    t = BlockedEvals()
    t.block(ev("b1", status="blocked"))
    assert t.untrack("default", "j", keep="b1") is None
    assert t.untrack("default", "j").id == "b1" and len(t) == 0


@pytest.mark.parametrize("yields", [0, 1, 2, 3])
def test_a_dequeue_cancelled_as_an_eval_arrives_never_loses_the_cancel(yields: int) -> None:
    """A leader loop's worker must stop when leadership is lost, whatever else is happening.

    asyncio.wait_for (Python 3.11) returns the inner result when the cancel
    lands after the inner wait finished but before wait_for resumed, dropping
    the cancel: the worker then took the eval and waited forever on a plan
    applier that had stopped ("Task was destroyed but it is pending!").
    Each interleaving: the waiter either finished before the cancel, with
    the eval, or is cancelled and leaves the eval queued.
    """
    c = Clock()
    b = broker(c)

    async def scenario() -> None:
        waiter = asyncio.create_task(b.dequeue(timeout=30))
        await asyncio.sleep(0)  # waiter now waits for a wake-up
        b.enqueue(ev("e1"))
        for _ in range(yields):
            await asyncio.sleep(0)
        if waiter.done():
            got, _token = waiter.result()
            assert got.id == "e1" and drain(b) == []
            return
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert drain(b) == ["e1"]  # still queued for the next leader's workers

    asyncio.run(scenario())


# -- holds (mark-downs first) ------------------------------------------------------------
def test_a_hold_stops_deliveries_until_released() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1", "j1"))
    b.hold("node-down")
    b.hold("node-down")  # idempotent: one hold, its time unchanged
    assert b.try_dequeue() is None and b.stats.holds == 1
    b.enqueue(ev("e2", "j2"))
    b.release("node-down")
    assert drain(b) == ["e1", "e2"]


def test_a_hold_stops_deliveries_for_at_most_hold_max_s_and_holding_again_does_not_renew_it() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1", "j1"))
    b.enqueue(ev("e2", "j2"))
    b.hold("node-down")
    c.advance(HOLD_MAX_S - 0.01)
    assert b.held_for() == pytest.approx(0.01)
    b.hold("node-down")
    assert b.try_dequeue() is None
    c.advance(0.02)
    assert b.held_for() is None
    assert b.try_dequeue()[0].id == "e1"
    b.release("node-down")
    b.hold("node-down")  # a new hold after a release counts afresh
    assert b.try_dequeue() is None and b.stats.holds == 2


def test_every_holder_must_release_and_disable_drops_the_holds() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1", "j1"))
    b.hold("a")
    b.hold("b")
    b.release("a")
    assert b.try_dequeue() is None
    b.disable()
    assert b.held_for() is None


def test_a_waiting_dequeue_wakes_when_the_hold_is_released() -> None:
    c = Clock()
    b = broker(c)
    b.enqueue(ev("e1", "j1"))
    b.hold("node-down")

    async def scenario() -> str:
        waiter = asyncio.create_task(b.dequeue())
        await asyncio.sleep(0)  # let it find the hold and wait
        assert not waiter.done()
        b.release("node-down")
        got = await asyncio.wait_for(waiter, 5)
        return got[0].id

    assert asyncio.run(scenario()) == "e1"
