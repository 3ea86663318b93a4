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

Cuts are owned: every ``partition``/``isolate`` names an *owner* (one held
fault, e.g. ``partition#3``) and sets that owner's cuts only; the pairs cut
are the union of every owner's, and ``heal(owner)`` drops that owner's cuts
alone, so a pair stays cut while any owner still cuts it. Two faults held at
once (``--overlap``) thus neither replace nor heal each other's cuts.
``heal_all()`` (the run's final heal) drops every owner's.

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
#: the owner of cuts made without naming one
DEFAULT_OWNER = "default"


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
    #: owner -> the pairs it cuts
    cuts: dict[str, set[frozenset[str]]] = field(default_factory=dict)
    #: the pairs cut: the union of every owner's (recomputed on each change)
    cut: set[frozenset[str]] = field(default_factory=set)
    #: (source, target) -> the open connections' writers (both sides of each)
    open: dict[tuple[str, str], set[asyncio.StreamWriter]] = field(default_factory=dict)
    counts: dict[tuple[str, str], _Counts] = field(default_factory=dict)


class LinkProxies:
    """One proxy per server, with pair-wise ``cut`` / ``heal`` controls.

    Usage: ``add_server(name, identity_addr, bind_addr)`` for each server
    (before it starts, so its peers can reach it and its dials are known),
    then ``isolate``/``partition``/``heal`` (each under an owner) while the
    cluster runs, ``heal_all`` to drop every owner's cuts, ``remove_server``
    for a server retired for good, and ``close()`` at the end.
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
    def partition(
        self, groups: Iterable[Iterable[str]], owner: str = DEFAULT_OWNER
    ) -> list[tuple[str, str]]:
        """As ``owner``, cut every pair of servers in different groups (a server in no group: from everyone).

        Replaces ``owner``'s earlier cuts (a pair it no longer cuts opens
        unless another owner cuts it); other owners' cuts stay. Returns
        ``owner``'s cut pairs (sorted), for the fault record.
        """
        group_of: dict[str, int] = {}
        for n, group in enumerate(groups):
            for name in group:
                group_of[name] = n
        names = self.names
        return self.cut(
            [
                (a, b)
                for i, a in enumerate(names)
                for b in names[i + 1 :]
                if group_of.get(a, -1) != group_of.get(b, -2)
            ],
            owner,
        )

    def cut(
        self, pairs: Iterable[tuple[str, str]], owner: str = DEFAULT_OWNER
    ) -> list[tuple[str, str]]:
        """As ``owner``, cut exactly these pairs (replacing ``owner``'s earlier cuts); returns them sorted."""
        wanted = {frozenset(pair) for pair in pairs}
        return self._call(self._set_cuts(owner, wanted))  # type: ignore[return-value]

    def isolate(self, name: str, owner: str = DEFAULT_OWNER) -> list[tuple[str, str]]:
        """As ``owner``, cut ``name`` off from every other server."""
        return self.partition([[name], [n for n in self.names if n != name]], owner)

    def heal(self, owner: str = DEFAULT_OWNER) -> None:
        """Drop ``owner``'s cuts; a pair another owner still cuts stays cut."""
        self._call(self._set_cuts(owner, set()))

    def heal_all(self) -> None:
        """Drop every owner's cuts (the end of a run)."""
        self._call(self._heal_all())

    def cut_links(self, owner: str | None = None) -> list[tuple[str, str]]:
        """The pairs cut (by anyone, or by ``owner``), sorted."""
        state = self._state
        pairs = state.cut if owner is None else state.cuts.get(owner, set())
        return sorted(tuple(sorted(pair)) for pair in set(pairs))  # type: ignore[misc]

    def owners(self) -> list[str]:
        """The owners holding any cut."""
        return sorted(o for o, pairs in dict(self._state.cuts).items() if pairs)

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
        for owner, pairs in state.cuts.items():
            state.cuts[owner] = {pair for pair in pairs if name not in pair}
        self._recompute()
        for key in [k for k in state.open if name in k]:
            self._abort_all(key)

    async def _set_cuts(self, owner: str, wanted: set[frozenset[str]]) -> list[tuple[str, str]]:
        """Set ``owner``'s cuts (empty: none), then close the pairs newly cut by anyone.

        A pair naming a server with no proxy (retired meanwhile) is dropped.
        """
        state = self._state
        if any(len(pair) != 2 for pair in wanted):
            raise ProxyError(f"{owner}: a server cannot be cut from itself")
        wanted = {pair for pair in wanted if pair <= state.targets.keys()}
        if wanted:
            state.cuts[owner] = wanted
        else:
            state.cuts.pop(owner, None)
        self._recompute()
        return sorted(tuple(sorted(pair)) for pair in wanted)  # type: ignore[misc]

    async def _heal_all(self) -> None:
        self._state.cuts.clear()
        self._recompute()

    def _recompute(self) -> None:
        """The cut set := the union of every owner's; close the connections of pairs newly in it."""
        state = self._state
        union: set[frozenset[str]] = set()
        for pairs in state.cuts.values():
            union |= pairs
        newly = union - state.cut
        state.cut = union
        for pair in newly:
            a, b = sorted(pair)
            self._abort_all((a, b))
            self._abort_all((b, a))

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
