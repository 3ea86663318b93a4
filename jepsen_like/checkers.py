"""Checkers: turn a recorded run into verdicts.

Each checker returns a ``CheckerResult`` whose ``status`` is ``ok``,
``anomaly`` (the run found a bug), ``unknown`` (could not decide: a search
timed out, a final read never succeeded) or ``skipped`` (feature absent).
Anomalies name the operations involved (``process`` + ``call_time``) so the
HTML timeline can highlight them.

* linearizability -- the register workload's history against
  ``RegisterModel``, partitioned per key (``jepsen_like.linearizability``).
* set -- every acknowledged add is in the final read; nothing is present
  that was never attempted or that definitely failed; a read never misses an
  add acknowledged before it started; an element once read never vanishes
  from a read that started after.
* convergence -- after healing, every current member reaches the same
  applied index with the same state digest, and every one lists the same
  members, the set the run ended with (observations recorded by the runner).
* up-after-heal -- after each heal every server that should run was up; one
  that was not is an anomaly, or a harness failure when the harness could
  not give it its port back (``jepsen_like.health``).
* server-logs -- a server that stopped on a fatal apply error, or raft
  truncating entries it had already applied, is an anomaly (``ANOMALY_MARKERS``);
  other error/critical lines are counted for the summary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from jepsen_like.history import Event, Operation, operations_from_events
from jepsen_like.linearizability import Verdict, check
from jepsen_like.models import RegisterModel

Status = Literal["ok", "anomaly", "unknown", "skipped"]


@dataclass
class CheckerResult:
    checker: str
    workload: str | None
    status: Status
    summary: str
    operations: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    #: operations to highlight: {"workload", "process", "call_time", "why"}
    highlight: list[dict[str, Any]] = field(default_factory=list)

    @property
    def anomaly(self) -> bool:
        return self.status == "anomaly"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckerResult:
        return cls(**data)


def _mark(workload: str, op: Operation, why: str) -> dict[str, Any]:
    return {"workload": workload, "process": op.process, "call_time": op.call_time, "why": why}


# -- linearizability -------------------------------------------------------------------
def check_register(events: Sequence[Event], timeout: float = 120.0) -> CheckerResult:
    ops = operations_from_events(events)
    counted = [op for op in ops if op.status != "fail"]
    result = check(RegisterModel(), ops, timeout=timeout)
    details: dict[str, Any] = {
        "verdict": str(result.verdict),
        "partitions": result.partitions,
        "elapsed": round(result.elapsed, 3),
        "ok": sum(op.status == "ok" for op in ops),
        "fail": sum(op.status == "fail" for op in ops),
        "info": sum(op.status == "info" for op in ops),
    }
    if result.verdict is Verdict.NOT_LINEARIZABLE and result.failure is not None:
        failure = result.failure
        marks = [_mark("register", failure.blocking, "returned, yet cannot be linearized")]
        marks += [_mark("register", op, "could not be linearized next") for op in failure.stuck]
        marks += [
            _mark("register", op, "end of the longest linearizable prefix")
            for op in failure.longest_linearization[-3:]
        ]
        details["key"] = failure.key
        details["explanation"] = result.explanation
        return CheckerResult(
            "linearizability",
            "register",
            "anomaly",
            f"NOT linearizable on key {failure.key!r} ({failure.operations} operations in that key)",
            len(counted),
            details,
            marks,
        )
    if result.verdict is Verdict.UNKNOWN:
        details["timed_out_keys"] = list(result.timed_out_keys)
        return CheckerResult(
            "linearizability", "register", "unknown", result.explanation, len(counted), details
        )
    return CheckerResult(
        "linearizability",
        "register",
        "ok",
        f"{len(counted)} operations on {result.partitions} keys linearizable ({result.elapsed:.1f}s)",
        len(counted),
        details,
    )


# -- set ----------------------------------------------------------------------------------
def check_set(events: Sequence[Event]) -> CheckerResult:
    ops = operations_from_events(events)
    adds: dict[int, Operation] = {}
    reads: list[Operation] = []
    final: Operation | None = None
    for op in ops:
        f = op.input.get("f") if isinstance(op.input, dict) else None
        if f == "add":
            adds[int(op.input["value"])] = op
        elif f == "read" and op.status == "ok":
            reads.append(op)
            if op.input.get("final"):
                final = op
    ok_adds = {e for e, op in adds.items() if op.status == "ok"}
    info_adds = {e for e, op in adds.items() if op.status == "info"}
    failed_adds = {e for e, op in adds.items() if op.status == "fail"}
    details: dict[str, Any] = {
        "attempted": len(adds),
        "acknowledged": len(ok_adds),
        "failed": len(failed_adds),
        "unknown": len(info_adds),
        "reads": len(reads),
    }
    marks: list[dict[str, Any]] = []
    problems: list[str] = []

    # Reads during the run: nothing acknowledged before a read started is missing,
    # and nothing a finished read saw vanishes from a read that started after it.
    reads.sort(key=lambda op: op.call_time)
    stale: list[dict[str, Any]] = []
    vanished: list[dict[str, Any]] = []
    acked = sorted((op.return_time, e) for e, op in adds.items() if op.status == "ok")
    for read in reads:
        seen = set(read.output or [])
        missing = [e for t, e in acked if t < read.call_time and e not in seen]
        if missing:
            stale.append(
                {"read_at": read.call_time, "missing": missing[:20], "count": len(missing)}
            )
            marks.append(
                _mark("set", read, f"misses {len(missing)} acknowledged adds, e.g. {missing[:5]}")
            )
            for e in missing[:5]:
                marks.append(_mark("set", adds[e], "acknowledged, then missing from a later read"))
        for earlier in reads:
            if earlier.return_time is not None and earlier.return_time < read.call_time:
                gone = sorted(set(earlier.output or []) - seen)
                if gone:
                    vanished.append(
                        {
                            "seen_at": earlier.call_time,
                            "gone_at": read.call_time,
                            "elements": gone[:20],
                            "count": len(gone),
                        }
                    )
                    marks.append(
                        _mark(
                            "set",
                            read,
                            f"{len(gone)} elements seen earlier are gone, e.g. {gone[:5]}",
                        )
                    )
                    break
    if stale:
        problems.append(f"{len(stale)} reads missed acknowledged adds")
    if vanished:
        problems.append(f"{len(vanished)} reads lost elements an earlier read saw")
    details["stale_reads"] = stale[:20]
    details["vanished"] = vanished[:20]

    if final is None:
        details["final_read"] = False
        status: Status = "anomaly" if problems else "unknown"
        summary = (
            "; ".join(problems)
            if problems
            else "no final read succeeded after healing; cannot check for lost adds"
        )
        return CheckerResult("set", "set", status, summary, len(adds), details, marks)

    present = set(final.output or [])
    lost = sorted(ok_adds - present)
    never = sorted(present - set(adds))
    resurrected = sorted(present & failed_adds)
    details.update(
        final_read=True,
        present=len(present),
        lost=lost[:100],
        lost_count=len(lost),
        unexpected=never[:100],
        unexpected_count=len(never),
        failed_but_present=resurrected[:100],
        failed_but_present_count=len(resurrected),
        recovered=len(present & info_adds),
    )
    for e in lost[:20]:
        marks.append(
            _mark("set", adds[e], "acknowledged add missing from the final read (lost write)")
        )
    for e in resurrected[:20]:
        marks.append(_mark("set", adds[e], "add reported as failed, yet present in the final read"))
    if lost:
        problems.append(f"{len(lost)} acknowledged adds lost, e.g. {lost[:5]}")
    if never:
        problems.append(f"{len(never)} elements present that were never added, e.g. {never[:5]}")
    if resurrected:
        problems.append(
            f"{len(resurrected)} adds reported as certainly failed are present, e.g. {resurrected[:5]}"
        )
    if problems:
        marks.append(_mark("set", final, "final read"))
        return CheckerResult(
            "set", "set", "anomaly", "; ".join(problems), len(adds), details, marks
        )
    return CheckerResult(
        "set",
        "set",
        "ok",
        f"{len(ok_adds)} acknowledged adds all present; {len(present & info_adds)} of {len(info_adds)} "
        f"unknown-outcome adds present; nothing unexpected ({len(reads)} reads checked)",
        len(adds),
        details,
    )


# -- convergence ----------------------------------------------------------------------------
def check_convergence(
    observation: dict[str, Any] | None, excused: dict[str, str] | None = None
) -> CheckerResult:
    """Verdict over the runner's final digest polls and member lists (``convergence.json``).

    ``excused``: servers the harness could not bring back (name -> why);
    they are left out rather than counted as never answering, since the
    run cannot say whether they would have converged.
    """
    if not observation:
        return CheckerResult(
            "convergence", None, "unknown", "no convergence observation was recorded"
        )
    excused = excused or {}
    final: dict[str, Any] = {
        n: o for n, o in (observation.get("final") or {}).items() if n not in excused
    }
    details = {
        "final": final,
        "polls": observation.get("polls", 0),
        "waited": observation.get("waited"),
        "members": observation.get("members"),
        "excused": excused,
    }
    problem = _divergence(final, observation) or _member_disagreement(observation, excused)
    if problem:
        return CheckerResult("convergence", None, "anomaly", problem, details=details)
    left_out = (
        f"; {', '.join(sorted(excused))} left out (the harness could not bring it back)"
        if excused
        else ""
    )
    members = (
        f" and members {', '.join(observation['expected_members'])}"
        if observation.get("expected_members")
        else ""
    )
    index, digest = next(((o["index"], o["digest"]) for o in final.values()), (0, ""))
    return CheckerResult(
        "convergence",
        None,
        "ok",
        f"all {len(final)} servers at applied index {index} with one digest {digest[:12]}{members}{left_out}",
        details=details,
    )


def _divergence(final: dict[str, Any], observation: dict[str, Any]) -> str:
    """Why the servers' final observations do not agree ("" when they do): silent, apart, or diverged."""
    silent = sorted(name for name, obs in final.items() if not obs)
    if silent:
        return f"after healing, {', '.join(silent)} never answered (crashed or wedged); see its server log"
    indexes = {obs["index"] for obs in final.values()}
    if len(indexes) > 1:
        shown = ", ".join(f"{n}@{o['index']}" for n, o in sorted(final.items()))
        waited = observation.get("waited", 0)
        return f"servers did not reach the same applied index within {waited:.0f}s: {shown}"
    if len({obs["digest"] for obs in final.values()}) > 1:
        shown = ", ".join(f"{n}={o['digest'][:12]}" for n, o in sorted(final.items()))
        return f"replicas DIVERGED: same applied index {indexes.pop()}, different state digests ({shown})"
    return ""


def _member_disagreement(observation: dict[str, Any], excused: dict[str, str]) -> str:
    """Servers whose member list is not the one the run ended with ("" when all agree or none was recorded)."""
    expected = observation.get("expected_members")
    if not expected:
        return ""  # a run recorded before member lists were
    views = {n: v for n, v in (observation.get("members") or {}).items() if n not in excused}
    wrong = {n: v for n, v in views.items() if v is None or sorted(v) != sorted(expected)}
    if not wrong:
        return ""
    shown = "; ".join(
        f"{n} lists {', '.join(v) if v is not None else 'nothing (no answer)'}"
        for n, v in sorted(wrong.items())
    )
    return f"member lists differ after healing: {shown} (expected {', '.join(expected)})"


# -- servers up after each heal ------------------------------------------------------------------
HARNESS = "harness"
UP_AFTER_HEAL = "up-after-heal"


def check_heals(meta: dict[str, Any]) -> list[CheckerResult]:
    """The per-heal checks' findings (``run.json``): harness failures and anomalies, kept apart.

    A harness failure (``unknown``) makes the run inconclusive; a server
    that would not come back on healthy ports is the product's anomaly.
    """
    if "heal_checks" not in meta:
        return []  # recorded before per-heal checks
    misses = meta.get("not_up") or []
    results = [
        CheckerResult(
            HARNESS,
            None,
            "unknown",
            f"{m['server']} not up after healing {m.get('after')}: {m['cause']}",
            details=m,
        )
        for m in misses
        if m.get("kind") == "harness"
    ]
    anomalies = [m for m in misses if m.get("kind") != "harness"]
    if anomalies:
        first = anomalies[0]
        results.append(
            CheckerResult(
                UP_AFTER_HEAL,
                None,
                "anomaly",
                f"{len(anomalies)} server(s) not up after a heal; first: {first['server']} after {first.get('after')} "
                f"(at {first.get('at', 0):.1f}s): {first['cause']}",
                details={"not_up": anomalies},
            )
        )
    elif not results:
        results.append(
            CheckerResult(
                UP_AFTER_HEAL,
                None,
                "ok",
                f"every server up after each of {meta['heal_checks']} heals",
            )
        )
    return results


def split_failures(
    results: Sequence[CheckerResult],
) -> tuple[list[CheckerResult], list[CheckerResult]]:
    """(product anomalies, harness failures): what the product did wrong, and what the harness could not do."""
    anomalies = [r for r in results if r.status == "anomaly"]
    harness = [r for r in results if r.checker == HARNESS]
    return anomalies, harness


# -- server logs ------------------------------------------------------------------------------
#: Log events that are anomalies in themselves: a server stopped rather than
#: diverge, or raft removed entries it had already applied (committed entries
#: must never leave a log; pysyncobj's follower-truncation defect, which the
#: raft adapter's fix must prevent).
ANOMALY_MARKERS = {
    "fatal apply error": "stopped on a fatal apply error",
    "raft_fatal_apply_error": "stopped on a fatal apply error",
    "truncating already-applied log entries": "truncated already-applied (committed) raft entries",
}


def check_server_logs(cluster_dir: str | Path) -> CheckerResult:
    root = Path(cluster_dir)
    counts: dict[str, dict[str, int]] = {}
    fatal: list[str] = []
    for log in sorted(root.glob("server*/server.log")):
        levels = {"error": 0, "critical": 0}
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            level = str(record.get("level", "")).lower()
            if level in levels:
                levels[level] += 1
            text = str(record.get("event", "")).lower()
            for marker, meaning in ANOMALY_MARKERS.items():
                if marker in text:
                    fatal.append(
                        f"{log.parent.name} {meaning}: {record.get('event')} {record.get('error', '')}"[
                            :300
                        ]
                    )
                    break
        counts[log.parent.name] = levels
    details = {"levels": counts, "fatal": fatal[:20]}
    if fatal:
        return CheckerResult(
            "server-logs",
            None,
            "anomaly",
            f"{len(fatal)} anomalous server log events, first: {fatal[0]}",
            details=details,
        )
    errors = sum(c["error"] + c["critical"] for c in counts.values())
    return CheckerResult(
        "server-logs",
        None,
        "ok",
        f"no fatal errors ({errors} error/critical log lines)",
        details=details,
    )


# -- change journal --------------------------------------------------------------------------------
def check_journal(path: str | Path) -> CheckerResult:
    """Subscribers' view of the journal: ordered, unique, gap-free, atomic, identical everywhere."""
    p = Path(path)
    if not p.exists():
        return CheckerResult(
            "journal", "journal", "unknown", "no journal recording (journal.jsonl) found"
        )
    received: dict[str, list[tuple[int, str]]] = {}
    last: dict[str, int] = {}
    resets: dict[str, list[tuple[int, int]]] = {}
    breaks: dict[str, int] = {}
    unknown_items: dict[str, int] = {}
    # servers the member nemesis replaced: their subscriber stopped early, by design
    retired: set[str] = set()
    target = 0
    for line in p.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        server, kind = r.get("server"), r.get("kind")
        if kind == "target":
            target = max(target, int(r["index"]))
            continue
        received.setdefault(server, [])
        if kind == "batch":
            received[server].append((int(r["index"]), r["hash"]))
            last[server] = max(last.get(server, 0), int(r["index"]))
        elif kind in ("progress", "end"):
            last[server] = max(last.get(server, 0), int(r.get("index") or 0))
        elif kind == "break":
            breaks[server] = breaks.get(server, 0) + 1
        elif kind == "retired":
            retired.add(server)
        elif kind == "unknown_item":
            unknown_items[server] = unknown_items.get(server, 0) + 1
        elif kind == "reset":
            before = last.get(server, 0)
            resets.setdefault(server, []).append((before, int(r.get("oldest_index") or before)))
    problems: list[str] = []
    disorder: dict[str, list[int]] = {}
    by_index: dict[int, dict[str, str]] = {}
    for server, batches in received.items():
        previous = 0
        for index, digest in batches:
            if index <= previous:
                disorder.setdefault(server, []).append(index)
            previous = max(previous, index)
            by_index.setdefault(index, {})[server] = digest
    for server, bad in disorder.items():
        problems.append(
            f"{server} delivered {len(bad)} batches out of order or twice (e.g. index {bad[0]})"
        )
    differing = sorted(i for i, seen in by_index.items() if len(set(seen.values())) > 1)
    if differing:
        problems.append(
            f"{len(differing)} batches differ between servers (e.g. index {differing[0]}: {by_index[differing[0]]})"
        )
    gaps: dict[str, list[int]] = {}
    for server in received:
        end = last.get(server, 0)
        have = {i for i, _ in received[server]}
        skipped = resets.get(server, [])
        missing = [
            i
            for i in by_index
            if i <= end and i not in have and not any(lo < i <= hi for lo, hi in skipped)
        ]
        if missing:
            gaps[server] = sorted(missing)
            problems.append(
                f"{server} never delivered {len(missing)} batches other servers did (e.g. index {min(missing)})"
            )
    lagging = sorted(s for s in received if last.get(s, 0) < target and s not in retired)
    details = {
        "subscribers": len(received),
        "batches": {s: len(b) for s, b in received.items()},
        "last_index": last,
        "target": target,
        "breaks": breaks,
        "resets": resets,
        "gaps": {s: g[:50] for s, g in gaps.items()},
        "differing": differing[:50],
        "disorder": {s: d[:50] for s, d in disorder.items()},
        "lagging": lagging,
        "retired": sorted(retired),
        "unknown_items": unknown_items,
    }
    total = sum(len(b) for b in received.values())
    if unknown_items:
        return CheckerResult(
            "journal",
            "journal",
            "unknown",
            f"the stream sent {sum(unknown_items.values())} items of a shape this harness does not know; "
            "update jepsen_like's subscriber (workloads._stream_batches)",
            total,
            details,
        )
    if problems:
        return CheckerResult("journal", "journal", "anomaly", "; ".join(problems), total, details)
    if not received:
        return CheckerResult(
            "journal", "journal", "unknown", "no subscriber recorded anything", 0, details
        )
    if lagging:
        return CheckerResult(
            "journal",
            "journal",
            "unknown",
            f"{', '.join(lagging)} did not reach the final index {target} in time; checked up to where each got",
            total,
            details,
        )
    return CheckerResult(
        "journal",
        "journal",
        "ok",
        f"{len(by_index)} batches, identical on {len(received)} servers, ordered, no duplicates or gaps "
        f"({sum(breaks.values())} resubscriptions after breaks)",
        total,
        details,
    )


# -- garbage collection --------------------------------------------------------------------------
def check_gc(events: Sequence[Event]) -> CheckerResult:
    """GC safety over the lifecycle workload's history.

    * a running job that nobody stopped (``keep-*``) is present in every
      observation that started after its registration was acknowledged;
    * a collected job never comes back: once an observation that started
      after the job's acknowledged registration misses it, no observation
      starting after that one returned sees it again;
    * no orphans: in the final state every evaluation and allocation of a
      workload job belongs to a job that still exists.
    """
    ops = operations_from_events(events)
    acked: dict[str, Operation] = {}
    kinds: dict[str, str] = {}
    stopped: set[str] = set()
    observations: list[
        tuple[Operation, dict[str, str] | None, set[str] | None]
    ] = []  # (op, seen, scope)
    final: Operation | None = None
    forced = 0
    for op in ops:
        f = op.input.get("f") if isinstance(op.input, dict) else None
        if f == "run":
            kinds[op.input["job"]] = op.input["kind"]
            if op.status == "ok":
                acked[op.input["job"]] = op
        elif f == "stop":
            stopped.add(op.input["job"])  # attempted counts: it may have happened
        elif f == "gc" and op.status == "ok":
            forced += 1
        elif op.status == "ok" and f == "list":
            observations.append((op, dict(op.output or {}), None))
        elif op.status == "ok" and f == "get":
            job = op.input["job"]
            observations.append((op, dict(op.output or {}), {job}))
        elif op.status == "ok" and f == "final":
            final = op
            observations.append((op, dict(op.output.get("jobs") or {}), None))
    observations.sort(key=lambda o: o[0].call_time)
    problems: list[str] = []
    marks: list[dict[str, Any]] = []

    collected_running = []
    for job, reg in acked.items():
        if kinds.get(job) != "keep" or job in stopped:
            continue
        for op, seen, scope in observations:
            if (
                (scope is None or job in scope)
                and op.call_time > reg.return_time
                and job not in seen
            ):  # type: ignore[operator]
                collected_running.append(job)
                marks.append(
                    _mark(
                        "lifecycle", op, f"running job {job} is missing (collected while running?)"
                    )
                )
                break
    if collected_running:
        problems.append(
            f"{len(collected_running)} running jobs disappeared: {sorted(collected_running)[:5]}"
        )

    came_back = []
    collected: set[str] = set()
    for job, reg in acked.items():
        gone_at: Operation | None = None
        for op, seen, scope in observations:
            if scope is not None and job not in scope:
                continue
            if op.call_time <= reg.return_time:  # type: ignore[operator]
                continue
            if job not in seen:
                if gone_at is None:
                    gone_at = op
                    collected.add(job)
            elif (
                gone_at is not None
                and gone_at.return_time is not None
                and op.call_time > gone_at.return_time
            ):
                came_back.append(job)
                marks.append(_mark("lifecycle", gone_at, f"{job} absent here"))
                marks.append(_mark("lifecycle", op, f"{job} is back after it was collected"))
                break
    if came_back:
        problems.append(f"{len(came_back)} collected jobs came back: {sorted(came_back)[:5]}")

    orphans: list[list[str]] = []
    pending: list[list[str]] = []
    if final is not None:
        pending = [row for row in (final.output or {}).get("allocs") or [] if row[2] == "pending"]
        jobs = set((final.output or {}).get("jobs") or {})
        ours = set(kinds)
        for kind in ("evals", "allocs"):
            for row in (final.output or {}).get(kind) or []:
                obj_id, job_id = row[0], row[1]
                if job_id in ours and job_id not in jobs:
                    orphans.append([kind[:-1], obj_id, job_id])
        if orphans:
            problems.append(
                f"{len(orphans)} evaluations/allocations outlive their job, e.g. {orphans[0]}"
            )
            marks.append(_mark("lifecycle", final, f"orphans: {orphans[:3]}"))
    details = {
        "registered": len(kinds),
        "acknowledged": len(acked),
        "keep_jobs": sum(1 for k in kinds.values() if k == "keep"),
        "stopped": len(stopped),
        "forced_gc": forced,
        "observations": len(observations),
        "collected_jobs": len(collected),
        "final_state": final is not None,
        "orphans": orphans[:50],
        "came_back": came_back[:50],
        "collected_while_running": collected_running[:50],
        # liveness, not safety: allocations that never started by the end of the run
        "pending_allocs_at_end": pending[:50],
    }
    if problems:
        return CheckerResult(
            "gc-safety", "lifecycle", "anomaly", "; ".join(problems), len(ops), details, marks
        )
    if final is None:
        return CheckerResult(
            "gc-safety",
            "lifecycle",
            "unknown",
            "no final state was read after healing",
            len(ops),
            details,
        )
    if not collected:
        return CheckerResult(
            "gc-safety",
            "lifecycle",
            "unknown",
            "GC collected no job during the run; nothing was exercised",
            len(ops),
            details,
        )
    liveness = (
        f"; liveness note: {len(pending)} allocations still pending at the end" if pending else ""
    )
    return CheckerResult(
        "gc-safety",
        "lifecycle",
        "ok",
        f"{len(collected)} of {len(acked)} acknowledged jobs collected; no running job collected, none came back, "
        f"no orphans ({len(observations)} observations, {forced} forced GCs){liveness}",
        len(ops),
        details,
    )
