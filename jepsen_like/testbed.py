"""A real cluster for one run: server processes, their configs and the raft proxies.

The harness is a client of the cluster: it starts and signals processes with
``node.devcluster`` and talks to servers over RPC; it imports nothing of the
server's internals.

How partitions work (per-link TCP proxies)
------------------------------------------
pysyncobj knows a peer only by the address string in its peer list, and the
two ends of a pair share ONE TCP connection, which only the end with the
greater address string dials (``TCPTransport._shouldConnect``: ``self.address
> peer.address``). The dialer sends its own address as the first message and
the acceptor looks that string up in *its* peer list. So per server:

* its own raft address (its identity, where it listens) must be what every
  peer that *accepts* its connection lists for it, and
* the address it lists for a peer it *dials* may be anything that reaches
  that peer -- as long as that string sorts below its own address, so it
  still decides to dial.

The layout below satisfies both: server *k* (1-based) has the identity
``127.0.1.k:PORT``; for each pair ``i < j``, server *j* (greater identity)
lists server *i* at a proxy ``127.0.0.1:P_ij`` (``127.0.0.1`` sorts below
every ``127.0.1.x``), which forwards to server *i*'s identity, while server
*i* lists server *j* at *j*'s real identity and never dials it. Every raft
connection thus passes through exactly one proxy per pair, owned by the
harness, and the configs differ between servers only in the raft_addr of
lower-ranked peers. Leader names stay consistent: a server maps the raft
address it sees to an RPC address through its own config, and RPC
addresses are the same in every config.

Membership changes need a testbed without the proxies (``proxies=False``):
a live membership change travels through the raft log as one raft address
per member (``raft/members.py``), so every server must know each member by
the same address string, which the per-server views above cannot give. The
member nemesis's runs therefore have no partitions (``Partition.unavailable``
says so). Every port comes from the launcher's address book
(``node.devcluster.AddressBook``), kept for the run's life.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from client.silence import SILENCE_FILE_ENV, read_ack, write_json_atomically
from jepsen_like.proxy import LinkProxies
from node import devcluster as cl
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient


class TestbedError(RuntimeError):
    """The cluster under test could not be set up or controlled."""


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


IDENTITY_NET = "127.0.1."
#: seconds a membership change may take to show in every running member's configuration
MEMBER_WAIT = 30.0
PROXY_HOST = "127.0.0.1"
RPC_HOST = "127.0.0.1"


def _new_node(root: Path, name: str, book: cl.AddressBook, raft_host: str) -> cl.ClusterNode:
    """A server's layout under ``root``: addresses from the run's one address book, files in its own dir.

    Its HTTP API gets a port of its own too: by default every server would
    race for 4646 (and take a developer's), the losers logging a warning per start.
    """
    return cl.ClusterNode(
        id=name,
        rpc_addr=book.get(RPC_HOST),
        raft_addr=book.get(raft_host),
        data_dir=str(root / name / "data"),
        log_file=str(root / name / "server.log"),
        config_file=str(root / name / "server.toml"),
        http_address=book.get(RPC_HOST),
    )


@dataclass
class Testbed:
    """The servers of one run. Build with ``Testbed.create``; always ``teardown``."""

    __test__ = False  # not a pytest class, despite the name

    directory: Path
    cluster: cl.Cluster
    proxies: LinkProxies | None
    paused: set[str] = field(default_factory=set)
    client_sim: subprocess.Popen[bytes] | None = None
    client_sim_args: list[str] = field(
        default_factory=list
    )  # `node.cli` args, to start it again (client-kill)
    #: the servers' ``raft_compaction_entries`` when the testbed set one (None: the profile's default)
    compaction_entries: int | None = None
    #: the file (in each server's data_dir) its wall-clock offset is read from, when the servers run
    #: with the test-only CARAVAN_UNSAFE_WALL_CLOCK_FILE switch (the clock nemesis); else None
    clock_file: str | None = None
    #: generations of the simulated client's silence control file (``client.silence``), written so far
    silence_generation: int = 0
    #: the launcher's address book: every port a server of this run holds or held, so a server
    #: added mid-run (the member nemesis) never lands on another's port
    book: cl.AddressBook = field(default_factory=cl.AddressBook)
    #: the config text every server gets besides its own lines (workload settings, compaction)
    extra_config: str = ""
    #: servers removed from the cluster for good (the member nemesis's replace), kept for teardown
    retired: list[cl.ClusterNode] = field(default_factory=list)
    #: the RPC addresses the workloads' clients use, and the servers' names in the same order: a
    #: replacement takes its predecessor's place in both, in place (the lanes read these lists)
    client_addresses: list[str] = field(default_factory=list)
    client_names: list[str] = field(default_factory=list)
    #: per server, the sizes of its output and log files when it was last started: what it said
    #: since then is what explains a start that failed (``jepsen_like.health``)
    output_marks: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: servers the harness killed and has not started since: down by its own hand, not the product's
    killed: set[str] = field(default_factory=set)

    @classmethod
    def create(
        cls,
        directory: str | Path,
        count: int,
        *,
        extra_config: str = "",
        proxies: bool = True,
        compaction_entries: int | None = None,
        clock_file: str | None = None,
    ) -> Testbed:
        """Lay out ``count`` servers under ``directory`` (configs, proxies); start nothing yet.

        ``compaction_entries`` sets the servers' ``raft_compaction_entries``: small values make the
        raft log compact every few seconds under load, so a follower cut off for a few seconds must
        be caught up by snapshot install (the ``snapshot-lag`` nemesis). ``clock_file``: the servers
        are started with ``CARAVAN_UNSAFE_WALL_CLOCK_FILE`` set to it (the caller sets the
        environment; the runner does), so ``set_clock_offset`` can move their wall clocks.
        """
        if count not in (1, 3, 5):
            raise TestbedError("--nodes must be 1, 3 or 5")
        if compaction_entries is not None:
            if compaction_entries < 1:
                raise TestbedError("compaction entries must be positive")
            # A top-level key: it must precede the extra config's [tables].
            extra_config = f"raft_compaction_entries = {compaction_entries}\n{extra_config}"
        root = Path(directory).resolve()
        root.mkdir(parents=True, exist_ok=True)
        password_file = root / "raft-password"
        password_file.write_text(secrets.token_urlsafe(24) + "\n")
        password_file.chmod(0o600)
        nodes: list[cl.ClusterNode] = []
        book = cl.AddressBook()
        for k in range(1, count + 1):
            host = f"{IDENTITY_NET}{k}" if proxies else RPC_HOST
            nodes.append(_new_node(root, f"server{k}", book, host))
        net = LinkProxies(PROXY_HOST) if proxies else None
        views: dict[str, list[cl.ClusterNode]] = {n.id: list(nodes) for n in nodes}
        if net is not None:
            for i, low in enumerate(nodes):
                for high in nodes[i + 1 :]:
                    via = net.add(high.id, low.id, low.raft_addr)
                    if (
                        not via < high.raft_addr
                    ):  # the dialing rule above; cannot fail with this layout
                        raise TestbedError(
                            f"proxy address {via} does not sort below {high.raft_addr}"
                        )
                    views[high.id] = [
                        replace(n, raft_addr=via) if n.id == low.id else n for n in views[high.id]
                    ]
        for node in nodes:
            Path(node.config_file).parent.mkdir(parents=True, exist_ok=True)
            Path(node.config_file).write_text(
                cl.render_config(node, views[node.id], str(password_file), extra_config)
            )
        cluster = cl.Cluster(dir=str(root), nodes=nodes)
        cluster.save()
        return cls(
            directory=root,
            cluster=cluster,
            proxies=net,
            compaction_entries=compaction_entries,
            clock_file=clock_file,
            book=book,
            extra_config=extra_config,
            client_addresses=cluster.rpc_addresses,
            client_names=[n.id for n in nodes],
        )

    # -- names ----------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [n.id for n in self.cluster.nodes]

    @property
    def rpc_addresses(self) -> list[str]:
        return self.cluster.rpc_addresses

    def node(self, name: str) -> cl.ClusterNode:
        return self.cluster.node(name)

    def running_addresses(self) -> list[str]:
        """Every RPC address, those of running servers (alive, not paused) first.

        For the harness's own calls: a paused server accepts a connection and
        never answers, so a call that asks it first waits out its whole
        timeout without trying the others.
        """
        running = [n for n in self.names if n not in self.paused and self.alive(n)]
        rest = [n for n in self.names if n not in running]
        return [self.node(n).rpc_addr for n in running + rest]

    # -- processes --------------------------------------------------------------------
    def start_all(self, timeout: float = 60.0) -> None:
        for node in self.cluster.nodes:
            self.start(node.id)
        self.wait_for_leader(timeout)

    def start(self, name: str) -> None:
        node = self.node(name)
        if cl.alive(node.pid):
            return
        self.output_marks[name] = (
            _size(Path(node.log_file).with_suffix(".out")),
            _size(Path(node.log_file)),
        )
        cl.start_node(node)
        self.killed.discard(name)
        self.paused.discard(name)
        self.cluster.save()

    def kill(self, name: str) -> None:
        """kill -9 (works on a paused process too)."""
        cl.kill(self.cluster, name, signal.SIGKILL)
        self.paused.discard(name)
        self.killed.add(name)

    def alive(self, name: str) -> bool:
        return cl.alive(self.node(name).pid)

    def pause(self, name: str) -> None:
        node = self.node(name)
        if cl.alive(node.pid):
            os.kill(node.pid, signal.SIGSTOP)
            self.paused.add(name)

    def resume(self, name: str) -> None:
        node = self.node(name)
        if cl.alive(node.pid):
            os.kill(node.pid, signal.SIGCONT)
        self.paused.discard(name)

    def start_client_sim(self, nodes: int, seed: int = 0) -> None:
        """``caravan client sim`` with ``nodes`` simulated client nodes, as one more process.

        Its state file keeps the node ids, so a restart brings the same nodes back.
        """
        self.client_sim_args = [
            "client",
            "sim",
            "--nodes",
            str(nodes),
            "--servers",
            ",".join(self.rpc_addresses),
            "--seed",
            str(seed),
            "--name-prefix",
            "sim",
            "--state-file",
            self.client_sim_state_file,
        ]
        self._spawn_client_sim()

    def kill_client_sim(self) -> None:
        """kill -9 the simulated client: its nodes stop heartbeating, as a crashed Nomad client's."""
        proc = self.client_sim
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10.0)

    def restart_client_sim(self) -> None:
        if self.client_sim is not None and self.client_sim.poll() is None:
            return
        self._spawn_client_sim()

    def _spawn_client_sim(self) -> None:
        # The client's test-only silence switch (the clients nemesis): launch() passes the
        # harness's environment on, so set it around the start.
        saved = os.environ.get(SILENCE_FILE_ENV)
        os.environ[SILENCE_FILE_ENV] = self.silence_file
        try:
            self.client_sim = cl.launch(self.client_sim_args, self.directory / "client-sim.log")
        finally:
            if saved is None:
                os.environ.pop(SILENCE_FILE_ENV, None)
            else:
                os.environ[SILENCE_FILE_ENV] = saved

    @property
    def client_sim_state_file(self) -> str:
        """Where the simulated client keeps its node ids (so a restart brings the same nodes back)."""
        return str(self.directory / "client-sim-nodes.json")

    @property
    def silence_file(self) -> str:
        """The simulated client's silence control file (``client.silence``)."""
        return str(self.directory / "client-sim-silence.json")

    def client_sim_node_ids(self) -> list[str]:
        """The simulated client's node ids, from its state file ([] before it wrote one)."""
        try:
            data = json.loads(Path(self.client_sim_state_file).read_text())
            return [str(n["id"]) for n in data["nodes"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def client_sim_secret(self) -> str:
        """The node secret the simulated client's nodes authenticate with ("" before it wrote its state).

        A test that reports for one of its nodes (as the client would) passes it as the token.
        """
        try:
            data = json.loads(Path(self.client_sim_state_file).read_text())
            return next((str(n["secret"]) for n in data["nodes"] if n.get("secret")), "")
        except (OSError, ValueError, KeyError, TypeError):
            return ""

    def silence_client_nodes(self, node_ids: list[str], timeout: float = 5.0) -> bool:
        """Cut exactly ``node_ids`` of the simulated client off the servers ([]: bring all back).

        True once the client acknowledged; False if it did not within
        ``timeout``, or at once if it is not running (killed by client-kill:
        it reads the file when it starts again).
        """
        self.silence_generation += 1
        generation = self.silence_generation
        write_json_atomically(
            self.silence_file, {"generation": generation, "silenced": sorted(node_ids)}
        )
        deadline = time.monotonic() + timeout
        while self.client_sim_running():
            if read_ack(self.silence_file) == generation:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)  # polling the client's acknowledgement with a deadline
        return False

    def client_sim_running(self) -> bool:
        return self.client_sim is not None and self.client_sim.poll() is None

    def _stop_client_sim(self) -> None:
        proc, self.client_sim = self.client_sim, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)

    # -- network --------------------------------------------------------------------------
    def partition(self, groups: list[list[str]]) -> list[tuple[str, str]]:
        if self.proxies is None:
            raise TestbedError("this testbed was built without proxies; partitions need them")
        return self.proxies.partition(groups)

    def heal_network(self) -> None:
        if self.proxies is not None:
            self.proxies.heal()

    def heal_all(self) -> None:
        """Undo every fault: continue paused servers, start dead ones, heal the network."""
        for name in list(self.paused):
            self.resume(name)
        if self.silence_generation:
            self.silence_client_nodes([], timeout=2.0)
        self.heal_network()
        for name in self.names:
            if not self.alive(name):
                self.start(name)

    # -- wall clocks (test-only server switch) ----------------------------------------------
    def set_clock_offset(self, name: str, offset_ns: int, timeout: float = 5.0) -> bool:
        """Shift ``name``'s wall clock to real time + ``offset_ns``; True once the server acknowledged it.

        The offset file outlives the process, so a restarted server comes back at the same offset.
        A dead or paused server cannot acknowledge (False); it takes the offset when it runs again.
        """
        if self.clock_file is None:
            raise TestbedError(
                "the servers run without the wall-clock switch (CARAVAN_UNSAFE_WALL_CLOCK_FILE)"
            )
        path = Path(self.node(name).data_dir) / self.clock_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{offset_ns}\n")
        tmp.replace(path)
        ack = path.with_name(path.name + ".ack")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive(name) and name not in self.paused and _read_int(ack) == offset_ns:
                return True
            time.sleep(0.02)  # polling the server's acknowledgement with a deadline
        return False

    # -- observation ------------------------------------------------------------------------
    def status(self, name: str, timeout: float = 1.0) -> dict[str, Any] | None:
        if name in self.paused or not self.alive(name):
            return None
        return cl.status_of(self.node(name).rpc_addr, timeout)

    def leader(self) -> str | None:
        """The server that believes it leads with the highest term (None if none answers)."""
        best: tuple[int, str] | None = None
        for name in self.names:
            st = self.status(name)
            if st and st.get("Role") == "leader":
                term = int(st.get("Term") or 0)
                if best is None or term > best[0]:
                    best = (term, name)
        return best[1] if best else None

    def wait_for_leader(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.leader()
            if name is not None:
                return name
            time.sleep(0.1)
        raise TestbedError(
            f"no leader within {timeout:g}s; see the server logs under {self.directory}"
        )

    def client(self, name: str, timeout: float = 5.0) -> RPCClient:
        return RPCClient([self.node(name).rpc_addr], timeout=timeout)

    def digest(self, name: str, timeout: float = 3.0) -> dict[str, Any] | None:
        """``debug.digest`` read stale from one server: {digest, index, node_id}, or None."""
        if name in self.paused or not self.alive(name):
            return None
        try:
            with self.client(name, timeout) as client:
                return client.call("debug.digest", {"stale": True}, timeout=timeout)
        except (RPCError, OSError):
            return None

    # -- membership (the member nemesis) ------------------------------------------------------
    def caravan(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``caravan ARGS``, the operator's own command, to completion: its output, or TestbedError with why.

        The member nemesis changes membership the way an operator does
        (``operator raft remove-peer``, ``server join``), so the commands
        themselves are under test too.
        """
        try:
            done = subprocess.run(
                [sys.executable, "-m", "node.cli", *args],
                capture_output=True,
                text=True,
                cwd=str(cl.REPO_ROOT),
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise TestbedError(f"caravan {' '.join(args[:3])}: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise TestbedError(
                f"caravan {' '.join(args[:3])} exited {done.returncode}: {said[-1] if said else ''}"
            )
        return done.stdout.strip()

    def peer_ids(self, name: str, timeout: float = 3.0) -> set[str] | None:
        """The voters ``name`` lists (``operator.raft.peers``, its own view), or None when it does not answer."""
        if name in self.paused or not self.alive(name):
            return None
        try:
            with self.client(name, timeout) as client:
                return {
                    str(p["ID"])
                    for p in client.call("operator.raft.peers", {"stale": True}, timeout=timeout)
                }
        except (RPCError, OSError, KeyError, TypeError):
            return None

    def wait_members(
        self, expected: set[str], among: list[str], timeout: float = MEMBER_WAIT
    ) -> None:
        """Until every server in ``among`` lists exactly ``expected``; TestbedError naming who does not."""
        deadline = time.monotonic() + timeout
        while True:
            views = {name: self.peer_ids(name) for name in among}
            wrong = {n: v for n, v in views.items() if v != expected}
            if not wrong:
                return
            if time.monotonic() >= deadline:
                shown = "; ".join(
                    f"{n}: {sorted(v) if v is not None else 'no answer'}"
                    for n, v in sorted(wrong.items())
                )
                raise TestbedError(f"members not {sorted(expected)} within {timeout:g}s: {shown}")
            time.sleep(0.2)  # polling the members' configurations with a deadline

    def remove_member(self, name: str) -> str:
        """``caravan operator raft remove-peer --id NAME`` through the other running servers; waits until all drop it."""
        others = [n for n in self.names if n != name and self.alive(n) and n not in self.paused]
        addresses = ",".join(self.node(n).rpc_addr for n in others)
        said = self.caravan("operator", "raft", "remove-peer", "--id", name, "--address", addresses)
        self.wait_members(set(self.names) - {name}, others)
        return said

    def retire(self, name: str) -> None:
        """Drop a removed (and stopped) server from the testbed for good; its files stay for the report."""
        node = self.node(name)
        self.cluster.nodes.remove(node)
        self.retired.append(node)
        self.cluster.save()

    def rejoin(self, name: str) -> str:
        """Wipe the stopped server's data dir, start it afresh at its own addresses, and ``caravan server join`` it."""
        others = [n for n in self.names if n != name and self.alive(n)]
        # join = []: the fresh server waits to be told (``server join``)
        node = cl.prepare_join(self.cluster, name, [], self.extra_config)
        self.start(name)
        self._wait_answering(name)
        said = self.caravan(
            "server", "join", self.node(others[0]).rpc_addr, "--address", node.rpc_addr
        )
        self.wait_members(set(self.names), self.names)
        return said

    def add_server(self, in_place_of: str = "") -> str:
        """A fresh server with a new id and new addresses, joining by its ``join`` setting; returns its name.

        ``in_place_of``: a retired server whose place in the workloads' lists it takes.
        """
        numbers = [
            int(n.id.removeprefix("server"))
            for n in self.cluster.nodes + self.retired
            if n.id[6:].isdigit()
        ]
        node = _new_node(
            self.directory, f"server{max(numbers, default=0) + 1}", self.book, RPC_HOST
        )
        Path(node.config_file).parent.mkdir(parents=True, exist_ok=True)
        others = [n for n in self.names if self.alive(n)]
        self.cluster.nodes.append(node)
        cl.prepare_join(
            self.cluster, node.id, [self.node(n).rpc_addr for n in others], self.extra_config
        )
        self.start(node.id)
        self.wait_members(set(self.names), self.names)
        if (
            in_place_of in self.client_names
        ):  # one item each, in place: a lane reads them without a lock
            slot = self.client_names.index(in_place_of)
            self.client_addresses[slot], self.client_names[slot] = node.rpc_addr, node.id
        else:
            self.client_addresses.append(node.rpc_addr)
            self.client_names.append(node.id)
        return node.id

    def _wait_answering(self, name: str, timeout: float = 30.0) -> None:
        """Until a just-started server answers RPC (any role: one waiting to join stays "starting")."""
        deadline = time.monotonic() + timeout
        while cl.status_of(self.node(name).rpc_addr) is None:
            if not self.alive(name):
                raise TestbedError(
                    f"{name} exited as it started; see {Path(self.node(name).log_file).with_suffix('.out')}"
                )
            if time.monotonic() >= deadline:
                raise TestbedError(f"{name} did not answer within {timeout:g}s of its start")
            time.sleep(0.1)

    # -- teardown -----------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stop every server (continuing paused ones first, or SIGTERM waits) and the proxies."""
        for name in self.names:
            with contextlib.suppress(Exception):
                self.resume(name)
        with contextlib.suppress(Exception):
            self._stop_client_sim()
        try:
            cl.down(self.cluster, timeout=10.0)
        finally:
            for node in (
                self.cluster.nodes + self.retired
            ):  # belt and braces: never leave a server behind
                if cl.alive(node.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(node.pid, signal.SIGKILL)
            if self.proxies is not None:
                self.proxies.close()
