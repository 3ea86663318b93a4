"""The benchmark's cluster: three servers seeded from the built state, two fleet processes, clean-up.

Servers start through ``node.devcluster`` (``up``, then
``devcluster_restore.restore_local_cluster``, the path ``caravan operator
snapshot restore --dir`` takes) and are killed and restarted through it.
Fleet processes run ``tests.bench.failover.fleetproc`` in sessions of their
own, like ``devcluster.launch``'s, so a Ctrl-C at the terminal reaches only
the benchmark, whose ``close`` then ends every process it started, by pid
and process group (never by name), and removes the scratch directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from node import devcluster as cl
from node.devcluster_restore import clean_backups, restore_local_cluster
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient

CANDIDATE = '"new": "candidate"'  # raft_role_changed to candidate, one per election a server started
LEADER = '"new": "leader"'


@dataclass(frozen=True)
class Heartbeat:
    """The [scheduler] heartbeat settings the servers run with (seconds, and beats a second)."""

    min_ttl: float = 10.0
    max_per_second: float = 1000.0
    grace: float = 5.0
    failover_ttl: float = 30.0

    @property
    def monitor_pass(self) -> float:
        """How often the leader's heartbeat monitor looks for expired nodes (``node.leader.heartbeat``'s interval)."""
        return max(0.05, min(1.0, self.min_ttl / 4))

    def toml(self) -> str:
        return ("[scheduler]\n"
                f'min_heartbeat_ttl = "{self.min_ttl:g}s"\n'
                f"max_heartbeats_per_second = {self.max_per_second:g}\n"
                f'heartbeat_grace = "{self.grace:g}s"\n'
                f'failover_heartbeat_ttl = "{self.failover_ttl:g}s"\n')


@dataclass
class Fleet:
    """One fleet process and the file its heartbeats are noted in."""

    name: str
    first: int
    count: int
    proc: subprocess.Popen[bytes]
    events: Path

    def lines(self) -> list[dict[str, Any]]:
        try:
            text = self.events.read_text()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # the last line, cut by the kill
        return out

    def registered(self) -> bool:
        return any(e.get("event") == "registered" for e in self.lines())


class Bench:
    """Everything the run started; ``close`` ends all of it (also after a failure or Ctrl-C)."""

    def __init__(self, keep: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="caravan-failover-"))
        self.keep = keep
        self.cluster: cl.Cluster | None = None
        self.fleets: list[Fleet] = []

    # -- servers ------------------------------------------------------------------
    def up(self, heartbeat: Heartbeat, snapshot: str, timeout: float) -> dict[str, Any]:
        """Start three servers and seed them with ``snapshot``; the restore's info."""
        try:
            self.cluster = cl.up(str(self.dir / "cluster"), 3, extra_config=heartbeat.toml(), timeout=60)
        except BaseException:
            try:
                self.cluster = cl.Cluster.load(str(self.dir / "cluster"))  # what it started, for ``close`` to stop
            except (cl.ClusterError, OSError, ValueError):
                pass
            raise
        try:
            info = restore_local_cluster(snapshot, self.cluster.dir, timeout=timeout)
        finally:
            self.cluster = cl.Cluster.load(self.cluster.dir)  # new pids, whatever happened
        clean_backups(info["backups"])
        return info

    @property
    def addresses(self) -> list[str]:
        assert self.cluster is not None
        return self.cluster.rpc_addresses

    def server(self, address: str) -> cl.ClusterNode:
        assert self.cluster is not None
        return self.cluster.node(address)

    def leader(self, timeout: float = 60.0) -> cl.ClusterNode:
        return self.server(cl.wait_for_leader(self.addresses, timeout)["Leader"])

    def kill(self, node: cl.ClusterNode) -> float:
        """SIGKILL one server; the wall time of the kill."""
        assert self.cluster is not None
        at = time.time()
        cl.kill(self.cluster, node.id)
        return at

    def start(self, node: cl.ClusterNode) -> float:
        """Start a stopped server again (not waiting for it); the wall time it was started."""
        assert self.cluster is not None
        at = time.time()
        cl.start_node(node)
        self.cluster.save()
        return at

    def candidates(self) -> dict[str, int]:
        """Elections each server has started so far (its log's transitions to candidate)."""
        assert self.cluster is not None
        out = {}
        for node in self.cluster.nodes:
            try:
                out[node.id] = Path(node.log_file).read_text(errors="replace").count(CANDIDATE)
            except OSError:
                out[node.id] = 0
        return out

    def leader_changes(self, since: float) -> list[float]:
        """Wall times (after ``since``) at which any server became leader, from the servers' logs.

        A new leader holds every live node for the failover TTL, so the last
        of these moves the time by which lost nodes must be down.
        """
        assert self.cluster is not None
        out = []
        for node in self.cluster.nodes:
            try:
                text = Path(node.log_file).read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if LEADER in line and "raft_role_changed" in line:
                    try:
                        stamp = json.loads(line)["timestamp"]
                    except (ValueError, KeyError):
                        continue
                    at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                    if at > since:
                        out.append(at)
        return sorted(out)

    # -- fleets -------------------------------------------------------------------
    def start_fleet(self, name: str, first: int, count: int, cpu: int, memory: int) -> Fleet:
        events = self.dir / f"fleet-{name}.jsonl"
        events.unlink(missing_ok=True)
        args = [sys.executable, "-m", "tests.bench.failover.fleetproc", "--servers", ",".join(self.addresses),
                "--first", str(first), "--count", str(count), "--cpu", str(cpu), "--memory", str(memory),
                "--events", str(events)]
        with open(self.dir / f"fleet-{name}.log", "ab") as out:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(cl.REPO_ROOT))
        fleet = Fleet(name, first, count, proc, events)
        self.fleets.append(fleet)
        return fleet

    def kill_fleet(self, fleet: Fleet) -> float:
        """SIGKILL the fleet's process group at once; the wall time of the kill."""
        at = time.time()
        _signal_group(fleet.proc.pid, signal.SIGKILL)
        fleet.proc.wait(10)
        return at

    # -- the end --------------------------------------------------------------------
    def close(self, failed: bool) -> None:
        for fleet in self.fleets:
            _signal_group(fleet.proc.pid, signal.SIGKILL)
            try:
                fleet.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if self.cluster is not None:
            pids = [n.pid for n in self.cluster.nodes]
            try:
                cl.down(self.cluster)
            finally:
                for pid in pids:
                    _signal_group(pid, signal.SIGKILL)  # whatever outlived the SIGTERM
        if self.keep:
            print(f"logs and data kept in {self.dir}", file=sys.stderr)
        elif failed:  # the logs say what went wrong; the data (GBs at 1M objects) goes
            for data in self.dir.glob("cluster/server*/data"):
                shutil.rmtree(data, ignore_errors=True)
            for snap in self.dir.glob("state.snap"):
                snap.unlink()
            shutil.rmtree(self.dir / "src", ignore_errors=True)
            print(f"servers' and fleets' logs kept in {self.dir} (data removed)", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the session ``pid`` leads (our child started it with ``start_new_session``)."""
    if pid <= 0:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def call(addresses: list[str], method: str, args: dict[str, Any], timeout: float) -> Any:
    """One RPC with the wire client's retries, for at most ``timeout`` seconds."""
    with RPCClient(addresses, timeout=timeout) as client:
        return client.call(method, args)


def status(address: str, timeout: float = 2.0) -> dict[str, Any] | None:
    return cl.status_of(address, timeout)


def settle(bench: Bench, timeout: float) -> cl.ClusterNode:
    """Wait until there is a leader, every server answers and each has applied what the leader had committed.

    Each figure starts from a quiet, whole cluster, not from the tail of the
    previous one (a follower still catching up would slow the next election).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            leader = bench.leader(timeout=max(1.0, deadline - time.monotonic()))
            target = int((status(leader.rpc_addr) or {}).get("CommitIndex", 0))
            behind = [a for a in bench.addresses if int((status(a) or {}).get("AppliedIndex", -1)) < target]
            if target and not behind:
                return leader
        except (cl.ClusterError, RPCError):
            behind = bench.addresses
        if time.monotonic() > deadline:
            raise cl.ClusterError(f"cluster did not settle within {timeout:g}s (behind: {', '.join(behind)})")
        time.sleep(0.2)


def wait_for(what: str, ok: Any, timeout: float, every: float = 0.1) -> float:
    """Poll ``ok()`` until it is true; the seconds it took. Raises TimeoutError naming ``what``."""
    t0 = time.monotonic()
    while not ok():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        time.sleep(every)
    return time.monotonic() - t0


def applied_index(bench: Bench) -> int:
    """The leader's applied index (raft entries written so far)."""
    return int(call([bench.leader().rpc_addr], "status", {}, 5)["AppliedIndex"])


def term(bench: Bench) -> int:
    """The current raft term as any server reports it (each election attempt raises it)."""
    return max(int((status(a) or {}).get("Term") or 0) for a in bench.addresses)


def broker_quiet(bench: Bench) -> bool:
    """Whether the leader's eval broker has nothing ready, in flight or waiting (blocked evals may stay)."""
    try:
        counts = call([bench.leader(10).rpc_addr], "scheduler.stats", {}, 10).get("Broker") or {}
    except (cl.ClusterError, RPCError):
        return False
    return not any(counts.get(k) for k in ("Ready", "Unacked", "Waiting"))
