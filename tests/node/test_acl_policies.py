"""ACL policies: rules parsing, what policies grant, and the method table, allow and deny for every row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fsm import messages as m
from fsm.structs import ACLNamespaceRule, ACLPolicy, Node
from node import endpoints  # noqa: F401 - registers every RPC method
from node.core import acl
from node.core.acl import METHOD_NEEDS, Need
from node.core.acl_rules import BUILTIN_POLICIES, Grants, PolicyRulesError, parse_rules
from node.endpoints.registry import METHODS, STREAMS
from node.wire.errors import RPCError
from tests.fsm.support import Harness, make_node, make_token

HCL = '''
namespace "default" {
  policy       = "read"
  capabilities = ["submit-job"]
}
namespace "batch-*" { policy = "write" }
node { policy = "read" }
operator { policy = "write" }
'''
JSON = ('{"namespace": {"default": {"policy": "read", "capabilities": ["submit-job"]}, "batch-*": {"policy": "write"}},'
        ' "node": {"policy": "read"}, "operator": {"policy": "write"}}')

#: Methods that check no capability from the table: open ones, and those that check their own.
NOT_IN_TABLE = {"status", "acl.bootstrap", "acl.token.self", "event.stream"}


def test_hcl_and_json_rules_parse_to_the_same_policy() -> None:
    hcl, js = parse_rules("p", "d", HCL), parse_rules("p", "d", JSON)
    assert hcl.namespaces == js.namespaces and (hcl.node, hcl.agent, hcl.operator) == ("read", "", "write")
    assert (js.node, js.agent, js.operator) == ("read", "", "write")
    assert hcl.namespaces[0] == ACLNamespaceRule(name="default", policy="read", capabilities=["submit-job"])
    assert hcl.rules == HCL


@pytest.mark.parametrize(("rules", "says"), [
    ("", "no rules"),
    ('namespace "default" { policy = "admin" }', "policy must be one of"),
    ('namespace "default" { capabilities = ["launch-rockets"] }', "unknown capabilities launch-rockets"),
    ('node { policy = "list" }', "node policy must be one of"),
    ('namespace { policy = "read" }', "needs one name"),
    ('keyring { policy = "read" }', "unknown rule block"),
    ('namespace "default" {', "invalid HCL"),
    ('{"node": [1]}', "must be an object"),
])
def test_bad_rules_are_one_line_errors_that_name_the_fix(rules: str, says: str) -> None:
    with pytest.raises(PolicyRulesError) as err:
        parse_rules("p", "", rules)
    assert says in str(err.value) and "\n" not in str(err.value)


def _grants(*rules: str) -> Grants:
    return Grants.of(parse_rules(f"p{i}", "", text) for i, text in enumerate(rules))


CAPABILITY_CASES = [
    # (rules, need, allowed)
    ('namespace "default" { policy = "read" }', Need.READ_JOB, True),
    ('namespace "default" { policy = "read" }', Need.LIST_JOBS, True),
    ('namespace "default" { policy = "read" }', Need.SUBMIT_JOB, False),
    ('namespace "default" { policy = "read" }', Need.READ_LOGS, False),
    ('namespace "default" { policy = "write" }', Need.SUBMIT_JOB, True),
    ('namespace "default" { policy = "write" }', Need.DISPATCH_JOB, True),
    ('namespace "default" { policy = "write" }', Need.READ_LOGS, True),
    ('namespace "default" { policy = "write" }', Need.ALLOC_LIFECYCLE, True),
    ('namespace "default" { capabilities = ["dispatch-job"] }', Need.DISPATCH_JOB, True),
    ('namespace "default" { capabilities = ["dispatch-job"] }', Need.SUBMIT_JOB, False),
    ('namespace "default" { capabilities = ["read-logs"] }', Need.READ_LOGS, True),
    ('namespace "default" { capabilities = ["alloc-lifecycle"] }', Need.ALLOC_LIFECYCLE, True),
    ('namespace "default" { capabilities = ["list-jobs"] }', Need.READ_JOB, False),
    ('namespace "default" { policy = "deny" }', Need.READ_JOB, False),
    ('namespace "default" { policy = "write" capabilities = ["deny"] }', Need.SUBMIT_JOB, False),
    ('namespace "*" { policy = "read" }', Need.READ_JOB, True),
    ('namespace "def*" { policy = "read" }', Need.READ_JOB, True),
    ('namespace "prod" { policy = "write" }', Need.READ_JOB, False),
    ('node { policy = "read" }', Need.NODE_READ, True),
    ('node { policy = "read" }', Need.NODE_WRITE, False),
    ('node { policy = "write" }', Need.NODE_READ, True),
    ('node { policy = "deny" }', Need.NODE_READ, False),
    ('agent { policy = "read" }', Need.AGENT_READ, True),
    ('agent { policy = "read" }', Need.AGENT_WRITE, False),
    ('agent { policy = "write" }', Need.AGENT_WRITE, True),
    ('operator { policy = "read" }', Need.OPERATOR_READ, True),
    ('operator { policy = "read" }', Need.OPERATOR_WRITE, False),
    ('operator { policy = "write" }', Need.OPERATOR_WRITE, True),
    ('namespace "default" { policy = "write" }', Need.NODE_READ, False),
]


@pytest.mark.parametrize(("rules", "need", "allowed"), CAPABILITY_CASES)
def test_each_capability_is_granted_only_by_the_rules_that_name_it(rules: str, need: Need, allowed: bool) -> None:
    grants = _grants(rules)
    scope, name = need.value
    got = grants.allows_namespace("default", name) if scope == "namespace" else grants.allows_level(scope, name)
    assert got is allowed


def test_policies_merge_and_a_deny_anywhere_wins() -> None:
    merged = _grants('namespace "default" { policy = "read" }', 'namespace "default" { capabilities = ["submit-job"] }')
    assert merged.allows_namespace("default", "submit-job") and merged.allows_namespace("default", "read-job")
    denied = _grants('namespace "default" { policy = "write" }', 'namespace "default" { policy = "deny" }')
    assert not denied.allows_namespace("default", "read-job")
    assert not _grants('node { policy = "write" }', 'node { policy = "deny" }').allows_level("node", "read")
    assert _grants('node { policy = "read" }', 'node { policy = "write" }').allows_level("node", "write")


def test_the_exact_namespace_rule_wins_over_a_glob() -> None:
    grants = _grants('namespace "*" { policy = "write" }\nnamespace "default" { policy = "read" }')
    assert grants.allows_namespace("default", "read-job") and not grants.allows_namespace("default", "submit-job")
    assert grants.allows_namespace("other", "submit-job")


def test_every_row_of_the_method_table_is_a_registered_method_and_every_method_has_a_row() -> None:
    registered = set(METHODS) | set(STREAMS)
    assert set(METHOD_NEEDS) <= registered, set(METHOD_NEEDS) - registered
    assert registered - set(METHOD_NEEDS) == NOT_IN_TABLE


# -- authorize, against a real state --------------------------------------------------
@pytest.fixture(scope="module")
def state() -> Iterator[Harness]:
    """ACLs bootstrapped; one policy per capability of the table, one token per policy, a legacy read token."""
    h = Harness.temp()
    h.ok(m.ACLTokenBootstrap(token=make_token("root", "root-secret", type="management")))
    policies = [ACLPolicy(name="nothing", node="deny")]
    for need in set(METHOD_NEEDS.values()) - {Need.MANAGEMENT}:
        scope, name = need.value
        policy = ACLPolicy(name=_policy_name(need))
        if scope == "namespace":
            policy.namespaces = [ACLNamespaceRule(name="default", capabilities=[name])]
        else:
            setattr(policy, scope, name)
        policies.append(policy)
    h.ok(m.ACLPolicyUpsert(policies=policies))
    h.ok(m.ACLTokenUpsert(tokens=[make_token(p.name, f"secret-{p.name}", policies=[p.name]) for p in policies]))
    h.ok(m.ACLTokenUpsert(tokens=[make_token("legacy-read", "secret-legacy-read", policies=["read"])]))
    node = make_node("n1")
    node.secret_hash = acl.hash_secret("node-secret")
    h.ok(m.NodeRegister(node=node))
    yield h
    h.destroy()


def _policy_name(need: Need) -> str:
    return need.name.lower().replace("_", "-")


def _check(h: Harness, secret: str | None, method: str, need: Need = Need.READ) -> bool:
    with h.reader() as r:
        try:
            acl.authorize(r, secret, need, 0, method)
        except RPCError as err:
            assert err.code == "permission_denied" and "\n" not in err.message
            return False
    return True


@pytest.mark.parametrize("method", sorted(METHOD_NEEDS))
def test_each_method_allows_the_token_with_its_capability_and_denies_the_others(state: Harness, method: str) -> None:
    need = METHOD_NEEDS[method]
    assert _check(state, "root-secret", method), "management bypasses policies"
    assert not _check(state, None, method) and not _check(state, "secret-nothing", method)
    for other in set(METHOD_NEEDS.values()) - {Need.MANAGEMENT}:
        allowed = _check(state, f"secret-{_policy_name(other)}", method)
        implied = other == need or (other.value[0] == need.value[0] != "namespace" and other.value[1] == "write")
        assert allowed is implied, (method, need, other)


def test_a_generic_word_takes_the_methods_row_and_a_capability_stays_itself(state: Harness) -> None:
    assert _check(state, "secret-submit-job", "job.register", Need.WRITE)
    assert not _check(state, "secret-submit-job", "job.get", Need.READ)
    assert _check(state, "secret-node-read", "event.stream", Need.NODE_READ)
    assert _check(state, "secret-node-read", "job.get", Need.NODE_READ)  # a capability is kept as is


def test_legacy_read_tokens_act_as_the_builtin_read_policy(state: Harness) -> None:
    assert _check(state, "secret-legacy-read", "job.get") and _check(state, "secret-legacy-read", "node.list")
    assert not _check(state, "secret-legacy-read", "job.register") and not _check(state, "secret-legacy-read", "system.gc")
    assert BUILTIN_POLICIES["write"].operator == "read"  # operator changes still need management


def test_a_node_secret_reads_what_a_client_needs_and_nothing_else(state: Harness) -> None:
    for method in ("job.get", "job.versions", "alloc.list", "alloc.get", "node.get"):
        assert _check(state, "node-secret", method), method
    for method in ("job.register", "job.list", "node.drain", "acl.token.list", "operator.scheduler.set_config"):
        assert not _check(state, "node-secret", method), method


def test_check_node_secret_refuses_a_wrong_or_missing_secret_in_one_line() -> None:
    node = Node(id="n1", secret_hash=acl.hash_secret("right"))
    acl.check_node_secret(node, "right")
    for wrong in ("wrong", None, ""):
        with pytest.raises(RPCError) as err:
            acl.check_node_secret(node, wrong)
        assert err.value.code == "permission_denied" and "node n1" in err.value.message
        assert "\n" not in err.value.message and "right" not in err.value.message
