"""Seeding stopped servers from a snapshot file, and restoring a local cluster.

Why seeding, not a restore through the log: pysyncobj has no way to replace
a running cluster's state through its log, and a raft index must never go
backwards under the FSM's exactly-once rule. So a restore *seeds* servers
while they are stopped: each server's store is rebuilt from the file
(verified first, swapped in with one rename) and its raft directory gets a
compaction dump at the snapshot's index, so pysyncobj's log resumes at
index + 1 on every server.

``caravan operator snapshot restore FILE --dir DIR`` does this for a local
cluster: stop the servers, keep their old data aside, seed, start, and put
the old data back if anything fails. Across hosts, stop every server and
run ``caravan operator snapshot restore FILE --config CONF`` on each, then
start them.

This sits beside ``node.devcluster`` rather than in it: the store and
snapshot code it needs is no business of the fault-injection harness,
which imports ``node.devcluster`` to start and kill servers.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from fsm.store import StateStore
from node import devcluster as cl
from snapshot import inspect, restore
from snapshot.format import RaftData
from snapshot.writer import write_file

SEED_COMMAND = b"caravan-snapshot-restore"  # log entry payload standing for the snapshot's index


def seed_server(snapshot_path: str, data_dir: str, raft_members: list[str], term: int | None = None) -> dict[str, Any]:
    """Make ``data_dir`` (of a stopped server) start from the snapshot's state.

    The store is restored (verified first; swapped in atomically), and the
    raft directory is replaced by one compaction dump at the snapshot's
    index, so raft resumes numbering after it. Returns the snapshot's info.
    """
    info = inspect(snapshot_path)
    state_dir = os.path.join(data_dir, "state")
    raft_dir = os.path.join(data_dir, "raft")
    os.makedirs(state_dir, exist_ok=True)
    restore(snapshot_path, state_dir, verified=info)
    index = info.index
    term = term or info.term or 1
    shutil.rmtree(raft_dir, ignore_errors=True)
    os.makedirs(raft_dir)
    raft = RaftData(
        last=(SEED_COMMAND, index, term),
        prev=(SEED_COMMAND, max(index - 1, 0), term),
        cluster=sorted(("TCPNode", member) for member in raft_members),
    )
    store = StateStore(state_dir)
    try:
        with store.read() as reader:
            write_file(reader, os.path.join(raft_dir, "raft.dump"), raft=raft, term=term)
    finally:
        store.close()
    return info.to_json()


def restore_local_cluster(snapshot_path: str, directory: str, timeout: float = 60.0) -> dict[str, Any]:
    """Restore a local cluster (``caravan cluster`` layout) from a snapshot file.

    Old data is moved aside first and moved back if seeding or start-up fails,
    so a failed restore leaves the previous state in place.
    """
    info = inspect(snapshot_path)  # refuse a bad file before touching anything
    c = cl.Cluster.load(directory)
    cl.down(c)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved: list[tuple[str, str]] = []
    try:
        for node in c.nodes:
            backup = f"{node.data_dir}.before-restore-{stamp}"
            if os.path.exists(node.data_dir):
                os.replace(node.data_dir, backup)
                moved.append((node.data_dir, backup))
            seed_server(snapshot_path, node.data_dir, [n.raft_addr for n in c.nodes], info.term)
        for node in c.nodes:
            cl.start_node(node)
        c.save()
        cl.wait_for_leader(c.rpc_addresses, timeout)
    except BaseException:
        cl.down(c)
        for data_dir, backup in moved:
            shutil.rmtree(data_dir, ignore_errors=True)
            os.replace(backup, data_dir)
        raise
    return {"index": info.index, "backups": [b for _, b in moved], "info": info.to_json()}


def clean_backups(paths: list[str]) -> None:
    """Remove the pre-restore data directories a successful restore kept aside."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
