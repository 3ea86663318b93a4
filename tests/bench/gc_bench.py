"""GC benchmark: sweep cost without garbage, collection rate, write latency under GC.

    python -m tests.bench.gc_bench [--live 1000000] [--dead 100000] [--cluster-dead 20000] [--skip-cluster]

(a) FSM level. A state of ``--live`` live objects (running service jobs with a
    pending eval and two running allocs each, ready nodes, ACL tokens of which
    a tenth expire in the future) is built through ``FSM.apply`` with group
    commit; at 1%, 10% and 100% of it a full sweep (all five collectors, one
    read transaction) is timed, with the default thresholds and with the
    forced (zero) ones. Reported: time and objects read (GC marks scanned plus
    objects loaded). Target: <= 50 ms, independent of the live count.
(b) FSM level. ``--dead`` dead batch jobs, each with one complete eval and two
    complete allocs, are collected the way the leader does it: plan the job
    collector on a snapshot, split into entries (id caps and the 48 KiB raft
    entry limit, measured on the pickled entry), apply every entry through
    ``FSM.apply`` (one commit per entry). Reported: objects removed per second
    (jobs + evals + allocs; versions and summaries go too and are not counted)
    and raft entries used, by wall clock and by CPU time (the machine may be
    shared). Target: >= 20,000 objects/s. Raft replication is not in this
    number; (c) shows the collector on a real cluster.
(c) Cluster level. A 3-server cluster gets ``--cluster-dead`` dead batch jobs
    (through the real RPCs); a client then writes serially (job registrations)
    and its p99 latency is measured without GC (``--samples`` writes before and
    as many after), and while a forced GC collects them. Reported: the p99s
    and their ratio. Target: <= 2.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
import threading
import time
from typing import Any

from fsm import messages as m
from fsm.gc import FORCE_ORDER, Thresholds, Window, plan_kind
from fsm.machine import FSM
from fsm.messages import encode_entry
from fsm.structs import (
    HOUR,
    SECOND,
    ACLToken,
    Allocation,
    Evaluation,
    Job,
    Node,
    Task,
    TaskGroup,
)
from node.leader.gc import MARKS_PER_PLAN, OBJECTS_PER_ENTRY, Limits, reap_bodies

T0 = 1_700_000_000 * SECOND


class Feeder:
    """Applies entries to an FSM with group commit (one commit per ``group`` entries)."""

    def __init__(self, fsm: FSM, group: int = 500) -> None:
        self.fsm, self.group = fsm, group
        self.index = fsm.applied_index
        self.time = T0
        self.pending = 0

    def apply(self, body: Any, *, commit: bool = False) -> Any:
        self.index += 1
        self.time += 1_000_000  # 1 ms per entry
        result = self.fsm.apply(self.index, encode_entry(body, time=self.time, rid=""))
        if not result.ok:
            raise SystemExit(f"bench setup entry rejected: {result.code} {result.error}")
        self.pending += 1
        if commit or self.pending >= self.group:
            self.flush()
        return result

    def flush(self) -> None:
        self.fsm.commit()
        self.pending = 0


def job(job_id: str, kind: str) -> Job:
    return Job(id=job_id, name=job_id, type=kind, task_groups=[TaskGroup(name="g", tasks=[Task(name="t")])])


def secret(i: int) -> str:
    return hashlib.sha256(f"bench-token-{i}".encode()).hexdigest()


# -- (a) --------------------------------------------------------------------------------
def sweep(fsm: FSM, now: int, th: Thresholds) -> tuple[float, int]:
    """One sweep of every collector on one snapshot: (seconds, objects read)."""
    t = time.perf_counter()
    read = 0
    with fsm.read() as r:
        for kind in FORCE_ORDER:
            plan = plan_kind(r, kind, now, th)
            assert plan.empty(), f"garbage found in a live-only state: {plan.counts()}"
            read += plan.marks + plan.reads
    return time.perf_counter() - t, read


def bench_live(total: int) -> list[tuple[int, float, int, float, int]]:
    path = tempfile.mkdtemp(prefix="caravan-gc-bench-a-")
    fsm = FSM(path)
    feed = Feeder(fsm)
    rows: list[tuple[int, float, int, float, int]] = []
    checkpoints = sorted({max(1000, total // 100), max(1000, total // 10), total})
    units = total // 5  # per unit: 1 job + 1 eval + 2 allocs (4/5 of the objects) ...
    extras = total - 4 * units  # ... and nodes + tokens (the remaining fifth)
    nodes = extras // 2
    tokens = extras - nodes
    built = 0
    node_ids = [f"node-{i:07d}" for i in range(max(1, nodes))]
    try:
        # Nodes, units and tokens grow together, so every checkpoint mixes all kinds.
        nodes_made = 0
        tokens_made = 0
        per_plan = 50  # jobs whose allocs one PlanApply places
        u = 0
        next_cp = 0
        t_build = time.perf_counter()
        while u < units or tokens_made < tokens:
            batch = list(range(u, min(units, u + per_plan)))
            want_nodes = max(1, len(node_ids) * (u + len(batch)) // max(1, units))
            while nodes_made < want_nodes:
                feed.apply(m.NodeRegister(node=Node(id=node_ids[nodes_made], status="ready")))
                nodes_made += 1
                built += 1
            for j in batch:
                jid = f"live-{j:07d}"
                feed.apply(m.JobRegister(job=job(jid, "service"), eval=Evaluation(id=f"{jid}-e", job_id=jid, type="service")))
            if batch:
                places = []
                for j in batch:
                    jid = f"live-{j:07d}"
                    for k in range(2):
                        places.append(
                            Allocation(
                                id=f"{jid}-a{k}",
                                eval_id=f"{jid}-e",
                                job_id=jid,
                                node_id=node_ids[(2 * j + k) % nodes_made],
                                task_group="g",
                                client_status="running",
                            )
                        )
                feed.apply(m.PlanApply(allocs_to_place=places))
            u += len(batch)
            built += 4 * len(batch)
            want_tokens = min(tokens, tokens * u // max(1, units)) if units else tokens
            new = []
            while tokens_made < want_tokens:
                i = tokens_made
                expiry = T0 + 1000 * HOUR if i % 10 == 0 else 0
                new.append(ACLToken(accessor_id=f"tok-{i:07d}", secret_hash=secret(i), policies=["read"], expiration_time=expiry))
                tokens_made += 1
            for part in range(0, len(new), 500):
                feed.apply(m.ACLTokenUpsert(tokens=new[part : part + 500]))
            built += len(new)
            if next_cp < len(checkpoints) and built >= checkpoints[next_cp]:
                while next_cp < len(checkpoints) and built >= checkpoints[next_cp]:
                    next_cp += 1
                feed.flush()
                now = feed.time + SECOND
                best_default = min((sweep(fsm, now, Thresholds()) for _ in range(5)), key=lambda x: x[0])
                best_forced = min((sweep(fsm, now, Thresholds.zero()) for _ in range(5)), key=lambda x: x[0])
                rows.append((built, best_default[0], best_default[1], best_forced[0], best_forced[1]))
                print(
                    f"  built {built:>9,} live objects ({time.perf_counter() - t_build:.0f}s): "
                    f"sweep {best_default[0] * 1000:.3f} ms / {best_default[1]} read (defaults), "
                    f"{best_forced[0] * 1000:.3f} ms / {best_forced[1]} read (forced)",
                    flush=True,
                )
        feed.flush()
        with fsm.read() as r:
            counted = sum(r.count(t) for t in ("jobs", "evals", "allocs", "nodes", "acl_tokens"))
        print(f"  state: {counted:,} objects in jobs/evals/allocs/nodes/acl_tokens", flush=True)
    finally:
        fsm.close()
        shutil.rmtree(path, ignore_errors=True)
    return rows


# -- (b) --------------------------------------------------------------------------------
def build_dead(feed: Feeder, n: int, prefix: str = "dead") -> None:
    chunk = 50
    for start in range(0, n, chunk):
        ids = [f"{prefix}-{j:07d}" for j in range(start, min(n, start + chunk))]
        for jid in ids:
            feed.apply(m.JobRegister(job=job(jid, "batch"), eval=Evaluation(id=f"{jid}-e", job_id=jid, type="batch")))
        feed.apply(
            m.PlanApply(
                allocs_to_place=[
                    Allocation(id=f"{jid}-a{k}", eval_id=f"{jid}-e", job_id=jid, node_id="n1", task_group="g")
                    for jid in ids
                    for k in range(2)
                ]
            )
        )
        feed.apply(m.EvalUpsert(evals=[Evaluation(id=f"{jid}-e", job_id=jid, type="batch", status="complete") for jid in ids]))
        feed.apply(
            m.AllocClientUpdate(
                allocs=[m.AllocClientState(id=f"{jid}-a{k}", client_status="complete") for jid in ids for k in range(2)]
            )
        )
    feed.flush()


def bench_dead(n: int) -> dict[str, float]:
    path = tempfile.mkdtemp(prefix="caravan-gc-bench-b-")
    fsm = FSM(path)
    feed = Feeder(fsm)
    try:
        feed.apply(m.NodeRegister(node=Node(id="n1", status="ready")), commit=True)
        t = time.perf_counter()
        build_dead(feed, n)
        print(f"  built {n:,} dead batch jobs in {time.perf_counter() - t:.0f}s", flush=True)
        now = feed.time + 5 * HOUR  # past the default 4h job threshold: the periodic collector's case
        # As the leader's job collector does it: a window of GC marks at a time,
        # planned on a snapshot, split into entries, applied; then the next window.
        limits = Limits(objects_per_entry=OBJECTS_PER_ENTRY)
        plan_s = plan_cpu = split_s = apply_s = 0.0
        removed = objects = entries = 0
        window = Window(None, MARKS_PER_PLAN)
        c0 = time.process_time()
        t0 = time.perf_counter()
        while True:
            a, ac = time.perf_counter(), time.process_time()
            with fsm.read() as r:
                plan = plan_kind(r, "job", now, Thresholds(), window=window)
            b = time.perf_counter()
            plan_s += b - a
            plan_cpu += time.process_time() - ac
            bodies = reap_bodies(plan, limits)
            c = time.perf_counter()
            split_s += c - b
            for body in bodies:
                feed.index += 1
                result = fsm.apply(feed.index, encode_entry(body, time=now, rid=""))
                fsm.commit()
                removed += len(result.value["reaped"])
            apply_s += time.perf_counter() - c
            objects += sum(plan.counts().values())
            entries += len(bodies)
            if plan.resume is None:
                break
            window = Window(plan.resume, MARKS_PER_PLAN)
        t3 = time.perf_counter()
        c3 = time.process_time()
        with fsm.read() as r:
            left = sum(r.count(t) for t in ("jobs", "evals", "allocs", "job_versions", "job_summary"))
        assert removed == n and left == 0, (removed, left)
        return {
            "objects": objects,
            "entries": entries,
            "plan_s": plan_s,
            "split_s": split_s,
            "apply_s": apply_s,
            "total_s": t3 - t0,
            "rate": objects / (t3 - t0),
            "plan_cpu_s": plan_cpu,
            "cpu_s": c3 - c0,
            "cpu_rate": objects / (c3 - c0),
        }
    finally:
        fsm.close()
        shutil.rmtree(path, ignore_errors=True)


# -- (c) --------------------------------------------------------------------------------
def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def bench_cluster(n: int, samples: int) -> dict[str, float]:
    from concurrent.futures import ThreadPoolExecutor

    from node import devcluster as cl
    from node.wire.rpc_client import RPCClient

    directory = tempfile.mkdtemp(prefix="caravan-gc-bench-c-")
    c = cl.up(directory, 3, extra_config='\n[gc]\njob_threshold = "1h"\nbatch_eval_threshold = "1h"\n\n[scheduler]\nenabled = false\n', timeout=60)
    try:
        leader = cl.wait_for_leader(c.rpc_addresses)["Leader"]
        local = threading.local()

        def call(method: str, args: dict[str, Any]) -> Any:
            cl_ = getattr(local, "c", None)
            if cl_ is None:
                cl_ = local.c = RPCClient([leader], timeout=120)
            return cl_.call(method, args)

        call("node.register", {"node": {"ID": "n1", "Name": "n1"}})
        spec = {"Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}
        ids = [f"cdead-{i:06d}" for i in range(n)]
        t = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            evals = list(pool.map(lambda j: call("job.register", {"job": {**spec, "ID": j}})["EvalID"], ids))
        places = [
            {"ID": f"{j}-a{k}", "EvalID": e, "JobID": j, "NodeID": "n1", "TaskGroup": "g"}
            for j, e in zip(ids, evals, strict=True)
            for k in range(2)
        ]

        def chunked(items: list[Any], size: int) -> list[list[Any]]:
            return [items[i : i + size] for i in range(0, len(items), size)]

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: call("plan.submit", {"plan": {"AllocsToPlace": p}}), chunked(places, 40)))
            list(
                pool.map(
                    lambda part: call("eval.update", {"evals": [{"ID": e, "JobID": j, "Type": "batch", "Status": "complete"} for j, e in part]}),
                    chunked(list(zip(ids, evals, strict=True)), 100),
                )
            )
            list(pool.map(lambda p: call("alloc.update", {"allocs": [{"ID": a["ID"], "ClientStatus": "complete"} for a in p]}), chunked(places, 200)))
        print(f"  built {n:,} dead batch jobs on the cluster in {time.perf_counter() - t:.0f}s", flush=True)

        def writes(tag: str, stop: threading.Event | None, count: int) -> list[float]:
            lat = []
            with RPCClient([leader], timeout=60) as client:
                i = 0
                while (stop is None and i < count) or (stop is not None and not stop.is_set()):
                    s = time.perf_counter()
                    client.call("job.register", {"job": {"ID": f"w-{tag}-{i}", "Type": "service", "TaskGroups": spec["TaskGroups"]}})
                    lat.append(time.perf_counter() - s)
                    i += 1
            return lat

        before = writes("before", None, samples)
        done = threading.Event()
        box: dict[str, Any] = {}

        def gc() -> None:
            s = time.perf_counter()
            with RPCClient([leader], timeout=900) as client:
                box["out"] = client.call("system.gc", {})
            box["seconds"] = time.perf_counter() - s
            done.set()

        thread = threading.Thread(target=gc)
        thread.start()
        during = writes("gc", done, 0)
        thread.join()
        after = writes("after", None, samples)
        base = before + after  # the shared machine's load drifts: baseline on both sides of the GC
        out = box["out"]
        collected = sum(out["Collected"].values())
        return {
            "base_p50": percentile(base, 0.5),
            "base_p99": percentile(base, 0.99),
            "before_p99": percentile(before, 0.99),
            "after_p99": percentile(after, 0.99),
            "gc_p50": percentile(during, 0.5),
            "gc_p99": percentile(during, 0.99),
            "gc_writes": len(during),
            "gc_seconds": box["seconds"],
            "collected": collected,
            "entries": out["Entries"],
        }
    finally:
        cl.down(c)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--live", type=int, default=1_000_000, help="live objects for (a)")
    ap.add_argument("--dead", type=int, default=100_000, help="dead batch jobs for (b)")
    ap.add_argument("--cluster-dead", type=int, default=20_000, help="dead batch jobs on the cluster for (c)")
    ap.add_argument("--samples", type=int, default=500, help="baseline writes for (c)")
    ap.add_argument("--skip-cluster", action="store_true")
    a = ap.parse_args()

    print(f"(a) sweep with no garbage, up to {a.live:,} live objects (FSM level)", flush=True)
    rows = bench_live(a.live)
    worst = max(max(r[1], r[3]) for r in rows)
    print(f"{'live objects':>14} {'sweep ms (defaults)':>20} {'read':>6} {'sweep ms (forced)':>18} {'read':>6}")
    for built, d_s, d_r, f_s, f_r in rows:
        print(f"{built:>14,} {d_s * 1000:>20.3f} {d_r:>6} {f_s * 1000:>18.3f} {f_r:>6}")
    print(f"    target <= 50 ms: {'met' if worst <= 0.050 else 'MISSED'} (worst {worst * 1000:.3f} ms)\n", flush=True)

    print(f"(b) collecting {a.dead:,} dead batch jobs (1 eval + 2 allocs each), FSM level", flush=True)
    b = bench_dead(a.dead)
    print(
        f"    {b['objects']:,.0f} objects in {b['total_s']:.2f}s = {b['rate']:,.0f} objects/s "
        f"(plan {b['plan_s']:.2f}s, split {b['split_s']:.2f}s, apply {b['apply_s']:.2f}s); "
        f"{b['entries']:.0f} raft entries"
    )
    print(
        f"    CPU time {b['cpu_s']:.2f}s (plan {b['plan_cpu_s']:.2f}s) = {b['cpu_rate']:,.0f} objects per CPU-second "
        f"(wall time counts waiting for a core on a shared machine)"
    )
    print(f"    target >= 20,000 objects/s: {'met' if b['rate'] >= 20_000 else 'MISSED'} (wall), "
          f"{'met' if b['cpu_rate'] >= 20_000 else 'MISSED'} (CPU)\n", flush=True)

    if a.skip_cluster:
        return
    print(f"(c) write p99 on a 3-server cluster while a forced GC collects {a.cluster_dead:,} dead batch jobs", flush=True)
    cres = bench_cluster(a.cluster_dead, a.samples)
    ratio = cres["gc_p99"] / cres["base_p99"]
    print(
        f"    without GC: p50 {cres['base_p50'] * 1000:.1f} ms, p99 {cres['base_p99'] * 1000:.1f} ms "
        f"({a.samples} writes before and {a.samples} after the GC; p99 {cres['before_p99'] * 1000:.1f} / {cres['after_p99'] * 1000:.1f} ms)\n"
        f"    during GC:  p50 {cres['gc_p50'] * 1000:.1f} ms, p99 {cres['gc_p99'] * 1000:.1f} ms ({cres['gc_writes']:.0f} writes; "
        f"GC took {cres['gc_seconds']:.1f}s, {cres['collected']:,.0f} objects, {cres['entries']:.0f} entries)\n"
        f"    p99 ratio {ratio:.2f}; target <= 2: {'met' if ratio <= 2 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
