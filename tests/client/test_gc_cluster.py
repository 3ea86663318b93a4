"""Client alloc GC on a real cluster: each trigger, forced GC by CLI and HTTP, a failing cleanup.

One three-server cluster and two ``caravan client sim`` processes serve
every scenario (started once for the module); each scenario pins its jobs
to a node of its own with a constraint, and reads the client's log lines
("gc: node N: evicted alloc A (reason: R)") and the alloc directories it
keeps under its --data-dir.

- ``gca`` (3 nodes, 100 MB disk each, gc_interval 2s): the interval
  trigger, the issue's disk-pressure run, forced GC, a failing cleanup and
  the servers' GC;
- ``gcb`` (1 node, 100 MB, gc_interval 1h so only the event triggers run,
  gc_max_allocs 2): an alloc turning terminal, a placement over the count,
  and last (it kills the leader) a forced GC across a leader change.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from client import allocdir
from node import devcluster as cl
from tests.lifecycle.conftest import Env, Sim, cluster_env, wait_until

pytestmark = pytest.mark.cluster

MB = 1 << 20
EVICTED = re.compile(r"gc: node (\S+): evicted alloc (\S+) \(reason: ([\w-]+)\)")


@pytest.fixture(scope="module")
def gc_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    gen = cluster_env(tmp_path_factory, "clientgc")
    env = next(gen)
    try:
        common = ("--disk", "100", "--gc-report-interval", "0.3s", "--verbose")
        env.start_sim(3, "gca", *common, "--gc-interval", "2s", "--data-dir", str(env.tmp / "gca"))
        env.start_sim(
            1,
            "gcb",
            *common,
            "--gc-interval",
            "1h",
            "--gc-max-allocs",
            "2",
            "--data-dir",
            str(env.tmp / "gcb"),
        )
        yield env
    finally:
        gen.close()


def node_of(env: Env, prefix: str, i: int) -> tuple[Sim, str]:
    sim = next(
        s for s in env.sims if any(name.startswith(prefix + "-") for name in s.nodes.values())
    )
    return sim, next(nid for nid, name in sim.nodes.items() if name == f"{prefix}-{i}")


def pinned(
    job_id: str, node_id: str, *, type: str = "batch", config: dict[str, Any] | None = None
) -> dict[str, Any]:
    task = {
        "Name": "t",
        "Driver": "sim",
        "Config": config if config is not None else {"run_for": "200ms", "files": 1},
        "Resources": {"CPU": 10, "MemoryMB": 10},
    }
    return {
        "ID": job_id,
        "Type": type,
        "Datacenters": ["dc1"],
        "Constraints": [{"LTarget": "${node.unique.id}", "RTarget": node_id, "Operand": "="}],
        "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}],
    }


def run(env: Env, node_id: str, *, status: str = "complete", **kw: Any) -> str:
    """Register a one-alloc job on ``node_id``; its alloc's id once the servers see it in ``status``."""
    job_id = f"gc-{uuid.uuid4().hex[:8]}"
    env.call("job.register", {"job": pinned(job_id, node_id, **kw)})

    def reached() -> str | None:
        rows = env.read("alloc.list", {"job_id": job_id})
        return rows[0]["ID"] if rows and rows[0]["ClientStatus"] == status else None

    return wait_until(reached, 60, f"job {job_id}'s alloc {status}")


def evictions(sim: Sim, node_id: str) -> list[tuple[str, str]]:
    return [(m[2], m[3]) for m in EVICTED.finditer(sim.output()) if m[1] == node_id]


def kept(env: Env, prefix: str, node_id: str) -> set[str]:
    root = env.tmp / prefix / node_id / "alloc"
    return set(p.name for p in root.iterdir()) if root.exists() else set()


def used_bytes(env: Env, prefix: str, node_id: str) -> int:
    root = env.tmp / prefix / node_id / "alloc"
    return allocdir.measure(str(root))[0] if root.exists() else 0


def put(env: Env, path: str) -> dict[str, Any]:
    http = env.cluster.http_addresses[0]
    with urllib.request.urlopen(
        urllib.request.Request(f"http://{http}{path}", method="PUT"), timeout=10
    ) as resp:
        return json.loads(resp.read())


# -- the four triggers ---------------------------------------------------------------------
def test_interval_trigger_evicts_under_disk_pressure_a_new_live_alloc_caused(gc_env: Env) -> None:
    env = gc_env
    sim, node = node_of(env, "gca", 0)
    old = run(env, node, config={"run_for": "200ms", "write_mb": 30})
    assert evictions(sim, node) == []  # 30%: kept for inspection
    live = run(env, node, type="service", status="running", config={"write_mb": 60})
    # 90% now, from a live alloc: no event trigger fires; the 2s ticker finds it.
    wait_until(lambda: evictions(sim, node) == [(old, "disk")], 30, "the ticker's disk eviction")
    assert kept(env, "gca", node) == {live}  # the live alloc is never touched
    log = sim.output()
    assert log.index(f"evicted alloc {old}") > log.index(f"alloc {live[:8]} running")


def test_disk_pressure_batch_runs_stay_under_the_threshold_oldest_evicted_first(
    gc_env: Env,
) -> None:
    """The issue's case: 30 MB batch tasks one after another on a 100 MB node."""
    env = gc_env
    sim, node = node_of(env, "gca", 1)
    done: list[str] = []
    for _ in range(5):
        done.append(run(env, node, config={"run_for": "300ms", "write_mb": 30}))
        wait_until(
            lambda: used_bytes(env, "gca", node) <= 80 * MB, 30, "usage under 80% after the pass"
        )
    wait_until(lambda: len(evictions(sim, node)) == 3, 30, "three evictions")
    assert evictions(sim, node) == [(done[0], "disk"), (done[1], "disk"), (done[2], "disk")]
    assert kept(env, "gca", node) == {done[3], done[4]}
    log = sim.output()
    for alloc in done[:3]:  # each went only once it had finished
        assert log.index(f"evicted alloc {alloc}") > log.index(f"alloc {alloc[:8]} complete")


def test_terminal_trigger_then_a_placement_over_gc_max_allocs_makes_room_first(gc_env: Env) -> None:
    env = gc_env
    sim, node = node_of(env, "gcb", 0)  # gc_interval 1h: only event triggers run here
    a = run(env, node, config={"run_for": "200ms", "write_mb": 50})
    b = run(env, node, config={"run_for": "200ms", "write_mb": 50})
    # b ended at 100% disk: its turning terminal ran the pass that evicted a.
    wait_until(lambda: evictions(sim, node) == [(a, "disk")], 30, "the terminal trigger's eviction")
    c = run(env, node)
    assert evictions(sim, node) == [(a, "disk")]  # 2 allocs kept: at gc_max_allocs, not over
    d = run(env, node)
    assert evictions(sim, node) == [(a, "disk"), (b, "count")]
    log = sim.output()
    assert log.index(f"evicted alloc {b}") < log.index(
        f"alloc {d[:8]} running"
    )  # room made before it started
    assert kept(env, "gcb", node) == {c, d}


# -- forced: CLI and HTTP; a failing cleanup --------------------------------------------------
def test_forced_gc_by_cli_and_http(gc_env: Env) -> None:
    env = gc_env
    sim, node = node_of(env, "gca", 2)
    first, second = run(env, node), run(env, node)
    out = env.cli("client", "gc", "--node", node[:8])
    assert out.returncode == 0 and f"Client GC requested from node {node}" in out.stdout, (
        out.stdout + out.stderr
    )
    wait_until(lambda: {first, second} <= set(dict(evictions(sim, node))), 30, "forced evictions")
    assert dict(evictions(sim, node))[first] == "forced"
    third = run(env, node)
    out = env.cli("client", "gc", "--alloc", third[:8])
    assert out.returncode == 0 and f"allocation {third} requested from node {node}" in out.stdout, (
        out.stdout
    )
    wait_until(lambda: (third, "forced") in evictions(sim, node), 30, "the alloc form's eviction")
    by_alloc, by_node = run(env, node), run(env, node)
    put(env, f"/v1/client/allocation/{by_alloc}/gc")
    wait_until(lambda: (by_alloc, "forced") in evictions(sim, node), 30, "HTTP alloc GC")
    assert by_node in kept(env, "gca", node)
    assert put(env, f"/v1/client/gc?node_id={node}")["NodeID"] == node
    wait_until(lambda: (by_node, "forced") in evictions(sim, node), 30, "HTTP node GC")
    missing = env.cli("client", "gc", "--node", "nosuchnode")
    assert (
        missing.returncode != 0 and missing.stderr.strip() == "Error: node nosuchnode not found"
    ), missing.stderr


def test_a_failing_cleanup_is_logged_and_skipped_and_status_shows_what_is_held(gc_env: Env) -> None:
    env = gc_env
    sim, node = node_of(env, "gca", 2)
    bad = run(env, node, config={"run_for": "200ms", "files": 1, "fail_cleanup": True})
    good = run(env, node)
    out = env.cli("client", "gc")  # every node
    assert out.returncode == 0 and "every node" in out.stdout, out.stdout + out.stderr
    wait_until(lambda: (good, "forced") in evictions(sim, node), 30, "the next alloc evicted")
    assert f"alloc {bad}: driver cleanup failed" in sim.output()
    assert bad in kept(env, "gca", node)

    def status() -> str:
        shown = env.cli("node", "status", node)
        return shown.stdout if "1 terminal" in shown.stdout and "GC Evicted" in shown.stdout else ""

    text = wait_until(status, 30, "node status showing the one alloc it holds")
    assert re.search(rf"Allocs Held\s+1 terminal \(oldest first: {bad[:8]}\)", text), text
    assert re.search(r"Disk Used\s+0\.0 MB of 100 MB", text), text
    assert re.search(r"Inodes Used\s+4 of 655360 ", text), (
        text
    )  # its dir, the task's, local/, one file


def test_server_gc_deletion_reaches_the_client(gc_env: Env) -> None:
    """``caravan system gc`` reaps the dead job on the servers; the client drops its alloc (as Nomad's removeAlloc)."""
    env = gc_env
    sim, node = node_of(env, "gca", 2)
    alloc = run(env, node, config={"run_for": "200ms", "write_mb": 1})
    assert alloc in kept(env, "gca", node)
    out = env.cli("system", "gc")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until(lambda: (alloc, "server-gc") in evictions(sim, node), 30, "the server GC's eviction")
    assert alloc not in kept(env, "gca", node)


def test_a_forced_gc_reaches_the_client_across_a_leader_change(gc_env: Env) -> None:
    """The request is a raft entry: a new leader commits it and every server's stream carries it."""
    env = gc_env
    sim, node = node_of(env, "gcb", 0)
    alloc = run(env, node)

    def leader() -> Any:
        return next(
            (
                n
                for n in env.cluster.nodes
                if (cl.status_of(n.rpc_addr) or {}).get("Role") == "leader"
            ),
            None,
        )

    cl.kill(env.cluster, wait_until(leader, 30, "a leader").id)
    out = env.cli("client", "gc", "--node", node)  # the CLI finds the new leader
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until(
        lambda: (alloc, "forced") in evictions(sim, node),
        60,
        "the eviction after the leader change",
    )
