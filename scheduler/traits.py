"""Trait rankings: the feasible nodes for one kind of request, in classes of equal score.

Protean caches rule state and sorted machine lists per request *trait*: most
requests repeat an earlier one's shape, so the work of filtering and sorting
30,000 machines is done once and then kept current. A ``TraitRanking`` is
that cache entry for one trait (``trait_key``: the ask's resources,
constraints, datacenters, drivers, distinct_hosts, and the policy's rules):

- every node that passes all validation rules (in the policy's order) at the
  source's usage is a *candidate*, in the class of its score tuple under the
  node-level preference rules (per-request and cluster-level rules are left
  to the selector, which knows the request and the plan's cluster loads),
  per cluster when the policy ranks clusters;
- each class is sorted by the nodes' fixed tiebreak hashes, so that a
  per-evaluation random rotation (``scheduler.ranking``) orders its members
  at random without touching them;
- every other node keeps the first rule it fails, counted per reason, and
  whether the ask exceeds it even empty: what ``eval status`` explains,
  without scanning the nodes again.

Nothing in a ranking depends on its history: ``rescore`` puts a node where
the source's current state puts it, so a ranking brought forward by
rescoring the nodes changed since its index equals one built from scratch at
the same index (tests/lifecycle/test_placement_cache.py checks it for any
sequence of changes). ``FreshSource`` builds rankings from a snapshot's nodes
and usage; ``scheduler.index.PlacementIndex`` keeps them from the journal.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fsm.structs import NODE_ELIGIBLE, NODE_READY, Node, Resources
from scheduler.feasibility import Ask, PlacementContext, ValidationRule, check_static
from scheduler.preferences import PreferenceRule, Request, cluster_of

Members = list[tuple[int, str]]  # (tiebreak hash, node id), sorted
ClassId = tuple[str, tuple[int, ...]]  # (cluster, or "" when not ranked per cluster; score tuple)
DIMENSIONS = ("cpu", "memory", "disk")  # the order Resources.exhausted checks them in (then "device NAME")


def dimension_order(dim: str) -> int:
    """Where ``dim`` comes in ``Resources.exhausted``'s order (devices, "device NAME", come last)."""
    return DIMENSIONS.index(dim) if dim in DIMENSIONS else len(DIMENSIONS)


def node_hash(node_id: str) -> int:
    """A node's fixed 64-bit tiebreak hash: the same in every process and every evaluation."""
    return int.from_bytes(hashlib.blake2b(node_id.encode(), digest_size=8).digest(), "big")


def usable(node: Node) -> bool:
    """Whether the node takes new work: what counts toward its cluster's capacity and load."""
    return node.status == NODE_READY and not node.drain and node.scheduling_eligibility == NODE_ELIGIBLE


def trait_key(ask: Ask, validation: tuple[ValidationRule, ...], rules: tuple[PreferenceRule, ...], by_cluster: bool) -> tuple:
    """What makes two asks rank the nodes alike: not the job, only what the rules read of the ask.

    Rules are named by name and bucket count (a rule's only parameter).
    """
    r = ask.resources
    return (
        (r.cpu, r.memory_mb, r.disk_mb, tuple(sorted(r.devices.items())) if r.devices else ()),
        tuple((c.l_target, c.operand, c.r_target) for c in ask.constraints),
        tuple(ask.datacenters),
        tuple(ask.drivers),
        ask.distinct_hosts,
        tuple(rule.name for rule in validation),
        tuple((rule.name, getattr(rule, "buckets", 0)) for rule in rules),
        by_cluster,
    )


class NodeSource(Protocol):
    """Nodes and their usage at one index, which rankings are built from."""

    nodes: Mapping[str, Node]

    def tiebreak_hash(self, node_id: str) -> int: ...

    def base_context(self) -> PlacementContext:
        """A context over the source's usage, no job allocs: what a ranking scores with."""


class TraitRanking:
    """The candidates for one trait, in score classes; the rest with the reason they fail."""

    def __init__(self, ask: Ask, validation: tuple[ValidationRule, ...], rules: tuple[PreferenceRule, ...], by_cluster: bool) -> None:
        self.ask = ask
        self.validation = validation
        self.rules = rules  # node-level rules only (no per-request, no cluster-level ones)
        self.by_cluster = by_cluster
        self.index = -1  # the journal index it reflects (-1: a fresh build, no index)
        self.classes: dict[ClassId, Members] = {}
        self.where: dict[str, tuple[ClassId, int]] = {}  # candidate -> (its class, its hash)
        self.reason: dict[str, str] = {}  # other node -> the first rule it fails
        self.reasons: Counter[str] = Counter()
        self.too_big: dict[str, str] = {}  # node the ask exceeds even empty -> the dimension
        self.too_big_dims: Counter[str] = Counter()
        self._request = Request(ask)

    def build(self, src: NodeSource) -> int:
        """Rank every node of ``src`` from scratch; returns how many were scored."""
        for part in (self.classes, self.where, self.reason, self.reasons, self.too_big, self.too_big_dims):
            part.clear()
        for node_id in src.nodes:
            self._place(src, node_id, sort=False)
        for members in self.classes.values():
            members.sort()  # once, rather than an insertion per member into an ever longer list
        return len(src.nodes)

    def rescore(self, src: NodeSource, node_ids: Iterable[str]) -> int:
        """Put each of ``node_ids`` where ``src`` now ranks it (gone from ``src``: forgotten)."""
        n = 0
        for node_id in node_ids:
            self._forget(node_id)
            self._place(src, node_id)
            n += 1
        return n

    def too_big_dim(self, nodes: int) -> str | None:
        """The dimension in which the ask exceeds all ``nodes`` nodes even when empty (None if one fits)."""
        if not nodes or len(self.too_big) < nodes:
            return None
        # Ties: the first in exhausted's order, then by name (max keeps the first of equals).
        return max(sorted(self.too_big_dims), key=lambda d: (self.too_big_dims[d], -dimension_order(d)))

    def signature(self) -> tuple[Any, ...]:
        """Everything the ranking holds, as plain sorted data (tests compare cached and fresh ones)."""
        return (
            sorted((cid, list(m)) for cid, m in self.classes.items()),
            sorted(self.reason.items()),
            sorted(self.too_big.items()),
        )

    # -- internals ------------------------------------------------------------------
    def _forget(self, node_id: str) -> None:
        placed = self.where.pop(node_id, None)
        if placed is not None:
            cid, h = placed
            members = self.classes[cid]
            del members[bisect_left(members, (h, node_id))]
            if not members:
                del self.classes[cid]
        reason = self.reason.pop(node_id, None)
        if reason is not None:
            _uncount(self.reasons, reason)
        dim = self.too_big.pop(node_id, None)
        if dim is not None:
            _uncount(self.too_big_dims, dim)

    def _place(self, src: NodeSource, node_id: str, sort: bool = True) -> None:
        node = src.nodes.get(node_id)
        if node is None:
            return
        ask = self.ask
        dim = ask.resources.exhausted(node.resources)
        if dim is not None:
            self.too_big[node_id] = dim
            self.too_big_dims[dim] += 1
        ctx = src.base_context()
        reason = check_static(node, ask, ctx, self.validation)
        if reason is not None:
            self.reason[node_id] = reason
            self.reasons[reason] += 1
            return
        key = tuple(rule.score(node, ask, ctx, self._request) for rule in self.rules)
        cid = (cluster_of(node) if self.by_cluster else "", key)
        h = src.tiebreak_hash(node_id)
        members = self.classes.setdefault(cid, [])
        if sort:
            insort(members, (h, node_id))
        else:
            members.append((h, node_id))
        self.where[node_id] = (cid, h)


def _uncount(counter: Counter[str], item: str) -> None:
    counter[item] -= 1
    if counter[item] <= 0:
        del counter[item]


@dataclass
class ClusterTotal:
    """Capacity and usage of a cluster's usable nodes: its load for PreferEmptierClusters."""

    capacity: Resources = field(default_factory=Resources.zero)
    used: Resources = field(default_factory=Resources.zero)
    nodes: int = 0

    def load(self) -> float:
        """Used share of the capacity, 0..1 (mean of cpu and memory, as BestFit's utilization)."""
        return Resources.zero().utilization(self.capacity, self.used)

    def copy(self) -> ClusterTotal:
        return ClusterTotal(self.capacity.copy(), self.used.copy(), self.nodes)


def cluster_totals(nodes: Mapping[str, Node], usage: Mapping[str, Resources]) -> dict[str, ClusterTotal]:
    """Per cluster, the capacity and usage of its usable nodes (a full pass; the index keeps them)."""
    out: dict[str, ClusterTotal] = {}
    for node_id, node in nodes.items():
        if not usable(node):
            continue
        total = out.setdefault(cluster_of(node), ClusterTotal())
        total.nodes += 1
        total.capacity.add(node.resources)
        used = usage.get(node_id)
        if used is not None:
            total.used.add(used)
    return out


@dataclass
class PlacementStats:
    """Per placement: whether its ranking came from a cache (hit) or was built (miss), and how many
    nodes were scored for it (brought forward or built, plus those the plan changed)."""

    placements: int = 0
    hits: int = 0
    misses: int = 0
    rescored_hit: int = 0
    rescored_miss: int = 0

    def record(self, hit: bool, rescored: int) -> None:
        self.placements += 1
        if hit:
            self.hits += 1
            self.rescored_hit += rescored
        else:
            self.misses += 1
            self.rescored_miss += rescored

    def add(self, other: PlacementStats) -> None:
        self.placements += other.placements
        self.hits += other.hits
        self.misses += other.misses
        self.rescored_hit += other.rescored_hit
        self.rescored_miss += other.rescored_miss


class RankingSource(NodeSource, Protocol):
    """Where a selector gets its rankings: built fresh, or from the leader's journal-fed index."""

    def ranking(
        self, ask: Ask, validation: tuple[ValidationRule, ...], rules: tuple[PreferenceRule, ...], by_cluster: bool
    ) -> tuple[TraitRanking, bool, int]:
        """The ranking for ``ask``'s trait at the source's index: (it, cache hit, nodes scored)."""

    def cluster_totals(self) -> dict[str, ClusterTotal]:
        """Per cluster, capacity and usage of its usable nodes (shared: copy before changing)."""


class FreshSource:
    """Rankings built from scratch from one snapshot's nodes and usage (no cache, no index).

    Rankings of the same trait within one evaluation are built once.
    """

    def __init__(self, nodes: Mapping[str, Node], usage: Mapping[str, Resources]) -> None:
        self.nodes = nodes
        self.usage = usage
        self._ctx = PlacementContext(usage={}, base=usage)
        self._hashes: dict[str, int] = {}
        self._built: dict[tuple, TraitRanking] = {}
        self._totals: dict[str, ClusterTotal] | None = None

    def tiebreak_hash(self, node_id: str) -> int:
        h = self._hashes.get(node_id)
        if h is None:
            h = self._hashes[node_id] = node_hash(node_id)
        return h

    def base_context(self) -> PlacementContext:
        return self._ctx

    def ranking(
        self, ask: Ask, validation: tuple[ValidationRule, ...], rules: tuple[PreferenceRule, ...], by_cluster: bool
    ) -> tuple[TraitRanking, bool, int]:
        key = trait_key(ask, validation, rules, by_cluster)
        found = self._built.get(key)
        if found is not None:
            return found, False, 0
        ranking = self._built[key] = TraitRanking(ask, validation, rules, by_cluster)
        return ranking, False, ranking.build(self)

    def cluster_totals(self) -> dict[str, ClusterTotal]:
        if self._totals is None:
            self._totals = cluster_totals(self.nodes, self.usage)
        return self._totals
