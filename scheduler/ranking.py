"""Ranking: the node selector, over trait rankings, with ties broken at random per evaluation.

The preference rules live in ``scheduler.preferences`` (re-exported here);
``scheduler.traits`` groups a trait's feasible nodes into classes of equal
score; ``scheduler.index`` keeps those rankings current from the journal.
The selector chooses nodes for one evaluation's placements from them.

**Order.** A node's key is its preference scores in strict priority, then a
tiebreak: the distance of the node's fixed hash past a random *rotation*
drawn once per evaluation from its seeded rng. Within a score class (sorted
by hash) that order is a walk around the class from the rotation on, so the
selector never scores the class's members one by one: it keeps one heap
entry per class (its cursor's next member) plus one per node the plan
changed. A placement costs O(log classes), whatever the node count.

**The plan's changes.** A node the plan claims on or releases from (and a
node already running the job, which anti-affinity and distinct_hosts rank
apart) is *touched*: it leaves its class and is ranked on its own with the
plan's usage, under a new version; older heap entries for it are stale.
A cluster-level rule (PreferEmptierClusters) scores every node of a cluster
by the cluster's load, which each claim changes: when its score changes,
the cluster's version moves on and the cluster's classes and touched nodes
are pushed again with the new score (cluster-level re-ranking), instead of
every node of the cluster.

**Two-level selection** (``cluster_top`` > 0, Protean): clusters are ranked
by the best their candidates offer, rule by rule (the componentwise maximum
of their keys; a cluster-level rule's score is the cluster's own), ties
broken at random with the same rotation. Only clusters that still have a
feasible candidate for the ask are ranked, so the ``cluster_top`` kept ones
always hold one whenever any cluster does (the choice widens past full
clusters), and machines are then ranked inside the kept clusters only.

**Conflicts** (``top_k`` > 1): the choice is a random one of the best
``top_k`` candidates, so concurrent workers stop piling onto the same node.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from fsm.structs import Node, Resources
from scheduler.feasibility import (
    VALIDATION_RULES,
    Ask,
    PlacementContext,
    PlacementFailure,
    ValidationRule,
    check_static,
)
from scheduler.preferences import (
    DEFAULT_BUCKETS,
    PREFERENCE_RULES,
    AvoidPreviousNode,
    BestFit,
    JobAntiAffinity,
    PreferEmptierClusters,
    PreferenceRule,
    PreferNonEmptyMachines,
    Request,
    bucket,
    cluster_of,
    rank_key,
)
from scheduler.traits import (
    FreshSource,
    Members,
    PlacementStats,
    RankingSource,
    TraitRanking,
    node_hash,
    trait_key,
    usable,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "PREFERENCE_RULES",
    "AvoidPreviousNode",
    "BestFit",
    "JobAntiAffinity",
    "PreferEmptierClusters",
    "PreferNonEmptyMachines",
    "PreferenceRule",
    "Request",
    "Selector",
    "bucket",
    "rank_key",
]

MASK = (1 << 64) - 1
CURSOR_NONE = -1  # an entry's tag when it stands for one node rather than a class's cursor
# A heap entry: (negated key, distance past the rotation, node id, class ordinal or CURSOR_NONE,
# the node's version, the cluster's version). Valid while both versions are current.
Entry = tuple[tuple[int, ...], int, str, int, int, int]


class _Tiebreaks(Mapping[str, int]):
    """Each node's tiebreak in this evaluation (higher wins): minus its hash's distance past the rotation."""

    def __init__(self, source: RankingSource, rotation: int) -> None:
        self.source = source
        self.rotation = rotation

    def __getitem__(self, node_id: str) -> int:
        if node_id not in self.source.nodes:
            raise KeyError(node_id)
        return -((self.source.tiebreak_hash(node_id) - self.rotation) & MASK)

    def __iter__(self) -> Iterator[str]:
        return iter(self.source.nodes)

    def __len__(self) -> int:
        return len(self.source.nodes)


class _AskState:
    """One ask's view of its trait ranking in this evaluation: cursors, heaps and touched nodes."""

    def __init__(self, ask: Ask, ranking: TraitRanking, hit: bool, scored: int) -> None:
        self.ask = ask
        self.ranking = ranking
        self.hit = hit
        self.pending = scored  # nodes scored for this ask, not yet counted against a placement
        self.cluster: list[str] = []  # per class ordinal
        self.keys: list[tuple[int, ...]] = []
        self.members: list[Members] = []
        self.start: list[int] = []  # where the rotation enters the class
        self.taken: list[int] = []  # how far its cursor has walked
        self.moved: list[int] = []  # how many of its members the plan touched
        self.neg: list[tuple[tuple[int, ...], int] | None] = []  # cached (negated full key, cluster version)
        self.ordinal: dict[tuple[str, tuple[int, ...]], int] = {}
        self.by_cluster: dict[str, list[int]] = {}
        self.heaps: dict[str, list[Entry]] = {}
        self.overlay: dict[str, tuple[int, ...] | None] = {}  # touched node -> its key now (None: infeasible)
        self.reason_now: dict[str, str | None] = {}  # touched node -> the first rule it fails now
        self.touched_in: dict[str, set[str]] = {}
        self.loose: dict[str, set[str]] = {}  # untouched nodes a cursor passed and that were pushed back
        self.cluster_keys: dict[str, tuple[int, ...] | None] = {}
        self.dirty: set[str] | None = None  # clusters whose key must be computed again (None: all)

    def add_class(self, cluster: str, key: tuple[int, ...], members: Members, start: int) -> int:
        i = len(self.cluster)
        self.cluster.append(cluster)
        self.keys.append(key)
        self.members.append(members)
        self.start.append(start)
        self.taken.append(0)
        self.moved.append(0)
        self.neg.append(None)
        self.ordinal[(cluster, key)] = i
        self.by_cluster.setdefault(cluster, []).append(i)
        return i

    def mark_dirty(self, cluster: str) -> None:
        if self.dirty is not None:
            self.dirty.add(cluster)


class Selector:
    """Chooses nodes for one evaluation's placements, tracking usage as the plan grows.

    Not thread-safe; one per scheduling run. ``rng`` draws the rotation that
    breaks ties (seed it with the eval id for reproducible plans) and the
    top-k choice. ``source`` gives the trait rankings (the leader's
    ``scheduler.index.PlacementIndex``); without one they are built from
    ``nodes`` and the usage in ``ctx`` (its ``base``, else its ``usage`` as
    it is now). ``validation`` and ``rules`` come from the placement policy,
    in its order; ``stats`` collects hits, misses and nodes scored.
    """

    def __init__(
        self,
        nodes: Iterable[Node] | Mapping[str, Node],
        ctx: PlacementContext,
        *,
        rng: random.Random | None = None,
        rules: tuple[PreferenceRule, ...] = PREFERENCE_RULES,
        top_k: int = 1,
        validation: tuple[ValidationRule, ...] = VALIDATION_RULES,
        cluster_top: int = 0,
        source: RankingSource | None = None,
        stats: PlacementStats | None = None,
    ) -> None:
        if source is None:
            by_id = dict(nodes) if isinstance(nodes, Mapping) else {n.id: n for n in nodes}
            base = ctx.base if ctx.base is not None else {k: v.copy() for k, v in ctx.usage.items()}
            source = FreshSource(by_id, base)
        self.source = source
        self.nodes_by_id = source.nodes
        self.ctx = ctx
        self.rules = rules
        self.node_rules = tuple(r for r in rules if not r.per_request)
        self.class_rules = tuple(r for r in self.node_rules if not r.cluster_level)
        self.cluster_rules = tuple((i, r) for i, r in enumerate(self.node_rules) if r.cluster_level)
        self.validation = validation
        self.top_k = max(1, top_k)
        self.cluster_top = max(0, cluster_top)
        self.by_cluster = bool(self.cluster_rules) or self.cluster_top > 0
        self.rng = rng or random.Random(0)
        self.rotation = self.rng.getrandbits(64)
        self.tiebreak = _Tiebreaks(source, self.rotation)
        self.stats = stats if stats is not None else PlacementStats()
        self.evaluated = 0
        self._version: dict[str, int] = {}  # touched node -> its version (untouched: 0)
        self._cv: dict[str, int] = {}  # cluster -> the version of its cluster-level scores
        self._states: dict[tuple, _AskState] = {}
        self._totals = {c: t.copy() for c, t in source.cluster_totals().items()} if self.cluster_rules else {}
        for cluster, total in self._totals.items():
            ctx.cluster_load[cluster] = total.load()
        for node_id, n in ctx.job_allocs.items():
            if n > 0:  # ranked apart: anti-affinity and distinct_hosts read the job's allocs there
                self._version[node_id] = 1

    # -- placement ------------------------------------------------------------------
    def select(self, request: Request) -> Node | None:
        """The best feasible node for ``request``, or None. Does not claim it (see ``claim``)."""
        state = self._state(request.ask)
        groups = self._groups(state)
        avoided = request.avoided
        picked, skipped = self._gather(state, groups, avoided)
        candidates = self._with_avoided(state, request, picked, groups) if avoided else picked
        for entry in picked + skipped:
            self._push_back(state, entry)
        self.stats.record(state.hit, state.pending)
        state.pending = 0
        if not candidates:
            return None
        # top_k > 1 (Protean, when plans conflict): a random one of the best few.
        choice = candidates[0] if len(candidates) == 1 else self.rng.choice(candidates)
        return self.nodes_by_id[choice[2]]

    def claim(self, node: Node, ask: Ask, resources: Resources | None = None) -> None:
        """Record a placement of ``ask`` on ``node`` and rank that node again.

        ``resources``: what the placed alloc claims, when it differs from the
        ask's (its devices bound to the node's, ``Resources.bound``).
        """
        held = ask.resources if resources is None else resources
        self.ctx.used(node.id).add(held)
        self.ctx.job_allocs[node.id] += 1
        self._touch(node.id, held, 1)

    def hold(self, node_id: str, resources: Resources) -> None:
        """Count what other plans, still committing, place on ``node_id``: the snapshot cannot show it yet.

        Ranked like this plan's own claims, so that an eval planned while
        earlier plans commit does not pick the node they just filled (the
        plan applier would reject it, and the eval be planned again).
        """
        self.ctx.used(node_id).add(resources)
        if node_id in self.nodes_by_id:
            self._touch(node_id, resources, 1)

    def release(self, node_id: str, resources: Resources, same_job: bool) -> None:
        """Give back what a stopped alloc held (stops are applied before placements)."""
        self.ctx.used(node_id).subtract(resources)
        if same_job and self.ctx.job_allocs.get(node_id, 0) > 0:
            self.ctx.job_allocs[node_id] -= 1
        if node_id in self.nodes_by_id:
            self._touch(node_id, resources, -1)

    def failure(self, ask: Ask, unplaced: int) -> PlacementFailure:
        """Why ``ask`` fits nowhere, per rule: the ranking's counts, corrected for the nodes the plan
        touched (no scan of the nodes, however many there are)."""
        state = self._state(ask)
        reasons = Counter(state.ranking.reasons)
        for node_id, now in state.reason_now.items():
            before = state.ranking.reason.get(node_id)
            if before is not None:
                reasons[before] -= 1
            if now is not None:
                reasons[now] += 1
        failure = PlacementFailure(unplaced=unplaced, nodes_evaluated=len(self.nodes_by_id))
        for reason, n in reasons.items():
            if n > 0:
                failure.count(reason, n)
        dim = state.ranking.too_big_dim(len(self.nodes_by_id))
        if dim is not None:
            failure.ask_too_big(ask, dim)
        return failure

    # -- the ask's state ------------------------------------------------------------
    def _state(self, ask: Ask) -> _AskState:
        # Per group and trait: a downgraded replacement asks what an older version of the group asked.
        key = (ask.key, trait_key(ask, self.validation, self.class_rules, self.by_cluster))
        state = self._states.get(key)
        if state is not None:
            return state
        ranking, hit, scored = self.source.ranking(ask, self.validation, self.class_rules, self.by_cluster)
        state = self._states[key] = _AskState(ask, ranking, hit, scored)
        for (cluster, key), members in sorted(ranking.classes.items()):
            i = state.add_class(cluster, key, members, bisect_left(members, (self.rotation,)))
            self._push_head(state, i)
        for node_id in self._version:
            self._retouch(state, node_id)
        return state

    def _cluster_of(self, node_id: str) -> str:
        node = self.nodes_by_id.get(node_id)
        return cluster_of(node) if node is not None and self.by_cluster else ""

    def _heap(self, state: _AskState, cluster: str) -> list[Entry]:
        return state.heaps.setdefault(cluster if self.cluster_top else "", [])

    def _distance(self, node_id: str) -> int:
        return (self.source.tiebreak_hash(node_id) - self.rotation) & MASK

    def _with_cluster_scores(self, key: tuple[int, ...], cluster: str) -> tuple[int, ...]:
        """A class key with the cluster-level rules' scores put back in their places."""
        if not self.cluster_rules:
            return key
        out = list(key)
        for pos, rule in self.cluster_rules:
            out.insert(pos, rule.cluster_score(cluster, self.ctx))
        return tuple(out)

    def _class_neg(self, state: _AskState, i: int) -> tuple[int, ...]:
        """Class ``i``'s full key, negated for the min-heap (cached per cluster version)."""
        cv = self._cv.get(state.cluster[i], 0)
        cached = state.neg[i]
        if cached is not None and cached[1] == cv:
            return cached[0]
        neg = tuple(-x for x in self._with_cluster_scores(state.keys[i], state.cluster[i]))
        state.neg[i] = (neg, cv)
        return neg

    def _node_key(self, node: Node, ask: Ask) -> tuple[int, ...]:
        request = Request(ask)
        return tuple(rule.score(node, ask, self.ctx, request) for rule in self.node_rules)

    def _current_key(self, state: _AskState, node_id: str) -> tuple[int, ...] | None:
        """The node's key for the ask as the plan stands (None: not a candidate)."""
        if node_id in state.overlay:
            return state.overlay[node_id]
        placed = state.ranking.where.get(node_id)
        if placed is None:
            return None
        return tuple(-x for x in self._class_neg(state, state.ordinal[placed[0]]))

    # -- heaps ----------------------------------------------------------------------
    def _push_head(self, state: _AskState, i: int) -> None:
        """Push class ``i``'s cursor: its next member in rotation order, if any is left."""
        members, n = state.members[i], state.taken[i]
        if n >= len(members):
            return
        h, node_id = members[(state.start[i] + n) % len(members)]
        cluster = state.cluster[i]
        entry = (self._class_neg(state, i), (h - self.rotation) & MASK, node_id, i, 0, self._cv.get(cluster, 0))
        heapq.heappush(self._heap(state, cluster), entry)

    def _push_node(self, state: _AskState, node_id: str, key: tuple[int, ...], cluster: str) -> None:
        entry = (tuple(-x for x in key), self._distance(node_id), node_id, CURSOR_NONE, self._version.get(node_id, 0), self._cv.get(cluster, 0))
        heapq.heappush(self._heap(state, cluster), entry)

    def _push_back(self, state: _AskState, entry: Entry) -> None:
        """Return a popped candidate to its heap; one a cursor passed stands for itself from now on."""
        neg, d, node_id, tag, version, cv = entry
        if tag == CURSOR_NONE:
            heapq.heappush(self._heap(state, self._cluster_of(node_id)), entry)
            return
        cluster = state.cluster[tag]
        state.loose.setdefault(cluster, set()).add(node_id)
        heapq.heappush(self._heap(state, cluster), (neg, d, node_id, CURSOR_NONE, version, cv))

    def _valid(self, state: _AskState, entry: Entry) -> bool:
        _neg, _d, node_id, tag, version, cv = entry
        cluster = state.cluster[tag] if tag != CURSOR_NONE else self._cluster_of(node_id)
        return cv == self._cv.get(cluster, 0) and version == self._version.get(node_id, 0)

    def _clean(self, state: _AskState, heap: list[Entry]) -> None:
        """Drop stale entries off the top of ``heap``; a cursor whose node was touched walks on."""
        while heap and not self._valid(state, heap[0]):
            _neg, _d, _node, tag, _version, cv = heapq.heappop(heap)
            if tag != CURSOR_NONE and cv == self._cv.get(state.cluster[tag], 0):
                state.taken[tag] += 1
                self._push_head(state, tag)

    def _gather(self, state: _AskState, groups: list[str], skip: frozenset[str]) -> tuple[list[Entry], list[Entry]]:
        """Pop the best ``top_k`` valid candidates across the heaps of ``groups`` (and the entries of
        ``skip``'s nodes, kept apart, that come up first): the caller pushes them all back."""
        heaps = [state.heaps[g] for g in groups if g in state.heaps]
        picked: list[Entry] = []
        skipped: list[Entry] = []
        while len(picked) < self.top_k:
            best = None
            for heap in heaps:
                self._clean(state, heap)
                if heap and (best is None or heap[0] < best[0]):
                    best = heap
            if best is None:
                break
            entry = heapq.heappop(best)
            if entry[3] != CURSOR_NONE:
                state.taken[entry[3]] += 1
                self._push_head(state, entry[3])
            if entry[2] in skip:
                skipped.append(entry)
                continue
            self.evaluated += 1
            picked.append(entry)
        return picked, skipped

    def _with_avoided(self, state: _AskState, request: Request, picked: list[Entry], groups: list[str]) -> list[Entry]:
        """The best ``top_k`` once the request's avoided nodes compete with their per-request score
        (AvoidPreviousNode): they only ever lose places, so the candidates found without them suffice."""
        scored = [(rank_key(self.nodes_by_id[e[2]], request, self.ctx, self.rules, 0), e) for e in picked]
        for node_id in sorted(request.avoided):
            node = self.nodes_by_id.get(node_id)
            if node is None or self._current_key(state, node_id) is None:
                continue
            if self.cluster_top and self._cluster_of(node_id) not in groups:
                continue
            entry = ((), self._distance(node_id), node_id, CURSOR_NONE, 0, 0)
            scored.append((rank_key(node, request, self.ctx, self.rules, 0), entry))
        scored.sort(key=lambda ke: (tuple(-x for x in ke[0]), ke[1][1], ke[1][2]))
        return [e for _key, e in scored[: self.top_k]]

    # -- the plan's changes ------------------------------------------------------------
    def _touch(self, node_id: str, resources: Resources, sign: int) -> None:
        """Rank ``node_id`` again for every ask, after its usage changed by ``sign * resources``."""
        self._version[node_id] = self._version.get(node_id, 0) + 1
        changed = self._cluster_usage(node_id, resources, sign)
        for state in self._states.values():
            self._retouch(state, node_id)
        if changed is not None:
            self._bump(changed)

    def _retouch(self, state: _AskState, node_id: str) -> None:
        """Rank a touched node on its own for one ask, with the plan's usage."""
        if node_id not in state.overlay:
            placed = state.ranking.where.get(node_id)
            if placed is not None:
                state.moved[state.ordinal[placed[0]]] += 1
        node = self.nodes_by_id.get(node_id)
        if node is None:
            state.overlay[node_id] = state.reason_now[node_id] = None
            return
        cluster = self._cluster_of(node_id)
        reason = check_static(node, state.ask, self.ctx, self.validation)
        state.reason_now[node_id] = reason
        key = None if reason is not None else self._node_key(node, state.ask)
        state.overlay[node_id] = key
        if key is not None:
            self._push_node(state, node_id, key, cluster)
        state.touched_in.setdefault(cluster, set()).add(node_id)
        state.mark_dirty(cluster)
        state.pending += 1

    def _cluster_usage(self, node_id: str, resources: Resources, sign: int) -> str | None:
        """Move the node's cluster load; the cluster if a cluster-level score changed with it."""
        node = self.nodes_by_id.get(node_id)
        if not self.cluster_rules or node is None or not usable(node):
            return None
        cluster = cluster_of(node)
        total = self._totals.get(cluster)
        if total is None:
            return None
        before = [rule.cluster_score(cluster, self.ctx) for _pos, rule in self.cluster_rules]
        if sign > 0:
            total.used.add(resources)
        else:
            total.used.subtract(resources)
        self.ctx.cluster_load[cluster] = total.load()
        after = [rule.cluster_score(cluster, self.ctx) for _pos, rule in self.cluster_rules]
        return cluster if after != before else None

    def _bump(self, cluster: str) -> None:
        """Cluster-level re-ranking: the cluster's scores changed, so its entries are pushed again."""
        self._cv[cluster] = self._cv.get(cluster, 0) + 1
        for state in self._states.values():
            for i in state.by_cluster.get(cluster, ()):
                self._push_head(state, i)
            for node_id in state.loose.get(cluster, ()):
                key = self._current_key(state, node_id)
                if key is not None and not self._version.get(node_id, 0):
                    self._push_node(state, node_id, key, cluster)
            for node_id in state.touched_in.get(cluster, ()):
                node = self.nodes_by_id.get(node_id)
                if node is not None and state.overlay.get(node_id) is not None:
                    key = state.overlay[node_id] = self._node_key(node, state.ask)
                    self._push_node(state, node_id, key, cluster)
                    state.pending += 1
            state.mark_dirty(cluster)

    # -- two-level selection ---------------------------------------------------------
    def _groups(self, state: _AskState) -> list[str]:
        """The heaps to choose from: all of them, or the best ``cluster_top`` clusters that still
        have a candidate for the ask."""
        if not self.cluster_top:
            return [""]
        if state.dirty is None:
            state.cluster_keys = {}
            state.dirty = set(state.by_cluster) | set(state.touched_in)
        for cluster in state.dirty:
            state.cluster_keys[cluster] = self._cluster_key(state, cluster)
        state.dirty = set()
        ranked = sorted(
            (tuple(-x for x in key), (node_hash(cluster) - self.rotation) & MASK, cluster)
            for cluster, key in state.cluster_keys.items()
            if key is not None
        )
        return [cluster for _neg, _d, cluster in ranked[: self.cluster_top]]

    def _cluster_key(self, state: _AskState, cluster: str) -> tuple[int, ...] | None:
        """The best the cluster's candidates offer, rule by rule; None if it has none left."""
        keys = [
            tuple(-x for x in self._class_neg(state, i))
            for i in state.by_cluster.get(cluster, ())
            if len(state.members[i]) > state.moved[i]
        ]
        keys += [k for n in state.touched_in.get(cluster, ()) if (k := state.overlay.get(n)) is not None]
        if not keys:
            return None
        return tuple(map(max, zip(*keys, strict=True)))
