"""Snapshot benchmark: save, inspect, verify and restore time, file size, and tick stall.

    python -m tests.bench.snapshot_bench [--objects N ...] [--json] [--dir DIR]

The state is built the way a server builds it: entries applied through the
real FSM with group commit (nodes, jobs with their evaluations, and plans
placing allocations), so indexes, job versions and summaries, the journal and
request ids are all present. "Objects" are the rows of the object tables
(``fsm.store.TABLES``); the size ratio compares the file with the msgpack
bytes of those objects (their stored values).

Tick stall: pysyncobj runs the serializer in its tick thread. We measure
(a) how long the synchronous serializer holds the caller, and (b) for the
background snapshotter, how long ``serializer`` holds the caller plus the
longest iteration of a stand-in tick loop (poll with a 10 ms timeout, apply
one entry, commit, as pysyncobj's tick does) while the writer thread runs.

Targets for 1,000,000 objects: save <= 15 s, inspect <= 5 s, restore <= 20 s,
size <= 1.2 x, tick stall < 200 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from fsm import messages as m
from fsm.machine import FSM
from fsm.store import TABLES
from fsm.structs import SECOND, Allocation, Evaluation, Job, Node, Resources, Task, TaskGroup
from snapshot import BackgroundSnapshotter, inspect, make_serializer, restore, save, verify

T0 = 1_700_000_000 * SECOND
ALLOCS_PER_PLAN = 100
COMMIT_EVERY = 20  # entries per group commit (one pysyncobj tick)
TARGETS = {"save_s": 15.0, "inspect_s": 5.0, "restore_s": 20.0, "ratio": 1.2, "stall_ms": 200.0}


def _uuid(kind: int, i: int) -> str:
    return f"{kind:08x}-0000-4000-8000-{i:012x}"


def build(fsm: FSM, objects: int) -> float:
    """Apply entries until the object tables hold about ``objects`` rows; returns seconds."""
    t0 = time.perf_counter()
    index = 0
    now = T0
    batch: list[tuple[int, bytes]] = []

    def submit(body: Any) -> None:
        nonlocal index, now
        index += 1
        now += 1_000_000
        batch.append((index, m.encode_entry(body, time=now, rid=f"bench-{index}")))
        if len(batch) >= COMMIT_EVERY:
            fsm.apply_batch(batch)
            batch.clear()

    # Per job: 1 job + 1 version + 1 summary + 1 eval + ALLOCS_PER_PLAN allocs.
    per_job = 4 + ALLOCS_PER_PLAN
    jobs = max(1, objects // per_job)
    nodes = max(1, jobs // 4)
    for n in range(nodes):
        submit(
            m.NodeRegister(
                node=Node(
                    id=_uuid(1, n),
                    name=f"client-{n}",
                    status="ready",
                    attributes={"os": "linux", "arch": "amd64"},
                )
            )
        )
    for j in range(jobs):
        job_id = f"job-{j:07d}"
        eval_id = _uuid(2, j)
        group = TaskGroup(
            name="web",
            count=ALLOCS_PER_PLAN,
            tasks=[
                Task(
                    name="server",
                    config={"image": "nginx:1.25", "ports": ["http"]},
                    resources=Resources(cpu=250, memory_mb=256),
                )
            ],
        )
        job = Job(id=job_id, name=job_id, task_groups=[group], meta={"team": f"t{j % 17}"})
        submit(m.JobRegister(job=job, eval=Evaluation(id=eval_id, job_id=job_id)))
        allocs = [
            Allocation(
                id=_uuid(3, j * ALLOCS_PER_PLAN + a),
                eval_id=eval_id,
                job_id=job_id,
                node_id=_uuid(1, (j * ALLOCS_PER_PLAN + a) % nodes),
                task_group="web",
                name=f"{job_id}.web[{a}]",
                resources=Resources(cpu=250, memory_mb=256),
            )
            for a in range(ALLOCS_PER_PLAN)
        ]
        submit(m.PlanApply(eval_id=eval_id, job_id=job_id, allocs_to_place=allocs))
    if batch:
        fsm.apply_batch(batch)
    fsm.commit()
    return time.perf_counter() - t0


def object_stats(fsm: FSM) -> tuple[int, int]:
    """(rows, msgpack bytes) of the object tables."""
    rows = size = 0
    with fsm.read() as r:
        for table in TABLES:
            for _, v in r.iter_raw(table):
                rows += 1
                size += len(v)
    return rows, size


TICK_ENTRIES = 20  # client updates applied per stand-in tick (what a busy server's tick carries)


def _tick_loop(fsm: FSM, allocs: int, stop: threading.Event, state: dict[str, int]) -> list[float]:
    """Stand-in for pysyncobj's tick: poll 10 ms, apply a batch of real entries, commit.

    Returns each iteration's time beyond the 10 ms poll.
    """
    times: list[float] = []
    while not stop.is_set():
        t = time.perf_counter()
        select.select([], [], [], 0.01)  # pysyncobj's poller wait (autoTickPeriod 0.01)
        for _ in range(TICK_ENTRIES):
            state["index"] += 1
            i = state["index"]
            update = m.AllocClientUpdate(
                allocs=[
                    m.AllocClientState(
                        id=_uuid(3, i % allocs), client_status=("running", "pending")[i % 2]
                    )
                ]
            )
            fsm.apply(i, m.encode_entry(update, time=T0 + i, rid=""))
        fsm.commit()
        times.append(time.perf_counter() - t - 0.01)
    return times


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def tick_stall(fsm: FSM, work: str) -> dict[str, float]:
    """Serializer stall in the calling ("tick") thread, sync and background."""
    out: dict[str, float] = {}
    raft = ((b"\x13", 10**9, 7), (b"\x13", 10**9 - 1, 7), set())
    with fsm.read() as r:
        allocs = r.count("allocs")
    # (a) synchronous serializer: the whole write happens in the tick.
    path = os.path.join(work, "sync.dump.tmp")
    t0 = time.perf_counter()
    make_serializer(fsm)(path, raft)
    out["sync_serializer_ms"] = (time.perf_counter() - t0) * 1000
    os.unlink(path)

    # (b) background: the serializer call, then ticks while the writer thread runs,
    # compared with the same ticks without it.
    state = {"index": fsm.applied_index + 10}
    baseline: list[float] = []
    stop = threading.Event()
    timer = threading.Timer(3.0, stop.set)  # a fixed 3 s baseline window
    timer.start()
    baseline = _tick_loop(fsm, allocs, stop, state)

    out["tick_baseline_p99_ms"] = _pct(baseline, 0.99)
    out["tick_baseline_max_ms"] = _pct(baseline, 1.0)
    for mode in ("process", "thread"):
        dump = os.path.join(work, f"{mode}.dump")
        bg = BackgroundSnapshotter(fsm, dump, mode=mode)
        during: list[float] = []
        stop = threading.Event()

        def ticker(during: list[float] = during, stop: threading.Event = stop) -> None:
            during.extend(_tick_loop(fsm, allocs, stop, state))

        t0 = time.perf_counter()
        bg.serializer(dump + ".tmp", raft)  # called in this thread, as pysyncobj's tick would
        out[f"{mode}_serializer_ms"] = (time.perf_counter() - t0) * 1000
        thread = threading.Thread(target=ticker)
        thread.start()
        bg.wait()
        out[f"{mode}_write_s"] = time.perf_counter() - t0
        stop.set()
        thread.join()
        t1 = time.perf_counter()
        if bg.serialize_checker() != 2:  # SUCCESS: the checker installs the file in the tick
            raise SystemExit(f"background dump failed: {bg.last_error}")
        out[f"{mode}_install_ms"] = (time.perf_counter() - t1) * 1000
        out[f"{mode}_tick_p50_ms"] = _pct(during, 0.5)
        out[f"{mode}_tick_p99_ms"] = _pct(during, 0.99)
        out[f"{mode}_tick_max_ms"] = _pct(during, 1.0)
        out[f"{mode}_ticks"] = float(len(during))
        os.unlink(dump)
    return out


def run(objects: int, base: str) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix=f"snapbench-{objects}-", dir=base)
    try:
        src = FSM(os.path.join(work, "src"))
        res: dict[str, Any] = {"objects_requested": objects}
        res["build_s"] = build(src, objects)
        res["objects"], res["object_msgpack_bytes"] = object_stats(src)
        digest = src.digest()
        path = os.path.join(work, "state.snap")

        t0 = time.perf_counter()
        info = save(src, path)
        res["save_s"] = time.perf_counter() - t0
        res["file_bytes"] = os.path.getsize(path)
        res["records"] = info.total_count
        res["record_bytes"] = info.total_size
        res["ratio"] = res["file_bytes"] / res["object_msgpack_bytes"]

        t0 = time.perf_counter()
        inspect(path)
        res["inspect_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        verify(path)
        res["verify_s"] = time.perf_counter() - t0

        dst = FSM(os.path.join(work, "dst"))
        t0 = time.perf_counter()
        restore(path, dst)
        res["restore_s"] = time.perf_counter() - t0  # includes its own full verify
        res["digest_equal"] = dst.digest() == digest
        dst.close()

        res.update(tick_stall(src, work))
        src.close()
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(res: dict[str, Any]) -> str:
    def mark(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    mib = 1 << 20
    lines = [
        f"objects {res['objects']:,} ({res['object_msgpack_bytes'] / mib:.1f} MiB msgpack), "
        f"{res['records']:,} records ({res['record_bytes'] / mib:.1f} MiB incl. indexes and journal); "
        f"built in {res['build_s']:.1f} s",
        f"  save     {res['save_s']:7.2f} s   {mark(res['save_s'] <= TARGETS['save_s'])} (<= 15 s at 1M)",
        f"  inspect  {res['inspect_s']:7.2f} s   {mark(res['inspect_s'] <= TARGETS['inspect_s'])} (<= 5 s at 1M)",
        f"  verify   {res['verify_s']:7.2f} s",
        f"  restore  {res['restore_s']:7.2f} s   {mark(res['restore_s'] <= TARGETS['restore_s'])} (<= 20 s at 1M; digest equal: {res['digest_equal']})",
        f"  size     {res['file_bytes'] / mib:7.1f} MiB = {res['ratio']:.3f} x object msgpack   {mark(res['ratio'] <= TARGETS['ratio'])} (<= 1.2 x)",
        f"  stall    sync serializer holds the tick {res['sync_serializer_ms']:.0f} ms; tick work "
        f"({TICK_ENTRIES} entries) without a writer: p99 {res['tick_baseline_p99_ms']:.1f} / max "
        f"{res['tick_baseline_max_ms']:.1f} ms",
    ]
    for mode in ("process", "thread"):
        worst = max(
            res[f"{mode}_serializer_ms"], res[f"{mode}_install_ms"], res[f"{mode}_tick_max_ms"]
        )
        lines.append(
            f"           background {mode:7}: serializer call {res[f'{mode}_serializer_ms']:.1f} ms, "
            f"install {res[f'{mode}_install_ms']:.1f} ms, write {res[f'{mode}_write_s']:.1f} s; ticks meanwhile "
            f"p50 {res[f'{mode}_tick_p50_ms']:.1f} / p99 {res[f'{mode}_tick_p99_ms']:.1f} / max "
            f"{res[f'{mode}_tick_max_ms']:.1f} ms over {int(res[f'{mode}_ticks'])}   "
            f"{mark(worst < TARGETS['stall_ms'])} (< 200 ms)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--objects", type=int, action="append", help="object count (repeatable); default 100000"
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    parser.add_argument(
        "--dir", default=None, help="where to put the temporary stores (default: system temp)"
    )
    args = parser.parse_args(argv)
    for objects in args.objects or [100_000]:
        res = run(objects, args.dir or tempfile.gettempdir())
        print(json.dumps(res) if args.json else report(res), flush=True)
        if not res["digest_equal"]:
            print("restored digest differs from the source", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
