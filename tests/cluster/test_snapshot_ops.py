"""Operator snapshots against real clusters: save under load, restore, refuse bad files."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fsm.machine import FSM
from node.wire.errors import RPCError
from snapshot import restore
from tests.cluster.conftest import ClusterHandle, job_spec

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
NO_SCHEDULER = "[scheduler]\nenabled = false\n"


def caravan(*args: str, address: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "CARAVAN_ADDRESS": address}
    env.pop("CARAVAN_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def digest_of_file(path: Path, tmp: Path) -> tuple[str, int]:
    store = tmp / "check-store"
    restore(str(path), str(store))
    fsm = FSM(str(store))
    try:
        return fsm.digest()
    finally:
        fsm.close()


def test_save_under_load_then_restore_into_a_fresh_cluster(cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    source: ClusterHandle = cluster_factory(extra_config=NO_SCHEDULER)
    for i in range(20):
        source.client().call("job.register", {"job": job_spec(f"pre-{i}")})
    stop = threading.Event()
    acked: list[str] = []

    def writer() -> None:
        client = source.client()
        i = 0
        while not stop.is_set():
            client.call("job.register", {"job": job_spec(f"load-{i}")})
            acked.append(f"load-{i}")
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        snap = tmp_path / "live.snap"
        acked_before = len(acked)
        out = caravan("operator", "snapshot", "save", str(snap), address=",".join(source.addresses))
        assert out.returncode == 0, out.stderr
    finally:
        stop.set()
        thread.join(30)
    inspected = caravan("operator", "snapshot", "inspect", str(snap))
    assert inspected.returncode == 0 and "Index" in inspected.stdout and "Total" in inspected.stdout
    expected_digest, expected_index = digest_of_file(snap, tmp_path)

    target: ClusterHandle = cluster_factory(extra_config=NO_SCHEDULER)
    target.client().call("job.register", {"job": job_spec("to-be-replaced")})
    out = caravan("operator", "snapshot", "restore", str(snap), "--dir", target.cluster.dir)
    assert out.returncode == 0, out.stderr
    target.reload()
    digests = target.digests()
    assert {d for d, _ in digests.values()} == {expected_digest}
    assert {i for _, i in digests.values()} == {expected_index}
    jobs = {j["ID"] for j in target.client().call("job.list", {"stale": True})["data"]}
    assert "to-be-replaced" not in jobs
    # Everything acknowledged before the save started is in the snapshot.
    assert {f"pre-{i}" for i in range(20)} | set(acked[:acked_before]) <= jobs
    # The restored cluster keeps working, numbering after the snapshot's index.
    reply = target.client().call("job.register", {"job": job_spec("after-restore")})
    assert reply["Index"] > expected_index


def test_bad_snapshot_is_refused_and_the_cluster_is_untouched(cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    c: ClusterHandle = cluster_factory(extra_config=NO_SCHEDULER)
    c.client().call("job.register", {"job": job_spec("keep")})
    snap = tmp_path / "good.snap"
    assert caravan("operator", "snapshot", "save", str(snap), address=",".join(c.addresses)).returncode == 0
    before = c.digests()
    corrupt = tmp_path / "corrupt.snap"
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0x40
    corrupt.write_bytes(bytes(data))
    truncated = tmp_path / "truncated.snap"
    truncated.write_bytes(snap.read_bytes()[: len(data) // 3])
    for bad in (corrupt, truncated, tmp_path / "missing.snap"):
        out = caravan("operator", "snapshot", "restore", str(bad), "--dir", c.cluster.dir)
        assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
        out = caravan("operator", "snapshot", "inspect", str(bad))
        assert out.returncode != 0 and "Traceback" not in out.stderr
    assert c.digests() == before  # same servers, same state, nothing restarted


def test_snapshot_save_needs_a_management_token(cluster: ClusterHandle) -> None:
    boot = cluster.client().call("acl.bootstrap", {})
    writer = cluster.client(token=boot["SecretID"]).call("acl.token.create", {"policies": ["write"]})["SecretID"]
    leader = cluster.leader()
    with pytest.raises(RPCError) as err:
        list(cluster.client(leader.rpc_addr, token=writer).stream("operator.snapshot.save", {}))
    assert err.value.code == "permission_denied"
    items = list(cluster.client(leader.rpc_addr, token=boot["SecretID"]).stream("operator.snapshot.save", {}))
    assert items[-1]["done"]["Index"] > 0 and any("chunk" in i for i in items)


def test_follower_behind_the_compacted_log_installs_a_snapshot(cluster_factory) -> None:  # noqa: ANN001
    from snapshot import inspect as inspect_file

    c: ClusterHandle = cluster_factory(extra_config="raft_compaction_entries = 200\n" + NO_SCHEDULER)
    follower = c.followers()[0]
    behind = c.client().call("job.register", {"job": job_spec("before-kill")})["Index"]
    c.kill(follower)
    last = 0
    client = c.client()
    for i in range(700):  # several compactions past the follower's log
        last = client.call("job.register", {"job": job_spec(f"while-down-{i}")})["Index"]
    leader = c.leader()
    leader_dump = Path(leader.data_dir) / "raft" / "raft.dump"

    def leader_compacted_past_follower() -> bool:
        return leader_dump.exists() and inspect_file(str(leader_dump)).raft_index > behind + 1

    from tests.conditions import wait_until

    wait_until(leader_compacted_past_follower, 60, "the leader to compact past the follower's log")
    c.restart(follower)
    digests = c.digests(expect_index=last, timeout=90)
    assert len({d for d, _ in digests.values()}) == 1
    follower_dump = Path(follower.data_dir) / "raft" / "raft.dump"
    assert follower_dump.exists() and inspect_file(str(follower_dump)).raft_index > behind
    jobs = {j["ID"] for j in c.client(follower.rpc_addr).call("job.list", {"stale": True})["data"]}
    assert {"before-kill", "while-down-0", "while-down-699"} <= jobs
