"""Local cluster control: start, inspect, kill and restart server processes.

``caravan cluster up`` writes one TOML config per server under DIR, starts
each as ``caravan agent`` in the background, waits for a leader, and keeps
``DIR/cluster.json`` current (ids, addresses, pids, data dirs, log files) so
that later commands — and jepsen_like — can find and kill them.

Every process it starts goes through ``launch``, one way for all of them.
It talks to servers only over RPC (``node.wire``) and never imports server
code, so the fault-injection harness can use it as a client would.
Seeding servers from a snapshot is in ``node.devcluster_restore``.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient
from raft.starting import ROLE_STARTING

CLUSTER_FILE = "cluster.json"
REPO_ROOT = Path(__file__).resolve().parents[1]  # where ``python -m node.cli`` finds this tree


class ClusterError(RuntimeError):
    """A cluster operation failed; the message says what to do."""


@dataclass
class ClusterNode:
    id: str
    rpc_addr: str
    raft_addr: str
    data_dir: str
    log_file: str
    config_file: str
    pid: int = 0
    http_address: str = ""  # the server's Nomad-compatible HTTP API ("" : its config's default)


@dataclass
class Cluster:
    dir: str
    nodes: list[ClusterNode] = field(default_factory=list)
    acl: bool = False
    client_pid: int = 0  # the simulated client ``caravan dev`` started beside the servers

    @property
    def rpc_addresses(self) -> list[str]:
        return [n.rpc_addr for n in self.nodes]

    @property
    def http_addresses(self) -> list[str]:
        return [n.http_address for n in self.nodes if n.http_address]

    def node(self, name: str) -> ClusterNode:
        for node in self.nodes:
            if name in (node.id, node.rpc_addr):
                return node
        raise ClusterError(
            f"no server {name!r} in {self.dir}; known: {', '.join(n.id for n in self.nodes)}"
        )

    def save(self) -> None:
        path = Path(self.dir) / CLUSTER_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "dir": self.dir,
                    "acl": self.acl,
                    "client_pid": self.client_pid,
                    "nodes": [asdict(n) for n in self.nodes],
                },
                indent=2,
            )
        )
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: str) -> Cluster:
        path = Path(directory) / CLUSTER_FILE
        if not path.exists():
            raise ClusterError(
                f"no cluster in {directory}: run 'caravan cluster up --dir {directory}' first"
            )
        data = json.loads(path.read_text())
        return cls(
            dir=data["dir"],
            acl=data.get("acl", False),
            client_pid=data.get("client_pid", 0),
            nodes=[ClusterNode(**n) for n in data["nodes"]],
        )


#: Where local servers listen when the kernel's ephemeral range cannot be read (Linux's default
#: range starts at 32768).
LISTEN_PORTS = (10000, 32768)


def listen_port_range() -> tuple[int, int]:
    """[low, high) for listening ports: below the kernel's ephemeral range.

    A port the kernel handed out (bind to port 0) comes from the ephemeral
    range, where any outgoing connection may take it as its source port
    while the server that listened on it is stopped; the restarted server
    then cannot bind its old address. Ports below the range are only ever
    taken by someone listening on them.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LISTEN_PORTS
    return (LISTEN_PORTS[0], low) if low - LISTEN_PORTS[0] >= 1000 else LISTEN_PORTS


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range (it may be taken again before use)."""
    low, high = listen_port_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        if port_is_free(host, port):
            return port
    raise ClusterError(
        f"no free port between {low} and {high} on {host}; stop some servers and retry"
    )


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (with SO_REUSEADDR, as ours do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


class AddressBook:
    """Hands out listen addresses: a server's previous one while it is free, else a fresh port.

    Restarting a cluster directory keeps its addresses, so the
    ``CARAVAN_ADDRESS`` a user exported, and the peers in each server's
    config, stay valid across ``caravan dev`` / ``cluster up`` runs. One
    book never hands out the same port twice (``free_port`` draws at
    random), and its ports lie below the ephemeral range, so a stopped
    server's port is still there when it restarts. The fault harness keeps
    one book for a run's life, so a server it adds mid-run never lands on
    a port another server holds.
    """

    def __init__(self) -> None:
        self.taken: set[tuple[str, int]] = set()

    def get(self, host: str, previous: str = "") -> str:
        if previous:
            old_host, _, old_port = previous.rpartition(":")
            port = int(old_port)
            if old_host == host and (host, port) not in self.taken and port_is_free(host, port):
                self.taken.add((host, port))
                return previous
        while True:
            port = free_port(host)
            if (host, port) not in self.taken:
                self.taken.add((host, port))
                return f"{host}:{port}"


def _previous_nodes(root: Path) -> dict[str, ClusterNode]:
    """The servers a directory's ``cluster.json`` recorded, by id (none when absent or unreadable)."""
    try:
        return {n.id: n for n in Cluster.load(str(root)).nodes}
    except (ClusterError, OSError, ValueError, KeyError, TypeError):
        return {}


def _toml_str(value: str) -> str:
    return json.dumps(value)


def render_config(
    node: ClusterNode, members: list[ClusterNode], password_file: str, extra: str = ""
) -> str:
    lines = [
        f"node_id = {_toml_str(node.id)}",
        f"data_dir = {_toml_str(node.data_dir)}",
        f"rpc_addr = {_toml_str(node.rpc_addr)}",
        f"raft_addr = {_toml_str(node.raft_addr)}",
        f"raft_password_file = {_toml_str(password_file)}",
        f"log_file = {_toml_str(node.log_file)}",
        'log_level = "info"',
    ]
    if node.http_address:
        lines.append(f"http_addr = {_toml_str(node.http_address)}")
    lines += [
        extra,
    ]
    for member in members:
        lines += [
            "",
            "[[server]]",
            f"id = {_toml_str(member.id)}",
            f"raft_addr = {_toml_str(member.raft_addr)}",
            f"rpc_addr = {_toml_str(member.rpc_addr)}",
        ]
    return "\n".join(lines) + "\n"


def plan(
    directory: str, count: int, hosts: list[str] | None = None, extra_config: str = ""
) -> Cluster:
    """Lay out ``count`` servers under ``directory`` with free loopback ports and configs.

    A directory that held a cluster before keeps each server's addresses
    where they are still free (see ``AddressBook``).
    """
    if count not in (1, 3, 5):
        raise ClusterError(
            "--nodes must be 1, 3 or 5 (an odd number keeps a majority through one or two failures)"
        )
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    password_file = root / "raft-password"
    if not password_file.exists():
        password_file.write_text(secrets.token_urlsafe(24) + "\n")
        password_file.chmod(0o600)
    hosts = hosts or ["127.0.0.1"] * count
    previous = _previous_nodes(root)
    addresses = AddressBook()
    nodes = []
    for i in range(count):
        host = hosts[i]
        name = f"server{i + 1}"
        old = previous.get(name)
        nodes.append(
            ClusterNode(
                id=name,
                rpc_addr=addresses.get(host, old.rpc_addr if old else ""),
                raft_addr=addresses.get(host, old.raft_addr if old else ""),
                data_dir=str(root / name / "data"),
                log_file=str(root / name / "server.log"),
                config_file=str(root / name / "server.toml"),
                http_address=addresses.get(host, old.http_address if old else ""),
            )
        )
    for node in nodes:
        Path(node.config_file).parent.mkdir(parents=True, exist_ok=True)
        Path(node.config_file).write_text(
            render_config(node, nodes, str(password_file), extra_config)
        )
    return Cluster(dir=str(root), nodes=nodes)


def launch(args: list[str], output: str | Path) -> subprocess.Popen[bytes]:
    """Run ``python -m node.cli ARGS`` from the repository root, in the background.

    Every process a local cluster runs (servers, the simulated client)
    starts here, the same way: in a session of its own, so a Ctrl-C at the
    terminal that started it spares it and only ``down``/``kill`` stop it;
    stdin closed; stdout and stderr appended to ``output``, so a process
    that dies at start-up leaves its reason behind (see ``_last_words``).
    """
    with open(output, "ab") as out:  # the child holds its own copy once started
        return subprocess.Popen(
            [sys.executable, "-m", "node.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(REPO_ROOT),
        )


def start_node(node: ClusterNode) -> int:
    """Start one server in the background (its own session, so Ctrl-C of the CLI spares it)."""
    proc = launch(["agent", "--config", node.config_file], Path(node.log_file).with_suffix(".out"))
    node.pid = proc.pid
    return proc.pid


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by whoever started it) is dead."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # reap it if it is our own child
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X") or _threads_running(pid)


def _threads_running(pid: int) -> bool:
    """Whether any thread of ``pid`` still runs. A multi-threaded server's main thread turns
    zombie before its other threads have exited and closed their sockets: the process is not
    gone (its ports still bound) until every thread is, and a restart then found them taken."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def status_of(address: str, timeout: float = 1.0) -> dict[str, Any] | None:
    """A server's ``status`` answer, or None when it does not answer within ``timeout``."""
    try:
        with RPCClient([address], timeout=timeout) as client:
            return client.call("status", {})
    except (RPCError, OSError):
        return None


def wait_for_leader(addresses: list[str], timeout: float = 30.0) -> dict[str, Any]:
    """Poll status until a server reports a leader every asked server agrees on."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        for address in addresses:
            last = status_of(address) or last
            if last and last.get("Leader"):
                leader = status_of(last["Leader"])
                if leader and leader.get("Role") == "leader":
                    return leader
        time.sleep(0.1)
    raise ClusterError(
        f"no leader elected within {timeout:g}s; check the server logs in the cluster directory"
    )


def up(directory: str, count: int = 3, *, extra_config: str = "", timeout: float = 30.0) -> Cluster:
    """Lay out, start and save a cluster, and return once it has a leader.

    A directory whose servers still run is refused rather than doubled.
    """
    path = Path(directory) / CLUSTER_FILE
    acl = False
    if path.exists():
        existing = Cluster.load(directory)
        if any(alive(n.pid) for n in existing.nodes):
            raise ClusterError(
                f"a cluster is already running in {directory}: 'caravan cluster down --dir {directory}' first"
            )
        acl = existing.acl  # the data dirs still hold the bootstrapped ACLs
        stop_client(existing)  # one left behind by a killed 'caravan dev' would double its nodes
    cluster = plan(directory, count, extra_config=extra_config)
    cluster.acl = acl
    for node in cluster.nodes:
        start_node(node)
    cluster.save()
    wait_serving(cluster.nodes, timeout)
    wait_for_leader(cluster.rpc_addresses, timeout)
    return cluster


def prepare_join(
    cluster: Cluster, name: str, join: list[str], extra_config: str = ""
) -> ClusterNode:
    """Wipe one stopped server's data dir and rewrite its config to join the cluster at ``join``.

    The server keeps its id and addresses (a replacement "in its place");
    its config lists only itself, since after bootstrap the cluster's
    membership comes from the raft log, not from configs. Remove the old
    server from the raft configuration first (``operator raft remove-peer``).
    """
    node = cluster.node(name)
    if alive(node.pid):
        raise ClusterError(
            f"{name} is still running (pid {node.pid}); stop it before wiping its data dir"
        )
    shutil.rmtree(node.data_dir, ignore_errors=True)
    password_file = str(Path(cluster.dir) / "raft-password")
    extra = "\n".join([f"join = [{', '.join(_toml_str(a) for a in join)}]", extra_config])
    Path(node.config_file).write_text(render_config(node, [node], password_file, extra))
    return node


def kill(cluster: Cluster, name: str, sig: int = signal.SIGKILL) -> ClusterNode:
    """Signal one server (SIGKILL: a crash) and wait until its process is gone."""
    node = cluster.node(name)
    if alive(node.pid):
        os.kill(node.pid, sig)
        wait_dead(node.pid, 10.0)
    return node


def wait_dead(pid: int, timeout: float) -> None:
    """Wait for ``pid`` to exit, so its ports and data dir are free for a restart."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            raise ClusterError(f"process {pid} did not exit within {timeout:g}s")
        time.sleep(0.02)


def restart(cluster: Cluster, name: str) -> ClusterNode:
    """Start one server again (stopping it first if it runs) and wait until it answers."""
    node = cluster.node(name)
    if alive(node.pid):
        kill(cluster, name, signal.SIGTERM)
    start_node(node)
    cluster.save()
    wait_serving([node])
    return node


def wait_serving(nodes: list[ClusterNode], timeout: float = 60.0) -> None:
    """Wait until each just-started server answers RPC with its raft up; one that exits fails the wait with its reason.

    Without this a server that could not start (its port taken, a bad data
    dir) was reported started, and the operator found out later from a
    missing leader. A server answers stale reads before its raft node is up
    (role "starting"), and binding the raft port is part of that: it is
    started once the role is another.
    """
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending:
        for node in list(pending):
            if not alive(node.pid):
                raise ClusterError(f"{node.id} exited as it started: {_last_words(node)}")
            answer = status_of(node.rpc_addr)
            if answer is not None and answer.get("Role") != ROLE_STARTING:
                pending.remove(node)
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(n.id for n in pending)
            raise ClusterError(
                f"{names} did not answer within {timeout:g}s; see {pending[0].log_file}"
            )
        time.sleep(0.05)


def _last_words(node: ClusterNode) -> str:
    """The last line a server printed (its one-line startup error), or where to look."""
    out = Path(node.log_file).with_suffix(".out")
    try:
        lines = [line for line in out.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else f"see {node.log_file}"


def _is_client_sim(pid: int) -> bool:
    """Whether ``pid`` is still a ``caravan client sim`` (not a process that reused the pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return alive(pid)  # no /proc: trust the pid
    return b"client" in argv and b"sim" in argv


def terminate(pids: list[int], timeout: float) -> None:
    """SIGTERM every live pid, then wait for each; SIGKILL what outlives ``timeout``."""
    live = [pid for pid in pids if alive(pid)]
    for pid in live:
        os.kill(pid, signal.SIGTERM)
    for pid in live:
        try:
            wait_dead(pid, timeout)
        except ClusterError:
            os.kill(pid, signal.SIGKILL)
            wait_dead(pid, 5.0)


def stop_client(cluster: Cluster, timeout: float = 10.0) -> None:
    """Stop the simulated client recorded in ``cluster``, if it still runs."""
    if alive(cluster.client_pid) and _is_client_sim(cluster.client_pid):
        terminate([cluster.client_pid], timeout)
    cluster.client_pid = 0


def down(cluster: Cluster, timeout: float = 15.0) -> None:
    """Stop the simulated client and every server, and record that none runs."""
    stop_client(cluster)
    terminate([node.pid for node in cluster.nodes], timeout)
    for node in cluster.nodes:
        node.pid = 0
    cluster.save()
