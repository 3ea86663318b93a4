"""The ``member`` nemesis: servers leave and join the live cluster, as an operator replaces them.

Each fault is one membership change out and one back in, never two at once:

1. kill -9 a server (the leader half of the time) and remove it with
   ``caravan operator raft remove-peer --id ID`` through the others; hold
   while the cluster runs with one voter less;
2. then, seeded, either
   * ``rejoin`` -- wipe its data dir and start it afresh at the same id and
     addresses, waiting to be told (``join = []``), and ``caravan server
     join`` it; or
   * ``replace`` -- retire it for good and start a new server (a new id, new
     ports from the run's address book) whose ``join`` setting names the
     others; it takes the old one's place in the workloads' address lists
     (the journal's subscriber of that place follows it from index 0).

Either way the fault ends once every member lists the new configuration;
the new server catches up by snapshot install or log. Never below quorum:
it injects only when every member runs (and is not paused), it is never
held together with another fault (``exclusive``), and a removal from three
leaves two, the quorum of three. It runs beside partition and snapshot-lag:
every server is known by one raft address behind its own harness proxy
(``testbed`` says how), a new server gets its proxy before it joins, a
rejoined one keeps its proxy, and a retired one's is removed, so the other
faults pick among (and cut) the current members only.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from jepsen_like.nemesis import Fault, await_leader, pick_target
from jepsen_like.testbed import Testbed, TestbedError

#: seconds a new member may take, once it is a member everywhere, to apply what the leader had applied
CATCH_UP_WAIT = 30.0


class MemberChange(Fault):
    """Remove a server, then re-add it wiped (``rejoin``) or put a new one in its place (``replace``)."""

    name = "member"
    exclusive = True
    MODES = ("rejoin", "replace")

    def __init__(self) -> None:
        self.counts = {mode: 0 for mode in self.MODES} | {"by_snapshot_install": 0}
        self.seconds: dict[str, list[float]] = {
            "remove": [],
            "join": [],
        }  # how long each change took to show everywhere

    def stats(self) -> dict[str, Any]:
        """Changes by mode, and how long removals and joins took (median, max): the run's membership figures."""
        took = {
            f"{step}_seconds": {"median": round(statistics.median(v), 2), "max": round(max(v), 2)}
            for step, v in self.seconds.items()
            if v
        }
        return {"changes": dict(self.counts), **took}

    def unavailable(self, testbed: Testbed) -> str | None:
        if len(testbed.names) < 3:
            return "removing a server from fewer than three would leave no quorum"
        return None

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        down = [n for n in testbed.names if n in testbed.paused or not testbed.alive(n)]
        if down:  # one change at a time, never below quorum
            raise TestbedError(f"{', '.join(down)} not running: no membership change now")
        await_leader(testbed, "to change the membership")
        target, why = pick_target(testbed, rng)
        mode = rng.choice(self.MODES)
        testbed.kill(target)
        started = time.monotonic()
        try:
            testbed.remove_member(target)
        except TestbedError:
            if not _removed(testbed, target):
                testbed.start(target)  # still a member: bring it back as it was
                raise
        removed = time.monotonic() - started
        self.seconds["remove"].append(removed)
        self.counts[mode] += 1
        if mode == "replace":
            testbed.retire(target)

        def undo() -> str:
            began = time.monotonic()
            if mode == "rejoin":
                testbed.rejoin(target)
                what, joined = f"{target} wiped and joined again at its address", target
            else:
                joined = testbed.add_server(in_place_of=target)
                what = f"{joined} joined in {target}'s place"
            took = time.monotonic() - began
            self.seconds["join"].append(took)
            how = caught_up_by(testbed, joined)
            self.counts["by_snapshot_install"] += "snapshot install" in how
            return f"{what} in {took:.1f}s ({how}); members {', '.join(testbed.names)}"

        plan = "to rejoin wiped" if mode == "rejoin" else "to be replaced by a new server"
        return (
            undo,
            [target],
            f"kill -9 and remove-peer {target} ({why}; removed everywhere in {removed:.1f}s), {plan}",
        )


def caught_up_by(testbed: Testbed, name: str, timeout: float = CATCH_UP_WAIT) -> str:
    """Wait (bounded) until the new member applied what the leader had, and say how it got there.

    Its membership shows everywhere before it holds the state; the next
    fault should find it caught up, and the window should say whether a
    snapshot install (the runner compacts logs small) or the log did it.
    """
    leader = testbed.leader()
    # The leader's applied index, not its commit index: a membership entry is committed but not
    # applied to the state, so with the workloads stopped the last one would never be reached.
    goal = int((testbed.status(leader) or {}).get("AppliedIndex") or 0) if leader else 0
    started = time.monotonic()
    status: dict[str, Any] = {}
    while time.monotonic() - started < timeout:
        status = testbed.status(name, timeout=2.0) or {}
        if goal and int(status.get("AppliedIndex") or 0) >= goal:
            break
        time.sleep(0.1)  # polling the new member's progress with a deadline
    else:
        return (
            f"NOT caught up to index {goal} within {timeout:g}s (at {status.get('AppliedIndex')})"
        )
    took = time.monotonic() - started
    if int(status.get("SnapshotInstalls") or 0) > 0:
        how = f"by snapshot install (index {status.get('LastSnapshotInstallIndex')})"
    else:
        how = "from the log"
    return f"caught up to index {goal} {how} {took:.1f}s after joining"


def _removed(testbed: Testbed, name: str) -> bool:
    """Whether every other running member answers without ``name`` in its configuration (a removal that did happen)."""
    views = [testbed.peer_ids(n) for n in testbed.names if n != name and testbed.alive(n)]
    return bool(views) and all(v is not None and name not in v for v in views)
