"""Raft adapter benchmark: raw pysyncobj vs Caravan's raft/ on 3 local processes.

    python -m tests.bench.raft_bench [--serial 2000] [--pipelined 20000] [--window 2000] [--repeat 3]

Every case starts three processes on loopback; the leader measures

* serial latency: one synchronous write at a time (p50/p99, writes/s),
* pipelined throughput: ``--pipelined`` writes with at most ``--window`` in flight,

and the table compares each case with raw pysyncobj under the same knobs.
Cases: raw pysyncobj with its defaults; raw pysyncobj with a profile's
knobs and a replicated no-op; the adapter (HMAC-authenticated link,
truncation fix, deferred callbacks, group commit) with a no-op target; the
adapter with an LMDB target (one write txn per tick); and the same with
``fsync=True`` (journal fsync per tick + durable LMDB commit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _free_ports(n: int) -> list[int]:
    import socket

    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class _NoopTarget:
    def __init__(self) -> None:
        self._applied = 0

    def apply(self, index: int, entry: bytes) -> object:
        self._applied = index
        return None

    def commit(self) -> None:
        pass

    @property
    def applied_index(self) -> int:
        return self._applied


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system


class _PhaseCPU:
    """This process's CPU seconds over the leader's pipelined phase, which files in DIR mark.

    Every node writes ``cpu-<address>``; ``run_case`` returns them, so a
    report can say where the CPU of a raw write goes (leader, followers) beside
    the same split for Caravan's writes. A follower polls the marks every
    10 ms: its figure is exact to about that much CPU.
    """

    def __init__(self, directory: str, me: str) -> None:
        self.dir = directory
        self.out = os.path.join(directory, "cpu-" + me.replace(":", "_"))
        self.start: float | None = None
        self.written = False

    def mark(self, name: str) -> None:
        open(os.path.join(self.dir, name), "w").close()

    def poll(self) -> None:
        if self.start is None:
            if os.path.exists(os.path.join(self.dir, "pipe_start")):
                self.start = _process_cpu()
        elif not self.written and os.path.exists(os.path.join(self.dir, "pipe_end")):
            self.write()

    def write(self) -> None:
        if self.start is not None and not self.written:
            with open(self.out + ".tmp", "w") as f:
                f.write(repr(_process_cpu() - self.start))
            os.rename(self.out + ".tmp", self.out)
            self.written = True


def _percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def run_node(a: argparse.Namespace) -> None:
    """One cluster member; the leader runs the measurement."""
    import logging

    import structlog

    logging.basicConfig(level=logging.ERROR)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    from pysyncobj import SyncObj, SyncObjConf, replicated

    from raft import RaftConfig, RaftNode

    peers = a.peers.split(",")
    cfg = RaftConfig(
        self_address=a.self_addr,
        peers=peers,
        data_dir=os.path.join(a.dir, a.self_addr.replace(":", "_")),
        password="bench-secret",
        profile=a.profile,
        fsync=a.fsync,
    )
    os.makedirs(cfg.data_path, exist_ok=True)
    entry = b"x" * a.size

    if a.kind.startswith("raw"):

        class Raw(SyncObj):
            @replicated
            def noop(self, value: bytes) -> None:
                return None

        if a.kind == "raw-defaults":
            conf = SyncObjConf(journalFile=cfg.journal_file)
        else:
            conf = cfg.to_syncobj_conf()
        obj = Raw(a.self_addr, cfg.other_peers, conf)

        def is_leader() -> bool:
            return obj._isLeader()

        def sync_write() -> None:
            obj.noop(entry, sync=True, timeout=10)

        def async_write(cb: Any) -> None:
            obj.noop(entry, callback=lambda r, e: cb())

    else:
        if a.kind == "adapter-lmdb":
            from tests.raft.helper_node import LogFSM

            target: Any = LogFSM(os.path.join(str(cfg.data_path), "fsm"), a.fsync, False)
        else:
            target = _NoopTarget()
        node = RaftNode(cfg, target)

        def is_leader() -> bool:
            return node.is_leader

        def sync_write() -> None:
            node.submit_sync(entry, 10)

        def async_write(cb: Any) -> None:
            node.submit(entry, lambda r, i, e: cb())

    done = os.path.join(a.dir, "done")
    phase = _PhaseCPU(a.dir, a.self_addr)
    deadline = time.monotonic() + 30
    while not os.path.exists(done) and not is_leader() and time.monotonic() < deadline:
        phase.poll()
        time.sleep(0.01)
    if is_leader() and not os.path.exists(done):
        time.sleep(0.5)  # let followers connect and the no-op commit
        res: dict[str, Any] = {"kind": a.kind, "profile": a.profile, "fsync": a.fsync}
        lat = []
        t0 = time.perf_counter()
        for _ in range(a.serial):
            t = time.perf_counter()
            sync_write()
            lat.append(time.perf_counter() - t)
        res["serial_s"] = time.perf_counter() - t0
        res["p50_ms"] = _percentile(lat, 0.50) * 1e3
        res["p99_ms"] = _percentile(lat, 0.99) * 1e3
        res["serial_wps"] = a.serial / res["serial_s"]
        if a.pipelined:
            sem = threading.Semaphore(a.window)
            ev = threading.Event()
            count = [0]
            lock = threading.Lock()

            def cb() -> None:
                with lock:
                    count[0] += 1
                    if count[0] == a.pipelined:
                        ev.set()
                sem.release()

            phase.mark("pipe_start")
            phase.poll()
            t0 = time.perf_counter()
            for _ in range(a.pipelined):
                sem.acquire()
                async_write(cb)
            ev.wait(300)
            res["pipelined_wps"] = a.pipelined / (time.perf_counter() - t0)
            phase.write()
            phase.mark("pipe_end")
            res["leader"] = a.self_addr
        with open(os.path.join(a.dir, "res.tmp"), "w") as f:
            json.dump(res, f)
        os.rename(os.path.join(a.dir, "res.tmp"), os.path.join(a.dir, "res"))
        open(done, "w").close()
    while not os.path.exists(done):
        phase.poll()
        time.sleep(0.01)
    phase.poll()  # the end mark precedes done
    os._exit(0)


def run_case(
    kind: str, profile: str, fsync: bool, serial: int, pipelined: int, window: int, size: int
) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="raftbench_")
    try:
        addrs = [f"127.0.0.1:{p}" for p in _free_ports(3)]
        procs = []
        for addr in addrs:
            args = [
                sys.executable,
                "-m",
                "tests.bench.raft_bench",
                "--node",
                "--self",
                addr,
                "--peers",
                ",".join(addrs),
                "--dir",
                d,
                "--kind",
                kind,
                "--profile",
                profile,
                "--serial",
                str(serial),
                "--pipelined",
                str(pipelined),
                "--window",
                str(window),
                "--size",
                str(size),
            ]
            if fsync:
                args.append("--fsync")
            env = dict(os.environ, PYTHONPATH=str(REPO))
            procs.append(
                subprocess.Popen(
                    args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )
        for p in procs:
            try:
                p.wait(600)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
        res_path = os.path.join(d, "res")
        if not os.path.exists(res_path):
            err = b"".join(p.stderr.read() if p.stderr else b"" for p in procs)
            return {
                "kind": kind,
                "profile": profile,
                "fsync": fsync,
                "error": err.decode(errors="replace")[-2000:],
            }
        with open(res_path) as f:
            res = json.load(f)
        res["cpu_s"] = {
            name[4:].replace("_", ":"): float(Path(d, name).read_text()) for name in os.listdir(d)
            if name.startswith("cpu-") and not name.endswith(".tmp")
        }
        return res
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--self", dest="self_addr")
    ap.add_argument("--peers")
    ap.add_argument("--dir")
    ap.add_argument("--kind", default="adapter")
    ap.add_argument("--profile", default="low-latency")
    ap.add_argument("--fsync", action="store_true")
    ap.add_argument("--serial", type=int, default=2000)
    ap.add_argument("--pipelined", type=int, default=20000)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cases", default="all", help="comma list of kind:profile[:fsync], or 'all'")
    a = ap.parse_args()
    if a.node:
        run_node(a)
        return
    if a.cases == "all":
        cases = [
            ("raw-defaults", "low-latency", False),
            ("raw", "low-latency", False),
            ("adapter", "low-latency", False),
            ("adapter-lmdb", "low-latency", False),
            ("adapter-lmdb", "low-latency", True),
            ("raw", "throughput", False),
            ("adapter", "throughput", False),
            ("adapter-lmdb", "throughput", False),
            ("raw", "batched", False),
            ("adapter", "batched", False),
        ]
    else:
        cases = []
        for c in a.cases.split(","):
            parts = c.split(":")
            cases.append(
                (
                    parts[0],
                    parts[1] if len(parts) > 1 else "low-latency",
                    len(parts) > 2 and parts[2] == "fsync",
                )
            )
    # Repeats run round-robin over the cases so a noisy neighbour on the
    # shared machine hits every case alike; the table shows medians.
    runs: dict[tuple[str, str, bool], list[dict[str, Any]]] = {c: [] for c in cases}
    for rep in range(a.repeat):
        for kind, profile, fsync in cases:
            serial = min(a.serial, 30) if kind == "raw-defaults" else a.serial
            pipelined = 0 if kind == "raw-defaults" else a.pipelined
            if kind == "raw-defaults" and rep > 0:
                continue
            r = run_case(kind, profile, fsync, serial, pipelined, a.window, a.size)
            runs[(kind, profile, fsync)].append(r)
            print(
                f"  run {rep + 1}/{a.repeat} {kind}/{profile}{'/fsync' if fsync else ''}: "
                + (
                    "ERROR"
                    if "error" in r
                    else f"p50 {r['p50_ms']:.2f} ms, pipelined {r.get('pipelined_wps', 0):.0f}/s"
                ),
                file=sys.stderr,
                flush=True,
            )

    def med(rs: list[dict[str, Any]], key: str) -> float:
        vals = sorted(r[key] for r in rs if key in r)
        return vals[len(vals) // 2] if vals else 0.0

    results = []
    raw_by_profile: dict[str, dict[str, float]] = {}
    print(f"median of {a.repeat} run(s), {a.size}-byte entries, 3 processes on one host")
    print(
        f"{'case':<34} {'p50 ms':>8} {'p99 ms':>8} {'serial/s':>9} {'pipelined/s':>12} {'vs raw (p50, pipelined)':>26}"
    )
    for (kind, profile, fsync), rs in runs.items():
        name = f"{kind}/{profile}" + ("/fsync" if fsync else "")
        ok = [r for r in rs if "error" not in r]
        if not ok:
            print(f"{name:<34} ERROR {rs[0]['error'][-300:] if rs else ''}")
            continue
        m = {k: med(ok, k) for k in ("p50_ms", "p99_ms", "serial_wps", "pipelined_wps")}
        results.append({"kind": kind, "profile": profile, "fsync": fsync, "runs": len(ok), **m})
        if kind == "raw":
            raw_by_profile[profile] = m
        base = raw_by_profile.get(profile)
        ratio = ""
        if base and kind != "raw":
            pr = m["pipelined_wps"] / base["pipelined_wps"] if base["pipelined_wps"] else 0
            ratio = f"{m['p50_ms'] / base['p50_ms']:.2f}x, {pr:.2f}x"
        pw = f"{m['pipelined_wps']:.0f}" if m["pipelined_wps"] else "-"
        print(
            f"{name:<34} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} {m['serial_wps']:9.0f} {pw:>12} {ratio:>26}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
