"""Live membership through the raft log: replace a dead follower, then a dead leader, under write load.

The replacement is the README's procedure: kill -9 a server, remove it from
the raft configuration, wipe its data dir, and start a fresh server in its
place that joins the cluster. A writer keeps registering jobs throughout;
every write it saw acknowledged must be readable at the end, and every
server's state digest must converge.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from node import devcluster as cl
from node.core.autopilot import choose
from node.core.membership_settings import AutopilotConfig
from node.wire.errors import RPCError
from raft.members import Member
from tests.cluster.conftest import ClusterHandle, job_spec, wait_until

pytestmark = pytest.mark.cluster

# Small compaction threshold: the new server catches up by snapshot install, not by log replay.
EXTRA = 'raft_compaction_entries = 150\n[autopilot]\ncleanup_dead_servers = false\n'


class Writer:
    """Registers jobs one after another; remembers each one a server acknowledged."""

    def __init__(self, c: ClusterHandle) -> None:
        self.c = c
        self.acked: list[str] = []
        self.stop = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            job_id = f"w-{n}"
            n += 1
            try:
                self.c.client(timeout=20.0).call("job.register", {"job": job_spec(job_id)})
                self.acked.append(job_id)
            except (RPCError, OSError):
                self.errors += 1  # outcome unknown: not counted as acknowledged

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def wait_for(self, more: int, timeout: float = 60.0) -> None:
        target = len(self.acked) + more
        wait_until(lambda: len(self.acked) >= target, timeout, f"{more} more acknowledged writes")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    root = Path(cl.__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, cwd=root, timeout=90)


def peers(c: ClusterHandle, address: str) -> list[dict[str, Any]]:
    return c.client(address, timeout=5.0).call("operator.raft.peers", {})


def live_addresses(c: ClusterHandle) -> list[str]:
    return [n.rpc_addr for n in c.cluster.nodes if cl.alive(n.pid)]


def replace(c: ClusterHandle, victim: cl.ClusterNode, *, by_config: bool) -> None:
    """kill -9, remove-peer, wipe, join a fresh server with the same id and addresses.

    ``by_config``: the new server joins by its ``join`` setting at first start; else it
    waits (``join = []``) and is told to join, as ``caravan server join`` does.
    """
    c.kill(victim)
    survivors = live_addresses(c)
    if by_config:
        out = wait_until(
            lambda: c.client(survivors[0], timeout=10.0).call("operator.raft.remove_peer", {"id": victim.id}),
            60, f"{victim.id} removed",
        )
        assert victim.id not in {m["id"] for m in out["Members"]}
    else:  # the operator's way
        done = cli("operator", "raft", "remove-peer", "--id", victim.id, "--address", ",".join(survivors))
        assert done.returncode == 0 and f"Removed peer {victim.id}" in done.stdout, done.stderr
    for address in survivors:  # every survivor's configuration drops it
        wait_until(lambda a=address: victim.id not in {p["ID"] for p in peers(c, a)}, 30, "the removal everywhere")
    cl.prepare_join(c.cluster, victim.id, survivors if by_config else [], EXTRA)
    cl.start_node(victim)
    c.cluster.save()
    cl.wait_serving([victim], 60)
    if not by_config:  # Nomad's 'server join', run against the new server's agent
        done = cli("server", "join", survivors[0], "--address", victim.rpc_addr)
        assert done.returncode == 0 and victim.id in done.stdout, done.stderr
    for address in live_addresses(c):
        wait_until(lambda a=address: victim.id in {p["ID"] for p in peers(c, a)}, 30, "the new member everywhere")
    status = wait_until(
        lambda: (s := c.status(victim.rpc_addr)) and s.get("Role") == "follower" and s.get("Leader") and s,
        60, "the new server following the leader",
    )
    assert status["Member"] is True


def test_replace_a_follower_then_the_leader_under_write_load(cluster_factory: Any) -> None:
    c = cluster_factory(3, extra_config=EXTRA)
    started = time.monotonic()
    with Writer(c) as writer:
        writer.wait_for(200)  # past the compaction threshold: the newcomer needs a snapshot
        follower = c.followers()[0]
        replace(c, follower, by_config=False)
        writer.wait_for(50)
        assert wait_until(lambda: c.status(follower.rpc_addr)["SnapshotInstalls"] >= 1, 30, "a snapshot install")
        leader = c.leader()
        replace(c, leader, by_config=True)
        writer.wait_for(50)
    assert time.monotonic() - started < 240
    acked = set(writer.acked)
    assert len(acked) >= 300  # the load ran through both replacements
    index = max(c.client(a).call("status", {})["AppliedIndex"] for a in live_addresses(c))
    digests = c.digests(expect_index=index, timeout=60)
    assert len({d for d, _ in digests.values()}) == 1, digests
    for address in live_addresses(c):
        present = {j["ID"] for j in c.client(address).call("job.list", {"stale": True, "per_page": 100000})["data"]}
        missing = acked - present
        assert not missing, f"{address} lost {len(missing)} acknowledged writes, e.g. {sorted(missing)[:5]}"
    # A config edit no longer decides membership: every server lists the same three voters.
    ids = {n.id for n in c.cluster.nodes}
    for address in live_addresses(c):
        assert {p["ID"] for p in peers(c, address)} == ids


def _http(address: str, verb: str, path: str) -> Any:
    request = urllib.request.Request(f"http://{address}{path}", method=verb)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_removed_server_does_not_disturb_the_cluster(cluster_factory: Any) -> None:
    c = cluster_factory(3, extra_config=EXTRA)
    leader = c.leader()
    follower = c.followers()[0]
    term = c.status(leader.rpc_addr)["Term"]
    # Nomad's routes: a member is already in a cluster; the removal goes through any server.
    with pytest.raises(urllib.error.HTTPError) as joined:
        _http(leader.http_address, "PUT", f"/v1/agent/join?address={follower.rpc_addr}")
    assert joined.value.code == 400 and b"already a member" in joined.value.read()
    out = _http(follower.http_address, "DELETE", f"/v1/operator/raft/peer?id={follower.id}")
    assert follower.id not in {m["id"] for m in out["Members"]}
    # Still running, no longer a member: it must neither campaign nor forward writes to a leader.
    wait_until(lambda: c.status(follower.rpc_addr)["Member"] is False, 30, "the removed server to notice")
    for i in range(20):
        c.client(leader.rpc_addr).call("job.register", {"job": job_spec(f"after-{i}")})
    assert c.status(leader.rpc_addr)["Role"] == "leader"
    assert c.status(leader.rpc_addr)["Term"] == term
    with pytest.raises(RPCError):
        c.client(follower.rpc_addr, timeout=3.0).call("job.register", {"job": job_spec("via-removed")})


def test_autopilot_removes_a_dead_server(cluster_factory: Any) -> None:
    c = cluster_factory(3, extra_config='[autopilot]\ndead_server_time = "2s"\n')
    leader = c.leader()
    dead, alive = c.followers()
    c.kill(dead)
    wait_until(lambda: dead.id not in {p["ID"] for p in peers(c, leader.rpc_addr)}, 30, "autopilot's removal")
    assert {p["ID"] for p in peers(c, leader.rpc_addr)} == {leader.id, alive.id}
    line = "autopilot removed a dead server"
    wait_until(lambda: line in Path(leader.log_file).read_text(), 10, "autopilot's log line")
    assert Path(leader.log_file).read_text().count(line) == 1
    c.client(leader.rpc_addr).call("job.register", {"job": job_spec("after-cleanup")})


def _status(peers_silent: dict[str, float]) -> dict[str, Any]:
    return {"self": "L", "role": "leader", "peers": [{"address": a, "last_contact": s} for a, s in peers_silent.items()]}


def _members(*addrs: str) -> list[Member]:
    return [Member(a, a, "") for a in addrs]


def test_autopilot_rule_keeps_a_quorum_of_the_original_size() -> None:
    settings = AutopilotConfig(dead_server_time=10.0)
    # 3 of 3: one dead -> removed (2 left, the quorum of 3).
    victim, _ = choose(_status({"a": 11.0, "b": 0.1}), _members("L", "a", "b"), settings, 3)
    assert victim is not None and victim.raft_addr == "a"
    # 2 left of an original 3: never below 2.
    victim, why = choose(_status({"b": 30.0}), _members("L", "b"), settings, 3)
    assert victim is None and "not a majority" in why
    # 5: two dead -> the longest silent goes first; at 3 voters (quorum of 5) it stops.
    five = _members("L", "a", "b", "c", "d")
    victim, _ = choose(_status({"a": 12.0, "b": 40.0, "c": 0.1, "d": 0.2}), five, settings, 5)
    assert victim is not None and victim.raft_addr == "b"
    victim, why = choose(_status({"a": 12.0, "c": 0.1}), _members("L", "a", "c"), settings, 5)
    assert victim is None and "floor of 3" in why
    # Not dead long enough: kept, silently.
    assert choose(_status({"a": 9.0, "b": 0.1}), _members("L", "a", "b"), settings, 3) == (None, "")
    # min_quorum overrides the bootstrap quorum.
    victim, why = choose(_status({"a": 11.0, "b": 0.1}), _members("L", "a", "b"), AutopilotConfig(dead_server_time=10.0, min_quorum=3), 3)
    assert victim is None and "floor of 3" in why


def test_config_join_and_autopilot_settings() -> None:
    from node.core.config import ConfigError, ServerConfig

    base = (
        'node_id = "s2"\ndata_dir = "/tmp/x"\nraft_password = "0123456789abcdef0"\n'
        '[[server]]\nid = "s2"\nrpc_addr = "127.0.0.1:4001"\nraft_addr = "127.0.0.1:4002"\n'
    )
    assert ServerConfig.loads(base).join is None
    cfg = ServerConfig.loads('join = ["127.0.0.1:5001"]\n' + base.replace("[[server]]", '[autopilot]\ndead_server_time = "30s"\nmin_quorum = 3\n[[server]]'))
    assert cfg.join == ("127.0.0.1:5001",)
    assert cfg.autopilot.dead_server_time == 30.0 and cfg.autopilot.min_quorum == 3
    assert cfg.raft_config().dynamic_membership is True
    assert ServerConfig.loads("join = []\n" + base).join == ()
    with pytest.raises(ConfigError, match="join must be a list"):
        ServerConfig.loads('join = "127.0.0.1:5001"\n' + base)
    with pytest.raises(ConfigError, match="unknown key 'dead_time' in \\[autopilot\\]"):
        ServerConfig.loads(base.replace("[[server]]", "[autopilot]\ndead_time = 1\n[[server]]"))
