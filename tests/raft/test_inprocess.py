"""One-member clusters in the test process: entry size (defect 2), the raft
port (defect 3), membership changes (defect 4), apply failures (defect 5)."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import FAIL_REASON
from structlog.testing import capture_logs

from raft import (
    EntryTooLargeError,
    FatalApplyError,
    MembershipChangeError,
    NodeStoppedError,
    NotLeaderError,
    RaftConfig,
    RaftError,
    RaftNode,
    UnknownOutcomeError,
    encoded_entry_size,
)
from raft.entries import encode_command
from tests.raft.cluster import free_ports, wait_for
from tests.raft.conftest import MemTarget

# -- defect 2: entry size ------------------------------------------------------


def test_oversized_entry_is_refused_at_submit_with_a_clear_error(single_node: Any) -> None:
    node, target = single_node()
    limit = node.max_entry_bytes
    with pytest.raises(EntryTooLargeError) as ei:
        node.submit_sync(b"a" * limit)
    msg = str(ei.value)
    assert "exceeds the limit" in msg and "split" in msg and str(limit) in msg
    # Binary entries cost their length plus pickle framing (protocol 2 used
    # to store each byte >= 0x80 as two); one of the limit's size is refused.
    assert encoded_entry_size(os.urandom(40_000)) <= 40_000 + 32
    blob = os.urandom(limit)
    assert encoded_entry_size(blob) > limit
    with pytest.raises(EntryTooLargeError):
        node.submit(blob, lambda r, i, e: None)
    # The largest entry that fits goes through.
    overhead = encoded_entry_size(b"a" * 1000) - 1000
    fits = b"a" * (limit - overhead)
    assert encoded_entry_size(fits) == limit
    _, index = node.submit_sync(fits)
    assert target.entries[index] == fits


def test_leader_refuses_oversized_commands_that_bypass_submit(single_node: Any) -> None:
    """A command forwarded by a peer enters the leader's queue directly."""
    node, _ = single_node()
    obj = node._obj
    before = node.status()["last_log_index"]
    got: list[Any] = []
    big = b"\x00" + pickle.dumps((obj._func_id, (b"z" * 70_000,)), protocol=2)
    obj._applyCommand(big, lambda r, e: got.append(e))
    assert got == [FAIL_REASON.REQUEST_DENIED]
    membership = b"\x02" + pickle.dumps(["add", "127.0.0.1:1", "127.0.0.1:1"], protocol=2)
    obj._applyCommand(membership, lambda r, e: got.append(e))
    assert got[-1] == FAIL_REASON.REQUEST_DENIED
    node.submit_sync(b"after")
    assert node.status()["last_log_index"] == before + 1  # nothing else entered the log


# -- defect 3: bind address and authentication ------------------------------


class _Payload:
    """Unpickling this creates a directory: proof of code execution."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _frame(obj: Any) -> bytes:
    data = zlib.compress(pickle.dumps(obj, protocol=2), 3)
    return struct.pack("i", len(data)) + data


def _attack(port: int, marker: str, timeout: float = 5.0) -> bytes:
    """Send pysyncobj-framed malicious pickles; return whatever comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_frame(_Payload(marker)) + _frame(["status"]) + _frame("readonly"))
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
        return got


def _listen_addresses(port: int) -> set[str]:
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        ip_hex, port_hex = local.split(":")
        if int(port_hex, 16) == port and state == "0A":
            out.add(socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16))))
    return out


def test_raft_port_binds_the_node_host_only(single_node: Any) -> None:
    node, _ = single_node()
    port = int(node.self_address.rsplit(":", 1)[1])
    assert _listen_addresses(port) == {"127.0.0.1"}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=2).close()


@pytest.mark.parametrize(
    ("address", "cause"),
    [("192.0.2.1:4648", "the host is not an address of this machine"), (None, "another process holds the port")],
)
def test_a_raft_address_that_cannot_be_bound_fails_at_once_naming_the_cause(
    tmp_path: Path, address: str | None, cause: str
) -> None:
    """pysyncobj would retry the bind each second, silently, until the node's bind timeout."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = address or f"127.0.0.1:{holder.getsockname()[1]}"
        cfg = RaftConfig(self_address=address, peers=[address], data_dir=tmp_path, password="pw")
        with pytest.raises(RaftError, match=f"cannot listen on raft address {address}: .*; {cause}"):
            RaftNode(cfg, MemTarget(), bind_timeout=60)


def test_unauthenticated_peer_gets_nothing_and_changes_nothing(
    single_node: Any, tmp_path: Path
) -> None:
    node, target = single_node()
    port = int(node.self_address.rsplit(":", 1)[1])
    before = node.status()
    marker = str(tmp_path / "pwned")
    with capture_logs() as events:
        assert _attack(port, marker) == b""  # connection dropped, not a byte answered
    assert not os.path.exists(marker)
    assert [(e["event"], e["peer"]) for e in events if e["event"] == "raft_peer_auth_failed"] == [
        ("raft_peer_auth_failed", "127.0.0.1")
    ]
    after = node.status()
    assert (after["role"], after["term"], after["leader"]) == (
        before["role"],
        before["term"],
        before["leader"],
    )
    _, index = node.submit_sync(b"still-working")
    assert target.entries[index] == b"still-working"


def test_a_peer_with_another_password_is_reported_and_no_secret_is_logged(tmp_path: Path) -> None:
    """pysyncobj drops a connection that fails authentication without a word; an
    operator who gave one host the wrong password file must see why it never joins.
    The server that accepts the connection reports it (pysyncobj connects each pair
    from one side only, and the connecting side is never sent a frame to reject)."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(2)]
    passwords = ["first-s3cret", "second-s3cret"]
    nodes = []
    with capture_logs() as events:
        try:
            for i, addr in enumerate(addrs):
                cfg = RaftConfig(self_address=addr, peers=addrs, data_dir=tmp_path / f"n{i}", password=passwords[i])
                nodes.append(RaftNode(cfg, MemTarget()))

            def reports() -> list[dict[str, Any]]:
                return [e for e in events if e["event"] == "raft_peer_auth_failed"]

            wait_for(reports, 15, "the accepting server to report the other")
            assert not any(n.is_leader for n in nodes)  # two of two votes needed, none granted
        finally:
            for n in nodes:
                n.destroy()
    (first, *_) = reports()
    assert first["node_id"] in addrs and first["peer"] == "127.0.0.1" and first["reason"] == "bad tag"
    assert not any(pw in repr(e) for e in events for pw in passwords)


def test_the_same_attack_runs_code_on_unguarded_pysyncobj(tmp_path: Path) -> None:
    """Control experiment: what the guard prevents is real."""
    port = free_ports(1)[0]
    raw = SyncObj(f"127.0.0.1:{port}", [], SyncObjConf(bindAddress=f"127.0.0.1:{port}"))
    try:
        raw.waitBinded()
        marker = str(tmp_path / "pwned")
        _attack(port, marker, timeout=0.5)
        wait_for(lambda: os.path.exists(marker), 5, "payload to run in raw pysyncobj")
    finally:
        raw.destroy()


# -- defect 4: membership changes -------------------------------------------


def test_membership_changes_are_refused_when_disabled(single_node: Any) -> None:
    node, _ = single_node()
    with pytest.raises(MembershipChangeError, match="disabled"):
        node.add_peer("127.0.0.1:1")


def test_second_membership_change_is_refused_while_first_is_uncommitted(single_node: Any) -> None:
    node, _ = single_node(dynamic_membership=True)
    # Adding an unreachable peer makes the quorum 2 of 2: the change cannot commit.
    # Check-quorum (raft/quorum.py) would depose the leader an election timeout
    # later; keep it leading, so the second change meets the guard, not that.
    node._obj.check_quorum = lambda: None
    with pytest.raises(UnknownOutcomeError):
        node.add_peer("127.0.0.1:1", timeout=0.5)
    with pytest.raises(MembershipChangeError, match="another change is still uncommitted"):
        node.add_peer("127.0.0.1:2", timeout=2)
    assert {p["address"] for p in node.status()["peers"]} == {"127.0.0.1:1"}


def test_unguarded_pysyncobj_accepts_concurrent_membership_changes(tmp_path: Path) -> None:
    """Control experiment for defect 4: pysyncobj's own guard is never set."""
    port = free_ports(1)[0]
    raw = SyncObj(f"127.0.0.1:{port}", [], SyncObjConf(dynamicMembershipChange=True))
    try:
        wait_for(lambda: raw._isLeader() and raw.raftLastApplied >= 2, 10, "raw node to lead")
        raw.addNodeToCluster("127.0.0.1:1")
        wait_for(lambda: len(raw.otherNodes) == 1, 5, "first change")
        raw.addNodeToCluster("127.0.0.1:2")
        wait_for(
            lambda: len(raw.otherNodes) == 2,
            5,
            "second change accepted while the first is uncommitted",
        )
    finally:
        raw.destroy()


# -- defect 5: a failing apply target ---------------------------------------


def test_apply_failure_halts_the_node_instead_of_wedging(single_node: Any) -> None:
    fatal: list[BaseException] = []
    node, target = single_node(MemTarget(fail_on=b"BOOM"), on_fatal=fatal.append)
    node.submit_sync(b"ok-1")
    done = threading.Event()
    node.submit(b"BOOM", lambda r, i, e: done.set())
    wait_for(lambda: fatal, 10, "the fatal handler")
    assert isinstance(fatal[0], FatalApplyError)
    wait_for(lambda: node.status()["halted"], 5, "node to halt")
    with pytest.raises((NodeStoppedError, NotLeaderError)):
        node.submit_sync(b"after", timeout=1)
    assert b"BOOM" not in target.entries.values()


# -- snapshot hooks --------------------------------------------------------------


class PendingTarget(MemTarget):
    """Tracks whether applied entries are still uncommitted."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = False

    def apply(self, index: int, entry: bytes) -> object:
        self.pending = True
        return super().apply(index, entry)

    def commit(self) -> None:
        self.pending = False
        super().commit()


def test_snapshot_hooks_see_a_committed_store_and_restore_on_restart(
    single_node: Any, tmp_path: Path
) -> None:
    seen: list[tuple[bool, int]] = []
    target = PendingTarget()

    def serializer(file_name: str, raft_data: Any) -> None:
        seen.append((target.pending, target.applied_index))
        with open(file_name, "wb") as f:
            pickle.dump(raft_data, f)

    loaded: list[Any] = []

    def deserializer(file_name: str) -> Any:
        with open(file_name, "rb") as f:
            data = pickle.load(f)
        loaded.append(data)
        return data

    node, _ = single_node(target, serializer=serializer, deserializer=deserializer)
    for i in range(20):
        node.submit(b"e%d" % i, None)
    node.submit_sync(b"last")
    node._obj.forceLogCompaction()
    wait_for(lambda: seen and os.path.exists(node.config.dump_file), 10, "a snapshot")
    assert seen[0][0] is False, "serializer ran with uncommitted applied entries"
    assert seen[0][1] >= 20
    wait_for(lambda: node.status()["first_log_index"] > 1, 10, "the journal to be compacted")
    cfg = node.config
    node.destroy()
    again = RaftNode(cfg, PendingTarget())
    try:
        wait_for(lambda: loaded, 10, "the deserializer at restart")
        assert (
            loaded[0][0][1] >= 20
        )  # (last applied entry, previous entry, cluster): its raft index
    finally:
        again.destroy()


def test_serialize_checker_decides_when_the_journal_is_compacted(single_node: Any) -> None:
    """A background serializer returns at once; pysyncobj must keep the
    journal until the checker reports SUCCESS (and survive a checker bug)."""
    state = {"value": 0, "polls": 0, "raise": False}
    started: list[Any] = []

    def serializer(file_name: str, raft_data: Any) -> None:
        started.append(raft_data)
        state["value"] = 1  # SERIALIZING: "the writer thread runs"

    def checker() -> int:
        state["polls"] += 1
        if state["raise"]:
            raise RuntimeError("checker bug")
        value = state["value"]
        if value in (2, 3):
            state["value"] = 0  # SUCCESS/FAILED are reported once
        return value

    def deserializer(file_name: str) -> Any:
        with open(file_name, "rb") as f:
            return pickle.load(f)

    node, _ = single_node(
        serializer=serializer, deserializer=deserializer, serialize_checker=checker
    )
    assert node._obj._SyncObj__conf.serializeChecker is not None
    for i in range(20):
        node.submit(b"e%d" % i, None)
    node.submit_sync(b"last")
    node._obj.forceLogCompaction()
    wait_for(lambda: started, 10, "the serializer to start a dump")
    polls = state["polls"]
    wait_for(lambda: state["polls"] > polls + 20, 10, "the checker to be polled")
    assert node.status()["first_log_index"] == 1, "journal compacted before the dump finished"

    # A checker that raises must not break the tick: writes still commit.
    state["raise"] = True
    polls = state["polls"]
    wait_for(lambda: state["polls"] > polls + 5, 10, "the raising checker to be polled")
    node.submit_sync(b"while the checker fails")
    assert node.status()["first_log_index"] == 1
    state["raise"] = False

    with open(node.config.dump_file, "wb") as f:
        pickle.dump(started[-1], f)
    state["value"] = 2  # SUCCESS: the background write finished
    wait_for(lambda: node.status()["first_log_index"] > 1, 10, "the journal to be compacted")


# -- leadership callbacks, transfer and lost quorum (three nodes, one process) --


def test_leadership_callbacks_follow_a_transfer_and_lost_quorum_gives_unknown_outcome(
    tmp_path: Path,
) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    events: dict[str, list[bool]] = {a: [] for a in addrs}
    nodes: dict[str, RaftNode] = {}
    try:
        for a in addrs:
            cfg = RaftConfig(
                self_address=a, peers=addrs, data_dir=tmp_path / a.replace(":", "_"), password="pw"
            )
            nodes[a] = RaftNode(cfg, MemTarget(), on_leadership=lambda v, a=a: events[a].append(v))
        leader = wait_for(
            lambda: next((a for a, n in nodes.items() if n.status()["leader_ready"]), None),
            15,
            "leader",
        )
        wait_for(lambda: events[leader] == [True], 5, "on_leadership(True) on the leader")
        assert all(events[a] == [] for a in addrs if a != leader)
        target = next(a for a in addrs if a != leader)
        nodes[leader].transfer_leadership(target, timeout=10)
        wait_for(
            lambda: events[target] == [True] and events[leader] == [True, False],
            10,
            "callbacks after transfer",
        )
        with pytest.raises(NotLeaderError) as ei:
            nodes[leader].submit(b"x")
        assert ei.value.leader_address == target
        # Lose the quorum: the new leader cannot commit; the outcome is unknown.
        for a in addrs:
            if a != target:
                nodes.pop(a).destroy()
        with pytest.raises(UnknownOutcomeError):
            nodes[target].submit_sync(b"no-quorum", timeout=0.5)
    finally:
        for n in nodes.values():
            n.destroy()


def test_a_leader_cut_off_from_its_quorum_steps_down_and_answers_its_writes(
    tmp_path: Path,
) -> None:
    """Check-quorum (raft/quorum.py): within about an election timeout, not pysyncobj's 2.5 s fallback."""
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    nodes: dict[str, RaftNode] = {}
    try:
        for a in addrs:
            cfg = RaftConfig(
                self_address=a, peers=addrs, data_dir=tmp_path / a.replace(":", "_"), password="pw"
            )
            nodes[a] = RaftNode(cfg, MemTarget())
        leader = wait_for(
            lambda: next((a for a, n in nodes.items() if n.status()["leader_ready"]), None),
            15,
            "leader",
        )
        node = nodes.pop(leader)
        for other in list(nodes):
            nodes.pop(other).destroy()
        nodes[leader] = node
        answered = threading.Event()
        errors: list[Any] = []

        def done(_result: Any, _index: Any, error: Any) -> None:
            errors.append(error)
            answered.set()

        cut = time.monotonic()
        try:
            node.submit(b"cannot-commit", done)
        except NotLeaderError:  # a slow machine: the lease ran out while the others stopped
            answered.set()
            errors.append(UnknownOutcomeError("stepped down before the submit"))
        assert answered.wait(5.0), "the cut-off leader never answered its write"
        waited = time.monotonic() - cut
        assert isinstance(errors[0], UnknownOutcomeError)
        assert waited < 1.5, f"answered only after {waited:.2f}s"
        assert not node.is_leader
        assert node.status()["check_quorum"]["check_quorum_step_downs"] == 1
        wait_for(lambda: node.quorum_contact_lost, 3, "quorum contact to count as lost")
    finally:
        for n in nodes.values():
            n.destroy()


# -- a busy leader ships new commands before it applies ------------------------


class _SeesTheLog(MemTarget):
    """Notes the leader's last log index as each entry is applied; ``zero``'s apply waits for a release."""

    def __init__(self) -> None:
        super().__init__()
        self.node: RaftNode | None = None
        self.last_index_at_apply: dict[bytes, int] = {}
        self.in_zero = threading.Event()
        self.release = threading.Event()

    def apply(self, index: int, entry: bytes) -> object:
        assert self.node is not None
        self.last_index_at_apply[entry] = self.node._obj._SyncObj__raftLog[-1][1]
        if entry == b"zero":
            self.in_zero.set()
            self.release.wait(10)
        return super().apply(index, entry)


def test_a_leader_ships_the_commands_queued_before_its_tick_ahead_of_that_ticks_apply(
    single_node: Any,
) -> None:
    """``take_commands_early`` (raft/commands.py): a write queued while the leader's tick applies
    an earlier one is in the log before the next tick applies anything, so its replication
    overlaps that apply instead of waiting for it (issue #34)."""
    target = _SeesTheLog()
    node, _ = single_node(target)
    target.node = node
    obj = node._obj
    state = {"armed": True}

    def at_tick_end() -> None:
        # The tick that appended "first" (after its apply) ends: queue "late" now, before the next tick.
        if state["armed"] and b"first" in obj._SyncObj__raftLog[-1][0]:
            state["armed"] = False
            obj.submit_command(encode_command(obj.func_id, b"late"), None)

    obj.addOnTickCallback(at_tick_end)
    node.submit(b"zero")
    assert target.in_zero.wait(10)
    node.submit(b"first")  # queued while "zero" applies: appended by that tick's own intake, after it
    target.release.set()
    wait_for(lambda: b"late" in target.entries.values(), 10, "the late write to be applied")
    first = next(i for i, e in target.entries.items() if e == b"first")
    # "late" went into the log (index first + 1) before "first" was applied.
    assert target.last_index_at_apply[b"first"] == first + 1
    assert target.entries[first + 1] == b"late"
