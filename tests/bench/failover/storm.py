"""Mass expiry: one fleet process (all its nodes) killed at once, optionally with a leader kill in the middle.

What is counted comes from the journal (``probes.Watcher``), not from an
assumption about how the leader writes mark-downs: a node is down when a
batch set its status to down; the batches are the distinct raft indexes of
those records; evals are those created (``node-update``) after the kill,
follow-ups (``previous_eval`` set) apart. All raft entries are the leader's
applied index delta, set against the rate measured over the baseline (the
steady writer and its evals), so the excess is what the storm wrote.

The "all down" target is the last TTL each killed chunk was granted plus the
grace (read from the fleet's heartbeat log, so it is exact) plus one pass of
the leader's heartbeat monitor; after a leader change it is that leader's
failover TTL plus grace instead, as a new leader holds every live node that long.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from node.wire.rpc_client import RPCClient
from tests.bench.failover.cluster import (
    Bench,
    Fleet,
    Heartbeat,
    applied_index,
    broker_quiet,
    settle,
    term,
    wait_for,
)
from tests.bench.failover.phases import SETTLE_S, first_write
from tests.bench.failover.probes import EvalSeen, Watcher, Writer
from tests.bench.failover.state import Layout, node_id

QUIET_S = 300.0  # how long to wait for the broker to drain before a storm's baseline
EVAL_SETTLE_S = 300.0  # how long the storm's evals may stay pending before the figure is reported as unsettled


def _ids(first: int, count: int) -> list[str]:
    return [node_id(i) for i in range(first, first + count)]


def revive(bench: Bench, watcher: Watcher, fleet: Fleet, name: str, layout: Layout, timeout: float) -> Fleet:
    """Start a new process for a killed fleet's nodes and wait until every one of them is ready again."""
    since = watcher.index
    new = bench.start_fleet(name, fleet.first, fleet.count, layout.node_cpu, layout.node_memory_mb)
    ids = _ids(fleet.first, fleet.count)
    wait_for(f"{fleet.count} revived nodes ready", lambda: watcher.count(ids, "ready", since) >= len(ids), timeout, 0.5)
    return new


def _mid_storm_leader_kill(bench: Bench, watcher: Watcher, ids: list[str], since: int, deadline_s: float) -> dict[str, Any]:
    """Once half the lost nodes are down, kill -9 the leader; time the first write, restart it."""
    wait_for("half the lost nodes down", lambda: watcher.count(ids, "down", since) >= len(ids) // 2, deadline_s, 0.05)
    leader = bench.leader()
    others = [a for a in bench.addresses if a != leader.rpc_addr]
    down_then = watcher.count(ids, "down", since)
    at = bench.kill(leader)
    took = first_write(others, f"probe-storm-kill-{int(at)}", at)
    bench.start(leader)
    return {"killed": leader.id, "at": at, "down_before_kill": down_then, "first_write_s": took}


def storm(bench: Bench, fleet: Fleet, others: Fleet, watcher: Watcher, writer: Writer, layout: Layout,
          hb: Heartbeat, *, leader_kill: bool, before_s: float, first: bool) -> dict[str, Any]:
    """Kill ``fleet``'s process, wait until all its nodes are down, and read every storm figure.

    Nodes that are not down by a generous limit (repeated elections keep
    renewing the failover hold) are reported as such, with the rest of the
    figures, rather than ending the run.
    """
    ids, live = _ids(fleet.first, fleet.count), _ids(others.first, others.count)
    quiet = _quiet(bench)
    # The first storm hurts the jobs the layout put on the lost nodes; after it (allocs
    # lost, replaced on revived nodes) only the servers know, so ask them, once quiet.
    affected = (layout.affected_jobs(range(fleet.first, fleet.first + fleet.count)) if first
                else live_jobs_on(bench, ids))
    settled, index_settled = _baseline(bench, fleet, hb, before_s)
    index0, term0, cand0 = applied_index(bench), term(bench), bench.candidates()
    baseline_rate = (index0 - index_settled) / max(1e-3, time.time() - settled)
    since = watcher.index
    killed_at = bench.kill_fleet(fleet)
    bound = ttl_bound(fleet, killed_at, hb.grace)
    limit = (bound or 2 * hb.min_ttl + hb.grace) + hb.failover_ttl + 180
    kill = _mid_storm_leader_kill(bench, watcher, ids, since, limit) if leader_kill else None
    try:
        wait_for(f"all {len(ids)} lost nodes down", lambda: watcher.count(ids, "down", since) >= len(ids), limit, 0.05)
    except TimeoutError as exc:
        print(f"  {exc}; reporting what was seen", flush=True)
    index_down = applied_index(bench)
    down = [n for n in (watcher.nodes.get(i) for i in ids) if n is not None and n.status == "down" and n.index > since]
    first_down = min((n.at for n in down), default=killed_at)
    last_down = max((n.at for n in down), default=time.time())
    changes = [t for t in bench.leader_changes(killed_at) if t <= last_down]
    if changes:  # each new leader holds every live node for the failover TTL (+ grace)
        bound = max(bound or 0.0, changes[-1] + hb.failover_ttl + hb.grace - killed_at)
    settled_s = _wait_evals(watcher, since)
    end, index_end = time.time(), applied_index(bench)
    return {
        "leader_kill": kill,
        "leader_changes_to_all_down": len(changes),
        "leader_changes": len(bench.leader_changes(killed_at)),  # to the end, as the elections
        "down": len(down),
        "all_down_s": last_down - killed_at if len(down) == len(ids) else None,
        "first_down_s": first_down - killed_at if down else None,
        "bound_s": bound,
        "monitor_pass_s": hb.monitor_pass,
        "live_marked_down": watcher.count(live, "down", since),
        "entries_to_all_down": index_down - index0,
        "entries_to_settled": index_end - index0,
        "baseline_entries_per_s": baseline_rate,
        "entries_over_baseline": index_end - index0 - baseline_rate * (end - killed_at),
        "writer_calls_to_all_down": writer.window(killed_at, last_down)["calls"],
        "evals_settled_s": None if settled_s is None else settled_s - killed_at,
        "elections": sum(bench.candidates().values()) - sum(cand0.values()),
        "term_delta": term(bench) - term0,
        "before": writer.window(killed_at - before_s, killed_at),
        "quiet": quiet,
        "during": writer.window(first_down - 0.5, max(last_down, settled_s or end) + 0.5),
        "affected_from": "layout" if first else "alloc.list",
        **storm_evals(watcher, since, affected, {n.index for n in down}),
    }


def _quiet(bench: Bench) -> bool:
    """Wait for a whole cluster whose eval broker has drained: the baseline is not the tail of the last storm.

    False when the broker was still busy after ``QUIET_S``: the baseline then
    measures that work, and the report compares with a quiet one instead.
    """
    settle(bench, SETTLE_S)
    try:
        wait_for("the eval broker to drain", lambda: broker_quiet(bench), QUIET_S, 0.5)
    except TimeoutError:
        print(f"  (the eval broker was still busy after {QUIET_S:g} s; the baseline includes that work, so the"
              " p99 ratio uses an earlier storm's quiet baseline if there is one)", flush=True)
        return False
    return True


def _baseline(bench: Bench, fleet: Fleet, hb: Heartbeat, before_s: float) -> tuple[float, int]:
    """Run the writer ``before_s`` on the quiet cluster; (wall time, applied index) at the start."""
    settle(bench, SETTLE_S)
    settled, index_settled = time.time(), applied_index(bench)
    wait_for("a baseline of writes", lambda: time.time() >= settled + before_s, before_s + 5, 0.2)
    # A new leader holds every node for the failover TTL until its first heartbeat to it:
    # wait until each chunk has beaten to this leader, so the storm measures TTLs, not holds.
    wait_for("every lost chunk heartbeating to this leader", lambda: _beaten_since(fleet, settled), 3 * hb.min_ttl + 60, 0.2)
    return settled, index_settled


def _beaten_since(fleet: Fleet, since: float) -> bool:
    """Whether every heartbeat chunk of ``fleet`` had a beat answered after ``since`` (wall clock)."""
    beats = [e for e in fleet.lines() if e.get("event") == "beat"]
    chunks = {e["chunk"] for e in beats}
    return bool(chunks) and all(any(e["chunk"] == c and e["answered"] > since for e in beats) for c in chunks)


def _wait_evals(watcher: Watcher, since: int) -> float | None:
    """Wall time at which no node-update eval created since ``since`` was pending any more (None: not in time)."""
    def done() -> bool:
        evals = [e for e in watcher.evals_since(since) if e.triggered_by == "node-update"]
        return bool(evals) and not any(e.status == "pending" for e in evals)
    try:
        wait_for("the storm's evals to leave pending", done, EVAL_SETTLE_S, 0.2)
    except TimeoutError:
        return None
    return time.time()


def ttl_bound(fleet: Fleet, killed_at: float, grace: float) -> float | None:
    """Seconds after the kill by which every node of ``fleet`` must be down: its last TTL granted, plus grace."""
    last: dict[int, tuple[float, float]] = {}
    for e in fleet.lines():
        if e.get("event") == "beat" and e["answered"] <= killed_at:
            last[e["chunk"]] = (e["answered"], e["ttl"])
    if not last:
        return None
    return max(at + ttl for at, ttl in last.values()) + grace - killed_at


def storm_evals(watcher: Watcher, since: int, affected: set[str], down_batches: set[int]) -> dict[str, Any]:
    """Evals created by the mark-downs (node-update), against one per affected job per batch.

    Follow-ups the scheduler makes of them (a blocked eval for allocs that
    found no room names its ``previous_eval``) are counted apart.
    """
    every = [e for e in watcher.evals_since(since) if e.triggered_by == "node-update"]
    evals = [e for e in every if not e.previous_eval]
    statuses: dict[str, int] = {}
    for e in every:
        statuses[e.status] = statuses.get(e.status, 0) + 1
    per_batch: dict[tuple[int, str], int] = {}
    for e in evals:
        per_batch[(e.create_index, e.job_id)] = per_batch.get((e.create_index, e.job_id), 0) + 1
    jobs = {e.job_id for e in evals}
    return {
        "storm_entries": len(down_batches | {e.create_index for e in evals}),
        "evals": len(evals),
        "affected_jobs": len(affected),
        "jobs_with_evals": len(jobs),
        "affected_jobs_without_eval": len(affected - jobs),
        "eval_batches": len({e.create_index for e in evals}),
        "down_batches": len(down_batches),
        "max_evals_per_job_per_batch": max(per_batch.values(), default=0),
        "evals_per_affected_job": len(evals) / len(affected) if affected else None,
        "followups": len(every) - len(evals),
        "other_triggers": _triggers([e for e in watcher.evals_since(since) if e.triggered_by != "node-update"]),
        "eval_statuses": statuses,
    }


def _triggers(evals: list[EvalSeen]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in evals:
        out[e.triggered_by] = out.get(e.triggered_by, 0) + 1
    return out


LIVE = ("pending", "running")


def live_jobs_on(bench: Bench, node_ids: list[str], workers: int = 4) -> set[str]:
    """Jobs with a live alloc (desired run, client pending or running) on any of ``node_ids``: stale pages from a follower."""
    leader = bench.leader().rpc_addr
    follower = next((a for a in bench.addresses if a != leader), leader)

    def one(node: str) -> set[str]:
        jobs: set[str] = set()
        token = ""
        with RPCClient([follower], timeout=60) as client:
            while True:
                out = client.call("alloc.list", {"node_id": node, "stale": True, "next_token": token})
                jobs |= {a["JobID"] for a in out["data"] if a.get("DesiredStatus") == "run" and a.get("ClientStatus") in LIVE}
                token = out.get("next_token") or ""
                if not token:
                    return jobs

    with ThreadPoolExecutor(workers) as pool:
        return set().union(*pool.map(one, node_ids))
