"""Per-link TCP proxies for the raft ports: the harness's network partitions.

Every raft connection between two servers runs through one proxy owned by the
harness (see ``jepsen_like.testbed`` for why exactly one connection per pair
exists and how the configs route it here). Cutting a link closes its open
connections and refuses new ones, as a firewall that rejects would; healing
lets the next connection attempt through. Both directions of a pair share
one TCP connection in pysyncobj, so partitions are symmetric.

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


class ProxyError(RuntimeError):
    """A proxy could not be started or controlled."""


@dataclass
class _Link:
    """One proxy: connections from the dialer ``source`` reach ``target_addr`` of ``target``."""

    source: str
    target: str
    target_addr: str
    listen_addr: str = ""
    cut: bool = False
    server: asyncio.base_events.Server | None = None
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    connections: int = 0
    refused: int = 0


class LinkProxies:
    """A set of link proxies with ``cut`` / ``heal`` controls.

    Usage: ``add(source, target, target_addr)`` for each link (returns the
    address the dialer must use), ``start()``, then ``isolate``/``partition``/
    ``heal`` while the cluster runs, and ``close()`` at the end.
    """

    def __init__(self, listen_host: str = "127.0.0.1") -> None:
        self.listen_host = listen_host
        self._links: dict[frozenset[str], _Link] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jepsen-proxies", daemon=True)
        self._thread.start()

    # -- set-up ------------------------------------------------------------------
    def add(self, source: str, target: str, target_addr: str) -> str:
        """Create the proxy of the pair {source, target}; returns its listen address."""
        key = frozenset((source, target))
        if key in self._links:
            raise ProxyError(f"link {source}-{target} already has a proxy")
        link = _Link(source, target, target_addr)
        self._links[key] = link
        self._call(self._listen(link))
        return link.listen_addr

    async def _listen(self, link: _Link) -> None:
        link.server = await asyncio.start_server(
            lambda r, w: self._accept(link, r, w), self.listen_host, 0, reuse_address=True
        )
        host, port = link.server.sockets[0].getsockname()[:2]
        link.listen_addr = f"{host}:{port}"

    # -- control (thread-safe) -------------------------------------------------------
    def partition(self, groups: Iterable[Iterable[str]]) -> list[tuple[str, str]]:
        """Cut every link between different groups; links inside a group are healed.

        Returns the cut pairs (sorted), for the fault record.
        """
        group_of: dict[str, int] = {}
        for n, group in enumerate(groups):
            for name in group:
                group_of[name] = n
        cut: list[tuple[str, str]] = []
        wanted: dict[frozenset[str], bool] = {}
        for key, link in self._links.items():
            a, b = link.source, link.target
            separated = group_of.get(a, -1) != group_of.get(b, -2)
            wanted[key] = separated
            if separated:
                cut.append(tuple(sorted((a, b))))  # type: ignore[arg-type]
        self._call(self._set(wanted))
        return sorted(cut)

    def isolate(self, name: str) -> list[tuple[str, str]]:
        """Cut ``name`` off from every other server."""
        others = {n for link in self._links.values() for n in (link.source, link.target)} - {name}
        return self.partition([[name], sorted(others)])

    def heal(self) -> None:
        self._call(self._set({key: False for key in self._links}))

    def cut_links(self) -> list[tuple[str, str]]:
        return sorted(tuple(sorted((k.source, k.target))) for k in self._links.values() if k.cut)  # type: ignore[misc]

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            f"{k.source}->{k.target}": {"connections": k.connections, "refused": k.refused}
            for k in self._links.values()
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

    async def _set(self, wanted: dict[frozenset[str], bool]) -> None:
        for key, cut in wanted.items():
            link = self._links[key]
            link.cut = cut
            if cut:
                for writer in list(link.writers):
                    _abort(writer)
                link.writers.clear()

    async def _close_all(self) -> None:
        for link in self._links.values():
            if link.server is not None:
                link.server.close()
            for writer in list(link.writers):
                _abort(writer)
            link.writers.clear()

    async def _accept(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if link.cut:
            link.refused += 1
            _abort(writer)
            return
        host, port = parse_address(link.target_addr)
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            _abort(writer)  # target down: the dialer sees a dropped connection and retries
            return
        if link.cut:  # cut while we were connecting
            _abort(writer)
            _abort(up_writer)
            return
        link.connections += 1
        link.writers.update((writer, up_writer))
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                link.writers.discard(w)
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
