"""Apply of ACL policies and node secrets: replicated, journaled without secrets, kept in snapshots."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsm import codec
from fsm import messages as m
from fsm.structs import ACLNamespaceRule, ACLPolicy
from snapshot import restore, save
from tests.fsm.support import Harness, make_node, make_token


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


def _policy(name: str = "readers") -> ACLPolicy:
    return ACLPolicy(name=name, rules='namespace "default" { policy = "read" }',
                     namespaces=[ACLNamespaceRule(name="default", policy="read")])


def test_a_policy_is_stored_stamped_journaled_and_deleted(h: Harness) -> None:
    h.ok(m.ACLPolicyUpsert(policies=[_policy()]))
    with h.reader() as r:
        stored = r.acl_policy("readers")
        assert stored is not None and stored.create_index == stored.modify_index == h.index
        assert [p.name for p in r.acl_policies()] == ["readers"]
    h.ok(m.ACLPolicyUpsert(policies=[_policy()]))
    with h.reader() as r:
        again = r.acl_policy("readers")
        assert again is not None and again.create_index == stored.create_index < again.modify_index
    h.ok(m.ACLPolicyDelete(names=["readers"]))
    with h.reader() as r:
        assert r.acl_policy("readers") is None
    assert h.apply(m.ACLPolicyDelete(names=["readers"])).code == "not_found"


@pytest.mark.parametrize("policy", [
    ACLPolicy(name="read"),  # the built-in name of older tokens
    ACLPolicy(name="has space"),
    ACLPolicy(name="p", node="sudo"),
    ACLPolicy(name="p", namespaces=[ACLNamespaceRule(name="default", policy="admin")]),
])
def test_a_policy_apply_cannot_store_is_rejected(h: Harness, policy: ACLPolicy) -> None:
    result = h.apply(m.ACLPolicyUpsert(policies=[policy]))
    assert not result.ok and result.code == "bad_request" and "\n" not in result.error


def test_tokens_name_existing_or_builtin_policies_only(h: Harness) -> None:
    assert h.apply(m.ACLTokenUpsert(tokens=[make_token("t1", policies=["ghost"])])).code == "bad_request"
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t2", policies=["read", "write"])]))  # older tokens' words
    h.ok(m.ACLPolicyUpsert(policies=[_policy()]))
    h.ok(m.ACLTokenUpsert(tokens=[make_token("t3", policies=["readers"])]))
    h.ok(m.ACLPolicyDelete(names=["readers"]))  # the token keeps the name, as in Nomad
    with h.reader() as r:
        assert r.token("t3").policies == ["readers"]


def test_a_nodes_secret_is_set_once_and_never_journaled(h: Harness) -> None:
    node = make_node("n1")
    node.secret_hash = _hash("right")
    h.ok(m.NodeRegister(node=node))
    with h.reader() as r:
        assert r.node("n1").secret_hash == _hash("right") and r.node_secret_known(_hash("right"))
    wrong = make_node("n1")
    wrong.secret_hash = _hash("wrong")
    result = h.apply(m.NodeRegister(node=wrong))
    assert result.code == "permission_denied" and "wrong node secret" in result.error
    h.ok(m.NodeRegister(node=make_node("n1")))  # a legacy re-registration keeps the secret
    with h.reader() as r:
        assert r.node("n1").secret_hash == _hash("right") and not r.node_secret_known(_hash("wrong"))
    with h.reader() as r:
        raw = b"".join(v for _, v in r.iter_raw("journal"))
    assert _hash("right").encode() not in raw and b"right" not in raw
    h.ok(m.NodeUpdateStatus(node_id="n1", status="down"))
    h.ok(m.NodeReap(nodes=[m.Reap("n1", h.index)]))
    with h.reader() as r:
        assert r.node("n1") is None and not r.node_secret_known(_hash("right"))


def test_policies_and_node_secrets_survive_a_snapshot(h: Harness, tmp_path: Path) -> None:
    h.ok(m.ACLPolicyUpsert(policies=[_policy("a"), _policy("b")]))
    node = make_node("n1")
    node.secret_hash = _hash("s")
    h.ok(m.NodeRegister(node=node))
    digest = h.fsm.digest()
    with h.reader() as r:
        before = codec.to_wire(r.acl_policy("a"))
    path = str(tmp_path / "s.snap")
    save(h.fsm, path)
    other = Harness.temp()
    try:
        restore(path, other.fsm)
        assert other.fsm.digest() == digest
        with other.reader() as r:
            assert [p.name for p in r.acl_policies()] == ["a", "b"] and r.node_secret_known(_hash("s"))
            assert codec.to_wire(r.acl_policy("a")) == before
    finally:
        other.destroy()
