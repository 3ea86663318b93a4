"""FSM apply throughput with group commit, against raw LMDB puts of the same bytes.

    python -m tests.bench.fsm_bench [--jobs 5000] [--allocs 10000] [--group 1000]
                                    [--batch 50] [--rounds 3] [--profile] [--json]

Measured in one run, on fresh stores in a temporary directory:

* ``JobRegister``: ``--jobs`` distinct jobs (one group, one task), each with
  its evaluation, as the leader submits a registration;
* ``JobRegister xN``: the same registrations as the cluster's leader sends
  them under load, ``--batch`` to a ``Batch`` entry (type 21), with a commit
  after every batch entry; figures are per registration (write), not per entry;
* ``AllocClientUpdate``: ``--allocs`` allocations are placed first (not
  measured), then every one is reported ``running`` and later ``complete``
  — one small entry per alloc and status change (2 x ``--allocs`` entries);
* ``raw LMDB``: the very same entry bytes put under their raft index, in
  write transactions of the same size, into an environment opened with the
  FSM's settings — the floor any LMDB-backed apply can reach.

Entries are encoded beforehand (that is the leader's cost) and carry a
leader time and a request id, as on the log. Apply runs as the raft adapter
drives it: ``apply`` per entry, ``commit`` once per ``--group`` entries (one
pysyncobj tick). Rates are medians over ``--rounds``; the machine may be
shared, so the CPU-time rate is printed too (less sensitive to neighbours).
Target (issue 2): >= 20,000 small alloc updates/s.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lmdb

from fsm import messages as m
from fsm.keys import u64
from fsm.machine import FSM
from fsm.messages import encode_batch, encode_entry
from fsm.store import ALL_DBS
from fsm.structs import SECOND, Allocation, Evaluation, Job, Node, Task, TaskGroup

T0 = 1_700_000_000 * SECOND
TARGET_ALLOC_UPDATES = 20_000
MAP_SIZE = 4 << 30


@dataclass
class Rate:
    entries: int
    wall: float
    cpu: float

    @property
    def per_s(self) -> float:
        return self.entries / self.wall

    @property
    def per_cpu_s(self) -> float:
        return self.entries / self.cpu


class Log:
    """Numbers, times and request-ids entries as the leader would."""

    def __init__(self) -> None:
        self.index = 0

    def entry(self, body: object) -> tuple[int, bytes]:
        self.index += 1
        rid = f"{self.index:08x}-0000-4000-8000-000000000000"  # uuid-shaped
        return self.index, encode_entry(body, time=T0 + self.index * 1000, rid=rid)


def job_entries(log: Log, n: int) -> list[tuple[int, bytes]]:
    out = []
    for i in range(n):
        job = Job(
            id=f"job-{i:06d}",
            task_groups=[TaskGroup(name="web", count=3, tasks=[Task(name="srv")])],
        )
        out.append(
            log.entry(m.JobRegister(job=job, eval=Evaluation(id=f"eval-{i:06d}", job_id=job.id)))
        )
    return out


def batch_entries(entries: list[tuple[int, bytes]], size: int) -> list[tuple[int, bytes]]:
    """``entries`` as the leader batches them (``Server._flush_writes``): ``size`` per Batch entry."""
    out = []
    for n, start in enumerate(range(0, len(entries), size), 1):
        items = [entry for _, entry in entries[start : start + size]]
        out.append((n, encode_batch(items, time=T0 + n * 1000)))
    return out


def alloc_setup(log: Log, n: int, per_plan: int = 50) -> tuple[list[tuple[int, bytes]], list[str]]:
    """Nodes, jobs and plans placing ``n`` pending allocs (50 per job)."""
    out = [
        log.entry(m.NodeRegister(node=Node(id=f"node-{i:03d}", status="ready"))) for i in range(100)
    ]
    ids: list[str] = []
    for j in range(0, n, per_plan):
        job_id, eval_id = f"job-{j:06d}", f"eval-{j:06d}"
        job = Job(
            id=job_id, task_groups=[TaskGroup(name="web", count=per_plan, tasks=[Task(name="srv")])]
        )
        out.append(log.entry(m.JobRegister(job=job, eval=Evaluation(id=eval_id, job_id=job_id))))
        allocs = []
        for k in range(j, min(n, j + per_plan)):
            alloc_id = f"alloc-{k:07d}-0000-0000-000000000000"
            ids.append(alloc_id)
            allocs.append(
                Allocation(
                    id=alloc_id,
                    eval_id=eval_id,
                    job_id=job_id,
                    node_id=f"node-{k % 100:03d}",
                    task_group="web",
                    name=f"{job_id}.web[{k - j}]",
                )
            )
        done = Evaluation(id=eval_id, job_id=job_id, status="complete")
        out.append(
            log.entry(
                m.PlanApply(eval_id=eval_id, job_id=job_id, allocs_to_place=allocs, evals=[done])
            )
        )
    return out, ids


def alloc_update_entries(log: Log, ids: list[str]) -> list[tuple[int, bytes]]:
    out = []
    for status in ("running", "complete"):
        for alloc_id in ids:
            update = m.AllocClientUpdate(
                allocs=[m.AllocClientState(id=alloc_id, client_status=status)]
            )
            out.append(log.entry(update))
    return out


def timed(fn: Callable[[], None], entries: int) -> Rate:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    fn()
    return Rate(entries, time.perf_counter() - wall0, time.process_time() - cpu0)


def apply_groups(fsm: FSM, entries: list[tuple[int, bytes]], group: int) -> None:
    apply, commit = fsm.apply, fsm.commit
    for start in range(0, len(entries), group):
        for index, entry in entries[start : start + group]:
            result = apply(index, entry)
            for item in result.batch or (result,):
                if not item.ok:
                    raise SystemExit(f"benchmark entry {index} failed: {item.code} {item.error}")
        commit()


def run_fsm(
    workdir: Path,
    setup: list[tuple[int, bytes]],
    measured: list[tuple[int, bytes]],
    group: int,
    profile: bool,
    writes: int | None = None,
) -> Rate:
    """``writes``: how many writes ``measured`` holds, if not one per entry (batches)."""
    path = tempfile.mkdtemp(dir=workdir)
    fsm = FSM(path, map_size=MAP_SIZE)
    try:
        apply_groups(fsm, setup, group)
        if profile:
            prof = cProfile.Profile()
            prof.enable()
        rate = timed(lambda: apply_groups(fsm, measured, group), writes or len(measured))
        if profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
        return rate
    finally:
        fsm.close()
        shutil.rmtree(path, ignore_errors=True)


def run_raw(
    workdir: Path, measured: list[tuple[int, bytes]], group: int, writes: int | None = None
) -> Rate:
    """The same bytes, one put each, in transactions of ``group`` puts, same env settings."""
    path = tempfile.mkdtemp(dir=workdir)
    env = lmdb.open(
        path,
        map_size=MAP_SIZE,
        max_dbs=len(ALL_DBS) + 4,
        sync=False,
        metasync=False,
        max_readers=512,
    )
    db = env.open_db(b"raw")

    def work() -> None:
        for start in range(0, len(measured), group):
            with env.begin(write=True) as txn:
                for index, entry in measured[start : start + group]:
                    txn.put(u64(index), entry, db=db)

    try:
        return timed(work, writes or len(measured))
    finally:
        env.close()
        shutil.rmtree(path, ignore_errors=True)


def median(rates: list[Rate]) -> Rate:
    by_rate = sorted(rates, key=lambda r: r.per_s)
    mid = by_rate[len(by_rate) // 2]
    cpu = statistics.median(r.cpu for r in rates)
    return Rate(mid.entries, mid.wall, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="JobRegister entries per round")
    parser.add_argument(
        "--allocs", type=int, default=10000, help="pre-placed allocs (2 updates each)"
    )
    parser.add_argument(
        "--group", type=int, default=1000, help="entries per commit (one raft tick)"
    )
    parser.add_argument(
        "--batch", type=int, default=50, help="JobRegister items per Batch entry (JobRegister xN)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the alloc-update apply path"
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the figures as one JSON line"
    )
    args = parser.parse_args(argv)

    log = Log()
    jobs = job_entries(log, args.jobs)
    batched = batch_entries(jobs, args.batch)
    batched_name = f"JobRegister x{args.batch}"
    log = Log()
    setup, ids = alloc_setup(log, args.allocs)
    updates = alloc_update_entries(log, ids)
    sizes = {
        "JobRegister": statistics.mean(len(e) for _, e in jobs),
        batched_name: sum(len(e) for _, e in batched) / len(jobs),
        "AllocClientUpdate": statistics.mean(len(e) for _, e in updates),
    }

    workdir = Path(tempfile.mkdtemp(prefix="caravan-fsm-bench-"))
    results: dict[str, dict[str, Rate]] = {
        "JobRegister": {},
        batched_name: {},
        "AllocClientUpdate": {},
    }
    try:
        samples: dict[tuple[str, str], list[Rate]] = {}
        for _ in range(args.rounds):
            for name, setup_entries, measured, group, writes in (
                ("JobRegister", [], jobs, args.group, None),
                (batched_name, [], batched, 1, len(jobs)),
                ("AllocClientUpdate", setup, updates, args.group, None),
            ):
                samples.setdefault((name, "fsm"), []).append(
                    run_fsm(workdir, setup_entries, measured, group, False, writes)
                )
                samples.setdefault((name, "raw"), []).append(
                    run_raw(workdir, measured, group, writes)
                )
        for (name, kind), rates in samples.items():
            results[name][kind] = median(rates)
        if args.profile:
            run_fsm(workdir, setup, updates, args.group, True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    load = os.getloadavg()
    print(
        f"FSM apply throughput, group commit every {args.group} entries, median of {args.rounds} rounds"
    )
    print(
        f"load average {load[0]:.1f} on {os.cpu_count()} CPUs: '/s' is wall clock, "
        "'/CPU s' this process's CPU time only (what an idle machine would give)"
    )
    header = (
        f"{'workload':<18}{'entries':>8}{'B/entry':>8}{'FSM /s':>10}{'FSM /CPU s':>12}"
        f"{'raw LMDB /s':>13}{'raw /CPU s':>12}{'FSM/raw (CPU)':>15}"
    )
    print(header)
    figures: dict[str, dict[str, float]] = {}
    for name, kinds in results.items():
        fsm_rate, raw_rate = kinds["fsm"], kinds["raw"]
        ratio = fsm_rate.per_s / raw_rate.per_s
        cpu_ratio = fsm_rate.per_cpu_s / raw_rate.per_cpu_s
        figures[name] = {
            "entries": fsm_rate.entries,
            "bytes_per_entry": round(sizes[name], 1),
            "fsm_per_s": round(fsm_rate.per_s),
            "fsm_per_cpu_s": round(fsm_rate.per_cpu_s),
            "raw_per_s": round(raw_rate.per_s),
            "raw_per_cpu_s": round(raw_rate.per_cpu_s),
            "ratio": round(ratio, 4),
            "ratio_cpu": round(cpu_ratio, 4),
        }
        print(
            f"{name:<18}{fsm_rate.entries:>8}{sizes[name]:>8.0f}{fsm_rate.per_s:>10,.0f}"
            f"{fsm_rate.per_cpu_s:>12,.0f}{raw_rate.per_s:>13,.0f}{raw_rate.per_cpu_s:>12,.0f}"
            f"{cpu_ratio:>15.4f}"
        )
    alloc = results["AllocClientUpdate"]["fsm"]
    share = alloc.cpu / alloc.wall
    wall_ok = alloc.per_s >= TARGET_ALLOC_UPDATES
    cpu_ok = alloc.per_cpu_s >= TARGET_ALLOC_UPDATES
    print(
        f"alloc updates: {alloc.per_s:,.0f}/s wall, {alloc.per_cpu_s:,.0f}/CPU s; target "
        f"{TARGET_ALLOC_UPDATES:,}/s {'met' if wall_ok else 'missed'} on the wall clock, "
        f"{'met' if cpu_ok else 'MISSED'} per CPU second (this process ran {share:.0%} of the time)"
    )
    if args.json:
        print(json.dumps({"load_avg_1m": round(load[0], 2), **figures}, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
