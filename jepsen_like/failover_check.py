"""The failover checker: every alloc lost with a silenced node is replaced exactly once, and nothing is lost.

Inputs: the ``clients`` nemesis's windows (run.json ``nemesis_stats``:
the nodes silenced, the allocs live on them when they went silent, whether
the servers marked them down) and the ``failover`` workload's history
(every listing of its jobs' allocs, and the final state after healing).

Nomad links a replacement to what it replaces: the new alloc's
``PreviousAllocation`` names the old one, whose ``NextAllocation`` then
names the new one. Every listing is merged into one picture -- a lost
alloc may be collected before the run ends, its replacement still names
it -- and judged, in the spirit of porcupine: plain facts, then rules.

Anomalies (the product is wrong):

* replaced twice: two allocs name the same ``PreviousAllocation``;
* links that disagree: an alloc's ``NextAllocation`` names one that does
  not name it back, or one read shows a replacement while the alloc it
  replaces does not yet name it (both are set by the same plan);
* not replaced: an alloc live on a silenced node that the servers marked
  down and stopped (the nemesis saw every such alloc stop before it
  brought the nodes back, or the alloc was seen ``lost``), of a job that
  still wants it (the workload's jobs never change), has no replacement by
  the end. An alloc whose node came back before the servers acted on its
  going down rightly keeps running: nothing was lost;
* lost: after healing and a bounded wait, a job runs fewer allocs than
  its count (or more: a replacement too many).

Unknown (the harness could not show it either way): no final state was
read, a window's allocs could not be listed, or its nodes were never seen
down or their allocs never seen stopped within the nemesis's waits.

A run in which no silenced node carried an alloc (or the nemesis never
fired, as happens when it is one of many in a mixed run) still checks the
final state -- every job at its count, every replacement link agreeing --
and is ok on that, saying that replacement exactly once was not exercised
(``details["exercised"]`` false).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jepsen_like.checkers import CheckerResult
from jepsen_like.failover import JOB_PREFIX, running
from jepsen_like.history import Event, Operation, operations_from_events

CHECKER = "failover"
WORKLOAD = "failover"


@dataclass
class Picture:
    """Everything the listings showed, merged: the newest row of each alloc, and who replaced whom."""

    allocs: dict[str, dict[str, Any]] = field(default_factory=dict)
    replaced_by: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    first_seen: dict[str, Operation] = field(default_factory=dict)  # alloc id -> the listing that first showed it
    final: Operation | None = None
    listings: int = 0
    #: (listing, replacement, replaced, its NextAllocation) where one read showed both and the replaced one
    #: did not name the replacement back
    unlinked: list[tuple[Operation, str, str, str]] = field(default_factory=list)

    def add(self, op: Operation, rows: list[dict[str, Any]]) -> None:
        reads: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)  # rows of one read: a consistent cut
        for row in rows:
            reads[row.get("Read")][row["ID"]] = row
        for row in rows:
            in_read = reads[row.get("Read")]
            self.allocs[row["ID"]] = row
            self.first_seen.setdefault(row["ID"], op)
            prev = row.get("PreviousAllocation")
            if prev:
                self.replaced_by[prev].add(row["ID"])
                if prev in in_read and in_read[prev].get("NextAllocation") != row["ID"]:
                    self.unlinked.append((op, row["ID"], prev, in_read[prev].get("NextAllocation") or ""))


def picture(events: Sequence[Event]) -> Picture:
    """Merge every successful listing (and the final state) in the order they were taken."""
    pic = Picture()
    for op in sorted(operations_from_events(events), key=lambda o: o.call_time):
        f = op.input.get("f") if isinstance(op.input, dict) else None
        if op.status != "ok":
            continue
        if f == "allocs":
            pic.listings += 1
            pic.add(op, list(op.output or []))
        elif f == "final":
            pic.final = op
            pic.add(op, list((op.output or {}).get("allocs") or []))
    return pic


def _mark(op: Operation | None, why: str) -> list[dict[str, Any]]:
    if op is None:
        return []
    return [{"workload": WORKLOAD, "process": op.process, "call_time": op.call_time, "why": why}]


def replaced_twice(pic: Picture) -> list[str]:
    """Allocs that more than one alloc names as its ``PreviousAllocation``."""
    return [f"{prev[:8]} replaced {len(nexts)} times ({', '.join(sorted(n[:8] for n in nexts))})"
            for prev, nexts in sorted(pic.replaced_by.items()) if len(nexts) > 1]


def broken_links(pic: Picture) -> list[str]:
    """Replacement links that disagree.

    The plan that places a replacement also sets the replaced alloc's
    ``NextAllocation`` (as Nomad's state store does), so no read may show
    one without the other, and the two must name each other.
    """
    problems = []
    for alloc_id, row in sorted(pic.allocs.items()):
        nxt = row.get("NextAllocation")
        if nxt and nxt in pic.allocs and pic.allocs[nxt].get("PreviousAllocation") != alloc_id:
            problems.append(f"{alloc_id[:8]} names {nxt[:8]} as its replacement, which replaces "
                            f"{pic.allocs[nxt].get('PreviousAllocation', '')[:8] or 'nothing'}")
    for op, new, prev, shown in pic.unlinked[:10]:
        problems.append(f"{new[:8]} replaces {prev[:8]}, but a read at {op.call_time:.1f}s showed {prev[:8]} "
                        f"with NextAllocation {shown[:8] or 'empty'}")
    return problems


def _wanted(final: dict[str, Any], job_id: str) -> bool:
    job = (final.get("jobs") or {}).get(job_id)
    return bool(job) and not job.get("stop") and int(job.get("count") or 0) > 0


def not_replaced(pic: Picture, windows: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Silenced allocs that had to be replaced and were not; and how many had to be."""
    final = (pic.final.output or {}) if pic.final else {}
    problems, needed = [], 0
    for n, window in enumerate(windows, 1):
        seen_lost = set(window.get("lost") or [])
        for alloc in window.get("allocs") or []:
            row = pic.allocs.get(alloc["ID"], {})
            lost = window.get("acted") or alloc["ID"] in seen_lost or row.get("ClientStatus") == "lost"
            if not lost or not alloc["JobID"].startswith(JOB_PREFIX) or not _wanted(final, alloc["JobID"]):
                continue  # only the workload's jobs have wants the checker knows never changed
            needed += 1
            if not pic.replaced_by.get(alloc["ID"]):
                status = f"{row.get('DesiredStatus', '?')}/{row.get('ClientStatus', '?')}" if row else "never listed"
                problems.append(f"window {n}: {alloc['JobID']} alloc {alloc['ID'][:8]} on silenced node "
                                f"{alloc['NodeID'][:8]} has no replacement (last seen {status})")
    return problems, needed


def lost_or_extra(pic: Picture) -> list[str]:
    """Jobs that, after healing, do not run exactly their count."""
    final = (pic.final.output or {}) if pic.final else {}
    rows = list(final.get("allocs") or [])
    problems = []
    for job_id, job in sorted((final.get("jobs") or {}).items()):
        if job.get("stop"):
            continue
        have = len(running([a for a in rows if a["JobID"] == job_id]))
        if have != int(job.get("count") or 0):
            word = "lost" if have < int(job["count"]) else "one too many"
            problems.append(f"{job_id} runs {have} of {job['count']} allocs ({word})")
    return problems


def check_failover(events: Sequence[Event], windows: list[dict[str, Any]]) -> CheckerResult:
    pic = picture(events)
    twice = replaced_twice(pic)
    links = broken_links(pic)
    missing, needed = not_replaced(pic, windows)
    lost = lost_or_extra(pic) if pic.final else []
    silenced = sum(len(w.get("allocs") or []) for w in windows)
    details: dict[str, Any] = {
        "windows": len(windows),
        "silenced_nodes": sum(len(w.get("nodes") or []) for w in windows),
        "silenced_allocs": silenced,
        "needed_replacement": needed,
        "replaced": needed - len(missing),
        "listings": pic.listings,
        "allocs_seen": len(pic.allocs),
        "replaced_twice": twice[:50],
        "broken_links": links[:50],
        "not_replaced": missing[:50],
        "lost": lost[:50],
        "final_settled": bool(pic.final and (pic.final.output or {}).get("settled")),
        # evidence, not judged: other faults may cost a node its heartbeat
        "other_nodes_down": sorted({n for w in windows for n in w.get("others_down") or []}),
    }
    ops = len(operations_from_events(events))
    problems = [(twice, "replaced more than once"), (links, "replacement links that disagree"), (missing, "never replaced"),
                (lost, "jobs not at their count")]
    found = [f"{len(p)} {what}: {'; '.join(p[:3])}" for p, what in problems if p]
    if found:
        marks = _mark(pic.final, "final state") if lost or missing else []
        for prev, nexts in pic.replaced_by.items():
            if len(nexts) > 1:
                marks += _mark(max((pic.first_seen[n] for n in nexts), key=lambda o: o.call_time), f"second replacement of {prev[:8]}")
        for op, new, prev, _ in pic.unlinked[:5]:
            marks += _mark(op, f"{prev[:8]} does not name its replacement {new[:8]}")
        return CheckerResult(CHECKER, WORKLOAD, "anomaly", "; ".join(found), ops, details, marks[:20])
    unknown = _harness_gaps(pic, windows)
    if unknown:
        return CheckerResult(CHECKER, WORKLOAD, "unknown", unknown, ops, details)
    details["exercised"] = bool(silenced)
    if not silenced:
        why = "the clients nemesis silenced no node" if not windows else "no silenced node carried an alloc"
        return CheckerResult(
            CHECKER, WORKLOAD, "ok",
            f"{why} (replacement exactly once not exercised); every job runs its count and every replacement "
            f"link agrees ({pic.listings} listings, {len(pic.allocs)} allocs seen)",
            ops, details,
        )
    return CheckerResult(
        CHECKER, WORKLOAD, "ok",
        f"{needed} allocs lost with {details['silenced_nodes']} silenced nodes over {len(windows)} window(s), each replaced "
        f"exactly once; every job runs its count ({pic.listings} listings, {len(pic.allocs)} allocs seen)",
        ops, details,
    )


def _harness_gaps(pic: Picture, windows: list[dict[str, Any]]) -> str:
    """Why the run cannot show the property either way ("" if it can): a harness failure, not a product anomaly."""
    if pic.final is None:
        return "no final state was read after healing"
    unlisted = [n for n, w in enumerate(windows, 1) if not w.get("listed")]
    if unlisted:
        return f"the allocs on the silenced nodes could not be listed in window(s) {unlisted}"
    never_down = [n for n, w in enumerate(windows, 1) if not w.get("down")]
    if never_down:
        return f"the servers never marked the silenced nodes down in window(s) {never_down} (within the nemesis's wait)"
    never_acted = [n for n, w in enumerate(windows, 1) if not w.get("acted")]
    if never_acted:
        return (f"the servers had not stopped the allocs of the down nodes in window(s) {never_acted} "
                "within the nemesis's wait, so whether they were lost is not known")
    return ""
