"""Leader-only garbage collection: periodic sweeps and the force-GC admin RPC.

Only the leader collects. While it leads, one loop per kind (evals, jobs,
deployments, nodes, expired ACL tokens) sleeps its configured interval, plans
a sweep with ``fsm.gc`` on the committed state (reading only the GC-mark
index up to ``now - threshold`` and what the marks name), splits the plan
into reap entries, and puts them on the log one at a time through
``ServerAPI.propose``. The loops are cancelled when leadership is lost; a sweep
cut short is simply planned again by the next leader, because every reaped
id carries the ``modify_index`` the leader saw and apply skips whatever is
gone or changed since (so nothing is deleted twice, and an object touched
after the read survives).

A sweep plans a window of at most ``MARKS_PER_PLAN`` marks at a time and
proposes that window's reaps before planning the next, so a large backlog
never holds a core for one long plan and the first reaps commit early. An
entry is bounded three ways, whichever is hit first: the configured id caps
(Nomad's 7,281 ids per reap, 2,048 jobs per job reap), the size the
leader's own entries are cut to (``node.core.writes.leader_entry_bytes``,
under the raft entry limit, measured on the encoded, pickled entry as the
raft adapter stores it), and ``OBJECTS_PER_ENTRY`` objects removed,
cascade included (the apply work every replica does for it in one go).
After each reap commits, the collector pauses twice as long as that reap
took (``PACE``), so it holds at most about a third of the log and client
writes keep most of their latency while a backlog is collected (the
benchmark's write-p99 ratio).

``system.gc`` (``caravan system gc``) runs every collector at once with all
time thresholds zero and every other rule kept, node GC last; it waits for
the reaps to commit and answers counts per kind with the last reap's raft
index. ``detach`` returns at once; ``dry_run`` plans on one snapshot and
writes nothing. Sweeps of one server never overlap (one lock), so a forced
run and a periodic sweep do not plan the same objects twice.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm import messages as m
from fsm.gc import FORCE_ORDER, EvalUnit, Plan, Thresholds, Window, plan_all, plan_kind
from fsm.store import StateReader
from fsm.structs import SECOND
from fsm.writer import GC_DEPLOYMENT, GC_EVAL, GC_JOB, GC_KINDS, GC_NODE, GC_TOKEN
from node.core import metrics
from node.core.config import GCConfig
from node.core.writes import entry_size, leader_entry_bytes
from node.wire.errors import INTERNAL, NO_LEADER, NOT_LEADER, UNKNOWN_OUTCOME, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI

# Bytes of each entry left for what differs between measuring and proposing
# (the envelope's time and request id).
ENTRY_MARGIN = 256
# Allocs of one eval reaped in the same entry as the eval; more go first in
# entries of their own so no single unit outgrows an entry.
UNIT_ALLOCS = 256
# Ids listed per table in a dry run's answer (counts are always complete).
DRY_RUN_IDS = 1000
# Objects one reap entry may remove, its cascade included. Every replica
# applies the entry in one go on its raft thread, where it delays every
# write queued behind it; this keeps that delay to a few milliseconds.
OBJECTS_PER_ENTRY = 32
# GC marks one plan reads before its reaps are proposed (see fsm.gc.Window).
MARKS_PER_PLAN = 256
# After each reap the collector pauses PACE times as long as the reap took to
# commit (at most PACE_MAX s), so it holds at most 1 / (1 + PACE) of the log.
PACE = 2.0
PACE_MAX = 0.5

# Names of the per-kind counts in answers and logs (Nomad's API nouns).
NAMES = {
    "jobs": "Jobs",
    "evals": "Evals",
    "allocs": "Allocs",
    "deployments": "Deployments",
    "nodes": "Nodes",
    "acl_tokens": "ACLTokens",
}
LEADERSHIP_LOST = frozenset({NOT_LEADER, NO_LEADER, UNKNOWN_OUTCOME})


class GCError(Exception):
    """A plan could not be turned into entries (an item larger than one entry)."""


@dataclass(frozen=True)
class Limits:
    """How big one reap entry may be."""

    reap_batch: int = 7281
    job_batch: int = 2048
    token_batch: int = 4096
    max_entry_bytes: int = 48 * 1024
    objects_per_entry: int = OBJECTS_PER_ENTRY

    @classmethod
    def of(cls, cfg: GCConfig, max_entry_bytes: int) -> Limits:
        return cls(cfg.reap_batch, cfg.job_batch, cfg.token_batch, max_entry_bytes, OBJECTS_PER_ENTRY)


def thresholds_of(cfg: GCConfig) -> Thresholds:
    """The configured thresholds (seconds) in the FSM's nanoseconds."""

    def ns(seconds: float) -> int:
        return int(round(seconds * SECOND))

    return Thresholds(
        eval=ns(cfg.eval_threshold),
        batch_eval=ns(cfg.batch_eval_threshold),
        job=ns(cfg.job_threshold),
        deployment=ns(cfg.deployment_threshold),
        node=ns(cfg.node_threshold),
        token=ns(cfg.token_threshold),
    )


# -- splitting a plan into entries --------------------------------------------------
def _split_units(units: list[EvalUnit]) -> list[EvalUnit]:
    """Break evals with many allocs into alloc-only units followed by the eval itself."""
    out: list[EvalUnit] = []
    for unit in units:
        if len(unit.allocs) <= UNIT_ALLOCS:
            out.append(unit)
            continue
        for i in range(0, len(unit.allocs), UNIT_ALLOCS):
            out.append(EvalUnit(unit.job_id, None, unit.allocs[i : i + UNIT_ALLOCS]))
        if unit.eval is not None:
            out.append(EvalUnit(unit.job_id, unit.eval, []))
    return out


def _split_unit(unit: EvalUnit) -> list[EvalUnit] | None:
    """A unit too big for one entry as smaller ones (allocs first, the eval last)."""
    if unit.eval is not None and unit.allocs:
        return [EvalUnit(unit.job_id, None, unit.allocs), EvalUnit(unit.job_id, unit.eval, [])]
    if len(unit.allocs) > 1:
        half = len(unit.allocs) // 2
        return [EvalUnit(unit.job_id, None, unit.allocs[:half]), EvalUnit(unit.job_id, None, unit.allocs[half:])]
    return None


def _pack(
    items: list[Any],
    caps: list[tuple[Callable[[Any], int], int]],
    make: Callable[[list[Any]], Any],
    limit: int,
    measure: Callable[[Any], int],
    split: Callable[[Any], list[Any] | None] = lambda _: None,
) -> list[Any]:
    """Greedy batches of ``items``: for every ``(count, cap)`` the batch's total stays within
    ``cap``, and the encoded entry within ``limit`` bytes.

    An item that alone exceeds a bound is ``split`` (in order) if it can be; one
    that cannot be split goes alone if it fits the entry, else it is an error.
    """
    items = list(items)
    bodies: list[Any] = []
    i, guess = 0, 0
    while i < len(items):
        n, totals = 0, [0] * len(caps)
        while i + n < len(items):
            adds = [count(items[i + n]) for count, _ in caps]
            if n and any(t + a > cap for t, a, (_, cap) in zip(totals, adds, caps, strict=True)):
                break
            totals = [t + a for t, a in zip(totals, adds, strict=True)]
            n += 1
        if guess:
            n = min(n, guess)
        while True:
            body = make(items[i : i + n])
            size = measure(body)
            over_cap = n == 1 and any(count(items[i]) > cap for count, cap in caps)
            if size <= limit and not over_cap:
                break
            if n == 1:
                parts = split(items[i])
                if parts is not None:
                    items[i : i + 1] = parts
                    continue
                if size > limit:
                    raise GCError(f"one reap item encodes to {size} bytes, over the {limit} byte entry limit")
                break  # one indivisible item over a count cap: it goes alone
            n = max(1, min(n - 1, n * limit // size))
        bodies.append(body)
        i += n
        guess = n + n // 4 + 1 if size > limit * 3 // 4 else 0
    return bodies


def _objects_of(plan: Plan) -> Callable[[m.Reap], int]:
    """How many objects reaping one job removes (the job and its cascade)."""

    def count(reap: m.Reap) -> int:
        c = plan.cascade.get(reap.id)
        return 1 + (len(c.evals) + len(c.allocs) + len(c.deployments) if c is not None else 0)

    return count


def reap_bodies(plan: Plan, limits: Limits, measure: Callable[[Any], int] = entry_size) -> list[Any]:
    """The reap entries (message bodies) that carry out ``plan``, in order."""
    limit = limits.max_entry_bytes - ENTRY_MARGIN
    if plan.kind == GC_EVAL:
        return _pack(
            _split_units(plan.units),
            [(EvalUnit.ids, min(limits.reap_batch, limits.objects_per_entry))],
            lambda units: m.EvalReap(
                evals=[u.eval for u in units if u.eval is not None],
                allocs=[a for u in units for a in u.allocs],
            ),
            limit,
            measure,
            _split_unit,
        )
    one: Callable[[Any], int] = lambda _: 1  # noqa: E731
    makers: dict[str, tuple[list[tuple[Callable[[Any], int], int]], Callable[[list[m.Reap]], Any]]] = {
        GC_JOB: (
            [(one, limits.job_batch), (_objects_of(plan), limits.objects_per_entry)],
            lambda rs: m.JobBatchDeregister(jobs=rs),
        ),
        GC_DEPLOYMENT: ([(one, limits.reap_batch)], lambda rs: m.DeploymentReap(deployments=rs)),
        GC_NODE: ([(one, limits.reap_batch)], lambda rs: m.NodeReap(nodes=rs)),
        GC_TOKEN: ([(one, limits.token_batch)], lambda rs: m.ACLTokenDelete(reaps=rs)),
    }
    caps, make = makers[plan.kind]
    return _pack(plan.reaps, caps, make, limit, measure)


def tally(plan: Plan, body: Any, value: dict[str, Any]) -> tuple[dict[str, int], int]:
    """(objects removed per table, ids skipped) from one reap entry's apply result."""
    counts: dict[str, int] = {}
    if isinstance(body, m.EvalReap):
        counts = {"evals": len(value.get("evals", [])), "allocs": len(value.get("allocs", []))}
    elif isinstance(body, m.JobBatchDeregister):
        reaped = value.get("reaped", [])
        counts = {"jobs": len(reaped), "evals": 0, "allocs": 0, "deployments": 0}
        for job_id in reaped:
            cascade = plan.cascade.get(job_id)
            if cascade is not None:
                counts["evals"] += len(cascade.evals)
                counts["allocs"] += len(cascade.allocs)
                counts["deployments"] += len(cascade.deployments)
    elif isinstance(body, m.DeploymentReap):
        counts = {"deployments": len(value.get("reaped", []))}
    elif isinstance(body, m.NodeReap):
        counts = {"nodes": len(value.get("reaped", []))}
    elif isinstance(body, m.ACLTokenDelete):
        counts = {"acl_tokens": len(value.get("deleted", []))}
    return counts, len(value.get("skipped", []))


# -- the collector ------------------------------------------------------------------
@dataclass
class Outcome:
    """What one run (a sweep of some kinds) did."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NAMES, 0))
    skipped: int = 0
    entries: int = 0
    index: int = 0
    planned: int = 0
    reads: int = 0

    def add(self, counts: dict[str, int]) -> None:
        for table, n in counts.items():
            self.counts[table] = self.counts.get(table, 0) + n

    def to_nomad(self) -> dict[str, Any]:
        return {
            "Index": self.index,
            "Collected": {NAMES[t]: n for t, n in self.counts.items()},
            "Entries": self.entries,
            "Skipped": self.skipped,
        }


def _now(r: StateReader) -> int:
    """The leader's clock, never behind the time the FSM has already seen."""
    return r.time_from(time.time_ns())


class Collector:
    """One server's GC: plans on committed state and proposes reaps (leader only)."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server
        self.lock = asyncio.Lock()
        self.log = server.log.bind(component="gc")
        self.background: set[asyncio.Task[Any]] = set()

    @property
    def limits(self) -> Limits:
        return Limits.of(self.server.config.gc, leader_entry_bytes(self.server.raft.max_entry_bytes))

    async def run(self, kinds: tuple[str, ...], th: Thresholds, *, forced: bool) -> Outcome:
        """Sweep ``kinds`` in order, each planned on state that includes the previous one's reaps."""
        outcome = Outcome()
        async with self.lock:
            for kind in kinds:
                await self._sweep(kind, th, forced, outcome)
        if outcome.index == 0:
            outcome.index = self.server.fsm.applied_index
        return outcome

    async def _sweep(self, kind: str, th: Thresholds, forced: bool, outcome: Outcome) -> None:
        """One collector: plan a window of marks, propose its reaps, go on with the next window."""
        limits = self.limits
        started = time.monotonic()
        now: list[int] = []
        window = Window(None, MARKS_PER_PLAN)
        tokens_left = limits.token_batch
        counts: dict[str, int] = {}
        skipped = index = entries = marks = 0
        while True:

            def plan_it(r: StateReader, window: Window = window, tokens_left: int = tokens_left) -> tuple[Plan, list[Any]]:
                if not now:
                    now.append(_now(r))  # one cutoff for the whole sweep
                plan = plan_kind(r, kind, now[0], th, token_limit=tokens_left, window=window)
                return plan, reap_bodies(plan, limits)

            plan, bodies = await self.server.local(plan_it)
            marks += plan.marks
            outcome.reads += plan.marks + plan.reads
            outcome.planned += sum(plan.counts().values())
            for body in bodies:
                sent = time.monotonic()
                result = await self.server.propose(body)
                # Leave the log to other writers: pause PACE times as long as this reap took.
                await asyncio.sleep(min(PACE * (time.monotonic() - sent), PACE_MAX))
                got, skip = tally(plan, body, result["value"])
                for table, n in got.items():
                    counts[table] = counts.get(table, 0) + n
                skipped += skip
                index = max(index, result["index"])
                entries += 1
            tokens_left -= len(plan.reaps) if kind == GC_TOKEN else 0
            if plan.resume is None or tokens_left <= 0:
                break
            window = Window(plan.resume, MARKS_PER_PLAN)
        if not entries:
            self.log.debug("gc sweep found nothing", kind=kind, marks=marks, forced=forced)
            return
        outcome.add(counts)
        metrics.record_gc(counts)  # optional hook; never raises
        outcome.entries += entries
        outcome.skipped += skipped
        outcome.index = max(outcome.index, index)
        self.log.info(
            "gc reaped",
            kind=kind,
            forced=forced,
            index=index,
            entries=entries,
            skipped=skipped,
            marks=marks,
            seconds=round(time.monotonic() - started, 3),
            **{t: n for t, n in counts.items() if n},
        )

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


_COLLECTORS: weakref.WeakKeyDictionary[Any, Collector] = weakref.WeakKeyDictionary()


def collector(server: ServerAPI) -> Collector:
    found = _COLLECTORS.get(server)
    if found is None:
        found = _COLLECTORS[server] = Collector(server)
    return found


# -- leader loops -------------------------------------------------------------------
def _sweep_loop(kind: str) -> Callable[[ServerAPI], Any]:
    async def loop(server: ServerAPI) -> None:
        gc = collector(server)
        interval = getattr(server.config.gc, f"{kind}_interval")
        while True:
            await asyncio.sleep(interval)
            try:
                await gc.run((kind,), thresholds_of(server.config.gc), forced=False)
            except RPCError as exc:
                # Losing leadership cancels this loop anyway; anything else is
                # retried next interval (a reap that did commit is skipped then).
                level = gc.log.info if exc.code in LEADERSHIP_LOST else gc.log.warning
                level("gc sweep cut short; the next sweep plans again", kind=kind, error=str(exc))
            except GCError as exc:
                gc.log.error("gc sweep could not batch its reaps", kind=kind, error=str(exc))

    loop.__qualname__ = f"gc_{kind}_sweep"
    return loop


LEADER_LOOPS = [_sweep_loop(kind) for kind in GC_KINDS]


# -- the admin RPC ------------------------------------------------------------------
async def force(gc: Collector) -> Outcome:
    try:
        outcome = await gc.run(FORCE_ORDER, Thresholds.zero(), forced=True)
    except GCError as exc:
        raise RPCError(INTERNAL, f"garbage collection could not batch its reaps: {exc}") from None
    gc.log.info(
        "forced gc done",
        index=outcome.index,
        entries=outcome.entries,
        skipped=outcome.skipped,
        **{t: n for t, n in outcome.counts.items() if n},
    )
    return outcome


async def force_detached(gc: Collector) -> None:
    try:
        await force(gc)
    except RPCError as exc:
        gc.log.warning("detached forced gc stopped", error=str(exc))


def dry_run(r: StateReader, token_limit: int) -> dict[str, Any]:
    plans = plan_all(r, _now(r), Thresholds.zero(), token_limit=token_limit)
    ids: dict[str, list[str]] = {t: [] for t in NAMES}
    for plan in plans:
        for table, found in plan.ids().items():
            ids[table].extend(found)
    return {
        "DryRun": True,
        "Index": r.applied_index,
        "Collected": {NAMES[t]: len(v) for t, v in ids.items()},
        "IDs": {NAMES[t]: sorted(v)[:DRY_RUN_IDS] for t, v in ids.items()},
        "Truncated": any(len(v) > DRY_RUN_IDS for v in ids.values()),
    }


