"""The clock nemesis: a deterministic jump of the leader's wall clock (test-only server switch).

The switch (``CARAVAN_UNSAFE_WALL_CLOCK_FILE``) shifts ``time.time`` /
``time.time_ns`` in one server process; the leader stamps every raft entry
with that clock, and the FSM turns entry times into modify/submit times,
never going backwards (``now = max(last_time, entry time)``). These tests
show the jump reaches the state through the leader's stamps, that a restored
clock cannot pull the FSM's time back, and that a short run under the clock
nemesis stays VALID (raft's timers are monotonic, so elections do not care).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jepsen_like.nemesis import ClockJump
from jepsen_like.runner import (
    CLOCK_FILE,
    EXIT_OK,
    UNSAFE_WALL_CLOCK_ENV,
)
from jepsen_like.testbed import Testbed
from jepsen_like.workloads import _job
from tests.conditions import wait_until
from tests.jepsen.support import short_run

pytestmark = pytest.mark.cluster

DAY = 86400


@pytest.fixture
def clock_testbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Testbed]:
    monkeypatch.setenv(UNSAFE_WALL_CLOCK_ENV, CLOCK_FILE)  # the servers inherit the harness's environment
    testbed = Testbed.create(tmp_path / "cluster", 3, clock_file=CLOCK_FILE)
    try:
        testbed.start_all(timeout=60.0)
        yield testbed
    finally:
        testbed.teardown()


def submit_time(testbed: Testbed, leader: str, job_id: str) -> float:
    """Register ``job_id`` through ``leader``; its SubmitTime (seconds), which the FSM takes from the entry's stamp."""
    with testbed.client(leader, timeout=10.0) as client:
        client.call("job.register", {"job": _job(job_id, {"k": job_id})})
        job = client.call("job.get", {"job_id": job_id})
    return int(job["data"]["SubmitTime"]) / 1e9


def test_leader_clock_jump_reaches_the_state_and_cannot_be_undone(clock_testbed: Testbed) -> None:
    leader = clock_testbed.wait_for_leader(30.0)
    before = submit_time(clock_testbed, leader, "before")
    assert abs(before - time.time()) < 60

    assert clock_testbed.set_clock_offset(leader, DAY * 10**9)
    ahead = submit_time(clock_testbed, leader, "ahead")
    assert abs(ahead - (time.time() + DAY)) < 60, "the leader stamps entries with its jumped clock"

    assert clock_testbed.set_clock_offset(leader, 0)
    after = submit_time(clock_testbed, leader, "after")
    assert after >= ahead, "the FSM's time never goes back, so the jump outlives the restored clock"
    assert clock_testbed.leader() == leader, "raft's timers are monotonic: a wall-clock jump starts no election"


def test_backward_jump_does_not_move_state_times_back(clock_testbed: Testbed) -> None:
    leader = clock_testbed.wait_for_leader(30.0)
    first = submit_time(clock_testbed, leader, "first")
    assert clock_testbed.set_clock_offset(leader, -DAY * 10**9)
    behind = submit_time(clock_testbed, leader, "behind")
    assert first <= behind < time.time() + 60


def test_short_run_under_clock_jumps_is_valid(tmp_path: Path) -> None:
    r = short_run(tmp_path / "clock", 41, ["clock", "partition"], time=20.0, convergence_wait=30.0)
    assert r.code == EXIT_OK, r.explain()
    clock = [f for f in r.faults if f["kind"] == "clock"]
    assert clock and all("wall clock" in f["detail"] and "restored" in f["detail"] for f in clock), r.faults


def test_a_clock_jump_right_after_the_leader_dies_waits_for_the_next_leader(clock_testbed: Testbed) -> None:
    """Overlapping faults (kill the leader, then jump the leader's clock) hit the newly elected leader.

    The nemesis used to give up at once ("no leader whose clock to jump"),
    which left the run UNKNOWN without any anomaly.
    """
    old = clock_testbed.wait_for_leader(30.0)
    clock_testbed.kill(old)
    undo, targets, what = ClockJump().inject(clock_testbed, random.Random(7))
    try:
        assert targets != [old] and clock_testbed.leader() in targets, what
    finally:
        undo()


def test_a_reschedule_delay_after_a_leader_clock_jump_takes_the_delay_not_the_skew(clock_testbed: Testbed) -> None:
    """A leader whose clock ran an hour ahead pins the state's time an hour forward (the FSM's
    time never goes back). An alloc reported failed without task times then has a modify time
    an hour ahead of the restored clock; it must be replaced after its 5 s reschedule delay,
    not after an hour (a campaign found such follow-up evals still pending at the end)."""
    leader = clock_testbed.wait_for_leader(30.0)
    clock_testbed.start_client_sim(1)
    # The client never judges it healthy itself (Nomad's order: MinHealthyTime < HealthyDeadline <
    # ProgressDeadline); the progress deadline outlasts the jump, which would otherwise fail the rollout.
    update = {"MaxParallel": 1, "MinHealthyTime": 600 * 10**9, "HealthyDeadline": 700 * 10**9, "ProgressDeadline": 7200 * 10**9}
    spec = {"ID": "sick", "Type": "service", "TaskGroups": [{
        "Name": "g", "Count": 1, "Update": update,
        "ReschedulePolicy": {"Delay": 5 * 10**9, "DelayFunction": "constant", "Unlimited": True},
        "Tasks": [{"Name": "t", "Driver": "sim"}]}]}
    with clock_testbed.client(leader, timeout=10.0) as client:
        client.call("job.register", {"job": spec})
        allocs = lambda: client.call("alloc.list", {"job_id": "sick"})["data"]  # noqa: E731
        (first,) = wait_until(lambda: [a for a in allocs() if a["ClientStatus"] == "running"], 30, "the alloc running")
        assert clock_testbed.set_clock_offset(leader, 3600 * 10**9)
        submit_time(clock_testbed, leader, "pin")  # an entry stamped an hour ahead
        assert clock_testbed.set_clock_offset(leader, 0)
        health = {"Healthy": False, "Timestamp": time.time_ns()}
        # Reported as the client would: with its nodes' secret (a tool's token may not speak for a node).
        client.call("alloc.update", {"allocs": [{"ID": first["ID"], "ClientStatus": "failed", "DeploymentStatus": health}]},
                    token=clock_testbed.client_sim_secret())
        reported = time.monotonic()
        wait_until(lambda: any(a["PreviousAllocation"] == first["ID"] for a in allocs()), 40,
                   "the failed alloc replaced after its 5 s delay (not the hour of skew)")
        assert time.monotonic() - reported >= 4.0, "the delay itself was kept"
        # A crash the client stamps with its own (wall) clock, an hour behind the state's time:
        # its delay is neither skipped (the stamp looks an hour old) nor stretched.
        crashy = {"ID": "crashy", "Type": "batch", "TaskGroups": [{
            "Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "sim", "Config": {"run_for": "200ms", "exit_code": 1}}],
            "ReschedulePolicy": {"Attempts": 3, "Interval": 3 * 3600 * 10**9, "Delay": 5 * 10**9,
                                 "DelayFunction": "constant", "Unlimited": False}}]}
        client.call("job.register", {"job": crashy})
        crashed = lambda: client.call("alloc.list", {"job_id": "crashy"})["data"]  # noqa: E731
        wait_until(lambda: any(a["ClientStatus"] == "failed" for a in crashed()), 30, "the batch alloc crashed")
        failed = time.monotonic()
        wait_until(lambda: any(a["PreviousAllocation"] for a in crashed()), 40, "the crash rescheduled after its delay")
    assert time.monotonic() - failed >= 3.5, "the crash's delay was kept, not skipped"


def test_a_drain_deadline_is_not_held_back_by_an_earlier_clock_jump(clock_testbed: Testbed) -> None:
    """Campaign 601:3, seed 601: after a leader's clock had run a minute ahead, a drain's 5 s deadline
    was still ahead 35 s later. The FSM stamps the deadline in the state's time, which stands still
    until the wall clock catches up with the jump; the drainer now also counts it on its own clock."""
    tb = clock_testbed
    tb.start_client_sim(1)
    leader = tb.wait_for_leader(30.0)
    assert tb.set_clock_offset(leader, 60 * 10**9)
    submit_time(tb, leader, "ahead")  # the state's time: a minute ahead from here on
    assert tb.set_clock_offset(leader, 0)
    batch = {"ID": "forever", "Type": "batch", "Datacenters": ["dc1"], "TaskGroups": [
        {"Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "sim", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}
    with tb.client(leader, timeout=10.0) as client:

        def running() -> list[str]:
            rows = client.call("alloc.list", {"job_id": "forever"})["data"]
            return [a["NodeID"] for a in rows if a["ClientStatus"] == "running"]

        client.call("job.register", {"job": batch})
        (node_id,) = wait_until(running, 60, "the batch alloc running on the simulated node")
        started = time.monotonic()
        client.call("node.drain", {"node_id": node_id, "drain_spec": {"Deadline": 3 * 10**9}})
        wait_until(lambda: not client.call("node.get", {"node_id": node_id})["data"]["Drain"], 30,
                   "the drain to end at its 3 s deadline (a batch alloc is left until then)")
    assert time.monotonic() - started >= 3.0, "the drain ended before its deadline"
