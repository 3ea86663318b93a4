"""Admission and preemption for queues with cohorts, as properties against a reference written apart.

The reference here recomputes Kueue's conditions from the admitted sets
alone (no ``Ledger``): a queue stays within nominal plus its borrowing
limit, a cohort's borrowers fit in what its queues may lend, and nothing
lends beyond its lending limit. The cycles run on generated queues,
cohorts and submissions, with workloads finishing and queues held,
drained and resumed between them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.queues import (
    ANY,
    BEST_EFFORT_FIFO,
    LOWER_OR_NEWER_EQUAL,
    LOWER_PRIORITY,
    NEVER,
    STOP_HOLD,
    STOP_HOLD_AND_DRAIN,
    STOP_NONE,
    STRICT_FIFO,
    Queue,
    QuotaLimit,
)
from fsm.quota import Ledger
from scheduler.queueing import (
    Line,
    Waiting,
    candidates,
    cycle,
    line_order,
    minimal,
    plan,
    victim_order,
    victims,
)

RESOURCES = ("gpu", "cpu")


# -- the reference ---------------------------------------------------------------------
def used_by(line: Line) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, running in line.admitted.items():
        for w in running:
            for r, amount in w.usage.items():
                out.setdefault(name, {}).setdefault(r, 0)
                out[name][r] += amount
    return out


def ref_violations(queues: Mapping[str, Queue], used: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Kueue's quota conditions, from the definitions."""
    out = []
    cohorts: dict[str, list[Queue]] = {}
    for q in queues.values():
        if q.cohort:
            cohorts.setdefault(q.cohort, []).append(q)
        for lim in q.resources:
            u = used.get(q.name, {}).get(lim.name, 0)
            if not q.cohort and u > lim.nominal:
                out.append(f"{q.name} above nominal {lim.name}")
            if q.cohort and lim.borrowing_limit is not None and u > lim.nominal + lim.borrowing_limit:
                out.append(f"{q.name} above its borrowing limit of {lim.name}")
    for cohort, members in cohorts.items():
        for r in RESOURCES:
            borrowed = lendable_unused = 0
            for q in members:
                lim = q.limit(r)
                if lim is None:
                    continue
                u = used.get(q.name, {}).get(r, 0)
                lendable = lim.nominal if lim.lending_limit is None else min(lim.nominal, lim.lending_limit)
                borrowed += max(0, u - lim.nominal)
                lendable_unused += max(0, min(lendable, lim.nominal - u))
            if borrowed > lendable_unused:
                out.append(f"cohort {cohort} borrows {borrowed} {r}, more than the {lendable_unused} lendable")
    return out


def ref_fits(line: Line, w: Waiting, removed: set[str], *, borrow: bool) -> bool:
    """Whether ``w`` fits once ``removed`` (job ids) are gone, by the definitions."""
    used = used_by(line)
    for running in line.admitted.values():
        for v in running:
            if v.job_id in removed:
                for r, a in v.usage.items():
                    used[v.queue][r] -= a
    used.setdefault(w.queue, {})
    queue = line.ledger.queues[w.queue]
    for r, a in w.usage.items():
        used[w.queue][r] = used[w.queue].get(r, 0) + a
        lim = queue.limit(r)
        if lim is not None and not borrow and used[w.queue][r] > lim.nominal:
            return False
    return not ref_violations(line.ledger.queues, used)


# -- generators ----------------------------------------------------------------------------
@st.composite
def queues(draw: st.DrawFn) -> dict[str, Queue]:
    out = {}
    for i in range(draw(st.integers(1, 5))):
        cohort = draw(st.sampled_from(["", "lab", "lab", "ops"]))
        limits = []
        for r in RESOURCES:
            if r == "cpu" and draw(st.booleans()):
                continue  # a queue need not limit every resource
            nominal = draw(st.integers(0, 6))
            borrowing = draw(st.one_of(st.none(), st.integers(0, 4))) if cohort else None
            lending = draw(st.one_of(st.none(), st.integers(0, nominal))) if cohort else None
            limits.append(QuotaLimit(r, nominal, borrowing, lending))
        out[f"q{i}"] = Queue(
            name=f"q{i}", cohort=cohort, resources=limits,
            reclaim_within_cohort=draw(st.sampled_from([NEVER, LOWER_PRIORITY, ANY])),
            within_queue=draw(st.sampled_from([NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL])),
            queueing_strategy=draw(st.sampled_from([STRICT_FIFO, BEST_EFFORT_FIFO])),
        )  # fmt: skip
    return out


def submissions(names: list[str]) -> st.SearchStrategy[list[tuple[str, int, dict[str, int]]]]:
    usage = st.fixed_dictionaries({"gpu": st.integers(1, 4)}, optional={"cpu": st.integers(1, 3)})
    return st.lists(st.tuples(st.sampled_from(names), st.integers(0, 3), usage), min_size=1, max_size=14)


Op = tuple[str, int]
OPS = st.lists(st.tuples(st.sampled_from(["cycle", "cycle", "finish", "hold", "drain", "resume"]), st.integers(0, 99)),
               max_size=12)  # fmt: skip


def check(line: Line, submitted: set[str]) -> None:
    assert used_by(line) == {q: u for q, u in line.ledger.used.items() if u} or all(
        not u for u in line.ledger.used.values()
    ), "the ledger equals a recount of the admitted"
    assert not ref_violations(line.ledger.queues, used_by(line))
    assert not line.ledger.violations()
    for name, queue in line.ledger.queues.items():
        lent = line.ledger.lent(name)
        for lim in queue.resources:
            cap = lim.nominal if lim.lending_limit is None else min(lim.nominal, lim.lending_limit)
            assert lent.get(lim.name, 0) <= cap, f"{name} lends more {lim.name} than its lending limit"
    pending = [w.job_id for ws in line.pending.values() for w in ws]
    admitted = [w.job_id for ws in line.admitted.values() for w in ws]
    assert len(set(pending)) == len(pending) and not set(pending) & set(admitted)
    assert set(pending) | set(admitted) == submitted, "no workload is lost: evicted ones are pending again"
    for ws in line.pending.values():
        assert ws == sorted(ws, key=line_order), "each line keeps its order"


def _step(line: Line, op: Op, submitted: set[str], finished: set[str]) -> None:
    kind, pick = op
    names = sorted(line.ledger.queues)
    if kind == "cycle":
        plan(line, max_cycles=4)
        return
    if kind == "finish":
        running = [w for ws in line.admitted.values() for w in ws]
        if running:
            w = running[pick % len(running)]
            line.admitted[w.queue].remove(w)
            line.ledger.remove(w.queue, w.usage)
            submitted.discard(w.job_id)
            finished.add(w.job_id)
        return
    policy = {"hold": STOP_HOLD, "drain": STOP_HOLD_AND_DRAIN, "resume": STOP_NONE}[kind]
    name = names[pick % len(names)]
    line.ledger.queues[name].stop_policy = policy
    if kind == "hold":
        before = len(line.admitted.get(name, []))
        plan(line)
        assert len(line.admitted.get(name, [])) <= before, "a held queue admits nothing new"


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_cycles_keep_every_quota_and_lose_no_workload(data: st.DataObject) -> None:
    qs = data.draw(queues())
    line = Line(Ledger(qs))
    submitted: set[str] = set()
    finished: set[str] = set()
    for i, (name, priority, usage) in enumerate(data.draw(submissions(sorted(qs)))):
        w = Waiting(f"j{i}", name, priority, i + 1, usage)
        line.pending.setdefault(name, []).append(w)
        line.pending[name].sort(key=line_order)
        submitted.add(w.job_id)
    check(line, submitted)
    for op in data.draw(OPS):
        _step(line, op, submitted, finished)
        check(line, submitted)
    for name, queue in qs.items():
        if queue.stop_policy == STOP_HOLD_AND_DRAIN:
            plan(line)
            assert not line.admitted.get(name), "HoldAndDrain evicts what runs"


@st.composite
def busy_lines(draw: st.DrawFn) -> tuple[Line, Waiting]:
    """A line with admitted work (admitted by cycles, so within quota) and one newcomer."""
    qs = draw(queues())
    for q in qs.values():
        q.queueing_strategy = BEST_EFFORT_FIFO
    line = Line(Ledger(qs))
    for i, (name, priority, usage) in enumerate(draw(submissions(sorted(qs)))):
        line.pending.setdefault(name, []).append(Waiting(f"j{i}", name, priority, i + 1, usage))
    for ws in line.pending.values():
        ws.sort(key=line_order)
    while cycle(line).admits:
        pass
    for i, ws in enumerate(line.admitted.values()):  # admitted order as the cycles went
        for j, w in enumerate(ws):
            ws[j] = Waiting(w.job_id, w.queue, w.priority, w.create_index, w.usage, admitted_index=100 + i * 10 + j)
    name, priority, usage = draw(submissions(sorted(qs)))[0]
    return line, Waiting("newcomer", name, priority, 1000, usage)


@settings(max_examples=200, deadline=None)
@given(busy_lines(), st.booleans())
def test_the_victim_set_is_minimal(case: tuple[Line, Waiting], borrow: bool) -> None:
    line, w = case
    same, others = candidates(line, w)
    ordered = sorted(same + others, key=lambda v: victim_order(v, w.queue))
    found = minimal(line, w, ordered, borrow=borrow)
    if found is None:
        return
    ids = {v.job_id for v in found}
    assert ref_fits(line, w, ids, borrow=borrow), "without the victims the preemptor fits"
    for size in range(len(ids)):
        for subset in itertools.combinations(sorted(ids), size):
            assert not ref_fits(line, w, set(subset), borrow=borrow), f"{subset} of {sorted(ids)} would do"


@settings(max_examples=200, deadline=None)
@given(busy_lines())
def test_victims_follow_the_policies(case: tuple[Line, Waiting]) -> None:
    line, w = case
    queue = line.ledger.queues[w.queue]
    for ev in victims(line, w):
        v = ev.victim
        if v.queue == w.queue:
            assert queue.within_queue != NEVER and (
                v.priority < w.priority or (queue.within_queue == LOWER_OR_NEWER_EQUAL and v.priority == w.priority)
            )
            assert "prioritization" in ev.message
        else:
            assert queue.cohort and line.ledger.queues[v.queue].cohort == queue.cohort
            assert queue.reclaim_within_cohort == ANY or v.priority < w.priority
            assert "due to reclamation within the cohort" in ev.message


def test_kueues_borrow_and_reclaim_scenario() -> None:
    """team-a borrows team-b's idle GPU; team-b's 2-GPU job reclaims it by evicting exactly one."""
    gpu = [QuotaLimit("gpu", nominal=2)]
    qs = {n: Queue(name=n, cohort="lab", resources=list(gpu), reclaim_within_cohort=ANY, within_queue=LOWER_PRIORITY)
          for n in ("team-a", "team-b")}  # fmt: skip
    line = Line(Ledger(qs))
    line.pending["team-a"] = [Waiting(f"a{i}", "team-a", 0, i, {"gpu": 1}) for i in (1, 2, 3)]
    plan(line)
    assert [w.job_id for w in line.admitted["team-a"]] == ["a1", "a2", "a3"]
    assert line.ledger.borrowed("team-a", "gpu") == 1 and line.ledger.lent("team-b") == {"gpu": 1}
    line.admitted["team-a"] = [Waiting(w.job_id, w.queue, 0, w.create_index, w.usage, admitted_index=i + 1)
                               for i, w in enumerate(line.admitted["team-a"])]  # fmt: skip
    line.pending["team-b"] = [Waiting("b1", "team-b", 0, 4, {"gpu": 2})]
    decided = plan(line)
    assert [e.victim.job_id for e in decided.evictions] == ["a3"], "the most recently admitted borrower"
    assert decided.evictions[0].message == (
        "Preempted to accommodate a workload (UID: default/b1) due to reclamation within the cohort; "
        "preemptor path: /lab/team-b; preemptee path: /lab/team-a"
    )
    assert [w.job_id for w in decided.admits] == ["b1"]
    assert [w.job_id for w in line.pending["team-a"]] == ["a3"], "evicted, pending again in its place"
    assert line.ledger.borrowed("team-a", "gpu") == 0 and line.ledger.usage("team-b", "gpu") == 2
