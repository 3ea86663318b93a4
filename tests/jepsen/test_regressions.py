"""Anomalies the jepsen_like campaigns found, as direct reproductions.

Each test replays the smallest fault scenario that showed the anomaly, on a
real cluster, without the harness's proxies (so a failure is the servers',
not the harness's).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from jepsen_like.testbed import Testbed
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _job(job_id: str, value: int) -> dict:
    return {
        "ID": job_id,
        "Type": "service",
        "Meta": {"v": str(value)},
        "TaskGroups": [{"Name": "g", "Count": 0, "Tasks": [{"Name": "t", "Driver": "sim"}]}],
    }


def _paused_leader_trial(directory: Path) -> str | None:
    """Pause the leader for 6 s under write load; None if every server then converges, else the stuck state."""
    tb = Testbed.create(directory, 3, proxies=False)
    stop = threading.Event()

    def writer(k: int) -> None:
        with RPCClient(tb.rpc_addresses, timeout=5) as client:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    client.call("job.register", {"job": _job(f"r{k}-{n % 5}", n)})
                except (RPCError, OSError):
                    pass

    try:
        tb.start_all()
        threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(6)]
        for t in threads:
            t.start()
        stop.wait(2.0)  # load builds up (fault timing, not synchronization)
        leader = tb.wait_for_leader(30)
        tb.pause(leader)
        stop.wait(6.0)  # the others elect a new leader and move on
        tb.resume(leader)
        stop.wait(3.0)
        stop.set()
        for t in threads:
            t.join(15)
        deadline = time.monotonic() + 30
        seen: dict = {}
        while time.monotonic() < deadline:
            seen = {n: (tb.status(n) or {}) for n in tb.names}
            if len({s.get("AppliedIndex") for s in seen.values()}) == 1:
                return None
            time.sleep(0.5)  # polling a condition with a deadline
        return f"paused {leader}; " + ", ".join(
            f"{n}: {s.get('Role')} term {s.get('Term')} commit {s.get('CommitIndex')} applied {s.get('AppliedIndex')}"
            for n, s in seen.items()
        )
    finally:
        stop.set()
        tb.teardown()


def test_paused_leader_catches_up(tmp_path: Path) -> None:
    """Found by the pause nemesis: the resumed ex-leader stayed at its old index while the others moved on.

    Mechanism (confirmed with a message trace of the raft hooks): the
    ex-leader's log ends with entries of its old term past the commit index
    (e.g. last 549 term 1, commit 547). The new leader pipelines several
    batches from nextIndex=550 each round: prevLogIdx=549/term 3, then 605,
    661, ... The follower rejects the first on the term mismatch with
    ``next_node_idx=549, reset`` and every later one (prevLogIdx beyond its
    log) with ``next_node_idx=550, reset``; the leader applies the replies in
    order, so nextIndex is back at 550 after every round and never reaches
    548, where the logs agree. 534 identical rounds in 20 s in the trace.
    Fixed in raft/catchup.py: the leader lets a failed reply only lower a
    follower's nextIndex (Raft's rule), and a follower's term-mismatch reject
    points at the start of the conflicting term's run (not below its commit
    index + 1). Fast versions: tests/raft/test_catchup.py (message level) and
    tests/raft/test_cluster.py::test_cut_off_leader_with_a_long_uncommitted_tail_catches_up.
    """
    for trial in range(8):
        stuck = _paused_leader_trial(tmp_path / f"t{trial}")
        assert stuck is None, f"trial {trial}: servers did not converge within 30 s: {stuck}"


def test_disabled_truncation_fix_is_caught_under_pipelined_load(tmp_path: Path) -> None:
    """The raft adapter's test-only switch re-enables pysyncobj's follower truncation (defect 1).

    32 back-to-back set clients and leader kills make followers truncate
    entries they had applied (and acknowledged); the server-logs checker (and,
    when a kill lands in the window, the set checker) must report it, and the
    same run with the fix on must be clean.
    """
    from jepsen_like.runner import EXIT_ANOMALY, EXIT_OK, RunOptions, run

    def pipelined(out: Path, env: dict[str, str]) -> int:
        return run(
            RunOptions(
                out=str(out), seed=31, time=30.0, nemeses=["kill"], workloads=["set"], set_lanes=32, think=0.0,
                quiet=(2.0, 4.0), hold=(2.0, 4.0), server_env=env, keep_cluster_data=False,
            ),
            log=lambda *_: None,
        )

    assert pipelined(tmp_path / "unfixed", {"CARAVAN_UNSAFE_DISABLE_TRUNCATION_FIX": "1"}) == EXIT_ANOMALY
    assert pipelined(tmp_path / "fixed", {}) == EXIT_OK
