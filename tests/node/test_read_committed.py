"""A read cut off by a snapshot restore is answered ``unavailable`` (retryable), not an internal error."""

from __future__ import annotations

import lmdb
import pytest

from fsm import messages as m
from node.errors import UNAVAILABLE, RPCError
from node.server import read_committed
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
