"""Per-server TCP proxies for the raft ports: the harness's network partitions.

Every server has one proxy, listening at the server's raft *identity* (the
address every config and the membership log know it by) and forwarding to
the address the server itself binds (see ``jepsen_like.testbed`` for the
layout). A server's outgoing raft connections leave from its own bind host
(``raft.transport.CaravanConnection``), so a proxy tells which server dialled
from the connection's source IP; a connection from a source IP no server
binds is refused (and counted). pysyncobj keeps one TCP connection per pair,
dialled by the greater identity, so every raft connection between two
servers passes through exactly one proxy: the one of the server dialled.

Cutting a pair closes that pair's open connections (both ways) and refuses
new ones from either at the other's proxy, as a firewall that rejects
would; healing lets the next connection attempt through. Both directions of
a pair share one TCP connection in pysyncobj, so partitions are symmetric.

The proxies run on one asyncio loop in a daemon thread of the harness
process; the public methods are thread-safe (nemesis threads call them).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from node.wire.framing import parse_address

CONNECT_TIMEOUT = 2.0
CHUNK = 256 * 1024
#: the source name, in ``stats``, of connections from an IP no server binds
UNKNOWN = "unknown"


class ProxyError(RuntimeError):
    """A proxy could not be started or controlled."""


@dataclass
class _Target:
    """The proxy of one server: accepts at its raft identity, forwards to its bind address."""

    name: str
    identity: str
    bind: str
    source_host: str
    server: asyncio.base_events.Server | None = None


@dataclass
class _Counts:
    connections: int = 0
    refused: int = 0


@dataclass
class _State:
    """Everything the loop thread owns."""

    targets: dict[str, _Target] = field(default_factory=dict)
    #: source IP -> server name (each server's bind host)
    source_of: dict[str, str] = field(default_factory=dict)
    cut: set[frozenset[str]] = field(default_factory=set)
    #: (source, target) -> the open connections' writers (both sides of each)
    open: dict[tuple[str, str], set[asyncio.StreamWriter]] = field(default_factory=dict)
    counts: dict[tuple[str, str], _Counts] = field(default_factory=dict)


class LinkProxies:
    """One proxy per server, with pair-wise ``cut`` / ``heal`` controls.

    Usage: ``add_server(name, identity_addr, bind_addr)`` for each server
    (before it starts, so its peers can reach it and its dials are known),
    then ``isolate``/``partition``/``heal`` while the cluster runs,
    ``remove_server`` for a server retired for good, and ``close()`` at the end.
    """

    def __init__(self) -> None:
        self._state = _State()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="jepsen-proxies", daemon=True
        )
        self._thread.start()

    # -- set-up ------------------------------------------------------------------
    def add_server(self, name: str, identity_addr: str, bind_addr: str) -> str:
        """Listen at ``identity_addr`` for ``name`` and forward to ``bind_addr``; returns the listen address.

        ``bind_addr``'s host is also the source IP of ``name``'s own dials.
        """
        return str(self._call(self._add(name, identity_addr, bind_addr)))

    def remove_server(self, name: str) -> None:
        """Stop ``name``'s proxy and close every connection to or from it (a server retired for good)."""
        self._call(self._remove(name))

    @property
    def names(self) -> list[str]:
        return sorted(self._state.targets)

    # -- control (thread-safe) -------------------------------------------------------
    def partition(self, groups: Iterable[Iterable[str]]) -> list[tuple[str, str]]:
        """Cut every pair of servers in different groups (a server in no group: from everyone); heal the rest.

        Returns the cut pairs (sorted), for the fault record.
        """
        group_of: dict[str, int] = {}
        for n, group in enumerate(groups):
            for name in group:
                group_of[name] = n
        return self._call(self._partition(group_of))  # type: ignore[return-value]

    def isolate(self, name: str) -> list[tuple[str, str]]:
        """Cut ``name`` off from every other server."""
        return self.partition([[name], [n for n in self.names if n != name]])

    def heal(self) -> None:
        self._call(self._partition(None))

    def cut_links(self) -> list[tuple[str, str]]:
        return sorted(tuple(sorted(pair)) for pair in self._state.cut)  # type: ignore[misc]

    def stats(self) -> dict[str, dict[str, int]]:
        """Per ``source->target`` that saw any: connections forwarded and refused (source ``unknown``: no server's IP)."""
        counts = dict(self._state.counts)
        return {
            f"{s}->{t}": {"connections": c.connections, "refused": c.refused}
            for (s, t), c in sorted(counts.items())
        }

    def close(self) -> None:
        if not self._loop.is_running():
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        with contextlib.suppress(Exception):
            self._loop.close()

    # -- internals (loop thread) -------------------------------------------------------
    def _call(self, coro: object, timeout: float = 10.0) -> object:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(timeout)

    async def _add(self, name: str, identity_addr: str, bind_addr: str) -> str:
        state = self._state
        if name in state.targets:
            raise ProxyError(f"{name} already has a proxy")
        source_host, _ = parse_address(bind_addr)
        if source_host in state.source_of:
            raise ProxyError(f"{name}'s bind host {source_host} is {state.source_of[source_host]}'s")
        target = _Target(name, identity_addr, bind_addr, source_host)
        host, port = parse_address(identity_addr)
        try:
            target.server = await asyncio.start_server(
                lambda r, w: self._accept(target, r, w), host, port, reuse_address=True
            )
        except OSError as exc:
            raise ProxyError(f"{name}'s proxy cannot listen at {identity_addr}: {exc}") from None
        bound_host, bound_port = target.server.sockets[0].getsockname()[:2]
        target.identity = f"{bound_host}:{bound_port}"
        state.targets[name] = target
        state.source_of[source_host] = name
        return target.identity

    async def _remove(self, name: str) -> None:
        state = self._state
        target = state.targets.pop(name, None)
        if target is None:
            return
        state.source_of.pop(target.source_host, None)
        if target.server is not None:
            target.server.close()
        state.cut = {pair for pair in state.cut if name not in pair}
        for key in [k for k in state.open if name in k]:
            self._abort_all(key)

    async def _partition(self, group_of: dict[str, int] | None) -> list[tuple[str, str]]:
        state = self._state
        names = sorted(state.targets)
        wanted: set[frozenset[str]] = set()
        if group_of is not None:
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    if group_of.get(a, -1) != group_of.get(b, -2):
                        wanted.add(frozenset((a, b)))
        for pair in wanted - state.cut:
            a, b = sorted(pair)
            self._abort_all((a, b))
            self._abort_all((b, a))
        state.cut = wanted
        return sorted(tuple(sorted(pair)) for pair in wanted)  # type: ignore[misc]

    def _abort_all(self, key: tuple[str, str]) -> None:
        for writer in self._state.open.pop(key, set()):
            _abort(writer)

    def _count(self, key: tuple[str, str]) -> _Counts:
        return self._state.counts.setdefault(key, _Counts())

    async def _close_all(self) -> None:
        for target in self._state.targets.values():
            if target.server is not None:
                target.server.close()
        for key in list(self._state.open):
            self._abort_all(key)

    async def _accept(
        self, target: _Target, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        state = self._state
        peer = writer.get_extra_info("peername")
        source = state.source_of.get(str(peer[0])) if peer else None
        if source is None or source == target.name:
            self._count((UNKNOWN, target.name)).refused += 1
            _abort(writer)
            return
        key = (source, target.name)
        pair = frozenset(key)
        if pair in state.cut:
            self._count(key).refused += 1
            _abort(writer)
            return
        host, port = parse_address(target.bind)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            _abort(writer)  # target down: the dialer sees a dropped connection and retries
            return
        if pair in state.cut or state.targets.get(target.name) is not target:
            self._count(key).refused += 1  # cut (or retired) while we were connecting
            _abort(writer)
            _abort(up_writer)
            return
        self._count(key).connections += 1
        held = state.open.setdefault(key, set())
        held.update((writer, up_writer))
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                state.open.get(key, set()).discard(w)
                _abort(w)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once (RST-like): a partition must not politely flush buffered data."""
    transport = writer.transport
    with contextlib.suppress(Exception):
        transport.abort()
