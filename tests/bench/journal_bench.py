"""Journal benchmark: catching up on a million records, and 100 subscribers under writes.

    python -m tests.bench.journal_bench [--records 1000000] [--per-batch 10]
                                        [--subscribers 100] [--stalled 10] [--writes 2000] [--window 64] [--rounds 4]

Part 1 — catch-up. Builds a real FSM store whose journal holds ``--records``
change records (plan applies of ``--per-batch`` allocations each, group
commits), then measures in the same run:

* a raw LMDB range scan of the journal (bytes only), and the same scan with
  msgpack decoding of every batch — the floor and the ceiling of any reader;
* ``event.stream`` served by a separate process (the real RPC server, hub and
  handler over that store; only ACL is stubbed out) to a subscriber here:
  - ``follow()`` as clients use it (journal bytes passed through by the
    server, every record decoded by the client),
  - the same without client decoding (what a pass-through consumer pays),
  - ``encoding=records`` (the server decodes and re-encodes every record).

Part 2 — fan-out. A real 3-server cluster takes pipelined writes
(``node.register``, one record per batch) from this process, in phases of
three kinds: no subscribers; ``--subscribers`` live streams (msgpack
encoding, groups of up to 256 batches) held by a separate process and spread
over the three servers; ``--stalled`` streams that never read. Each round
runs the phases in a rotated order (``phase_order``) so no kind always comes
first or last. Reported per kind: the median write rate and the servers' CPU
per write (utime + stime from /proc), delivery lag (receive time minus the
leader's time stamp on the record) over every 10th subscriber, and the
subscriber process's own CPU time. That process checks that every stream got
exactly the journal's batches in order (count and index sum), and otherwise
does only what any consumer must (read and decode frames); it runs on the
servers' two CPUs, so the throughput figure includes its cost, while the
servers' CPU per write does not. Compare ratios within a run, not absolute
numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

REPO = Path(__file__).resolve().parents[2]
BIG = 1 << 40


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


# -- part 1: catch-up ------------------------------------------------------------------
def build_store(path: str, records: int, per_batch: int) -> tuple[int, int]:
    """A real FSM store with ``records`` journal records; returns (batches, records)."""
    from fsm import messages as m
    from fsm.journal import Retention
    from fsm.machine import FSM
    from fsm.messages import encode_entry
    from fsm.structs import SECOND, Allocation, Evaluation, Job, Node, Resources, Task, TaskGroup

    fsm = FSM(path, retention=Retention(max_batches=BIG, max_bytes=BIG))
    index, now = 0, 1_700_000_000 * SECOND

    def apply(body: Any, commit: bool) -> None:
        nonlocal index, now
        index += 1
        now += 1000
        result = fsm.apply(index, encode_entry(body, time=now, rid=""))
        assert result.ok, result.error
        if commit:
            fsm.commit()

    apply(m.NodeRegister(node=Node(id="n1", name="n1", status="ready")), True)
    job = Job(id="web", task_groups=[TaskGroup(name="g", tasks=[Task(name="t")])])
    apply(m.JobRegister(job=job, eval=Evaluation(id="e1", job_id="web")), True)
    made = 0
    while made + 3 < records:
        allocs = [
            Allocation(
                id=f"a{made + i:08d}",
                eval_id="e1",
                job_id="web",
                node_id="n1",
                task_group="g",
                name=f"web.g[{made + i}]",
                resources=Resources(cpu=100, memory_mb=64),
            )
            for i in range(min(per_batch, records - 3 - made))
        ]
        made += len(allocs)
        apply(m.PlanApply(job_id="web", allocs_to_place=allocs), commit=index % 64 == 0)
    fsm.commit()
    with fsm.read() as r:
        batches = total = 0
        for _, raw in r.iter_raw("journal"):
            batches += 1
            total += _count(raw)
    fsm.close()
    return batches, total


def _count(raw: bytes) -> int:
    from node.core.stream import record_count

    return record_count(raw)


def raw_scans(path: str) -> dict[str, dict[str, float]]:
    """Records/s of a raw LMDB range scan (wall clock, and per CPU-second of this process)."""
    from fsm.store import StateStore

    store = StateStore(path)
    out = {}
    try:
        with store.read() as r:
            for name, scan in (
                ("lmdb_scan_bytes", lambda: sum(_count(v) for _, v in r.iter_raw("journal"))),
                ("lmdb_scan_decoded", lambda: sum(len(batch) for _, batch in r.journal_batches())),
            ):
                t, c = time.perf_counter(), time.process_time()
                n = scan()
                out[name] = {"wall": n / (time.perf_counter() - t), "cpu": n / (time.process_time() - c)}
    finally:
        store.close()
    return out


def serve(path: str) -> None:
    """``--serve``: event.stream over an existing store (real RPC server and hub, no raft, no ACL)."""
    from fsm.journal import Retention
    from fsm.machine import FSM
    from node.core.rpc_server import RPCServer
    from node.endpoints.events import event_stream

    class Stub:
        def __init__(self, fsm: FSM) -> None:
            self.fsm = fsm

        async def authorize(self, ctx: Any, need: Any) -> None:
            return None

    async def main() -> None:
        stub = Stub(FSM(path, retention=Retention(max_batches=BIG, max_bytes=BIG)))
        rpc = RPCServer("127.0.0.1:0", max_frame=64 << 20)
        rpc.register("event.stream", functools.partial(event_stream, stub), streaming=True)
        print("ADDR " + await rpc.start(), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def catch_up(path: str, expected: int) -> dict[str, dict[str, float]]:
    """Records/s of a subscriber catching up from index 0, three ways.

    ``wall`` is what this run saw; ``cpu`` divides by the CPU time of the
    busier side (server process or this client), i.e. the rate with a core
    for each — the figure that survives a machine shared with other work.
    """
    from node.wire.events import follow
    from node.wire.rpc_client import RPCClient

    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.journal_bench", "--serve", path],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)

    def via_follow(decode: bool) -> int:
        n = 0
        for item in follow([address], heartbeat=30, decode=decode):
            if "progress" in item:
                break
            n += len(item["events"]) if decode else _count(item["raw"])
        return n

    def via_records_encoding() -> int:
        n = 0
        with RPCClient([address], timeout=60, max_frame=64 << 20) as client:
            for frame in client.stream("event.stream", {"index": 0, "heartbeat": 30, "encoding": "records", "group": 256}):
                if "progress" in frame:
                    break
                n += sum(len(item["events"]) for item in frame.get("batches", [frame]))
        return n

    try:
        assert proc.stdout is not None
        address = next(line for line in proc.stdout if line.startswith("ADDR")).split()[1]
        out = {}
        for name, run in (
            ("stream_follow_decoded", lambda: via_follow(True)),
            ("stream_passthrough", lambda: via_follow(False)),
            ("stream_records_encoding", via_records_encoding),
        ):
            t, c, sc = time.perf_counter(), time.process_time(), cpu_seconds([proc.pid])
            n = run()
            wall, client_cpu, server_cpu = time.perf_counter() - t, time.process_time() - c, cpu_seconds([proc.pid]) - sc
            assert n == expected, (name, n, expected)
            out[name] = {"wall": n / wall, "cpu": n / max(client_cpu, server_cpu, 1e-9),
                         "client_cpu_s": client_cpu, "server_cpu_s": server_cpu}
        return out
    finally:
        proc.kill()
        proc.wait()


# -- part 2: fan-out under writes ---------------------------------------------------------
HEADER = 4


LAG_SAMPLE = 10  # every 10th stream records a receive time per batch (for lag percentiles)


def subscribe(addresses: list[str], count: int, start: int, result_file: str) -> None:
    """``--subscribe``: hold ``count`` raw streams; per stream, what it received (index count/sum/order).

    Reads stdin for ``UNTIL <index>`` and exits once every stream got that far.
    Every stream decodes every frame (as any consumer must to learn the
    indexes), but only every ``LAG_SAMPLE``-th keeps a receive time per
    batch: the bookkeeping of 100 streams x every batch in Python would
    otherwise be this process's main cost, on the servers' two CPUs.
    """
    from node.wire.events import unfold

    sel = selectors.DefaultSelector()
    socks = []
    for i in range(count):
        host, port = addresses[i % len(addresses)].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        request = {"id": f"s{i}", "method": "event.stream", "token": None,
                   "args": {"index": start, "encoding": "msgpack", "heartbeat": 5, "group": 256}}
        body = msgpack.packb(request, use_bin_type=True)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        sock.setblocking(False)
        state = {"buf": bytearray(), "seen": [] if i % LAG_SAMPLE == 0 else None, "last": start, "live": False,
                 "i": i, "count": 0, "sum": 0, "ordered": True}
        sel.register(sock, selectors.EVENT_READ, state)
        socks.append(sock)
    sel.register(sys.stdin, selectors.EVENT_READ, None)
    until = None
    ready_sent = False
    states = [key.data for key in sel.get_map().values() if key.data is not None]
    while True:
        if not ready_sent and all(s["live"] for s in states):
            print("READY", flush=True)
            ready_sent = True
        if until is not None and all(s["last"] >= until for s in states):
            break
        for key, _ in sel.select(timeout=1.0):
            if key.data is None:
                line = sys.stdin.readline()
                if line.startswith("UNTIL"):
                    until = int(line.split()[1])
                continue
            st = key.data
            try:
                chunk = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not chunk:
                raise SystemExit(f"stream {st['i']} closed by the server")
            now = time.time_ns()
            buf = st["buf"]
            buf += chunk
            pos = 0
            seen = st["seen"]
            while len(buf) - pos >= HEADER:
                length = int.from_bytes(buf[pos : pos + HEADER], "big")
                if len(buf) - pos - HEADER < length:
                    break
                message = msgpack.unpackb(bytes(buf[pos + HEADER : pos + HEADER + length]), raw=False)
                pos += HEADER + length
                frame = message.get("stream")
                if frame is None:
                    raise SystemExit(f"stream {st['i']} ended: {message.get('error')}")
                for item in unfold(frame):
                    index = item.get("index")
                    if index is not None:
                        if index <= st["last"] and st["count"]:
                            st["ordered"] = False
                        st["last"] = index
                        st["count"] += 1
                        st["sum"] += index
                        if seen is not None:
                            seen.append((index, now))
                    else:
                        st["live"] = True
                        st["last"] = max(st["last"], item["progress"])
            del buf[:pos]
    for sock in socks:
        sock.close()
    cpu = os.times()
    streams = [{k: s[k] for k in ("count", "sum", "ordered", "last", "seen")} for s in states]
    Path(result_file).write_text(json.dumps({"streams": streams, "cpu": cpu.user + cpu.system}))


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of processes, from /proc (Linux)."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


async def pipelined_writes(leader: str, n: int, window: int, tag: str) -> tuple[float, int]:
    from node.wire.rpc_client import AsyncRPCClient

    client = AsyncRPCClient([leader], timeout=60)
    sem = asyncio.Semaphore(window)
    last = 0

    async def one(i: int) -> None:
        nonlocal last
        async with sem:
            # Registered down: a ready node that never heartbeats would be marked
            # down by the leader later, a background write in some later phase.
            node = {"ID": f"{tag}-{i}", "Name": f"{tag}-{i}", "Status": "down"}
            out = await client.call("node.register", {"node": node})
            last = max(last, out["Index"])

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - t
    await client.close()
    return n / elapsed, last


def stalled_streams(addresses: list[str], count: int, start: int) -> list[socket.socket]:
    """Subscribers that never read (a tiny receive buffer): the server must cut them off, not wait."""
    socks = []
    for i in range(count):
        host, port = addresses[i % len(addresses)].rsplit(":", 1)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        request = {"id": f"stalled{i}", "method": "event.stream", "token": None,
                   "args": {"index": start, "buffer": 64, "heartbeat": 60}}
        body = msgpack.packb(request, use_bin_type=True)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        socks.append(sock)
    return socks


PHASES = ("none", "subscribers", "none", "stalled")


def phase_order(round_no: int, stalled: int) -> list[str]:
    """Round ``r`` runs PHASES rotated by ``r``: over four rounds every kind of phase takes every
    position, so a cluster that slows down (or a neighbour that speeds up) during the run does not
    favour one kind."""
    kinds = [k for k in PHASES if stalled or k != "stalled"]
    shift = round_no % len(kinds)
    return kinds[shift:] + kinds[:shift]


def fanout(subscribers: int, writes: int, window: int, rounds: int, stalled: int) -> dict[str, Any]:
    """Phases with no subscribers / ``subscribers`` live ones / ``stalled`` ones that never read,
    interleaved (``phase_order``) over ``rounds``; medians per kind.

    On a shared machine neighbouring work moves every figure a lot; phases
    of each kind are spread over the whole run and compared by median, and
    the servers' CPU per write is reported beside the write rate.
    """
    from node import devcluster as cl
    from node.wire.rpc_client import RPCClient
    from tests.journal.support import read_journal

    directory = tempfile.mkdtemp(prefix="caravan-journal-bench-")
    c = cl.up(directory, 3)
    try:
        leader = cl.wait_for_leader(c.rpc_addresses)["Leader"]
        leader_node = next(n for n in c.nodes if n.rpc_addr == leader)
        pids = [n.pid for n in c.nodes]
        asyncio.run(pipelined_writes(leader, 300, window, "warmup"))
        rate: dict[str, list[float]] = {"none": [], "subscribers": [], "stalled": []}
        cpu_ms: dict[str, list[float]] = {"none": [], "subscribers": [], "stalled": []}
        lags: list[float] = []
        sub_cpu: list[float] = []

        def measure(kind: str, tag: str) -> int:
            before = cpu_seconds(pids)
            r, last = asyncio.run(pipelined_writes(leader, writes, window, tag))
            cpu_ms[kind].append(1000 * (cpu_seconds(pids) - before) / writes)
            rate[kind].append(r)
            return last

        def with_subscribers(tag: str) -> None:
            start = RPCClient([leader]).call("status")["AppliedIndex"]
            result_file = os.path.join(directory, f"subs-{tag}.json")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.bench.journal_bench", "--subscribe", ",".join(c.rpc_addresses),
                 str(subscribers), str(start), result_file],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
            )
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "READY"
            last = measure("subscribers", tag)
            proc.stdin.write(f"UNTIL {last}\n")
            proc.stdin.flush()
            assert proc.wait(300) == 0, "subscriber process failed"
            data = json.loads(Path(result_file).read_text())
            sub_cpu.append(data["cpu"])
            journal = read_journal(Path(leader_node.data_dir) / "state")
            stamp = {i: b[0][3]["modify_time"] for i, b in journal.items() if b and b[0][3] and start < i <= last}
            for n, stream in enumerate(data["streams"]):
                expected = [i for i in journal if start < i <= stream["last"]]
                assert stream["ordered"], f"stream {n} saw batches out of order"
                assert (stream["count"], stream["sum"]) == (len(expected), sum(expected)), \
                    f"stream {n} did not get exactly the journal's batches"
                if stream["seen"] is not None:
                    lags.extend((t - stamp[i]) / 1e6 for i, t in stream["seen"] if i in stamp)

        def with_stalled(tag: str) -> None:
            start = RPCClient([leader]).call("status")["AppliedIndex"]
            socks = stalled_streams(c.rpc_addresses, stalled, start)
            try:
                measure("stalled", tag)
            finally:
                for sock in socks:
                    sock.close()

        for r in range(rounds):
            for p, kind in enumerate(phase_order(r, stalled)):
                tag = f"{kind[:2]}{r}.{p}"
                if kind == "none":
                    measure("none", tag)
                elif kind == "subscribers":
                    with_subscribers(tag)
                else:
                    with_stalled(tag)
        med = {k: statistics.median(v) for k, v in rate.items() if v}
        med_cpu = {k: statistics.median(v) for k, v in cpu_ms.items() if v}
        return {
            "subscribers": subscribers,
            "stalled_subscribers": stalled,
            "writes_per_phase": writes,
            "write_rate": rate,
            "server_cpu_ms_per_write": cpu_ms,
            "median_write_rate": med,
            "median_server_cpu_ms_per_write": med_cpu,
            "throughput_cost_pct": 100 * (1 - med["subscribers"] / med["none"]),
            "cpu_cost_pct": 100 * (med_cpu["subscribers"] / med_cpu["none"] - 1),
            "stalled_throughput_cost_pct": 100 * (1 - med["stalled"] / med["none"]) if stalled else None,
            "stalled_cpu_cost_pct": 100 * (med_cpu["stalled"] / med_cpu["none"] - 1) if stalled else None,
            "lag_ms_p50": percentile(lags, 0.50),
            "lag_ms_p99": percentile(lags, 0.99),
            "lag_ms_max": max(lags),
            "lag_samples": len(lags),
            "subscriber_process_cpu_s": sub_cpu,
            "load_average": os.getloadavg(),
        }
    finally:
        cl.down(c)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--per-batch", type=int, default=10)
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--writes", type=int, default=2000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--stalled", type=int, default=10, help="subscribers that never read, in extra rounds")
    ap.add_argument("--skip-catch-up", action="store_true")
    ap.add_argument("--skip-fanout", action="store_true")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--subscribe", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve)
        return
    if a.subscribe:
        addrs, count, start, result = a.subscribe
        subscribe(addrs.split(","), int(count), int(start), result)
        return
    report: dict[str, Any] = {}
    if not a.skip_catch_up:
        path = tempfile.mkdtemp(prefix="caravan-journal-bench-store-")
        try:
            t = time.perf_counter()
            batches, records = build_store(path, a.records, a.per_batch)
            print(f"built a journal of {records} records in {batches} batches ({time.perf_counter() - t:.0f}s)", flush=True)
            scans = raw_scans(path)
            stream = catch_up(path, records)
            report["catch_up"] = {"records": records, "batches": batches, **scans, **stream}
            print("  records/s                              wall clock   per CPU-second of the busier side")
            for name, label in (
                ("lmdb_scan_bytes", "raw LMDB range scan, bytes only"),
                ("lmdb_scan_decoded", "raw LMDB range scan, msgpack decoded"),
                ("stream_follow_decoded", "event.stream, follow() (client decodes)"),
                ("stream_passthrough", "event.stream, pass-through (no decode)"),
                ("stream_records_encoding", "event.stream, encoding=records"),
            ):
                x = report["catch_up"][name]
                print(f"  {label:<40} {x['wall']:>10,.0f}   {x['cpu']:>10,.0f}")
        finally:
            shutil.rmtree(path, ignore_errors=True)
    if not a.skip_fanout:
        f = fanout(a.subscribers, a.writes, a.window, a.rounds, a.stalled)
        report["fanout"] = f
        print(f"{f['subscribers']} subscribers over 3 servers; {a.rounds} rounds of phases of {f['writes_per_phase']} "
              f"pipelined writes (median of each kind)")
        for kind, label in (("none", "no subscribers"), ("subscribers", f"{f['subscribers']} subscribers"),
                            ("stalled", f"{f['stalled_subscribers']} stalled (never read)")):
            if f["write_rate"][kind]:
                print(f"  {label:<28} {f['median_write_rate'][kind]:>8,.0f} writes/s   "
                      f"{f['median_server_cpu_ms_per_write'][kind]:.2f} ms servers' CPU per write   "
                      f"(phases: {', '.join(f'{x:,.0f}' for x in f['write_rate'][kind])})")
        print(f"  throughput cost of {f['subscribers']} subscribers  {f['throughput_cost_pct']:.1f}%  "
              f"(servers' CPU per write {f['cpu_cost_pct']:+.1f}%)")
        if f["stalled_throughput_cost_pct"] is not None:
            print(f"  throughput cost of stalled subscribers  {f['stalled_throughput_cost_pct']:.1f}%  "
                  f"(servers' CPU per write {f['stalled_cpu_cost_pct']:+.1f}%)")
        print(f"  delivery lag p50/p99/max  {f['lag_ms_p50']:.1f} / {f['lag_ms_p99']:.1f} / {f['lag_ms_max']:.1f} ms "
              f"over {f['lag_samples']:,} deliveries to every {LAG_SAMPLE}th subscriber (leader's stamp -> subscriber)")
        print(f"  subscriber process CPU {', '.join(f'{x:.1f}s' for x in f['subscriber_process_cpu_s'])}; "
              f"load average {', '.join(f'{x:.1f}' for x in f['load_average'])} on {os.cpu_count()} CPUs")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
