"""Ranking: preference rules in strict priority, and the node selector.

A preference rule scores a feasible node with a small integer (higher is
better). Rules combine in **strict priority** — the score is a tuple compared
lexicographically, which is Protean's exponentially growing weights — so a
later rule only breaks ties left by the earlier ones. A continuous score
(BestFit) is **quantized into a few buckets**; otherwise it would break every
tie and the later rules would never matter. Remaining ties go to a random
order fixed per evaluation.

The selector keeps one max-heap of candidate nodes per task group. Placing
an alloc changes only the chosen node's scores (usage, this job's count), so
it pushes that node's new key and drops stale entries lazily: a plan of P
placements over N nodes costs O(N + P log N) rule evaluations instead of
O(P * N).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from fsm.structs import Node, Resources
from scheduler.feasibility import (
    Ask,
    PlacementContext,
    PlacementFailure,
    check_dynamic,
    check_static,
    explain,
)

DEFAULT_BUCKETS = 3  # Protean's production choice


class PreferenceRule:
    """A soft preference: ``score`` returns an int, higher is better."""

    name = "preference"
    per_request = False  # depends on the placement request, not only on node and job

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class Request:
    """One placement to make; ``previous_node`` is set for a rescheduled alloc."""

    ask: Ask
    previous_node: str = ""


class AvoidPreviousNode(PreferenceRule):
    """A rescheduled alloc prefers any other node than the one it failed on (Nomad's penalty)."""

    name = "avoid-previous-node"
    per_request = True

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return 0 if request.previous_node and node.id == request.previous_node else 1


class BestFit(PreferenceRule):
    """Pack tightly: utilization after placement, quantized into ``buckets`` (Protean's BestFit)."""

    name = "best-fit"

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        self.buckets = max(1, buckets)

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return bucket(ask.resources.utilization(node.resources, ctx.used(node.id)), self.buckets)


class JobAntiAffinity(PreferenceRule):
    """Among equally packed nodes, spread one job's allocs (Nomad's job anti-affinity)."""

    name = "job-anti-affinity"

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return -ctx.job_allocs.get(node.id, 0)


class PreferNonEmptyMachines(PreferenceRule):
    """Keep empty machines empty: a node already running something scores higher (Protean)."""

    name = "prefer-non-empty-machines"

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        used = ctx.used(node.id)
        return 1 if used.cpu > 0 or used.memory_mb > 0 or used.disk_mb > 0 else 0


class PreferEmptierClusters(PreferenceRule):
    """Balance clusters: a node in a less loaded cluster scores higher, quantized (Protean).

    The load of each cluster (0..1) comes from ``ctx.cluster_load``, which
    whoever builds the context keeps (the two-level selector does).
    """

    name = "prefer-emptier-clusters"

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        self.buckets = max(1, buckets)

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        load = ctx.cluster_load.get(node.attributes.get("meta.cluster", ""), 0.0)
        return bucket(1.0 - load, self.buckets)


PREFERENCE_RULES: tuple[PreferenceRule, ...] = (AvoidPreviousNode(), BestFit(), JobAntiAffinity())


def bucket(value: float, buckets: int) -> int:
    """Quantize 0..1 into 0..buckets-1."""
    return min(buckets - 1, max(0, int(value * buckets)))


def rank_key(node: Node, request: Request, ctx: PlacementContext, rules: tuple[PreferenceRule, ...], tiebreak: float) -> tuple:
    """The node's strict-priority score for ``request``: compare tuples, higher wins."""
    return tuple(rule.score(node, request.ask, ctx, request) for rule in rules) + (tiebreak,)


@dataclass
class _GroupHeap:
    nodes: set[str]  # statically feasible node ids
    heap: list[tuple] = field(default_factory=list)  # (negated key, version, node id)
    dead: set[str] = field(default_factory=set)  # dynamically infeasible for this ask (plans only shrink)
    exhausted: bool = False


class Selector:
    """Chooses nodes for placements, tracking usage as the plan grows.

    Not thread-safe; one per scheduling run. ``rng`` breaks ties (seed it
    with the eval id for reproducible plans).
    """

    def __init__(
        self,
        nodes: list[Node],
        ctx: PlacementContext,
        *,
        rng: random.Random | None = None,
        rules: tuple[PreferenceRule, ...] = PREFERENCE_RULES,
        top_k: int = 1,
    ) -> None:
        self.nodes = sorted(nodes, key=lambda n: n.id)
        self.top_k = max(1, top_k)
        self.by_id = {n.id: n for n in self.nodes}
        self.ctx = ctx
        self.rules = rules
        self.node_rules = tuple(r for r in rules if not r.per_request)
        rng = rng or random.Random(0)
        self.rng = rng
        self.tiebreak = {n.id: rng.random() for n in self.nodes}
        self.version: dict[str, int] = {n.id: 0 for n in self.nodes}
        self._heaps: dict[tuple[str, str], _GroupHeap] = {}
        self._asks: dict[tuple[str, str], Ask] = {}
        self.evaluated = 0

    # -- placement ------------------------------------------------------------------
    def select(self, request: Request) -> Node | None:
        """The best feasible node for ``request``, or None. Does not claim it (see ``claim``)."""
        if request.previous_node:
            return self._scan(request)
        gh = self._heap(request.ask)
        if gh.exhausted:
            return None
        heap = gh.heap
        picked: list[tuple] = []
        while heap and len(picked) < self.top_k:
            entry = heapq.heappop(heap)
            _neg, version, node_id = entry
            if node_id in gh.dead or version != self.version[node_id]:
                continue
            node = self.by_id[node_id]
            self.evaluated += 1
            if check_dynamic(node, request.ask, self.ctx) is not None:
                gh.dead.add(node_id)
                continue
            picked.append(entry)
        if not picked:
            gh.exhausted = True
            return None
        # top_k > 1 (Protean, when plans conflict): a random one of the best few,
        # so concurrent workers stop piling onto the same nodes.
        choice = picked[0] if len(picked) == 1 else self.rng.choice(picked)
        for entry in picked:
            heapq.heappush(heap, entry)
        return self.by_id[choice[2]]

    def claim(self, node: Node, ask: Ask) -> None:
        """Record a placement of ``ask`` on ``node`` and refresh that node's keys."""
        self.ctx.used(node.id).add(ask.resources)
        self.ctx.job_allocs[node.id] += 1
        self._touched(node.id)

    def release(self, node_id: str, resources: Resources, same_job: bool) -> None:
        """Give back what a stopped alloc held (stops are applied before placements)."""
        self.ctx.used(node_id).subtract(resources)
        if same_job and self.ctx.job_allocs.get(node_id, 0) > 0:
            self.ctx.job_allocs[node_id] -= 1
        if node_id in self.version:
            for gh in self._heaps.values():
                gh.dead.discard(node_id)
                gh.exhausted = False
            self._touched(node_id)

    def failure(self, ask: Ask, unplaced: int) -> PlacementFailure:
        return explain(self.nodes, ask, self.ctx, unplaced)

    # -- internals ------------------------------------------------------------------
    def _heap(self, ask: Ask) -> _GroupHeap:
        gh = self._heaps.get(ask.key)
        if gh is None:
            feasible = [n.id for n in self.nodes if check_static(n, ask, self.ctx) is None]
            gh = _GroupHeap(nodes=set(feasible))
            request = Request(ask)
            gh.heap = [(self._neg_key(self.by_id[nid], request), self.version[nid], nid) for nid in feasible]
            heapq.heapify(gh.heap)
            self._heaps[ask.key] = gh
            self._asks[ask.key] = ask
        return gh

    def _neg_key(self, node: Node, request: Request) -> tuple:
        key = rank_key(node, request, self.ctx, self.node_rules, self.tiebreak[node.id])
        return tuple(-k for k in key)

    def _touched(self, node_id: str) -> None:
        self.version[node_id] += 1
        node = self.by_id.get(node_id)
        if node is None:
            return
        for key, gh in self._heaps.items():
            if node_id in gh.dead:
                continue
            if node_id not in gh.nodes:
                continue
            request = Request(self._asks[key])
            heapq.heappush(gh.heap, (self._neg_key(node, request), self.version[node_id], node_id))

    def _scan(self, request: Request) -> Node | None:
        best, best_key = None, None
        for node in self.nodes:
            self.evaluated += 1
            if check_static(node, request.ask, self.ctx) is not None:
                continue
            if check_dynamic(node, request.ask, self.ctx) is not None:
                continue
            key = rank_key(node, request, self.ctx, self.rules, self.tiebreak[node.id])
            if best_key is None or key > best_key:
                best, best_key = node, key
        return best
