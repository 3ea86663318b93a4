"""The leader's placement index: nodes, their usage and trait rankings, fed by the change journal.

Without it every evaluation read and decoded every node and summed its
usage from LMDB, then scored every node (~86 ms per eval at 5,000 nodes).
The index does that work once and then follows the journal, as
``fsm.caches.NodeUsageCache`` does, through an ``fsm.cursor.Cursor``:

- nodes are decoded once, when their record changes; a record that changes
  nothing placement reads (a heartbeat's timestamps) does not count as a change;
- per-node usage is the sum of the node's non-terminal allocs' resources;
- each node remembers the journal index of its last change (``applied``), and
  a change log lists (index, node) in order, so that
- each trait's ``TraitRanking`` (``scheduler.traits``), which remembers the
  index it reflects, is brought forward by rescoring only the nodes changed
  since — Protean's caches. Rankings are kept in LRU order, at most
  ``max_traits`` of them (the cold ones are dropped); one left behind the
  trimmed change log is rebuilt.

The index is shared by the leader's workers. A caller holds ``lock`` while
it catches the index up to its read (``catch_up``) and for as long as it
reads ``nodes``, ``usage`` and rankings; a read older than the index cannot
be served (the index never goes back) and the caller reads again.
A cache is an optimisation only: what an evaluation sees through it equals
a fresh read at the same index (tests/lifecycle/test_placement_cache.py).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fsm import codec
from fsm.cursor import Cursor, Record
from fsm.store import StateReader
from fsm.structs import CLIENT_TERMINAL, DESIRED_EVICT, DESIRED_STOP, Node, Resources
from fsm.topics import TOPIC_ALLOC, TOPIC_NODE
from scheduler.feasibility import Ask, PlacementContext, ValidationRule
from scheduler.preferences import PreferenceRule, cluster_of
from scheduler.traits import ClusterTotal, TraitRanking, node_hash, trait_key, usable

DEFAULT_MAX_TRAITS = 64  # at 30,000 nodes a ranking holds a few MB
LOG_PER_NODE = 4  # change-log entries kept per node before the older half is trimmed
LOG_MIN = 50_000
_SERVER_TERMINAL = (DESIRED_STOP, DESIRED_EVICT)


@dataclass
class IndexStats:
    rebuilds: int = 0  # whole-index rebuilds (first catch-up, journal trimmed past it)
    batches: int = 0
    node_changes: int = 0  # node changes that matter to placement (record or usage)
    stale_reads: int = 0  # reads older than the index, sent back to read again
    trait_builds: int = 0  # rankings built from scratch (a new trait, or behind the change log)
    evictions: int = 0
    refreshed: int = 0  # rankings brought forward while the leader was idle


def _claim_of(alloc: dict[str, Any] | None) -> tuple[str, Resources] | None:
    """(node, resources) an alloc (journal map) holds, or None if it holds nothing (Nomad's TerminalStatus)."""
    if alloc is None or alloc.get("desired_status") in _SERVER_TERMINAL or alloc.get("client_status") in CLIENT_TERMINAL:
        return None
    res = alloc.get("resources") or {}
    devices = res.get("devices")
    return alloc["node_id"], Resources(
        cpu=int(res.get("cpu", 0)), memory_mb=int(res.get("memory_mb", 0)), disk_mb=int(res.get("disk_mb", 0)),
        devices=dict(devices) if devices else {},
    )


def same_for_placement(a: Node, b: Node) -> bool:
    """Whether two versions of a node rank and filter alike (only timestamps and indexes differ)."""
    return (
        a.status == b.status
        and a.drain == b.drain
        and a.scheduling_eligibility == b.scheduling_eligibility
        and a.datacenter == b.datacenter
        and a.node_class == b.node_class
        and a.name == b.name
        and a.resources == b.resources
        and a.attributes == b.attributes
    )


class PlacementIndex:
    """Nodes, usage, cluster totals and trait rankings at one journal index (see the module doc)."""

    TOPICS = frozenset({TOPIC_NODE, TOPIC_ALLOC})

    def __init__(self, max_traits: int = DEFAULT_MAX_TRAITS) -> None:
        self.max_traits = max(1, max_traits)
        self.nodes: dict[str, Node] = {}
        self.usage: dict[str, Resources] = {}  # every node has an entry (zero when idle)
        self.applied: dict[str, int] = {}  # node id -> index of its last change that matters to placement
        self.stats = IndexStats()
        self._claims: dict[str, tuple[str, Resources]] = {}  # live alloc -> (node, resources)
        self._hashes: dict[str, int] = {}
        self._member: dict[str, str] = {}  # usable node -> the cluster whose totals count it
        self._totals: dict[str, ClusterTotal] = {}
        self._log_index: list[int] = []
        self._log_node: list[str] = []
        self._log_start = 0  # changes at or below this index are no longer in the log
        self._traits: OrderedDict[tuple, TraitRanking] = OrderedDict()
        self._ctx = PlacementContext(usage=self.usage)
        self.cursor = Cursor(self, self.TOPICS)
        self.lock = self.cursor.lock
        self._closed = False  # see close()

    @property
    def index(self) -> int | None:
        """The raft index the index reflects (None before the first catch-up)."""
        return self.cursor.index

    def catch_up(self, reader: StateReader) -> bool:
        """Reflect exactly ``reader``'s index; False (nothing changed) if ``reader`` is older or the index closed. Hold ``lock``."""
        with self.lock:
            if self._closed:
                return False
            current = self.cursor.index
            if current is not None and current > reader.applied_index:
                self.stats.stale_reads += 1
                return False
            self.cursor.catch_up(reader)
            return True

    # -- RankingSource --------------------------------------------------------------
    def tiebreak_hash(self, node_id: str) -> int:
        h = self._hashes.get(node_id)
        return node_hash(node_id) if h is None else h

    def base_context(self) -> PlacementContext:
        return self._ctx

    def cluster_totals(self) -> dict[str, ClusterTotal]:
        return self._totals

    def ranking(
        self, ask: Ask, validation: tuple[ValidationRule, ...], rules: tuple[PreferenceRule, ...], by_cluster: bool
    ) -> tuple[TraitRanking, bool, int]:
        """The trait's ranking at the index: (it, hit, nodes scored). Hold ``lock``."""
        key = trait_key(ask, validation, rules, by_cluster)
        found = self._traits.get(key)
        if found is not None:
            self._traits.move_to_end(key)
            scored = self._bring_forward(found)
            if scored is not None:
                return found, True, scored
            return found, False, self._build(found)
        ranking = TraitRanking(ask, validation, rules, by_cluster)
        scored = self._build(ranking)
        self._traits[key] = ranking
        while len(self._traits) > self.max_traits:
            self._traits.popitem(last=False)
            self.stats.evictions += 1
        return ranking, False, scored

    def refresh(self, reader: StateReader, budget: float) -> int:
        """Spare time: catch up with ``reader`` and bring the most recently used rankings forward
        for up to ``budget`` seconds, so the next evaluations find them current. Returns how many.

        Never waits for the lock: a worker holding it has better use for it.
        """
        if not self.lock.acquire(blocking=False):
            return 0
        try:
            if not self.catch_up(reader):
                return 0
            deadline = time.monotonic() + budget
            done = 0
            for ranking in reversed(list(self._traits.values())):
                if time.monotonic() >= deadline:
                    break
                if ranking.index == self.cursor.index:
                    continue
                if self._bring_forward(ranking) is None:
                    self._build(ranking)
                done += 1
            self.stats.refreshed += done
            return done
        finally:
            self.lock.release()

    def status(self) -> dict[str, Any]:
        """Counters for ``scheduler.stats``."""
        s = self.stats
        return {
            "Index": self.cursor.index or 0,
            "Nodes": len(self.nodes),
            "Clusters": len(self._totals),
            "Traits": len(self._traits),
            "MaxTraits": self.max_traits,
            "ChangeLog": len(self._log_index),
            "Rebuilds": s.rebuilds,
            "NodeChanges": s.node_changes,
            "StaleReads": s.stale_reads,
            "TraitBuilds": s.trait_builds,
            "TraitEvictions": s.evictions,
            "TraitsRefreshedIdle": s.refreshed,
        }

    # -- Follower (called by the cursor, under ``lock``) ------------------------------------
    def close(self) -> None:
        """Drop every node, claim and ranking now, for good (the leader's term ended).

        A dropped term's objects are freed by reference counting only if
        nothing in a cycle still reaches them; exception tracebacks of the
        term's cancelled tasks often do, and then the collector's full pass
        met millions of claims at once (4.2 s at 1M allocs, every thread
        stopped, raft's included). Emptied here, they go at once. A closed
        index stays empty: ``catch_up`` answers False (as for a stale read),
        so a read still queued on the executor when the term ended does not
        rebuild a million claims for nobody.
        """
        with self.cursor.lock:
            self._closed = True
            self._drop_all()

    def _drop_all(self) -> None:
        for part in (self.nodes, self.usage, self.applied, self._claims, self._hashes, self._member, self._totals, self._traits):
            part.clear()
        self._log_index.clear()
        self._log_node.clear()

    def rebuild(self, reader: StateReader) -> None:
        index = reader.applied_index
        self._drop_all()
        for node in reader.nodes():
            self._set_node(node.id, node, index)
        for key, raw in reader.iter_raw("allocs"):
            self._set_claim(key.decode(), codec.unpack(raw), index)
        self._log_start = index
        self.stats.rebuilds += 1

    def apply(self, index: int, records: Sequence[Record]) -> None:
        for topic, _type, key, obj in records:
            if topic == TOPIC_NODE:
                self._set_node(key, None if obj is None else codec.from_wire(Node, obj), index)
            elif topic == TOPIC_ALLOC:
                self._set_claim(key, obj, index)
        self.stats.batches += 1
        self._trim_log()

    # -- internals ------------------------------------------------------------------
    def _build(self, ranking: TraitRanking) -> int:
        self.stats.trait_builds += 1
        scored = ranking.build(self)
        ranking.index = self.cursor.index if self.cursor.index is not None else -1
        return scored

    def _bring_forward(self, ranking: TraitRanking) -> int | None:
        """Rescore the nodes changed since the ranking's index; None if the log no longer reaches back."""
        current = self.cursor.index
        if ranking.index == current:
            return 0
        if current is None or ranking.index < self._log_start:
            return None
        start = bisect_right(self._log_index, ranking.index)
        scored = ranking.rescore(self, set(self._log_node[start:]))
        ranking.index = current
        return scored

    def _set_node(self, node_id: str, node: Node | None, index: int) -> None:
        old = self.nodes.get(node_id)
        if old is not None and node is not None and same_for_placement(old, node):
            self.nodes[node_id] = node
            return
        self._leave_cluster(node_id)
        if node is None:
            self.nodes.pop(node_id, None)
            self._hashes.pop(node_id, None)
        else:
            self.nodes[node_id] = node
            if node_id not in self._hashes:
                self._hashes[node_id] = node_hash(node_id)
            used = self.usage.setdefault(node_id, Resources.zero())
            if usable(node):
                cluster = self._member[node_id] = cluster_of(node)
                total = self._totals.setdefault(cluster, ClusterTotal())
                total.nodes += 1
                total.capacity.add(node.resources)
                total.used.add(used)
        self._changed(node_id, index)

    def _leave_cluster(self, node_id: str) -> None:
        cluster = self._member.pop(node_id, None)
        if cluster is None:
            return
        total = self._totals[cluster]
        total.nodes -= 1
        if total.nodes == 0:
            del self._totals[cluster]
            return
        total.capacity.subtract(self.nodes[node_id].resources)
        total.used.subtract(self.usage[node_id])

    def _set_claim(self, alloc_id: str, alloc: dict[str, Any] | None, index: int) -> None:
        old = self._claims.pop(alloc_id, None)
        new = _claim_of(alloc)
        if new is not None:
            self._claims[alloc_id] = new
        if old == new:
            return
        if old is not None:
            self._use(old[0], old[1], -1, index)
        if new is not None:
            self._use(new[0], new[1], 1, index)

    def _use(self, node_id: str, resources: Resources, sign: int, index: int) -> None:
        used = self.usage.get(node_id)
        if used is None:
            used = self.usage[node_id] = Resources.zero()
        cluster = self._member.get(node_id)
        total = self._totals[cluster].used if cluster is not None else None
        for target in (used, total):
            if target is None:
                continue
            if sign > 0:
                target.add(resources)
            else:
                target.subtract(resources)
        self._changed(node_id, index)

    def _changed(self, node_id: str, index: int) -> None:
        if self.applied.get(node_id) == index:
            return
        self.applied[node_id] = index
        self._log_index.append(index)
        self._log_node.append(node_id)
        self.stats.node_changes += 1

    def _trim_log(self) -> None:
        """Keep the change log bounded: drop its older half once it outgrows the nodes it covers."""
        limit = max(LOG_MIN, LOG_PER_NODE * len(self.nodes))
        if len(self._log_index) <= limit:
            return
        cut = self._log_index[len(self._log_index) // 2]
        keep = bisect_right(self._log_index, cut)
        del self._log_index[:keep]
        del self._log_node[:keep]
        self._log_start = cut
