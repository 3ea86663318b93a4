"""Real clusters and simulated clients for the lifecycle tests (always torn down)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from node import devcluster as cl
from node.wire.rpc_client import RPCClient
from tests import conditions
from tests.fsm.support import Harness

REPO = Path(__file__).resolve().parents[2]

# Short TTLs so a dead client is noticed within seconds, with enough slack
# that a loaded test machine does not mark live nodes down. The failover TTL
# is as short: an election in the middle of a test must not hold a dead
# client's nodes up for Nomad's 5 minutes.
LIFECYCLE_CONFIG = """
[scheduler]
min_heartbeat_ttl = "2s"
heartbeat_grace = "2s"
failover_heartbeat_ttl = "2s"
eval_nack_delay = "200ms"
eval_nack_delay_later = "1s"
"""


@pytest.fixture
def h() -> Iterator[Harness]:
    """An FSM in a temporary directory (removed afterwards)."""
    harness = Harness.temp()
    yield harness
    harness.destroy()


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail at the deadline."""
    return conditions.wait_until(predicate, timeout, what, interval)


@dataclass
class Sim:
    proc: subprocess.Popen
    nodes: dict[str, str]  # id -> name
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(15)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Env:
    cluster: cl.Cluster
    tmp: Path
    sims: list[Sim] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return self.cluster.rpc_addresses

    def client(self, timeout: float = 15.0) -> RPCClient:
        return RPCClient(self.addresses, timeout=timeout)

    def call(self, method: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
        with self.client() as c:
            return c.call(method, args or {}, **kw)

    def read(self, method: str, args: dict[str, Any] | None = None) -> Any:
        return self.call(method, args)["data"]

    def cli(self, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
        env = {**os.environ, "CARAVAN_ADDRESS": ",".join(self.addresses)}
        return subprocess.run(
            [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
        )

    def start_sim(self, nodes: int, prefix: str, *extra: str) -> Sim:
        log = self.tmp / f"sim-{prefix}.log"
        out = open(log, "wb")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "client", "sim", "--nodes", str(nodes), "--name-prefix", prefix,
             "--servers", ",".join(self.addresses), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
        )
        out.close()
        sim = Sim(proc, {}, log)
        self.sims.append(sim)

        def registered() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"client sim exited early:\n{sim.output()}")
            lines = [ln.split() for ln in sim.output().splitlines() if ln.startswith("  node ")]
            if len(lines) < nodes:
                return False
            sim.nodes = {parts[1]: parts[2] for parts in lines}
            return True

        wait_until(registered, 60, f"client sim {prefix} to register {nodes} nodes")
        wait_until(lambda: all(n["Status"] == "ready" for n in self.read("node.list") if n["ID"] in sim.nodes)
                   and sim.nodes.keys() <= {n["ID"] for n in self.read("node.list")}, 30, "sim nodes ready")
        return sim

    def stop_sims(self) -> None:
        for sim in self.sims:
            try:
                sim.kill(signal.SIGTERM)
            except subprocess.TimeoutExpired:
                sim.kill(signal.SIGKILL)
        self.sims = []


def cluster_env(tmp_path_factory: pytest.TempPathFactory, name: str, config: str = LIFECYCLE_CONFIG) -> Iterator[Env]:
    """A three-server cluster with ``config`` as its extra server config, torn down with its clients."""
    tmp = tmp_path_factory.mktemp(name)
    cluster = cl.up(str(tmp / "cluster"), 3, extra_config=config, timeout=60)
    env = Env(cluster, tmp)
    try:
        yield env
    finally:
        env.stop_sims()
        cl.down(cl.Cluster.load(cluster.dir))


@pytest.fixture(scope="module")
def lifecycle_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A three-server cluster with one simulated client of three nodes."""
    gen = cluster_env(tmp_path_factory, "lifecycle")
    env = next(gen)
    try:
        env.start_sim(3, "main")
        yield env
    finally:
        gen.close()


@pytest.fixture
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A cluster of its own (for tests that kill servers)."""
    yield from cluster_env(tmp_path_factory, "lifecycle-fresh")
