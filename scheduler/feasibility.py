"""Feasibility: validation rules that a node must pass to host a task group.

Each rule is a small object with a ``name`` and ``check(node, ask, ctx)``
that returns ``None`` (feasible) or a short reason. Rules are a list, in the
order they run (cheap, static ones first), so a new rule (fault-domain
spread, hardware generation, quota) is one more class, not a rewrite — the
way Protean's allocator composes its policy.

*Static* rules depend only on the node and the job, so the selector checks
them once per task group per node. *Dynamic* rules depend on what is already
placed (resources, distinct hosts) and are re-checked as the plan grows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from fsm.structs import (
    DEVICE_DIMENSION,
    NODE_ELIGIBLE,
    NODE_READY,
    Constraint,
    Job,
    Node,
    Resources,
    TaskGroup,
)

DISTINCT_HOSTS = "distinct_hosts"
EXHAUSTED = "resources exhausted: "  # ResourcesFit's reasons start so; the dimension ("cpu", "device nvidia/gpu") follows


@dataclass(frozen=True)
class Ask:
    """What one allocation of a task group asks of a node."""

    job_id: str
    group: str
    resources: Resources
    drivers: tuple[str, ...]
    constraints: tuple[Constraint, ...]
    datacenters: tuple[str, ...]
    distinct_hosts: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.job_id, self.group)


def group_resources(group: TaskGroup) -> Resources:
    """The sum of the group's task resources: what one allocation claims."""
    return Resources.total(task.resources for task in group.tasks)


def ask_for(job: Job, group: TaskGroup) -> Ask:
    constraints = tuple(job.constraints) + tuple(group.constraints)
    distinct = any(c.operand == DISTINCT_HOSTS for c in constraints)
    return Ask(
        job_id=job.id,
        group=group.name,
        resources=group_resources(group),
        drivers=tuple(sorted({t.driver for t in group.tasks})),
        constraints=tuple(c for c in constraints if c.operand != DISTINCT_HOSTS),
        datacenters=tuple(job.datacenters),
        distinct_hosts=distinct,
    )


@dataclass
class PlacementContext:
    """What dynamic rules need: per-node usage and this job's allocs, as the plan grows.

    ``base`` (optional) is usage shared with others — the leader's placement
    index — that must never change: a node's entry is copied into ``usage``
    the first time it is asked for, so a plan's claims change only the copy,
    and an evaluation copies only the nodes it looks at instead of all of them.
    """

    usage: dict[str, Resources]
    job_allocs: Counter[str] = field(default_factory=Counter)  # node id -> live allocs of the job
    cluster_load: dict[str, float] = field(default_factory=dict)  # cluster -> used share of its capacity (0..1)
    base: Mapping[str, Resources] | None = None

    def peek(self, node_id: str) -> Resources | None:
        """The node's usage as this plan has it, to read only (None: nothing in use).

        What ``used`` would return, without copying the shared entry or making a
        zero record for a node the plan never changes: rules read every node's
        usage while ranking (30,000 of them), and a record per node was most of
        what reading cost.
        """
        found = self.usage.get(node_id)
        if found is None and self.base is not None:
            found = self.base.get(node_id)
        return found

    def used(self, node_id: str) -> Resources:
        """The node's usage as this plan has it (a record of this context's own: safe to change)."""
        found = self.usage.get(node_id)
        if found is None:
            shared = self.base.get(node_id) if self.base is not None else None
            found = self.usage[node_id] = shared.copy() if shared is not None else Resources.zero()
        return found


class ValidationRule:
    """A hard filter. ``dynamic`` rules are re-checked as placements accumulate."""

    name = "rule"
    dynamic = False

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        raise NotImplementedError


class NodeReady(ValidationRule):
    name = "node-status"

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        return None if node.status == NODE_READY else f"node {node.status}"


class NodeEligible(ValidationRule):
    name = "node-eligibility"

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        if node.drain:
            return "node draining"
        if node.scheduling_eligibility != NODE_ELIGIBLE:
            return "node ineligible"
        return None


class InDatacenter(ValidationRule):
    name = "datacenter"

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        for pattern in ask.datacenters:
            if pattern == "*" or pattern == node.datacenter or ("*" in pattern and _glob(pattern, node.datacenter)):
                return None
        return "missing datacenter"


class HasDrivers(ValidationRule):
    name = "drivers"

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        for driver in ask.drivers:
            if node.attributes.get(f"driver.{driver}", "") in ("", "0", "false"):
                return f"missing driver {driver}"
        return None


class Constraints(ValidationRule):
    name = "constraints"

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        for c in ask.constraints:
            if not constraint_met(c, node):
                return f"constraint {c.l_target} {c.operand} {c.r_target}".rstrip()
        return None


class DistinctHosts(ValidationRule):
    name = "distinct-hosts"
    dynamic = True

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        if ask.distinct_hosts and ctx.job_allocs.get(node.id, 0) > 0:
            return "distinct_hosts: node already runs this job"
        return None


class ResourcesFit(ValidationRule):
    name = "resources"
    dynamic = True

    def check(self, node: Node, ask: Ask, ctx: PlacementContext) -> str | None:
        dim = ask.resources.exhausted(node.resources, ctx.peek(node.id))
        return None if dim is None else EXHAUSTED + dim


# The order they run in: static and cheap first.
VALIDATION_RULES: tuple[ValidationRule, ...] = (
    NodeReady(),
    NodeEligible(),
    InDatacenter(),
    HasDrivers(),
    Constraints(),
    DistinctHosts(),
    ResourcesFit(),
)
STATIC_RULES = tuple(r for r in VALIDATION_RULES if not r.dynamic)
DYNAMIC_RULES = tuple(r for r in VALIDATION_RULES if r.dynamic)


def check_static(node: Node, ask: Ask, ctx: PlacementContext, rules: tuple[ValidationRule, ...] = STATIC_RULES) -> str | None:
    for rule in rules:
        reason = rule.check(node, ask, ctx)
        if reason is not None:
            return reason
    return None


def check_dynamic(node: Node, ask: Ask, ctx: PlacementContext, rules: tuple[ValidationRule, ...] = DYNAMIC_RULES) -> str | None:
    return check_static(node, ask, ctx, rules)


def larger_than_any_node(ask: Ask, nodes: list[Node]) -> str | None:
    """Why ``ask`` fits no node even when empty (None if some node is big enough)."""
    dims = [ask.resources.exhausted(n.resources) for n in nodes]
    if not nodes or any(d is None for d in dims):
        return None
    return Counter(d for d in dims if d).most_common(1)[0][0]


# -- constraints -------------------------------------------------------------------
_TARGET = re.compile(r"^\$\{(.+)\}$")


def resolve_target(target: str, node: Node) -> str | None:
    """A constraint side: ``${attr.x}``, ``${meta.x}``, ``${node.datacenter|class|unique.id|unique.name}``, or a literal."""
    match = _TARGET.match(target.strip())
    if match is None:
        return target
    name = match.group(1)
    if name.startswith("attr."):
        return node.attributes.get(name[5:])
    if name.startswith("meta.") or name.startswith("node.meta."):
        key = name.split("meta.", 1)[1]
        return node.attributes.get(f"meta.{key}")
    return {
        "node.datacenter": node.datacenter,
        "node.class": node.node_class,
        "node.unique.id": node.id,
        "node.unique.name": node.name,
    }.get(name)


def _num(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _compare(left: str, right: str, op: str) -> bool:
    a, b = _num(left), _num(right)
    if a is not None and b is not None:
        pair: tuple = (a, b)
    else:
        pair = (left, right)
    if op == "<":
        return pair[0] < pair[1]
    if op == "<=":
        return pair[0] <= pair[1]
    if op == ">":
        return pair[0] > pair[1]
    return pair[0] >= pair[1]


def _glob(pattern: str, value: str) -> bool:
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), value) is not None


def constraint_met(c: Constraint, node: Node) -> bool:
    """Nomad's constraint operands over node attributes (unknown operands never match)."""
    op = c.operand or "="
    left = resolve_target(c.l_target, node)
    if op == "is_set":
        return left is not None
    if op == "is_not_set":
        return left is None
    right = resolve_target(c.r_target, node)
    if left is None or right is None:
        return False
    if op in ("=", "==", "is"):
        return left == right
    if op in ("!=", "not"):
        return left != right
    if op in ("<", "<=", ">", ">="):
        return _compare(left, right, op)
    if op == "regexp":
        try:
            return re.search(right, left) is not None
        except re.error:
            return False
    if op == "set_contains":
        have = {s.strip() for s in left.split(",")}
        return all(s.strip() in have for s in right.split(","))
    if op == "set_contains_any":
        have = {s.strip() for s in left.split(",")}
        return any(s.strip() in have for s in right.split(","))
    return False


# -- failure explanations -----------------------------------------------------------
@dataclass
class PlacementFailure:
    """Why a task group could not be (fully) placed: Nomad's AllocMetric, summarised."""

    unplaced: int = 0
    nodes_evaluated: int = 0
    filtered: Counter[str] = field(default_factory=Counter)  # reason -> nodes
    exhausted: Counter[str] = field(default_factory=Counter)  # dimension -> nodes
    too_big: str = ""  # set when the ask exceeds every node even when empty

    def describe(self) -> str:
        parts = [f"{self.unplaced} allocation{'s' if self.unplaced != 1 else ''} unplaced"]
        if self.too_big:
            parts.append(self.too_big)
        if self.nodes_evaluated == 0:
            parts.append("no nodes registered")
        else:
            parts.append(f"{self.nodes_evaluated} node{'s' if self.nodes_evaluated != 1 else ''} evaluated")
        for reason, n in sorted(self.filtered.items(), key=lambda kv: (-kv[1], kv[0])):
            parts.append(f"{reason}: {n} node{'s' if n != 1 else ''}")
        for dim, n in sorted(self.exhausted.items(), key=lambda kv: (-kv[1], kv[0])):
            parts.append(f"resources exhausted ({dim}): {n} node{'s' if n != 1 else ''}")
        return "; ".join(parts)

    def count(self, reason: str, nodes: int = 1) -> None:
        """Count ``nodes`` nodes filtered for ``reason`` (a rule's answer), by kind."""
        if reason.startswith(EXHAUSTED):
            self.exhausted[reason[len(EXHAUSTED):]] += nodes
        else:
            self.filtered[reason] += nodes

    def ask_too_big(self, ask: Ask, dim: str) -> None:
        """Say that ``ask`` exceeds every node in ``dim``, even an empty one."""
        r = ask.resources
        if dim.startswith(DEVICE_DIMENSION):
            asked = str(r.devices.get(dim[len(DEVICE_DIMENSION):], 0))
        else:
            asked = {"cpu": f"{r.cpu} MHz", "memory": f"{r.memory_mb} MB", "disk": f"{r.disk_mb} MB"}[dim]
        self.too_big = f"asks more {dim} ({asked}) than any node has"


def explain(
    nodes: list[Node], ask: Ask, ctx: PlacementContext, unplaced: int, rules: tuple[ValidationRule, ...] = VALIDATION_RULES
) -> PlacementFailure:
    """Run every rule on every node to say why ``ask`` fits nowhere (the failure path, without a
    ranking to read it from: ``scheduler.ranking.Selector.failure`` keeps these counts per trait)."""
    failure = PlacementFailure(unplaced=unplaced, nodes_evaluated=len(nodes))
    for node in nodes:
        reason = check_static(node, ask, ctx, rules)
        if reason is not None:
            failure.count(reason)
    too_big = larger_than_any_node(ask, nodes)
    if too_big is not None:
        failure.ask_too_big(ask, too_big)
    return failure
