"""Reads of committed state: one cut off by a snapshot restore is answered ``unavailable``
(retryable), not an internal error; a point read (served on the RPC loop) stays bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import lmdb
import pytest

from fsm import messages as m
from fsm.machine import FSM
from node.core.acl import Need
from node.core.config import ServerConfig
from node.core.context import RequestContext
from node.core.hub import Hub
from node.core.reads import read_committed
from node.endpoints.registry import PREFIX_MATCH_LIMIT, by_prefix
from node.server import Server
from node.wire.errors import BAD_REQUEST, UNAVAILABLE, RPCError
from tests.fsm.support import Harness
from tests.lifecycle.support import node


@pytest.fixture
def h():
    harness = Harness.temp()
    yield harness
    harness.destroy()


def test_a_read_cut_off_by_a_store_swap_is_unavailable(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("n1")))

    def read_across_a_restore(r):
        h.fsm.reopen()  # what a snapshot restore does under open reads
        return r.node("n1")

    with pytest.raises(RPCError) as err:
        read_committed(h.fsm, read_across_a_restore)
    assert err.value.code == UNAVAILABLE and "snapshot" in err.value.message
    # Reads after the swap see the store again.
    assert read_committed(h.fsm, lambda r: r.node("n1")).id == "n1"


def test_other_storage_errors_are_not_disguised(h: Harness) -> None:
    def broken(r):
        raise lmdb.Error("disk on fire")

    with pytest.raises(lmdb.Error):
        read_committed(h.fsm, broken)


def test_a_prefix_lookup_reads_a_bounded_number_of_objects(h: Harness) -> None:
    """Short ids, as Nomad's CLI takes them. The lookup is served on the RPC loop, so however
    short the prefix it decodes at most PREFIX_MATCH_LIMIT + 1 objects."""
    for i in range(PREFIX_MATCH_LIMIT + 5):
        h.ok(m.NodeRegister(node=node(f"abc{i:03d}-node")))
    asked: list[int | None] = []

    def lookup(ident: str) -> Any:
        def scan(r: Any, prefix: str, limit: int | None = None) -> list[Any]:
            asked.append(limit)
            return r.nodes(prefix, limit)

        return read_committed(h.fsm, lambda r: by_prefix(r.node, lambda p, n: scan(r, p, n), ident))

    assert lookup("abc007-node").id == "abc007-node" and asked == []  # an exact id: no scan
    assert lookup("abc024").id == "abc024-node"
    assert lookup("zzz") is None
    with pytest.raises(RPCError) as err:
        lookup("abc00")  # abc000-node .. abc009-node
    assert err.value.code == BAD_REQUEST
    assert "matches 10 objects (abc000-node, abc001-node" in err.value.message
    with pytest.raises(RPCError) as err:
        lookup("abc")
    assert f"matches more than {PREFIX_MATCH_LIMIT} objects; give more characters" in err.value.message
    assert set(asked) == {PREFIX_MATCH_LIMIT + 1}


def _server(tmp_path: Any) -> Server:
    """A real Server over a temporary store; its raft node and RPC port are never started."""
    return Server(
        ServerConfig.from_dict(
            {
                "node_id": "s1",
                "data_dir": str(tmp_path / "data"),
                "raft_password": "pw-0123456789abcdef",
                "server": [{"id": "s1", "rpc_addr": "127.0.0.1:4647", "raft_addr": "127.0.0.1:4648"}],
            }
        )
    )


def _cut_off_reads(fsm: FSM, monkeypatch: Any) -> None:
    """The next read begins as a snapshot restore swaps the store, as a restore does under open reads."""
    real_read = fsm.store.read

    def read_across_a_restore() -> Any:
        fsm.reopen()
        return real_read()

    monkeypatch.setattr(fsm.store, "read", read_across_a_restore)


@pytest.mark.parametrize("bootstrapped", [False, True])
def test_a_token_check_cut_off_by_a_store_swap_is_unavailable(tmp_path: Any, monkeypatch: Any, bootstrapped: bool) -> None:
    """Campaign 661:3, seed 661: an ``event.stream`` checked its token while a snapshot
    was restored, and the store's "closed/deleted/dropped object" came back as an internal
    error with a traceback in the log. The token check reads the store as every read does."""
    server = _server(tmp_path)
    try:
        if bootstrapped:
            server._acls_on = True  # the bootstrap is already known: the token read is the one cut off
        ctx = RequestContext("r1", "event.stream", "some-token", "peer", None, server.log, None)
        _cut_off_reads(server.fsm, monkeypatch)
        with pytest.raises(RPCError) as err:
            asyncio.run(server.authorize(ctx, Need.READ))
        assert err.value.code == UNAVAILABLE and "snapshot" in err.value.message
        monkeypatch.undo()
        if not bootstrapped:  # the store is back: no ACLs yet, so nothing to check
            asyncio.run(server.authorize(ctx, Need.READ))
    finally:
        server.fsm.close()
        server.executor.shutdown()


def test_a_digest_cut_off_by_a_store_swap_is_unavailable(tmp_path: Any, monkeypatch: Any) -> None:
    """``debug.digest`` reads the store the same way (and answered an internal error the same way)."""
    server = _server(tmp_path)
    try:
        _cut_off_reads(server.fsm, monkeypatch)
        with pytest.raises(RPCError) as err:
            server.fsm_digest()
        assert err.value.code == UNAVAILABLE
        monkeypatch.undo()
        digest, index = server.fsm_digest()
        assert index == 0 and digest
    finally:
        server.fsm.close()
        server.executor.shutdown()


def test_a_journal_read_cut_off_by_a_store_swap_is_unavailable(h: Harness, monkeypatch: Any) -> None:
    """The journal hub's reads (a subscriber catching up, the fan-out pump) go the same way:
    a catching-up ``event.stream`` got an internal error for a restore under its read."""
    h.ok(m.NodeRegister(node=node("n1")))

    async def catch_up(cut_off: bool) -> Any:
        hub = Hub(h.fsm, asyncio.get_running_loop())
        if cut_off:
            _cut_off_reads(h.fsm, monkeypatch)
        return await hub.read(0)

    with pytest.raises(RPCError) as err:
        asyncio.run(catch_up(cut_off=True))
    assert err.value.code == UNAVAILABLE
    monkeypatch.undo()
    assert asyncio.run(catch_up(cut_off=False)).batches, "the store is back: the journal reads again"
