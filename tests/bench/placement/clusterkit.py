"""A real local cluster for the latency and C1M parts: servers, one simulated client, measurements.

Every process goes through ``node.devcluster`` (servers) and
``devcluster.launch`` (the simulated client), each in a session of its own.
``LocalCluster`` is a context manager: on the way out it kills every process
group it started (never by name), removes the directory unless ``keep``,
and on a failure says where the failure happened and keeps the directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from node import devcluster as cl
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient

NODES_PER_CLUSTER = 1000  # topology handed to the simulated client, when it takes --clusters
RACKS_PER_CLUSTER = 20
_SIM_HELP: str | None = None

# The sections ``scheduler.stats`` had before issue 36; anything else is printed as found.
KNOWN_SECTIONS = {"Broker", "BrokerTotals", "Workers", "PlanApplier", "Nodes", "ActiveDeployments", "LeaderSeconds", "Leader"}


class Step:
    """Names the step under way, so that a failure says where it happened."""

    def __init__(self) -> None:
        self.name = "starting"

    def __call__(self, name: str) -> None:
        self.name = name
        print(f"  ... {name}", file=sys.stderr, flush=True)


class LocalCluster:
    """Three servers (or ``servers``) in a fresh directory, and the simulated clients started on them."""

    def __init__(self, label: str, *, servers: int = 3, fsync: bool = False, workers: int | None = None,
                 keep: bool = False, extra: str = "") -> None:
        self.label = label
        self.dir = tempfile.mkdtemp(prefix=f"caravan-placement-{label}-")
        self.keep = keep
        self.step = Step()
        self.sims: list[subprocess.Popen[bytes]] = []
        config = f"fsync = {'true' if fsync else 'false'}\n"
        if workers is not None:
            config += f"[scheduler]\nworkers = {workers}\n"
        self.config = config + extra
        self.servers = servers
        self.cluster: cl.Cluster | None = None

    def __enter__(self) -> LocalCluster:
        self.step(f"{self.label}: starting {self.servers} servers in {self.dir}")
        try:
            self.cluster = cl.up(self.dir, self.servers, extra_config=self.config, timeout=60)
        except BaseException:
            self._stop()
            print(f"{self.label}: failed while {self.step.name}; the directory is kept: {self.dir}", file=sys.stderr)
            raise
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self._stop()
        if kind is not None:
            print(f"{self.label}: failed while {self.step.name}: {exc!r}; servers' and client's logs kept in {self.dir}",
                  file=sys.stderr)
        elif self.keep:
            print(f"{self.label}: cluster directory kept in {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _stop(self) -> None:
        for proc in self.sims:
            _kill_group(proc.pid, proc)
        if self.cluster is not None:
            try:
                cl.down(self.cluster)
            finally:
                for node in self.cluster.nodes:
                    _kill_group(node.pid, None)
        else:  # up() failed half-way: whatever it recorded
            try:
                for node in cl.Cluster.load(self.dir).nodes:
                    _kill_group(node.pid, None)
            except (cl.ClusterError, OSError, ValueError):
                pass

    # -- what the parts use -----------------------------------------------------------
    @property
    def addresses(self) -> list[str]:
        assert self.cluster is not None
        return self.cluster.rpc_addresses

    def http_address(self, rpc_address: str) -> str:
        assert self.cluster is not None
        return next(n.http_address for n in self.cluster.nodes if n.rpc_addr == rpc_address)

    def leader(self) -> tuple[str, int]:
        """The leader's RPC address and pid."""
        assert self.cluster is not None
        address = cl.wait_for_leader(self.addresses, 30)["Leader"]
        pid = next(n.pid for n in self.cluster.nodes if n.rpc_addr == address)
        return address, pid

    def start_sim(self, nodes: int, prefix: str) -> subprocess.Popen[bytes]:
        args = ["client", "sim", "--nodes", str(nodes), "--name-prefix", prefix, "--servers", ",".join(self.addresses)]
        args += topology_args(nodes)
        proc = cl.launch(args, Path(self.dir) / f"sim-{prefix}.log")
        self.sims.append(proc)
        return proc

    def sim_log_tail(self, prefix: str, lines: int = 5) -> str:
        try:
            text = (Path(self.dir) / f"sim-{prefix}.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


def _kill_group(pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the process group ``pid`` leads, then SIGKILL what is left after a few seconds."""
    if pid <= 0:
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if proc is None and not cl.alive(pid):
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # anything of the group still there
    except (ProcessLookupError, PermissionError):
        pass
    if proc is not None:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def sim_help() -> str:
    global _SIM_HELP
    if _SIM_HELP is None:
        out = subprocess.run([sys.executable, "-m", "node.cli", "client", "sim", "--help"], capture_output=True, text=True,
                             cwd=str(cl.REPO_ROOT), timeout=60)
        _SIM_HELP = out.stdout
    return _SIM_HELP


def topology_args(nodes: int) -> list[str]:
    """``--clusters``/``--racks`` for the simulated client, when it has them (detected from ``--help``)."""
    text = sim_help()
    if "--clusters" not in text:
        return []
    clusters = max(1, -(-nodes // NODES_PER_CLUSTER))
    args = ["--clusters", str(clusters)]
    if "--racks" in text:
        racks_help = " ".join(text.split("--racks", 1)[1][:200].lower().split())
        per_cluster = "per cluster" in racks_help or "each cluster" in racks_help
        args += ["--racks", str(RACKS_PER_CLUSTER if per_cluster else clusters * RACKS_PER_CLUSTER)]
    return args


def topology_note(nodes: int) -> str:
    args = topology_args(nodes)
    return " ".join(args) if args else "no --clusters/--racks in 'caravan client sim --help': one flat pool"


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` (MiB), from /proc; NaN where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, seconds) ``pid`` has used, from /proc; NaN where unavailable.

    The leader's CPU per placement is steadier than placements/s on a shared
    machine: another process's load slows the phase, not the work it takes.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def mem_available_mib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def applied_index(address: str) -> int:
    status = cl.status_of(address, timeout=10)
    if status is None:
        raise RuntimeError(f"{address} does not answer 'status'")
    return int(status["AppliedIndex"])


def ready_nodes(http_address: str, prefix: str) -> int:
    """Nodes named PREFIX-* that are ready (one full node list: call it once, not in a loop).

    Through the HTTP API (``/v1/nodes?stale``), which runs the same handler
    in process: 30,000 nodes do not fit in one 4 MiB RPC frame.
    """
    with urllib.request.urlopen(f"http://{http_address}/v1/nodes?stale=true", timeout=120) as resp:
        nodes = json.load(resp)
    return sum(1 for n in nodes if n.get("Status") == "ready" and str(n.get("Name", "")).startswith(f"{prefix}-"))


def wait_nodes(client: RPCClient, want: int, timeout: float, sim: subprocess.Popen[bytes] | None = None) -> float:
    """Wait until the leader's lifecycle knows ``want`` nodes (``scheduler.stats`` Nodes; cheap at any size).

    Returns the seconds it took. Listing 30,000 nodes every poll would load
    the servers being measured.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    seen = 0
    while time.monotonic() < deadline:
        if sim is not None and sim.poll() is not None:
            raise RuntimeError(f"the simulated client exited (code {sim.returncode}) with {seen} of {want} nodes registered")
        try:
            seen = int(client.call("scheduler.stats", {}).get("Nodes", 0))
        except Exception:  # noqa: BLE001, S110 - the lifecycle may be starting; poll until the deadline
            pass
        if seen >= want:
            return time.monotonic() - t0
        time.sleep(1.0)
    raise RuntimeError(f"only {seen} of {want} simulated nodes registered within {timeout:g}s")


class EvalWatch:
    """When each eval left pending, seen on the leader's event stream (one subscription, cheap).

    As lifecycle_bench's, but it resubscribes from the last index after a
    break and ends quietly once stopped (the cluster going down breaks it).
    """

    def __init__(self, address: str, index: int) -> None:
        self.done: dict[str, tuple[float, dict[str, Any]]] = {}
        self.cond = threading.Condition()
        self.stop = False
        self.error = ""
        self.index = index
        self.thread = threading.Thread(target=self._run, args=(address,), daemon=True)
        self.thread.start()

    def _run(self, address: str) -> None:
        breaks = 0
        while not self.stop and breaks < 20:
            try:
                with RPCClient([address], timeout=60) as client:
                    args = {"index": self.index, "topics": ["Evaluation"], "heartbeat": 1}
                    for item in client.stream("event.stream", args, idle_timeout=30):
                        if self.stop:
                            return
                        self._take(item)
            except (RPCError, OSError) as exc:
                if self.stop:
                    return
                breaks += 1
                self.error = str(exc)
                time.sleep(0.2)

    def _take(self, item: dict[str, Any]) -> None:
        now = time.perf_counter()
        self.index = max(self.index, int(item.get("index") or item.get("progress") or 0))
        for _topic, _type, key, obj in item.get("events") or []:
            if obj is not None and obj["status"] != "pending":
                with self.cond:
                    self.done.setdefault(key, (now, obj))
                    self.cond.notify_all()

    def wait_one(self, eval_id: str, deadline: float) -> float | None:
        """When ``eval_id`` left pending (perf_counter), or None at ``deadline`` (monotonic)."""
        with self.cond:
            while eval_id not in self.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))
            return self.done[eval_id][0]


# -- scheduler.stats, whatever the selector exposes --------------------------------------
def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = obj
    return out


def find(stats: dict[str, Any], *patterns: str) -> tuple[str, Any] | None:
    """The first numeric stat whose dotted path matches one of ``patterns`` (regexes, any case)."""
    flat = flatten(stats)
    for pattern in patterns:
        rx = re.compile(pattern, re.I)
        for path, value in flat.items():
            if rx.search(path) and isinstance(value, (int, float)) and not isinstance(value, bool):
                return path, value
    return None


def _numeric(stats: dict[str, Any]) -> dict[str, float]:
    return {p: v for p, v in flatten(stats).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


_PER = re.compile(r"(Per|Avg|Mean|Average)(?=[A-Z]|$)|(per|avg|mean|average)_")  # RescoredPerHit, rescored_per_hit


def _count(flat: dict[str, float], name: str) -> tuple[str, float] | None:
    rx = re.compile(rf"(^|\.)(cache)?{name}$", re.I)
    return next(((p, v) for p, v in flat.items() if rx.search(p)), None)


def cache_figures(phases: list[dict[str, Any]]) -> dict[str, tuple[str, float] | None]:
    """Cache hit rate and nodes re-scored per placement on a hit and on a miss, over ``phases``' stats.

    Each figure comes with the path it was read from: the selector's stats
    are found by name, as their section is newer than this benchmark.
    Counters (hits, misses, nodes re-scored) are summed over the phases (the
    workers' stats are reset between them); a figure whose count is zero
    (no miss at all) is None, printed n/a.
    """
    flats = [_numeric(p) for p in phases]
    total: dict[str, float] = {}
    for f in flats:
        for p, v in f.items():
            total[p] = total.get(p, 0) + v
    out: dict[str, tuple[str, float] | None] = {}
    hits, misses = _count(total, "hits"), _count(total, "misses")
    if hits is not None and misses is not None:
        n = hits[1] + misses[1]
        out["hit_rate"] = (f"{hits[0]} / ({hits[0]} + {misses[0]})", hits[1] / n) if n else None
    else:
        rate = next(((p, v) for f in reversed(flats) for p, v in f.items() if re.search(r"hit.?rate", p, re.I)), None)
        out["hit_rate"] = (rate[0], rate[1] / 100 if rate[1] > 1 else rate[1]) if rate else None
    for kind, count in (("hit", hits), ("miss", misses)):
        key = f"rescored_{kind}"
        if count is not None and count[1] == 0:
            out[key] = None
            continue
        paths = [p for p in total if re.search("scor", p, re.I) and re.search(kind, p, re.I)]
        totals = [p for p in paths if not _PER.search(p)]
        per = [p for p in paths if _PER.search(p)]
        if totals and count is not None:
            out[key] = (f"{totals[0]} / {count[0]}", total[totals[0]] / count[1])
        elif per:  # an average only: the last phase that has one
            out[key] = next(((per[0], f[per[0]]) for f in reversed(flats) if per[0] in f), None)
        else:
            out[key] = None
    # Time on a miss: from a phase that had misses (a phase without reports 0 for it).
    out["miss_ms"] = None
    for stats, flat in zip(phases, flats, strict=True):
        n = _count(flat, "misses")
        found = find(stats, r"miss\w*(latency|ms)", r"(latency|ms)\w*miss")
        if found is not None and (n is None or n[1] > 0):
            out["miss_ms"] = found
    return out


def placement_latency(stats: dict[str, Any]) -> tuple[str, float, float] | None:
    """Dequeue-to-commit p50/p99 per placement, if the workers report it (else None)."""
    workers = stats.get("Workers") or {}
    for key, value in workers.items():
        if re.search(r"dequeue|placement.?latency|schedule.?latency", key, re.I) and isinstance(value, dict):
            if "P50" in value and "P99" in value:
                return f"Workers.{key}", float(value["P50"]), float(value["P99"])
    return None


def extra_sections(stats: dict[str, Any]) -> dict[str, Any]:
    """The sections of ``scheduler.stats`` added since issue 36 began (the selector's, the cache's)."""
    return {k: v for k, v in stats.items() if k not in KNOWN_SECTIONS}
