"""GC on real three-server clusters, driven only through RPCs (and the CLI).

The scheduler is off (``[scheduler] enabled = false``): jobs come from ``job.register``;
their evals and allocs are driven to completion with the worker RPCs
(``plan.submit`` places allocs, ``eval.update`` completes evals) and client
updates (``alloc.update``), as a scheduler worker and a client would.

Two clusters (module fixtures, always torn down):

* ``swept``: small thresholds (2s) and intervals (0.5s), tiny job batches:
  the periodic collectors do the work, and leadership is moved mid-sweep.
* ``forced``: thresholds of an hour (the periodic sweeps run but find
  nothing old enough), ACLs bootstrapped: force GC, dry runs, detach, the
  cluster-level re-registration race, tokens, permissions and the CLI.

After every test: no orphan on any server, and every server's digest equal
at the same applied index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from node import devcluster as cl
from node.wire.errors import NOT_FOUND, PERMISSION_DENIED, RPCError
from node.wire.rpc_client import RPCClient
from tests import conditions

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SWEPT = """
[gc]
eval_interval = "500ms"
job_interval = "500ms"
deployment_interval = "500ms"
node_interval = "500ms"
token_interval = "500ms"
eval_threshold = "2s"
batch_eval_threshold = "2s"
job_threshold = "2s"
deployment_threshold = "2s"
node_threshold = "2s"
token_threshold = "2s"
job_batch = 2

[scheduler]
enabled = false
"""
FORCED = """
[gc]
eval_interval = "500ms"
job_interval = "500ms"
deployment_interval = "500ms"
node_interval = "500ms"
token_interval = "500ms"
eval_threshold = "1h"
batch_eval_threshold = "1h"
job_threshold = "1h"
deployment_threshold = "1h"
node_threshold = "1h"
token_threshold = "1h"
job_batch = 10

[scheduler]
enabled = false
"""


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until truthy; fail at the deadline (never a fixed sleep)."""
    return conditions.wait_until(predicate, timeout, what)


class Env:
    """A running cluster plus the token to use with it."""

    def __init__(self, cluster: cl.Cluster, token: str | None = None) -> None:
        self.cluster = cluster
        self.token = token
        self._local = threading.local()

    def client(self, address: str | None = None, token: str | None = None, timeout: float = 30.0) -> RPCClient:
        return RPCClient([address] if address else self.cluster.rpc_addresses, token=token or self.token, timeout=timeout)

    def call(self, method: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """A call from this thread's own client (RPCClient serializes calls)."""
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = self.client()
        return c.call(method, args or {}, timeout=timeout)

    def leader(self) -> cl.ClusterNode:
        def find() -> cl.ClusterNode | None:
            for node in self.cluster.nodes:
                st = cl.status_of(node.rpc_addr, timeout=2.0)
                if st and st.get("Role") == "leader":
                    return node
            return None

        return wait_until(find, 30, "a leader")

    def exists(self, method: str, key: str, ident: str) -> bool:
        try:
            self.call(method, {key: ident})
            return True
        except RPCError as exc:
            if exc.code == NOT_FOUND:
                return False
            raise


def start(tmp_path_factory: pytest.TempPathFactory, name: str, extra: str) -> cl.Cluster:
    directory = tmp_path_factory.mktemp(name)
    c = cl.plan(str(directory), 3, extra_config=extra)
    for node in c.nodes:
        cl.start_node(node)
    c.save()
    try:
        cl.wait_for_leader(c.rpc_addresses, 60.0)
    except Exception:
        stop(c)
        raise
    return c


def stop(c: cl.Cluster) -> None:
    try:
        cl.down(c, timeout=15.0)
    except Exception:  # noqa: BLE001 - best effort, then SIGKILL
        for node in c.nodes:
            if cl.alive(node.pid):
                cl.kill(c, node.id)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    c = start(tmp_path_factory, "gc-swept", SWEPT)
    try:
        env = Env(c)
        env.call("node.register", {"node": {"ID": "n1", "Name": "n1"}})
        yield env
    finally:
        stop(c)


@pytest.fixture(scope="module")
def forced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    c = start(tmp_path_factory, "gc-forced", FORCED)
    try:
        with RPCClient(c.rpc_addresses) as boot:
            secret = boot.call("acl.bootstrap", {})["SecretID"]
        env = Env(c, secret)
        env.call("node.register", {"node": {"ID": "n1", "Name": "n1"}})
        yield env
    finally:
        stop(c)


# -- driving jobs to completion through the real RPCs ----------------------------------
def spec(job_id: str, job_type: str = "batch", meta: dict[str, str] | None = None) -> dict[str, Any]:
    return {"ID": job_id, "Type": job_type, "Meta": meta or {}, "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def run_jobs(env: Env, ids: list[str], *, client_status: str = "complete", job_type: str = "batch", allocs: int = 2) -> dict[str, str]:
    """Register jobs, place their allocs, complete their evals, report the allocs' status. {job: eval}"""
    with ThreadPoolExecutor(8) as pool:
        evals = dict(zip(ids, pool.map(lambda j: env.call("job.register", {"job": spec(j, job_type)})["EvalID"], ids), strict=True))
    places = [
        {"ID": f"{j}-a{i}", "EvalID": evals[j], "JobID": j, "NodeID": "n1", "TaskGroup": "g"}
        for j in ids
        for i in range(allocs)
    ]
    for part in chunks(places, 40):
        env.call("plan.submit", {"plan": {"EvalID": part[0]["EvalID"], "JobID": part[0]["JobID"], "AllocsToPlace": part}})
    for part in chunks(ids, 100):
        env.call("eval.update", {"evals": [{"ID": evals[j], "JobID": j, "Type": job_type, "Status": "complete"} for j in part]})
    for part in chunks(places, 200):
        env.call("alloc.update", {"allocs": [{"ID": p["ID"], "ClientStatus": client_status} for p in part]})
    return evals


def job_ids(env: Env, prefix: str = "") -> set[str]:
    return {j["ID"] for j in env.call("job.list", {"prefix": prefix})["data"]}


# -- the checks after every test ---------------------------------------------------------
def converged(env: Env, gone_jobs: tuple[str, ...] | list[str] = ()) -> str:
    """All servers at one applied index with one digest, and no orphan on any of them."""

    def same() -> dict[str, tuple[str, int]] | None:
        out = {}
        for node in env.cluster.nodes:
            with env.client(node.rpc_addr, timeout=5.0) as c:
                d = c.call("debug.digest", {"stale": True})
            out[node.id] = (d["digest"], d["index"])
        return out if len({i for _, i in out.values()}) == 1 else None

    digests = wait_until(same, 60, "replicas to reach the same applied index")
    assert len({d for d, _ in digests.values()}) == 1, f"replicas diverged: {digests}"
    for node in env.cluster.nodes:
        with env.client(node.rpc_addr, timeout=30.0) as c:
            jobs = {j["ID"] for j in c.list_all("job.list", {"stale": True})}
            evals = {e["ID"]: e for e in c.list_all("eval.list", {"stale": True})}
            allocs = c.list_all("alloc.list", {"stale": True})
            deployments = c.list_all("deployment.list", {"stale": True})
            for a in allocs:
                assert a["EvalID"] in evals, f"{node.id}: alloc {a['ID']} names missing eval {a['EvalID']}"
                assert a["JobID"] in jobs, f"{node.id}: alloc {a['ID']} names missing job {a['JobID']}"
            for e in evals.values():
                assert e["JobID"] in jobs, f"{node.id}: eval {e['ID']} names missing job {e['JobID']}"
            for d in deployments:
                assert d["JobID"] in jobs, f"{node.id}: deployment {d['ID']} names missing job {d['JobID']}"
            for job_id in gone_jobs:
                for method in ("job.versions", "job.summary"):
                    with pytest.raises(RPCError) as err:
                        c.call(method, {"job_id": job_id, "stale": True})
                    assert err.value.code == NOT_FOUND, f"{node.id}: {method} of collected job {job_id}"
    return next(iter(digests.values()))[0]


def deleted_records(env: Env, topic: str) -> Counter[str]:
    """How often each key was deleted, from the change journal (event.stream from index 0)."""
    counts: Counter[str] = Counter()
    with env.client(timeout=30.0) as c:
        for item in c.stream("event.stream", {"index": 0, "topics": [topic]}, idle_timeout=30.0):
            if "progress" in item:
                return counts
            for _topic, kind, key, _obj in item["events"]:
                if kind.endswith("Deleted"):
                    counts[key] += 1
    return counts


def gc_errors(env: Env) -> list[str]:
    """Error lines of the collector (or of a leader loop that crashed) in the servers' logs."""
    lines = []
    for node in env.cluster.nodes:
        for line in Path(node.log_file).read_text(errors="replace").splitlines():
            if '"level": "error"' not in line and '"level": "critical"' not in line:
                continue
            if '"component": "gc"' in line or "leader loop failed" in line:
                lines.append(f"{node.id}: {line}")
    return lines


# -- periodic sweeps ------------------------------------------------------------------------
def test_finished_batch_job_is_swept_with_its_evals_and_allocs(swept: Env) -> None:
    web_eval = swept.call("job.register", {"job": spec("web", "service")})["EvalID"]
    swept.call("plan.submit", {"plan": {"EvalID": web_eval, "JobID": "web", "AllocsToPlace": [
        {"ID": "web-a0", "EvalID": web_eval, "JobID": "web", "NodeID": "n1", "TaskGroup": "g"}]}})
    swept.call("eval.update", {"evals": [{"ID": web_eval, "JobID": "web", "Type": "service", "Status": "complete"}]})
    swept.call("alloc.update", {"allocs": [{"ID": "web-a0", "ClientStatus": "running"}]})

    evals = run_jobs(swept, ["batch1"])
    assert swept.call("job.get", {"job_id": "batch1"})["data"]["Status"] == "dead"
    wait_until(lambda: not swept.exists("job.get", "job_id", "batch1"), 60, "the periodic job GC to take batch1")
    assert not swept.exists("eval.get", "eval_id", evals["batch1"])
    assert not swept.exists("alloc.get", "alloc_id", "batch1-a0")
    assert not swept.exists("alloc.get", "alloc_id", "batch1-a1")
    # The running job beside it is untouched (its complete eval holds a running alloc).
    web = swept.call("job.get", {"job_id": "web"})["data"]
    assert web["Status"] == "running"
    assert swept.exists("eval.get", "eval_id", web_eval) and swept.exists("alloc.get", "alloc_id", "web-a0")
    converged(swept, ["batch1"])


def test_leadership_moves_during_a_sweep(swept: Env) -> None:
    """150 job-reap entries (job_batch = 2); leadership moves while they are being proposed."""
    ids = [f"lead-{i:03d}" for i in range(300)]
    run_jobs(swept, ids, allocs=1)
    old = swept.leader()
    remaining = wait_until(
        lambda: (n := len(job_ids(swept, "lead-"))) < len(ids) and [n], 60, "the sweep to start"
    )[0]
    with swept.client(old.rpc_addr) as c:
        moved_to = c.call("operator.raft.transfer", {})["Leader"]
    assert moved_to != old.rpc_addr
    wait_until(lambda: not job_ids(swept, "lead-"), 120, "the new leader to finish the sweep")
    assert 0 < remaining < len(ids), "leadership did not move mid-sweep"
    # No double delete: the journal deleted each job exactly once.
    deleted = deleted_records(swept, "Job")
    assert all(deleted[j] == 1 for j in ids), {j: deleted[j] for j in ids if deleted[j] != 1}
    assert gc_errors(swept) == []
    converged(swept, ids)


# -- forced GC --------------------------------------------------------------------------------
def test_client_token_may_not_force_gc(forced: Env) -> None:
    client_secret = forced.call("acl.token.create", {"type": "client", "policies": ["read", "write"]})["SecretID"]
    for secret in (client_secret, None):
        with RPCClient(forced.cluster.rpc_addresses, token=secret) as c:
            for args in ({}, {"dry_run": True}, {"detach": True}):
                with pytest.raises(RPCError) as err:
                    c.call("system.gc", args)
                assert err.value.code == PERMISSION_DENIED
    converged(forced)


def test_force_gc_collects_at_once_ignoring_thresholds(forced: Env) -> None:
    """Regression for Nomad #24455: thresholds are 1h here, yet force GC takes everything eligible now."""
    web_eval = forced.call("job.register", {"job": spec("keep", "service")})["EvalID"]
    forced.call("plan.submit", {"plan": {"EvalID": web_eval, "JobID": "keep", "AllocsToPlace": [
        {"ID": "keep-a0", "EvalID": web_eval, "JobID": "keep", "NodeID": "n1", "TaskGroup": "g"}]}})
    forced.call("alloc.update", {"allocs": [{"ID": "keep-a0", "ClientStatus": "running"}]})
    ids = [f"force-{i:02d}" for i in range(20)]
    run_jobs(forced, ids)
    forced.call("node.register", {"node": {"ID": "gone", "Name": "gone"}})
    forced.call("node.status", {"node_id": "gone", "status": "down"})
    tok = forced.call("acl.token.create", {"type": "client", "policies": ["read"], "ttl_seconds": 1})
    wait_until(lambda: time.time_ns() > tok["ExpirationTime"], 10, "the token to expire")

    dry = forced.call("system.gc", {"dry_run": True})
    assert dry["DryRun"] and dry["Collected"]["Jobs"] == 20 and dry["Collected"]["Allocs"] == 40
    assert set(ids) <= set(dry["IDs"]["Jobs"]) and "gone" in dry["IDs"]["Nodes"]
    assert tok["AccessorID"] in dry["IDs"]["ACLTokens"] and "keep" not in dry["IDs"]["Jobs"]
    assert set(ids) <= job_ids(forced, "force-"), "a dry run changed state"

    out = forced.call("system.gc", {}, timeout=120)
    got = out["Collected"]
    assert (got["Jobs"], got["Evals"], got["Allocs"], got["Nodes"], got["ACLTokens"]) == (20, 20, 40, 1, 1), out
    assert out["Index"] > dry["Index"] and out["Skipped"] == 0
    assert not job_ids(forced, "force-") and not forced.exists("node.get", "node_id", "gone")
    assert forced.exists("alloc.get", "alloc_id", "keep-a0")
    assert forced.call("job.get", {"job_id": "keep"})["data"]["Status"] == "running"
    # Nothing left to do: a second run collects nothing.
    again = forced.call("system.gc", {})
    assert sum(again["Collected"].values()) == 0
    converged(forced, ids)


def test_detached_force_gc_returns_at_once_and_collects(forced: Env) -> None:
    ids = [f"detach-{i}" for i in range(5)]
    run_jobs(forced, ids)
    out = forced.call("system.gc", {"detach": True})
    assert out["Detached"] is True
    wait_until(lambda: not job_ids(forced, "detach-"), 60, "the detached GC to finish")
    converged(forced, ids)


def test_job_registered_again_during_a_forced_gc_survives(forced: Env) -> None:
    """The race against a live leader: reaps in 20 entries while every job is registered again."""
    ids = [f"race-{i:03d}" for i in range(200)]
    run_jobs(forced, ids, allocs=1)
    result: dict[str, Any] = {}
    gc = threading.Thread(target=lambda: result.update(forced.call("system.gc", {}, timeout=120)))
    gc.start()
    with ThreadPoolExecutor(6) as pool:
        again = dict(zip(
            reversed(ids),
            pool.map(lambda j: forced.call("job.register", {"job": spec(j, meta={"again": "1"})})["EvalID"], list(reversed(ids))),
            strict=True,
        ))
    gc.join(150)
    assert not gc.is_alive() and "Collected" in result, result
    assert job_ids(forced, "race-") == set(ids), "a job registered again was reaped"
    for job_id, eval_id in again.items():
        assert forced.call("eval.get", {"eval_id": eval_id})["data"]["JobID"] == job_id
    print(f"race: forced GC reaped {result['Collected']['Jobs']} jobs, skipped {result['Skipped']}")
    converged(forced)


def test_cli_system_gc(forced: Env) -> None:
    run_jobs(forced, ["cli-1"])
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(forced.cluster.rpc_addresses), "CARAVAN_TOKEN": forced.token or ""}

    def caravan(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        e = env if token is None else {**env, "CARAVAN_TOKEN": token}
        return subprocess.run(
            [sys.executable, "-m", "node.cli", "system", "gc", *args], cwd=REPO, env=e, capture_output=True, text=True, timeout=120
        )

    dry = caravan("--dry-run")
    assert dry.returncode == 0 and "cli-1" in dry.stdout and "nothing was changed" in dry.stdout, dry
    done = caravan("--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["Collected"]["Jobs"] == 1
    bad = caravan("--detach", "--dry-run")
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1
    client = forced.call("acl.token.create", {"type": "client", "policies": ["write"]})["SecretID"]
    denied = caravan(token=client)
    assert denied.returncode != 0 and "management token" in denied.stderr and "Traceback" not in denied.stderr
    converged(forced, ["cli-1"])
