"""A real cluster for one run: server processes, their configs and the raft proxies.

The harness is a client of the cluster: it starts and signals processes with
``node.devcluster`` and talks to servers over RPC; it imports nothing of the
server's internals.

How partitions work (one TCP proxy per server)
----------------------------------------------
pysyncobj knows a peer only by the address string in its peer list, and the
two ends of a pair share ONE TCP connection, which only the end with the
greater address string dials (``TCPTransport._shouldConnect``: ``self.address
> peer.address``). The dialer sends its own address as the first message and
the acceptor looks that string up in *its* peer list. A live membership
change, and the cluster set in a snapshot a leader sends, carry ONE raft
address per member through the log (``raft/members.py``,
``raft/membership.py``), so every server must know every server by the same
address string.

The layout: server *k* (1-based) has the raft identity ``127.0.1.k:P_k`` --
what every config, and the membership log, list for it -- and *binds*
``127.0.2.k:P'_k`` itself (its config's ``raft_bind``). The harness's proxy
for server *k* (``jepsen_like.proxy``) listens at the identity and forwards
to the bind address. A server's outgoing raft connections leave from its
bind host (``raft.transport.CaravanConnection`` binds the socket's source to
it), so the proxy of the server dialled reads the dialer from the source IP
(``127.0.2.i`` is server *i*) and refuses any other source. Every raft
connection between a pair thus passes through exactly one harness proxy (the
dialled server's), which can cut that pair alone; the configs are the same
for every server but their own ``node_id``/``raft_bind`` lines. Leader names
stay consistent: a server maps the raft address it sees to an RPC address
through its config or the membership, and those agree everywhere.

Cuts are owned (``LinkProxies``): ``partition(groups, owner)`` sets one
held fault's cuts and ``heal_network(owner)`` drops only those, so two
overlapping faults keep each other's pairs cut; ``heal_network()`` with no
owner (``heal_all``, the run's final heal) drops every cut.

A server the member nemesis adds mid-run gets its proxy before it starts (so
the others reach it and its dials are recognised); one wiped and joined
again keeps its proxy; a retired one's proxy is removed. ``proxies=False``
lays the servers out on 127.0.0.1 with no proxy and no ``raft_bind`` (no
partitions then: ``Partition.unavailable`` says so). Every port comes from
the launcher's address book (``node.devcluster.AddressBook``), kept for the
run's life.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.silence import SILENCE_FILE_ENV, read_ack, write_json_atomically
from jepsen_like.proxy import DEFAULT_OWNER, LinkProxies
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


#: server k's raft identity host is IDENTITY_NET + k (its proxy listens there) ...
IDENTITY_NET = "127.0.1."
#: ... and it binds its raft port at BIND_NET + k (where the proxy forwards, and where its dials leave from)
BIND_NET = "127.0.2."
#: seconds a membership change may take to show in every running member's configuration
MEMBER_WAIT = 30.0
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


def _identity_host(k: int) -> str:
    if not 1 <= k <= 254:
        raise TestbedError(f"server number {k} has no address in {IDENTITY_NET}0/24")
    return f"{IDENTITY_NET}{k}"


def _own_extra(raft_bind: str | None, extra_config: str) -> str:
    """A server's config lines besides the layout's: its ``raft_bind`` (top-level, so first) and the run's."""
    if not raft_bind:
        return extra_config
    return f"raft_bind = {json.dumps(raft_bind)}\n{extra_config}"


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
    #: per server, where it binds its raft port when that is not its raft identity (behind a proxy)
    raft_binds: dict[str, str] = field(default_factory=dict)

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
        net = LinkProxies() if proxies else None
        binds: dict[str, str] = {}
        try:
            for k in range(1, count + 1):
                node = _new_node(root, f"server{k}", book, _identity_host(k) if net else RPC_HOST)
                nodes.append(node)
                if net is not None:
                    binds[node.id] = book.get(f"{BIND_NET}{k}")
                    net.add_server(node.id, node.raft_addr, binds[node.id])
        except Exception:
            if net is not None:
                net.close()
            raise
        for node in nodes:
            Path(node.config_file).parent.mkdir(parents=True, exist_ok=True)
            Path(node.config_file).write_text(
                cl.render_config(
                    node, nodes, str(password_file), _own_extra(binds.get(node.id), extra_config)
                )
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
            raft_binds=binds,
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

    def listen_addresses(self, name: str) -> list[str]:
        """The addresses ``name``'s own process listens on (RPC, raft bind, HTTP): its proxy holds its raft identity."""
        node = self.node(name)
        raft = self.raft_binds.get(name) or node.raft_addr
        return [a for a in (node.rpc_addr, raft, node.http_address) if a]

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
    def partition(
        self, groups: list[list[str]], owner: str = DEFAULT_OWNER
    ) -> list[tuple[str, str]]:
        """As ``owner`` (one held fault), cut every pair in different groups; other owners' cuts stay.

        Returns ``owner``'s cut pairs (``LinkProxies.partition``).
        """
        if self.proxies is None:
            raise TestbedError("this testbed was built without proxies; partitions need them")
        return self.proxies.partition(groups, owner)

    def heal_network(self, owner: str | None = None) -> None:
        """Drop ``owner``'s cuts (a pair another owner cuts stays cut); no owner: every cut (the final heal)."""
        if self.proxies is None:
            return
        if owner is None:
            self.proxies.heal_all()
        else:
            self.proxies.heal(owner)

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
        if self.proxies is not None:
            self.proxies.remove_server(name)

    def rejoin(self, name: str) -> str:
        """Wipe the stopped server's data dir, start it afresh at its own addresses, and ``caravan server join`` it."""
        others = [n for n in self.names if n != name and self.alive(n)]
        # join = []: the fresh server waits to be told (``server join``)
        node = cl.prepare_join(self.cluster, name, [], self._extra_for(name))
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
        k = max(numbers, default=0) + 1
        host = _identity_host(k) if self.proxies is not None else RPC_HOST
        node = _new_node(self.directory, f"server{k}", self.book, host)
        Path(node.config_file).parent.mkdir(parents=True, exist_ok=True)
        if self.proxies is not None:  # its proxy first: the others must reach it, and know its dials
            self.raft_binds[node.id] = self.book.get(f"{BIND_NET}{k}")
            self.proxies.add_server(node.id, node.raft_addr, self.raft_binds[node.id])
        others = [n for n in self.names if self.alive(n)]
        self.cluster.nodes.append(node)
        cl.prepare_join(
            self.cluster, node.id, [self.node(n).rpc_addr for n in others], self._extra_for(node.id)
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

    def _extra_for(self, name: str) -> str:
        return _own_extra(self.raft_binds.get(name), self.extra_config)

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
