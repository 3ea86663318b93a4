"""Preference rules: soft scores combined in strict priority.

A preference rule scores a feasible node with a small integer (higher is
better). Rules combine in **strict priority** — the score is a tuple compared
lexicographically, which is Protean's exponentially growing weights — so a
later rule only breaks ties left by the earlier ones. A continuous score
(BestFit) is **quantized into a few buckets**; otherwise it would break every
tie and the later rules would never matter.

Two attributes tell the selector and the trait caches (``scheduler.traits``)
what a rule's score depends on, so they can cache it:

- ``per_request``: the score depends on the placement request; such a rule
  may single out only the request's avoided nodes (``Request.avoided``:
  every other node scores as for a request without them), so a cached
  ranking stays right for all nodes but those few;
- ``cluster_level``: the score is the same for every node of a cluster and
  comes from ``ctx.cluster_load``; caches rank nodes without it and the
  selector adds it per cluster, as the cluster's load changes with the plan.

Everything else may depend on the node, the ask, the node's usage and the
job's allocs on the node (``ctx.job_allocs``), nothing more.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from fsm.scheduler_config import (
    DEFAULT_BUCKETS,
)
from fsm.structs import CLUSTER_ATTRIBUTE, Node
from scheduler.feasibility import Ask, PlacementContext


def cluster_of(node: Node) -> str:
    """The cluster a node belongs to ("" when it names none)."""
    return node.attributes.get(CLUSTER_ATTRIBUTE, "")


class PreferenceRule:
    """A soft preference: ``score`` returns an int, higher is better."""

    name = "preference"
    per_request = False  # depends on the placement request (its previous node only)
    cluster_level = False  # one score per cluster, from ctx.cluster_load

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        raise NotImplementedError

    def cluster_score(self, cluster: str, ctx: PlacementContext) -> int:
        """A ``cluster_level`` rule's score for every node of ``cluster``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Request:
    """One placement to make; a replacement names the nodes to avoid (Nomad's penalty nodes).

    ``penalty_nodes`` are every node the replaced alloc's reschedule tracker
    lists, plus the one it failed on (``scheduler.reschedule.penalty_nodes``);
    ``previous_node`` is the older spelling of a single one. ``avoided`` is
    their union, what the selector and ``AvoidPreviousNode`` read.
    """

    ask: Ask
    previous_node: str = ""
    penalty_nodes: frozenset[str] = frozenset()

    @functools.cached_property
    def avoided(self) -> frozenset[str]:
        """Every node this placement is penalised on (empty for a fresh placement)."""
        if not self.previous_node:
            return self.penalty_nodes
        return self.penalty_nodes | {self.previous_node}


class AvoidPreviousNode(PreferenceRule):
    """A replacement prefers any node but those its alloc failed on (Nomad's NodeReschedulingPenaltyIterator).

    Each penalised node scores the same, however often it appears in the
    tracker: Nomad keeps them in a set and gives each one penalty.
    """

    name = "avoid-previous-node"
    per_request = True

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return 0 if node.id in request.avoided else 1


class BestFit(PreferenceRule):
    """Pack tightly: utilization after placement, quantized into ``buckets`` (Protean's BestFit)."""

    name = "best-fit"

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        self.buckets = max(1, buckets)

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return bucket(ask.resources.utilization(node.resources, ctx.peek(node.id)), self.buckets)


class JobAntiAffinity(PreferenceRule):
    """Among equally packed nodes, spread one job's allocs (Nomad's job anti-affinity)."""

    name = "job-anti-affinity"

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return -ctx.job_allocs.get(node.id, 0)


class PreferNonEmptyMachines(PreferenceRule):
    """Keep empty machines empty: a node already running something scores higher (Protean)."""

    name = "prefer-non-empty-machines"

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        used = ctx.peek(node.id)
        return 1 if used is not None and (used.cpu > 0 or used.memory_mb > 0 or used.disk_mb > 0) else 0


class PreferEmptierClusters(PreferenceRule):
    """Balance clusters: a node in a less loaded cluster scores higher, quantized (Protean).

    The load of each cluster (0..1) comes from ``ctx.cluster_load``, which
    the selector keeps current as its plan claims and releases resources.
    """

    name = "prefer-emptier-clusters"
    cluster_level = True

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        self.buckets = max(1, buckets)

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return self.cluster_score(cluster_of(node), ctx)

    def cluster_score(self, cluster: str, ctx: PlacementContext) -> int:
        """The score every node of ``cluster`` gets."""
        return bucket(1.0 - ctx.cluster_load.get(cluster, 0.0), self.buckets)


PREFERENCE_RULES: tuple[PreferenceRule, ...] = (AvoidPreviousNode(), BestFit(), JobAntiAffinity())


def bucket(value: float, buckets: int) -> int:
    """Quantize 0..1 into 0..buckets-1."""
    return min(buckets - 1, max(0, int(value * buckets)))


def rank_key(node: Node, request: Request, ctx: PlacementContext, rules: tuple[PreferenceRule, ...], tiebreak: float) -> tuple:
    """The node's strict-priority score for ``request``: compare tuples, higher wins."""
    return tuple(rule.score(node, request.ask, ctx, request) for rule in rules) + (tiebreak,)


class WorstFit(PreferenceRule):
    """Spread: the node left emptiest after placement scores highest, quantized (Nomad's ``spread`` algorithm).

    BestFit's mirror image (``1 - utilization``), with the same buckets, so
    that the later rules (job anti-affinity) still break ties between nodes
    about as empty. Only a configured policy selects it (``spread``).
    """

    name = "worst-fit"

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        self.buckets = max(1, buckets)

    def score(self, node: Node, ask: Ask, ctx: PlacementContext, request: Request) -> int:
        return bucket(1.0 - ask.resources.utilization(node.resources, ctx.peek(node.id)), self.buckets)
