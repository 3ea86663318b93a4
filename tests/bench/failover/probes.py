"""What the benchmark watches the cluster with: a steady writer, and a journal watcher.

``Writer`` registers a tiny job (count 0: an eval with nothing to place, so
the probe adds a write, not scheduling work) at a steady rate through the
wire client, which follows the leader; each call's wall-clock start and
latency are kept, so any window's p50/p99 can be read afterwards.

``Watcher`` follows ``event.stream`` (Node and Evaluation topics) from one
index, moving to another server and resuming from the last index when its
stream breaks. It keeps, per node, the batch (raft index) and commit time of
its latest status, and every eval created after the start: that is how the
storm's mark-downs, batches and evals are counted whatever message type the
leader writes them with.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient

TINY_JOB = {"Type": "service", "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "g", "Count": 0,
                            "Tasks": [{"Name": "t", "Driver": "sim", "Config": {}, "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}


def tiny_job(job_id: str) -> dict[str, Any]:
    return {"Job": {"ID": job_id, "Name": job_id, **TINY_JOB}}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Sample:
    start: float  # wall clock
    seconds: float
    ok: bool


class Writer:
    """Writes ``rate`` tiny jobs a second until stopped; a late call delays the next, never piles them up."""

    def __init__(self, addresses: list[str], rate: float, timeout: float = 30.0) -> None:
        self.addresses = addresses
        self.period = 1.0 / rate
        self.timeout = timeout
        self.samples: list[Sample] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        with RPCClient(self.addresses, timeout=self.timeout) as client:
            next_at = time.monotonic()
            while not self.stopped.is_set():
                n += 1
                start, t0 = time.time(), time.perf_counter()
                try:
                    client.call("job.register", {"job": tiny_job(f"fw-{n:06d}")})
                    ok = True
                except (RPCError, OSError):
                    ok = False
                self.samples.append(Sample(start, time.perf_counter() - t0, ok))
                next_at = max(next_at + self.period, time.monotonic())
                self.stopped.wait(max(0.0, next_at - time.monotonic()))  # pacing, not synchronisation

    def window(self, start: float, end: float) -> dict[str, Any]:
        """p50/p99 (ms) of the calls started in [start, end) (wall clock); failed calls count at their duration."""
        inside = [s for s in list(self.samples) if start <= s.start < end]
        ms = [s.seconds * 1000 for s in inside]
        return {"calls": len(inside), "failed": sum(not s.ok for s in inside),
                "p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99), "max_ms": max(ms, default=None)}

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)  # a call still retrying ends with the cluster (the thread is a daemon)


@dataclass
class NodeSeen:
    status: str
    index: int  # the raft index of the batch that set it
    at: float  # its status_updated_at (the leader's clock at commit, seconds)


@dataclass
class EvalSeen:
    job_id: str
    triggered_by: str
    create_index: int
    status: str
    previous_eval: str = ""  # set on a follow-up (a blocked or retried eval), empty on one a mark-down created


@dataclass
class Watcher:
    """The latest status of every node, and the evals created after ``index``, from the journal."""

    addresses: list[str]
    index: int
    nodes: dict[str, NodeSeen] = field(default_factory=dict)
    evals: dict[str, EvalSeen] = field(default_factory=dict)
    breaks: int = 0
    error: str = ""

    def __post_init__(self) -> None:
        self.start_index = self.index
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="watcher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        turn = 0
        while not self.stopped:
            address = self.addresses[turn % len(self.addresses)]
            try:
                with RPCClient([address], timeout=5) as client:
                    args = {"index": self.index, "topics": ["Node", "Evaluation"], "heartbeat": 1, "group": 64}
                    for item in client.stream("event.stream", args, idle_timeout=15):
                        if self.stopped:
                            return
                        self._take(item)
            except (RPCError, OSError) as exc:
                self.breaks += 1
                self.error = str(exc)
            turn += 1
            time.sleep(0.1)  # back off before the next server, not a wait for a condition

    def _take(self, item: dict[str, Any]) -> None:
        for batch in item.get("batches") or [item]:
            index = int(batch.get("index") or 0)
            with self.lock:
                for topic, _type, key, obj in batch.get("events") or []:
                    if obj is None:
                        continue
                    if topic == "Node":
                        self.nodes[key] = NodeSeen(obj.get("status", ""), index, obj.get("status_updated_at", 0) / 1e9)
                    elif topic == "Evaluation" and int(obj.get("create_index", 0)) > self.start_index:
                        self.evals[key] = EvalSeen(obj.get("job_id", ""), obj.get("triggered_by", ""),
                                                   int(obj.get("create_index", 0)), obj.get("status", ""),
                                                   obj.get("previous_eval") or "")
                self.index = max(self.index, index)
            if "progress" in batch:
                self.index = max(self.index, int(batch["progress"]))

    def count(self, ids: list[str], status: str, since_index: int = 0) -> int:
        with self.lock:
            return sum(1 for i in ids if (n := self.nodes.get(i)) is not None and n.status == status and n.index > since_index)

    def evals_since(self, index: int) -> list[EvalSeen]:
        with self.lock:
            return [e for e in self.evals.values() if e.create_index > index]

    def stop(self) -> None:
        self.stopped = True
