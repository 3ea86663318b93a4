"""Point reads (one object by id, or by a short prefix of its id), which are served on the RPC loop."""

from __future__ import annotations

from typing import Any

import pytest

from fsm import messages as m
from node.endpoints import PREFIX_MATCH_LIMIT, by_prefix
from node.errors import BAD_REQUEST, RPCError
from node.server import read_committed
from tests.fsm.support import Harness
from tests.lifecycle.support import node


@pytest.fixture
def h():
    harness = Harness.temp()
    yield harness
    harness.destroy()


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
