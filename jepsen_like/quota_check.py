"""The quota checker: no queue or cohort is ever over-admitted, no workload is lost, replicas agree.

Input: the ``quota`` workload's history (``jepsen_like.quota``): the
queues it defined (the set-up operation's input: the checker judges
against what was asked), every ledger sample (one ``queue.list`` read, a
consistent cut, through the leader or one server's own state), every
single-workload read, the leader's census after healing and every
server's own state read at one index.

Anomalies (the product is wrong), on every sample, in two arithmetics --
``fsm.quota.Ledger.violations()`` and this module's own, written from
Kueue's rules and not from that code:

* a queue uses more than its nominal quota plus its borrowing limit (no
  cohort: more than its nominal);
* a cohort uses more than the sum of its queues' nominal quotas;
* what the cohort's queues use above their nominal exceeds what the
  others leave unused of their lendable quota (a lending limit broken);
* the ledger view contradicts itself or the queues as defined: limits
  other than those set, ``borrowed`` other than use above nominal,
  ``lent`` above the queue's lending limit or its unused quota, a cohort
  whose ``lent`` and ``borrowed`` totals differ.

After healing:

* lost: a job whose registration was acknowledged and that was never
  stopped has no workload, or its service's workload finished (a batch
  job's may: it completed); a read during the run that showed the same;
* a job acknowledged stopped still holds quota or waits in line;
* a job whose every registration was refused has a workload;
* a workload's ask or queue is none the job asked for;
* on a server: the ledger's ``used`` is not the sum of the admitted
  workloads' usage, or the admitted/pending counts are not theirs;
* servers that read their state at one index disagree on any workload's
  state, queue or usage, or on any ledger (the admitted set above all).

Unknown (the harness could not show it either way): the queues were never
set up, no sample was read, nothing was acknowledged, no census was read,
or the servers never showed one unchanged index for the replica read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from fsm.queues import Queue, QuotaLimit
from fsm.quota import Ledger
from jepsen_like.checkers import CheckerResult
from jepsen_like.history import Event, Operation, operations_from_events

CHECKER = "quota"
WORKLOAD = "quota"
PENDING, ADMITTED, FINISHED = "pending", "admitted", "finished"
LIMIT_KEYS = ("nominal", "borrowing_limit", "lending_limit")


def _f(op: Operation) -> str:
    return op.input.get("f", "") if isinstance(op.input, dict) else ""


def _mark(op: Operation | None, why: str) -> list[dict[str, Any]]:
    if op is None:
        return []
    return [{"workload": WORKLOAD, "process": op.process, "call_time": op.call_time, "why": why}]


# -- the queues as defined ---------------------------------------------------------------------
def queue_records(defs: list[dict[str, Any]]) -> list[Queue]:
    """The set-up's queue definitions as the FSM's records (for ``fsm.quota.Ledger``)."""
    return [
        Queue(
            name=d["name"],
            cohort=d.get("cohort") or "",
            resources=[
                QuotaLimit(
                    name=r["name"],
                    nominal=int(r.get("nominal") or 0),
                    borrowing_limit=r.get("borrowing_limit"),
                    lending_limit=r.get("lending_limit"),
                )
                for r in d.get("resources") or []
            ],
        )
        for d in defs
    ]


def _limits(defs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """queue -> resource -> {nominal, borrowing_limit, lending_limit} (None: unset)."""
    return {
        d["name"]: {
            r["name"]: {k: r.get(k) if k != "nominal" else int(r.get(k) or 0) for k in LIMIT_KEYS}
            for r in d.get("resources") or []
        }
        for d in defs
    }


def _groups(defs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Cohort -> its queues; a queue without a cohort is a group of its own (``/name``)."""
    out: dict[str, list[str]] = defaultdict(list)
    for d in defs:
        out[d.get("cohort") or f"/{d['name']}"].append(d["name"])
    return dict(out)


def _lendable(limit: dict[str, Any]) -> int:
    nominal = limit["nominal"]
    return nominal if limit["lending_limit"] is None else min(nominal, limit["lending_limit"])


# -- the arithmetic, written again from Kueue's rules ------------------------------------------
def quota_violations(defs: list[dict[str, Any]], used: dict[str, dict[str, int]]) -> list[str]:
    """Every quota invariant ``used`` (queue -> resource -> amount) breaks, by this module's own arithmetic."""
    limits = _limits(defs)
    out: list[str] = []
    for group, names in sorted(_groups(defs).items()):
        cohort = not group.startswith("/")
        for resource in sorted({r for n in names for r in limits[n]}):
            members = [n for n in names if resource in limits[n]]
            total = borrowed = unused_lendable = usage = 0
            for name in members:
                limit = limits[name][resource]
                u = used.get(name, {}).get(resource, 0)
                usage += u
                total += limit["nominal"]
                if not cohort and u > limit["nominal"]:
                    out.append(
                        f"queue {name} uses {u} {resource}, above its nominal {limit['nominal']} (no cohort)"
                    )
                if cohort and limit["borrowing_limit"] is not None:
                    cap = limit["nominal"] + limit["borrowing_limit"]
                    if u > cap:
                        out.append(
                            f"queue {name} uses {u} {resource}, above its nominal {limit['nominal']} plus "
                            f"borrowing limit {limit['borrowing_limit']}"
                        )
                borrowed += max(0, u - limit["nominal"])
                unused_lendable += max(0, min(_lendable(limit), limit["nominal"] - u))
            if not cohort:
                continue
            if usage > total:
                out.append(f"cohort {group} uses {usage} {resource}, above its total {total}")
            if borrowed > unused_lendable:
                out.append(
                    f"cohort {group}'s queues borrow {borrowed} {resource} above their nominal, but the others "
                    f"leave only {unused_lendable} of their lendable quota unused (a lending limit is broken)"
                )
    return out


def view_contradictions(defs: list[dict[str, Any]], queues: dict[str, Any]) -> list[str]:
    """Where a sample's ledger view contradicts the queues as defined or itself."""
    limits = _limits(defs)
    out: list[str] = []
    for name in sorted(limits):
        if name not in queues:
            out.append(f"queue {name} is missing from the list")
    lent_total: dict[tuple[str, str], int] = defaultdict(int)
    borrowed_total: dict[tuple[str, str], int] = defaultdict(int)
    for name, row in sorted(queues.items()):
        if name not in limits:
            continue
        for resource, limit in sorted(limits[name].items()):
            view = (row.get("ledger") or {}).get(resource)
            if view is None:
                out.append(f"queue {name}'s ledger has no {resource}")
                continue
            shown = {k: view.get(k) for k in LIMIT_KEYS}
            if shown != limit:
                out.append(
                    f"queue {name} shows {resource} limits {shown}, not the {limit} it was given"
                )
            used, nominal = int(view.get("used") or 0), limit["nominal"]
            borrowed, lent = int(view.get("borrowed") or 0), int(view.get("lent") or 0)
            if borrowed != max(0, used - nominal):
                out.append(
                    f"queue {name} shows {resource} borrowed {borrowed} with {used} used of {nominal} nominal"
                )
            if lent > min(_lendable(limit), max(0, nominal - used)):
                out.append(
                    f"queue {name} shows {resource} lent {lent}, above its lendable "
                    f"{_lendable(limit)} or unused {max(0, nominal - used)}"
                )
            cohort = row.get("cohort") or ""
            if cohort:
                lent_total[cohort, resource] += lent
                borrowed_total[cohort, resource] += borrowed
    for key in sorted(set(lent_total) | set(borrowed_total)):
        if lent_total[key] != borrowed_total[key]:
            out.append(
                f"cohort {key[0]} shows {key[1]} lent {lent_total[key]} but borrowed {borrowed_total[key]}"
            )
    return out


def sample_used(queues: dict[str, Any]) -> dict[str, dict[str, int]]:
    """queue -> resource -> used, from a sample's ledger view."""
    return {
        name: {res: int(view.get("used") or 0) for res, view in (row.get("ledger") or {}).items()}
        for name, row in queues.items()
    }


def check_sample(
    defs: list[dict[str, Any]], records: list[Queue], queues: dict[str, Any]
) -> list[str]:
    """Every problem of one ledger sample: the FSM's arithmetic, this module's, and the view's own sums."""
    used = sample_used(queues)
    ledger = Ledger.build([q for q in records if q.name in queues], used.items())
    problems = [f"Ledger.violations: {v}" for v in ledger.violations()]
    problems += quota_violations(defs, used)
    problems += view_contradictions(defs, queues)
    return problems


# -- jobs: what was asked and acknowledged ---------------------------------------------------
class Jobs:
    """Per job: its registrations and stops, with their outcomes."""

    def __init__(self, ops: Sequence[Operation]) -> None:
        self.writes: dict[str, list[Operation]] = defaultdict(list)
        self.stops: dict[str, list[Operation]] = defaultdict(list)
        self.kind: dict[str, str] = {}
        self.queue: dict[str, str] = {}
        for op in ops:
            f = _f(op)
            if f in ("register", "resize"):
                job = op.input["job"]
                self.writes[job].append(op)
                self.kind.setdefault(job, op.input.get("kind", ""))
                self.queue.setdefault(job, op.input.get("queue", ""))
            elif f == "stop":
                self.stops[op.input["job"]].append(op)

    def acked(self, job: str) -> bool:
        return any(op.status == "ok" for op in self.writes[job])

    def refused(self, job: str) -> bool:
        """Every registration of the job definitely had no effect."""
        return bool(self.writes[job]) and all(op.status == "fail" for op in self.writes[job])

    def uncertain_write(self, job: str) -> bool:
        return any(op.status == "info" for op in self.writes[job])

    def stop_tried(self, job: str, before: float = float("inf")) -> bool:
        """A stop that may have taken effect, invoked before ``before``."""
        return any(op.status != "fail" and op.call_time < before for op in self.stops[job])

    def stop_acked(self, job: str) -> bool:
        return any(op.status == "ok" for op in self.stops[job])

    def usages(self, job: str) -> list[dict[str, int]]:
        return [op.input.get("usage") or {} for op in self.writes[job] if op.status != "fail"]


def _lost(
    jobs: Jobs, job: str, wl: dict[str, Any] | None, where: str, collected: bool = False
) -> str:
    """Why an acknowledged, never-stopped job's workload counts as lost ("" if it does not).

    ``collected``: the job itself is gone too; a batch job's is then excused
    (a finished batch job may be collected by the GC, with its workload).
    """
    if wl is None and collected and jobs.kind.get(job) == "batch":
        return ""
    if wl is None:
        return f"{job} ({jobs.kind.get(job)} in {jobs.queue.get(job)}, acknowledged, never stopped) has no workload {where}"
    if wl.get("state") == FINISHED and jobs.kind.get(job) == "service":
        return f"service {job} in {jobs.queue.get(job)} was never stopped, yet its workload finished {where}"
    if wl.get("state") not in (PENDING, ADMITTED, FINISHED):
        return f"{job}'s workload is in an unknown state {wl.get('state')!r} {where}"
    return ""


def census_problems(
    jobs: Jobs, census: dict[str, Any], gone: dict[str, Any] | None = None
) -> tuple[list[str], list[str]]:
    """(lost workloads, other problems) in the leader's census after healing.

    ``gone``: for jobs without a workload, the job's status, None when the
    job itself was not found.
    """
    lost, other = [], []
    gone = gone or {}
    for job, wl in sorted(census.items()):
        if jobs.acked(job) and not jobs.stop_tried(job):
            collected = job in gone and gone[job] is None
            why = _lost(jobs, job, wl, "after healing", collected)
            if why:
                lost.append(why)
        if wl is None:
            continue
        if (
            jobs.stop_acked(job)
            and not jobs.uncertain_write(job)
            and wl.get("state") in (PENDING, ADMITTED)
        ):
            other.append(
                f"{job} was stopped (acknowledged), yet its workload is still {wl['state']}"
            )
        if jobs.refused(job):
            other.append(
                f"{job}'s every registration was refused, yet it has a {wl.get('state')} workload"
            )
            continue
        usage = {k: v for k, v in (wl.get("usage") or {}).items() if v}
        if usage not in jobs.usages(job):
            other.append(f"{job}'s workload asks {usage}, which no registration of it asked")
        if jobs.queue.get(job) and wl.get("queue") != jobs.queue[job]:
            other.append(f"{job}'s workload is in queue {wl.get('queue')}, not {jobs.queue[job]}")
    return lost, other


def read_problems(jobs: Jobs, reads: Sequence[Operation]) -> list[tuple[Operation, str]]:
    """Linearizable reads during the run that showed an acknowledged, unstopped job's workload lost."""
    out = []
    for op in reads:
        job = op.input["job"]
        acked_before = any(
            w.status == "ok" and w.return_time < op.call_time for w in jobs.writes[job]
        )
        if not acked_before or jobs.stop_tried(job, before=op.return_time):
            continue
        if op.output is None and jobs.kind.get(job) == "batch":
            continue  # it may have finished and been collected; the census after healing tells
        why = _lost(jobs, job, op.output, f"in a read at {op.call_time:.1f}s")
        if why:
            out.append((op, why))
    return out


# -- every server's own state ------------------------------------------------------------------
def server_problems(
    defs: list[dict[str, Any]], records: list[Queue], name: str, read: dict[str, Any]
) -> list[str]:
    """One server's own state: its ledger keeps the quota and is the sum of its admitted workloads."""
    queues, workloads = read.get("queues") or {}, read.get("workloads") or {}
    out = [f"{name}: {p}" for p in check_sample(defs, records, queues)]
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for wl in workloads.values():
        if wl is None:
            continue
        counts[wl.get("queue", ""), wl.get("state", "")] += 1
        if wl.get("state") == ADMITTED:
            for res, amount in (wl.get("usage") or {}).items():
                sums[wl.get("queue", "")][res] += int(amount)
    for q, row in sorted(queues.items()):
        for res, view in sorted((row.get("ledger") or {}).items()):
            if int(view.get("used") or 0) != sums[q][res]:
                out.append(
                    f"{name}: queue {q}'s ledger shows {res} used {view.get('used')}, but its admitted "
                    f"workloads ask {sums[q][res]}"
                )
        for state, key in ((ADMITTED, "admitted"), (PENDING, "pending")):
            if int(row.get(key) or 0) != counts[q, state]:
                out.append(
                    f"{name}: queue {q} counts {row.get(key)} {key}, but holds {counts[q, state]} {state} workloads"
                )
    return out


def replica_disagreements(reads: dict[str, Any]) -> list[str]:
    """Servers (read at one index) that disagree on a workload or a ledger."""
    answered = {n: r for n, r in sorted(reads.items()) if "error" not in r}
    if len(answered) < 2:
        return []
    out = []
    names = list(answered)
    first = answered[names[0]]

    def state(r: dict[str, Any]) -> dict[str, Any]:
        return {
            j: None
            if w is None
            else (w.get("state"), w.get("queue"), sorted((w.get("usage") or {}).items()))
            for j, w in (r.get("workloads") or {}).items()
        }

    def admitted(r: dict[str, Any]) -> set[str]:
        return {
            j for j, w in (r.get("workloads") or {}).items() if w and w.get("state") == ADMITTED
        }

    for other in names[1:]:
        r = answered[other]
        a, b = admitted(first), admitted(r)
        if a != b:
            out.append(
                f"{names[0]} and {other} admit different sets: only on {names[0]}: {sorted(a - b)[:5]}, "
                f"only on {other}: {sorted(b - a)[:5]}"
            )
        sa, sb = state(first), state(r)
        differ = sorted(j for j in set(sa) | set(sb) if sa.get(j) != sb.get(j))
        if differ:
            out.append(
                f"{names[0]} and {other} disagree on {len(differ)} workload(s): {differ[:5]}"
            )
        ua, ub = sample_used(first.get("queues") or {}), sample_used(r.get("queues") or {})
        if ua != ub:
            out.append(f"{names[0]} and {other} hold different ledgers: {ua} vs {ub}")
    return out


# -- the verdict -------------------------------------------------------------------------------
def _last(ops: Sequence[Operation], f: str) -> Operation | None:
    found = [op for op in ops if _f(op) == f and op.status == "ok"]
    return found[-1] if found else None


def check_quota(events: Sequence[Event]) -> CheckerResult:
    ops = sorted(operations_from_events(events), key=lambda o: o.call_time)
    setups = [op for op in ops if _f(op) == "setup"]
    defs: list[dict[str, Any]] = list(setups[0].input.get("queues") or []) if setups else []
    records = queue_records(defs)
    jobs = Jobs(ops)
    samples = [op for op in ops if _f(op) == "ledger" and op.status == "ok"]
    reads = [op for op in ops if _f(op) == "workload" and op.status == "ok"]
    census_op, replicas_op = _last(ops, "census"), _last(ops, "replicas")

    over: list[tuple[Operation, str]] = []
    per_server: dict[str, int] = defaultdict(int)
    max_borrowed: dict[str, int] = defaultdict(int)
    for op in samples:
        server = op.input.get("server", "?")
        per_server[server] += 1
        queues = (op.output or {}).get("queues") or {}
        for problem in check_sample(defs, records, queues):
            over.append(
                (
                    op,
                    f"{server}{' (stale)' if op.input.get('stale') else ''} at {op.call_time:.1f}s: {problem}",
                )
            )
        for name, row in queues.items():
            for res, view in (row.get("ledger") or {}).items():
                key = f"{name}/{res}"
                max_borrowed[key] = max(max_borrowed[key], int(view.get("borrowed") or 0))

    census = ((census_op.output or {}).get("workloads") or {}) if census_op else {}
    gone = ((census_op.output or {}).get("jobs") or {}) if census_op else {}
    lost, other = census_problems(jobs, census, gone) if census_op else ([], [])
    lost_reads = read_problems(jobs, reads)
    replicas = ((replicas_op.output or {}).get("servers") or {}) if replicas_op else {}
    consistent = bool(replicas_op and (replicas_op.output or {}).get("consistent"))
    servers: list[str] = []
    disagree: list[str] = []
    if consistent:
        for name, read in sorted(replicas.items()):
            servers += server_problems(defs, records, name, read)
        disagree = replica_disagreements(replicas)

    states = defaultdict(int)
    for wl in census.values():
        states[(wl or {}).get("state") or "none"] += 1
    acked = [j for j in jobs.writes if jobs.acked(j)]
    details: dict[str, Any] = {
        "queues": [d["name"] for d in defs],
        "samples": len(samples),
        "samples_per_server": dict(per_server),
        "max_borrowed": dict(max_borrowed),
        "jobs_registered": len(acked),
        "jobs_stopped": sum(1 for j in jobs.stops if jobs.stop_acked(j)),
        "workload_reads": len(reads),
        "final_states": dict(states),
        "collected": sorted(j for j, status in gone.items() if status is None)[:50],
        "evicted_workloads": sum(1 for wl in census.values() if wl and wl.get("evictions")),
        "evictions": sum(int(wl.get("evictions") or 0) for wl in census.values() if wl),
        "settled": bool(census_op and (census_op.output or {}).get("settled")),
        "replicas_consistent": consistent,
        "replica_indexes": {n: r.get("index_before", r.get("error")) for n, r in replicas.items()},
        "over_admitted": [w for _, w in over[:50]],
        "lost": (lost + [w for _, w in lost_reads])[:50],
        "other": other[:50],
        "servers": servers[:50],
        "replicas_disagree": disagree[:50],
    }
    problems = [
        ([w for _, w in over], "over-admitted or contradictory ledger samples"),
        (lost + [w for _, w in lost_reads], "lost workloads"),
        (other, "workloads that do not match their jobs"),
        (servers, "server ledgers that are not their workloads' sum"),
        (disagree, "replica disagreements"),
    ]
    found = [f"{len(p)} {what}: {'; '.join(p[:3])}" for p, what in problems if p]
    if found:
        marks: list[dict[str, Any]] = []
        for op, why in over[:5] + lost_reads[:5]:
            marks += _mark(op, why[:120])
        if lost or other:
            marks += _mark(census_op, "census after healing")
        if servers or disagree:
            marks += _mark(replicas_op, "every server's own state")
        return CheckerResult(
            CHECKER, WORKLOAD, "anomaly", "; ".join(found), len(ops), details, marks[:20]
        )
    gap = _harness_gaps(setups, samples, acked, census_op, replicas_op, consistent)
    if gap:
        return CheckerResult(CHECKER, WORKLOAD, "unknown", gap, len(ops), details)
    borrowed = len({k.split("/")[0] for k, v in max_borrowed.items() if v})
    return CheckerResult(
        CHECKER,
        WORKLOAD,
        "ok",
        f"{len(samples)} ledger samples over {len(per_server)} views keep every quota ({borrowed} queue(s) "
        f"seen borrowing); {len(acked)} jobs, none lost ({details['evicted_workloads']} evicted at least once); "
        f"{len(replicas)} servers agree at index {next(iter(details['replica_indexes'].values()), '?')}",
        len(ops),
        details,
    )


def _harness_gaps(
    setups: list[Operation],
    samples: list[Operation],
    acked: list[str],
    census: Operation | None,
    replicas: Operation | None,
    consistent: bool,
) -> str:
    """Why the run cannot show the properties either way ("" if it can): a harness failure, not an anomaly."""
    if not setups or not any(op.status == "ok" for op in setups):
        return "the queues were never set up (no acknowledged queue.upsert)"
    if not samples:
        return "no ledger sample was read"
    if not acked:
        return "no job registration was acknowledged; nothing was exercised"
    if census is None:
        return "no census of the workloads was read after healing"
    if replicas is None or not consistent:
        return "the servers never showed one unchanged applied index, so their states could not be compared"
    return ""
