"""Nemeses: faults injected into the running cluster on a seeded schedule.

One ``random.Random`` (seeded from the run's seed) decides everything the
schedule can decide: the quiet time before each fault, which enabled fault
comes next, whom it hits (the leader or a random server), and how long it
lasts. Which server *is* the leader at that moment is up to the cluster, so
two runs with one seed inject the same sequence of fault kinds and
durations, not necessarily on the same servers.

Faults (``--nemesis`` names):

* ``kill`` -- kill -9 one server (the leader half of the time), restart it.
* ``kill-all`` -- kill -9 every server at once, restart them all.
* ``pause`` -- SIGSTOP one server (the leader half of the time), SIGCONT.
* ``partition`` -- cut raft links through the harness's proxies (one per
  server, cutting pairs: ``jepsen_like.proxy``): isolate one server (the
  leader half of the time), or, with five servers, split them into a random
  majority and minority; then heal.
* ``snapshot-lag`` -- isolate a follower until the others have compacted
  their raft log past it (writing filler if the workload is too slow), so
  it must catch up by snapshot install; the window's detail says whether it
  did. Needs servers started with a small ``raft_compaction_entries`` (the
  runner does that when this nemesis is enabled); skipped with the reason
  otherwise (see ``SnapshotLag.unavailable``).
* ``client-kill`` -- kill -9 the simulated client (lifecycle runs), hold
  until the servers have marked its nodes down (bounded), then start it
  again on the same node ids: its allocs are lost and replaced, placements
  wait in blocked evals while no node is up, and a rollout waiting on its
  canaries replaces lost old allocs with the last settled version.
* ``drain`` -- drain a random node of the simulated client (lifecycle
  runs) with a short deadline, no deadline or ``--force``, sometimes
  ignoring system jobs; hold, wait (bounded) for the drain to complete, then
  end it and open the node again: the drainer's steps, its deadline and its
  completion meet leader changes and the other faults.
* ``clients`` -- silence a seeded 20-50% of the simulated client's nodes
  until the servers have marked them down and their allocs lost, then bring
  them back (``jepsen_like.clients_fault``; listed in ``catalogue``, which
  adds the ``failover`` workload its checker reads).
* ``clock`` -- jump the leader's wall clock by a seeded offset (±0.5 s to
  ±1 day), then restore it; needs the servers' test-only wall-clock switch,
  which the runner turns on when this nemesis is enabled (``ClockJump``).
* ``member`` -- kill -9 and remove-peer a server, then re-add it wiped or
  join a new server in its place (``jepsen_like.member_fault``; listed in
  ``catalogue``); never held with another fault, and the others pick among
  the current members (``testbed.names``), each behind its own proxy.

Every fault is recorded as a window (start, end, targets) in faults.jsonl;
the nemesis always undoes its own fault, waits (bounded) for a leader, checks
that every server that should be up is up (``jepsen_like.health``: one that
is not is reported at once, with its cause, as a harness failure or an
anomaly), and the runner heals everything at the end regardless.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jepsen_like.health import UP_WAIT, NotUp, check_up
from jepsen_like.recorder import Fault as Window
from jepsen_like.recorder import FaultLog
from jepsen_like.testbed import Testbed, TestbedError
from node.wire.errors import NOT_FOUND, RPCError
from node.wire.rpc_client import RPCClient


@dataclass
class Timing:
    """Seconds: quiet time between faults and how long a fault lasts (uniform ranges)."""

    quiet: tuple[float, float] = (2.0, 5.0)
    hold: tuple[float, float] = (2.0, 6.0)
    kill_all_hold: tuple[float, float] = (0.5, 2.0)
    settle: float = 30.0  # longest wait for a leader after a fault is undone
    up_wait: float = UP_WAIT  # longest wait, after a heal, for every server to run and answer


class Fault:
    """One kind of fault: ``inject`` returns an undo function and the affected servers."""

    name = "fault"
    #: never held together with another fault (``--overlap``): kill-all leaves nothing to overlap with,
    #: and a membership change must be the only change under way
    exclusive = False

    def unavailable(self, testbed: Testbed) -> str | None:
        """A reason this fault cannot run on this cluster, or None."""
        return None

    def stats(self) -> dict[str, Any]:
        """Counters worth keeping in run.json (empty for most faults)."""
        return {}

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        raise NotImplementedError


#: numbers the network faults' cut owners: each held fault heals only its own cuts (``LinkProxies``)
_cut_owners = itertools.count(1)


def cut_owner(kind: str) -> str:
    """A fresh owner key for one held fault's cuts, e.g. ``partition#3``."""
    return f"{kind}#{next(_cut_owners)}"


#: How long a fault aimed at the leader waits for one (an election after a
#: kill, or the other fault of an overlapping pair, leaves none for a moment).
LEADER_WAIT = 10.0


def await_leader(testbed: Testbed, purpose: str) -> str:
    """The leader, waiting up to LEADER_WAIT for an election; TestbedError naming ``purpose`` if none."""
    try:
        return testbed.wait_for_leader(LEADER_WAIT)
    except TestbedError:
        raise TestbedError(f"no leader within {LEADER_WAIT:g}s {purpose}") from None


def pick_target(testbed: Testbed, rng: random.Random) -> tuple[str, str]:
    """(server, why): the leader half of the time, else a random server."""
    if rng.random() < 0.5:
        leader = testbed.leader()
        if leader is not None:
            return leader, "leader"
    return rng.choice(testbed.names), "random"


class Kill(Fault):
    name = "kill"

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        target, why = pick_target(testbed, rng)
        testbed.kill(target)

        def undo() -> str:
            testbed.start(target)
            return f"restarted {target}"

        return undo, [target], f"kill -9 {target} ({why})"


class KillAll(Fault):
    name = "kill-all"
    exclusive = True

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        for name in testbed.names:
            testbed.kill(name)

        def undo() -> str:
            for name in testbed.names:
                testbed.start(name)
            return "restarted all"

        return undo, list(testbed.names), "kill -9 all servers"


class Pause(Fault):
    name = "pause"

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        target, why = pick_target(testbed, rng)
        if not testbed.alive(target):
            testbed.start(target)
        testbed.pause(target)

        def undo() -> str:
            testbed.resume(target)
            return f"SIGCONT {target}"

        return undo, [target], f"SIGSTOP {target} ({why})"


class Partition(Fault):
    name = "partition"

    def unavailable(self, testbed: Testbed) -> str | None:
        if testbed.proxies is None or len(testbed.names) < 3:
            return "partitions need at least three servers behind the harness's proxies"
        return None

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        names = list(testbed.names)
        owner = cut_owner(self.name)
        if len(names) >= 5 and rng.random() < 0.5:
            rng.shuffle(names)
            minority = sorted(names[: len(names) // 2])
            majority = sorted(names[len(names) // 2 :])
            testbed.partition([minority, majority], owner)
            what = f"split {'+'.join(minority)} | {'+'.join(majority)}"
            targets = minority
        else:
            target, why = pick_target(testbed, rng)
            rest = [n for n in names if n != target]
            testbed.partition([[target], rest], owner)
            what = f"isolate {target} ({why})"
            targets = [target]

        def undo() -> str:
            testbed.heal_network(owner)  # its own cuts only: an overlapping fault's stay
            return "healed"

        return undo, targets, what


FILLER_NODE = "jepsen-snapshot-lag-filler"


@dataclass
class LagProgress:
    """What one snapshot-lag fault saw: the follower's position and the others' log start."""

    target: str
    behind_at: int  # the isolated follower's last raft index once cut off
    installs_before: int
    owner: str = ""  # whose cuts isolate it (``cut_owner``): healing drops these only
    #: servers not waited for: cut off from the leader by an overlapping fault, they cannot compact
    uncounted: set[str] = field(default_factory=set)
    first_index: int = 0  # the others' lowest first raft index when they had compacted past it
    filler: int = 0  # writes the fault made itself to get there


class SnapshotLag(Fault):
    """Cut a follower off until the others have compacted their raft log past it, then heal.

    The follower's next entry is then gone from every other log, so the only
    way back is a snapshot install (pysyncobj sends the leader's dump). The
    fault isolates the follower through the proxies (the others keep
    serving the workload), holds it like a partition, and on undo: waits
    (bounded) until every live server but the follower reports a
    ``FirstLogIndex`` above the follower's last index -- writing filler
    itself (re-registering one down node, which no checker reads) if the
    workload was too slow --, heals, waits (bounded) until the follower has
    applied the leader's commit index at heal time, and records whether
    ``SnapshotInstalls`` rose on it.
    """

    name = "snapshot-lag"
    compact_wait = 20.0  # longest wait, after the hold, for the others to compact past the follower
    catch_up_wait = 30.0  # longest wait for the follower after healing
    filler_batch = 25  # filler writes between two looks at the others' logs
    install_count_wait = 1.0  # how long a catch-up seen without an install counted looks again for one

    def __init__(self) -> None:
        self.faults = 0
        self.installs = 0  # faults this run that ended in a snapshot install

    def stats(self) -> dict[str, Any]:
        return {"faults": self.faults, "caught_up_by_snapshot_install": self.installs}

    def unavailable(self, testbed: Testbed) -> str | None:
        if testbed.proxies is None or len(testbed.names) < 3:
            return "snapshot-lag isolates a follower through the harness's proxies: needs at least three servers behind them"
        if testbed.compaction_entries is None:
            return (
                "the servers run with the profile's compaction threshold (tens of thousands of entries), which a "
                "short run never reaches; start them with a small raft_compaction_entries (Testbed.create(compaction_entries=...))"
            )
        status = next((st for st in map(testbed.status, testbed.names) if st), None) or {}
        if "FirstLogIndex" not in status or "SnapshotInstalls" not in status:
            return "the servers' status reports no FirstLogIndex / SnapshotInstalls, so a snapshot install cannot be observed"
        return None

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        leader = await_leader(testbed, "to lag a follower behind")
        followers = sorted(n for n in testbed.names if n != leader and testbed.status(n))
        if not followers:
            raise TestbedError("no live follower to lag")
        target = rng.choice(followers)
        rest = [n for n in testbed.names if n != target]
        owner = cut_owner(self.name)
        testbed.partition([[target], rest], owner)
        self.faults += 1
        status = testbed.status(target, timeout=2.0) or {}
        progress = LagProgress(
            target,
            int(status.get("LastLogIndex") or 0),
            int(status.get("SnapshotInstalls") or 0),
            owner,
        )

        def undo() -> str:
            return self._finish(testbed, progress, rest)

        return (
            undo,
            [target],
            f"isolate {target} (follower; at raft index {progress.behind_at}) until the others compact past it",
        )

    def _finish(self, testbed: Testbed, progress: LagProgress, rest: list[str]) -> str:
        compacted = self._wait_compacted(testbed, progress, rest)
        leader = testbed.leader()
        goal = int((testbed.status(leader) or {}).get("CommitIndex") or 0) if leader else 0
        testbed.heal_network(progress.owner)  # its own cuts only: an overlapping fault's stay
        filler = f" ({progress.filler} filler writes)" if progress.filler else ""
        if progress.uncounted:
            filler += f" (not waited for: {', '.join(sorted(progress.uncounted))}, cut off from the leader by another fault)"
        still = _cut_by_others(testbed, progress.target)
        if still:
            filler += f" (still cut by another fault: {', '.join(still)})"
        if not compacted:
            head = f"healed; the others did not compact past index {progress.behind_at} within {self.compact_wait:g}s{filler}"
        else:
            head = f"healed; the others' logs start at {progress.first_index} > {progress.behind_at}{filler}"
        return f"{head}; {self._wait_caught_up(testbed, progress, goal)}"

    def _wait_compacted(self, testbed: Testbed, progress: LagProgress, rest: list[str]) -> bool:
        """Until every answering server but the target (the leader among them) starts its log past the target.

        A server an overlapping fault cuts from the leader is not waited for:
        it cannot compact meanwhile, and, behind the others, cannot lead after.
        """
        deadline = time.monotonic() + self.compact_wait
        while True:
            seen = {name: testbed.status(name) for name in rest}
            live = {name: st for name, st in seen.items() if st}
            leaders = sorted(
                (int(st.get("Term") or 0), name)
                for name, st in live.items()
                if st.get("Role") == "leader"
            )
            led = bool(leaders)
            if led:  # one an overlapping fault cuts from the leader cannot compact: not waited for
                cut = set(testbed.proxies.cut_links()) if testbed.proxies is not None else set()
                leader = leaders[-1][1]
                off = {n for n in live if tuple(sorted((n, leader))) in cut}
                progress.uncounted = off
                live = {n: st for n, st in live.items() if n not in off}
            firsts = [int(st.get("FirstLogIndex") or 0) for st in live.values()]
            if led and firsts and min(firsts) > progress.behind_at + 1:
                progress.first_index = min(firsts)
                return True
            if time.monotonic() >= deadline:
                return False
            target = (
                testbed.status(progress.target) or {}
            )  # cut off, but its RPC port still answers
            progress.behind_at = max(progress.behind_at, int(target.get("LastLogIndex") or 0))
            wrote = _filler(testbed, rest, self.filler_batch)
            progress.filler += wrote
            if not wrote:
                time.sleep(0.2)  # no leader for the moment: look again shortly

    def _wait_caught_up(self, testbed: Testbed, progress: LagProgress, goal: int) -> str:
        started = time.monotonic()
        status: dict[str, Any] = {}
        while time.monotonic() - started < self.catch_up_wait:
            status = testbed.status(progress.target) or {}
            if goal and int(status.get("AppliedIndex") or 0) >= goal:
                break
            time.sleep(0.1)  # polling a condition with a deadline
        else:
            return f"{progress.target} did NOT catch up to index {goal} within {self.catch_up_wait:g}s (at {status.get('AppliedIndex')})"
        took = time.monotonic() - started
        installs = int(status.get("SnapshotInstalls") or 0) - progress.installs_before
        # the server moves AppliedIndex while restoring a dump, before it counts the install: a
        # status read in between shows the goal reached by "log entries"; look again (bounded)
        settle = time.monotonic() + self.install_count_wait
        while installs <= 0 and time.monotonic() < settle:
            time.sleep(0.1)  # polling a condition with a deadline
            later = testbed.status(progress.target) or {}
            if later:
                status = later
                installs = int(status.get("SnapshotInstalls") or 0) - progress.installs_before
        if installs > 0:
            self.installs += 1
            how = f"by snapshot install (SnapshotInstalls +{installs}, restored index {status.get('LastSnapshotInstallIndex')})"
        else:
            how = "without a snapshot restored (SnapshotInstalls unchanged: by log entries)"
        return f"{progress.target} caught up to index {goal} in {took:.1f}s {how}"


def _cut_by_others(testbed: Testbed, name: str) -> list[str]:
    """``name``'s links still cut by an owner (an overlapping fault), as ``owner: a-b, ...``."""
    proxies = testbed.proxies
    if proxies is None:
        return []
    found = []
    for owner in proxies.owners():
        pairs = [f"{a}-{b}" for a, b in proxies.cut_links(owner) if name in (a, b)]
        if pairs:
            found.append(f"{owner} {' '.join(pairs)}")
    return found


def _filler(testbed: Testbed, servers: list[str], count: int) -> int:
    """Up to ``count`` writes no checker reads (one down node, re-registered); returns how many succeeded."""
    done = 0
    node = {"ID": FILLER_NODE, "Name": FILLER_NODE, "Status": "down"}
    try:
        with RPCClient([testbed.node(n).rpc_addr for n in servers], timeout=2.0) as client:
            for _ in range(count):
                client.call("node.register", {"node": node}, timeout=2.0)
                done += 1
    except (RPCError, OSError):
        pass  # an election or a dead server: the caller looks again and retries until its deadline
    return done


class ClockJump(Fault):
    """Jump the leader's wall clock forward or back by a seeded amount, then set it right.

    Jepsen's clock nemesis, made deterministic with the servers' test-only
    ``CARAVAN_UNSAFE_WALL_CLOCK_FILE`` switch: the harness writes an offset,
    the server acknowledges it, and from then on every wall-time read in that
    process (raft entry time stamps, which the FSM turns into modify times and
    GC ages; token expiry; eval wait times) is off by it. Raft itself is not:
    pysyncobj's election and heartbeat timers, asyncio and the heartbeat TTLs
    run on monotonic clocks. The FSM reads no clock, so the only way a skewed
    leader reaches the state is through the times it stamps on entries.
    """

    name = "clock"
    #: seconds; the seed picks one and a sign. Small skews, a minute, an hour (past GC thresholds), a day.
    JUMPS = (0.5, 5.0, 60.0, 3600.0, 86400.0)

    def unavailable(self, testbed: Testbed) -> str | None:
        if testbed.clock_file is None:
            return "the servers run without the test-only wall-clock switch (CARAVAN_UNSAFE_WALL_CLOCK_FILE)"
        for name in testbed.names:
            if testbed.alive(name) and not testbed.set_clock_offset(name, 0, timeout=3.0):
                return f"{name} did not acknowledge a wall-clock offset; is the switch supported by this server version?"
        return None

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        seconds = rng.choice(self.JUMPS) * rng.choice((1, -1))
        target = await_leader(testbed, "whose clock to jump")
        offset = int(seconds * 1e9)
        if not testbed.set_clock_offset(target, offset):
            testbed.set_clock_offset(target, 0, timeout=0.5)
            raise TestbedError(f"{target} did not acknowledge the clock offset {seconds:+g}s")

        def undo() -> str:
            if testbed.set_clock_offset(target, 0):
                return f"restored {target}'s clock"
            return f"{target}'s clock offset reset (not acknowledged: down or paused; it takes it when it runs)"

        return undo, [target], f"jump {target}'s wall clock {seconds:+g}s (leader)"


def _without_client_sim(testbed: Testbed) -> str | None:
    """Why a fault of the simulated client cannot run here, or None."""
    if testbed.client_sim is None:
        return "no simulated client in this run (a lifecycle workload starts one)"
    return None


class ClientKill(Fault):
    name = "client-kill"

    def unavailable(self, testbed: Testbed) -> str | None:
        return _without_client_sim(testbed)

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        testbed.kill_client_sim()

        def undo() -> str:
            down = _await_nodes_down(testbed, NODES_DOWN_WAIT)
            testbed.restart_client_sim()
            return "restarted the simulated client" + (
                "" if down else f" (its nodes not all down within {NODES_DOWN_WAIT:g}s)"
            )

        return undo, ["client-sim"], "kill -9 the simulated client"


#: How long the client-kill nemesis holds for the servers to mark the dead client's nodes down.
NODES_DOWN_WAIT = 30.0


def _await_stale(
    testbed: Testbed, method: str, args: dict[str, Any], done: Callable[[Any], bool], timeout: float
) -> bool:
    """Whether ``done(data)`` held for a stale read of ``method`` (any server's view) within ``timeout``; a list is read whole."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with RPCClient(testbed.running_addresses(), timeout=2.0) as client:
                call = {**args, "stale": True}
                data = (
                    client.list_all(method, call)
                    if method.endswith(".list")
                    else client.call(method, call)["data"]
                )
                if done(data):
                    return True
        except (RPCError, OSError):
            pass
        time.sleep(0.5)
    return False


def _await_nodes_down(testbed: Testbed, timeout: float) -> bool:
    """Whether every node of the simulated client became ``down`` within ``timeout``.

    A node no longer listed counts as down: a forced GC (the lifecycle
    workload's) collects down nodes whose allocs are terminal, so all of
    them could be gone before a look found them all down.
    """
    ours = set(testbed.client_sim_node_ids())

    def down(nodes: list[dict[str, Any]]) -> bool:
        if not ours:  # no state file to say which: every node the servers know
            return bool(nodes) and all(n["Status"] == "down" for n in nodes)
        return all(n["Status"] == "down" for n in nodes if n["ID"] in ours)

    return _await_stale(testbed, "node.list", {}, down, timeout)


READY_NODE_WAIT = 15.0  # seconds the drain fault looks for a ready node in the servers' stale views


def _ready_nodes(testbed: Testbed, timeout: float) -> list[str]:
    """The nodes a drain may take, from the first stale view that has any (none within ``timeout``: [])."""
    seen: list[str] = []

    def has_ready(nodes: list[dict[str, Any]]) -> bool:
        seen[:] = sorted(n["ID"] for n in nodes if n["Status"] == "ready" and not n.get("Drain"))
        return bool(seen)

    _await_stale(testbed, "node.list", {}, has_ready, timeout)
    return seen


class Drain(Fault):
    name = "drain"

    def unavailable(self, testbed: Testbed) -> str | None:
        return _without_client_sim(testbed)

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        # A stale view: a running server may not have applied the newest nodes yet (its leader
        # was just paused before telling it the commit index), so look again for a while.
        ready = _ready_nodes(testbed, READY_NODE_WAIT)
        if not ready:
            raise TestbedError(f"no ready node to drain within {READY_NODE_WAIT:g}s")
        with RPCClient(testbed.running_addresses(), timeout=5.0) as client:
            node_id = rng.choice(ready)
            deadline = rng.choice([-1, 0, 2, 5, 10])  # seconds; -1: force, 0: none
            ignore_system = rng.random() < 0.3
            spec = {
                "Deadline": deadline * 1_000_000_000 if deadline > 0 else deadline,
                "IgnoreSystemJobs": ignore_system,
            }
            # Another fault may hold the leader: a request without an answer may still have
            # started the drain, so the window is kept and ended either way.
            unknown = ""
            try:
                client.call(
                    "node.drain",
                    {"node_id": node_id, "drain_spec": spec},
                    timeout=DRAIN_CALL_TIMEOUT,
                )
            except (RPCError, OSError) as exc:
                unknown = f" (no answer: {exc})"
        started = time.monotonic()

        def undo() -> str:
            done = _await_drained(testbed, node_id, DRAIN_WAIT)
            took = time.monotonic() - started
            if done:
                said = f"complete (seen {took:.1f}s after it began)"
            else:  # what held it, read before the drain ends and the node fills up again
                said = f"not complete within {took:.1f}s; {_left_on(testbed, node_id)}"
            _end_drain(testbed, node_id, DRAIN_WAIT)
            return f"drain {said}; ended it and opened the node again"

        what = {-1: "forced", 0: "no deadline"}.get(deadline, f"deadline {deadline}s")
        system = ", ignoring system jobs" if ignore_system else ""
        return undo, [f"node {node_id[:8]}"], f"drain node {node_id[:8]} ({what}{system}){unknown}"


#: How long the drain nemesis waits for a drain to complete before it ends it anyway.
DRAIN_WAIT = 30.0
#: How long it waits for the answer to its drain request (through an election another fault caused).
DRAIN_CALL_TIMEOUT = 15.0


def _await_drained(testbed: Testbed, node_id: str, timeout: float) -> bool:
    """Whether the node's drain completed within ``timeout``."""
    return _await_stale(
        testbed, "node.get", {"node_id": node_id}, lambda node: not node.get("Drain"), timeout
    )


def _left_on(testbed: Testbed, node_id: str) -> str:
    """The node's allocs that still run, as ``describe_left`` puts them; a failed read says so."""
    try:
        with RPCClient(testbed.running_addresses(), timeout=5.0) as client:
            allocs = client.list_all("alloc.list", {"node_id": node_id, "stale": True})
    except (RPCError, OSError) as exc:
        return f"could not list its allocs ({exc})"
    return describe_left(allocs)


def describe_left(allocs: list[dict[str, Any]], most: int = 6) -> str:
    """What still runs on a node whose drain did not complete: job, group, client status, health, migration mark."""
    live = [
        a
        for a in allocs
        if a.get("DesiredStatus") == "run" and a.get("ClientStatus") in ("pending", "running")
    ]
    if not live:
        return "nothing left running on it"
    parts = []
    for a in sorted(live, key=lambda a: (a.get("JobID", ""), a.get("ID", "")))[:most]:
        health = (a.get("DeploymentStatus") or {}).get("Healthy")
        words = [f"{a.get('JobID')}/{a.get('TaskGroup')}", a["ClientStatus"]]
        if health is not None:
            words.append("healthy" if health else "unhealthy")
        if (a.get("DesiredTransition") or {}).get("Migrate"):
            words.append("marked to migrate")
        parts.append(" ".join(words))
    more = f" and {len(live) - most} more" if len(live) > most else ""
    return f"left on it: {'; '.join(parts)}{more}"


def _end_drain(testbed: Testbed, node_id: str, timeout: float) -> None:
    """End the drain (if still on) and open the node, retrying through elections for up to ``timeout``."""
    deadline = time.monotonic() + timeout
    # Each call may take longer than a server's hold for a leader (5 s,
    # node.server.NO_LEADER_HOLD): a server cut off from the others answers
    # no_leader only then, and the client tries the next one. With a 5 s
    # call, a client whose first address was such a server timed out on it
    # every time (campaign 601:3, seed 603: a drain during snapshot-lag).
    while True:
        try:
            with RPCClient(testbed.running_addresses(), timeout=DRAIN_CALL_TIMEOUT) as client:
                client.call(
                    "node.drain", {"node_id": node_id, "drain_spec": None, "mark_eligible": True}
                )
            return
        except (RPCError, OSError) as exc:
            if isinstance(exc, RPCError) and exc.code == NOT_FOUND:
                return  # down (client-kill) and collected by a forced GC meanwhile: no drain left to end
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


FAULTS: dict[str, Callable[[], Fault]] = {
    "kill": Kill,
    "kill-all": KillAll,
    "pause": Pause,
    "partition": Partition,
    "snapshot-lag": SnapshotLag,
    "clock": ClockJump,
    "client-kill": ClientKill,
    "drain": Drain,
}


class Nemesis:
    """Runs the enabled faults on a seeded schedule, in its own thread.

    One fault at a time, or with ``overlap`` sometimes two different kinds at
    once (a partition while a server is killed, a pause during a partition):
    compound faults are where recovery paths meet.
    """

    def __init__(
        self,
        testbed: Testbed,
        faults: list[Fault],
        rng: random.Random,
        log: FaultLog,
        stop: threading.Event,
        timing: Timing | None = None,
        overlap: bool = False,
        report: Callable[[str], Any] | None = None,
    ) -> None:
        self.testbed = testbed
        self.report = report or (lambda line: None)
        self.not_up: list[NotUp] = []  # every server found not up after a heal, in order
        self.heal_checks = 0
        # (server, kind) not up at the last check: each reported once while it stays down
        self._down: set[tuple[str, str]] = set()
        self.overlap = overlap
        self.faults = faults
        self.rng = rng
        self.log = log
        self.stop = stop
        self.timing = timing or Timing()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        if self.faults:
            self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _pick(self) -> list[Fault]:
        """One fault, or with ``overlap`` half of the time two different ones held together."""
        first = self.rng.choice(self.faults)
        if not self.overlap or first.exclusive or self.rng.random() < 0.5:
            return [first]
        others = [f for f in self.faults if f.name != first.name and not f.exclusive]
        return [first, self.rng.choice(others)] if others else [first]

    def _run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.timing.quiet)):
            picked = self._pick()
            hold_range = (
                self.timing.kill_all_hold if picked[0].name == "kill-all" else self.timing.hold
            )
            hold = self.rng.uniform(*hold_range)
            active: list[tuple[Fault, Callable[[], str], Any]] = []
            for fault in picked:
                leader = self.testbed.leader()  # for the report's availability: was it hit?
                start = self.log.clock.now()
                try:
                    undo, targets, what = fault.inject(self.testbed, self.rng)
                except Exception as exc:  # noqa: BLE001 - a failed injection is reported, not fatal
                    self.errors.append(f"{fault.name}: could not inject: {exc}")
                    continue
                window = self.log.begin(fault.name, targets, what, start=start, leader=leader)
                active.append((fault, undo, window))
            if not active:
                continue
            self.stop.wait(hold)  # hold the fault(s) (ends early when the run stops)
            for fault, undo, window in reversed(active):
                try:
                    done = undo()
                except Exception as exc:  # noqa: BLE001
                    done = f"undo failed: {exc}"
                    self.errors.append(f"{fault.name}: {done}")
                self.log.end(window, done)
            self._settle()
            self.check_healed([window for _, _, window in active])

    def check_healed(self, windows: list[Window], after: str = "") -> list[NotUp]:
        """After a heal: every server that should run (all but paused ones) is up, or reported now.

        A server still down from an earlier heal is not reported again for
        the same kind of failure; one found not up is also noted in the
        window it followed, so the timeline shows where it stayed down.
        """
        names = [n for n in self.testbed.names if n not in self.testbed.paused]
        found = check_up(self.testbed, names, self.timing.up_wait)
        self.heal_checks += 1
        after = after or "+".join(w.kind for w in windows)
        for miss in found:
            miss.after, miss.at = after, self.log.clock.now()
            if (miss.server, miss.kind) in self._down:
                continue
            self.not_up.append(miss)
            self.report(miss.line())
            for window in windows[-1:]:
                self.log.note(window, f"NOT UP: {miss.server} ({miss.kind})")
        self._down = {(m.server, m.kind) for m in found}
        return found

    def _settle(self) -> None:
        """Wait (bounded) until some server leads again, so the quiet time is time the cluster can serve.

        Without this a whole-cluster restart (seconds: imports, log replay,
        election) eats most of the quiet period and the next fault hits a
        cluster that never came back, which tests little.
        """
        deadline = time.monotonic() + self.timing.settle
        while not self.stop.is_set() and time.monotonic() < deadline:
            if self.testbed.leader() is not None:
                return
            self.stop.wait(0.2)
