"""pysyncobj TCP transport with Caravan's hooks in front of the library.

pysyncobj builds its transport inside ``SyncObj.__init__`` and starts the tick
thread before the constructor returns, so patching callbacks afterwards would
race with the first messages. A transport subclass is in place from the very
first byte: every received message passes through the node's
``_filter_incoming`` (truncation fix, leader-side size/type guards) and every
sent message through ``_filter_outgoing`` (ack rewriting, fsync ordering,
instrumentation). Its constructor is also where the node swaps in the
crash-safe journal (``caravan_before_start``).

Every connection is a :class:`CaravanConnection`: the same frame a stock
peer reads (length, auth tag, zlib stream, pickle), built without
pysyncobj's two hot spots. ``zlib.compress`` pays ~35-50 us per call on this
hardware whatever the size (deflate allocates ~256 KiB of state each time),
and pickle protocol 2 turns every ``bytes`` into a latin-1 string: pickling an
append_entries of 64 job registrations took 330 us at protocol 2 and 9 us at
protocol 5. Any Python 3 ``pickle.loads`` and ``zlib.decompress`` read these
frames, so servers on older Caravan builds still understand them.

Keep-alives: pysyncobj drops a connection that has *read* nothing for
``connectionTimeout`` (3 s) the moment it next sends or receives on it. Two
followers exchange nothing while a leader is up, so their link is always
stale when the leader fails: the first vote request each sends closes the
link and is lost, and the election needs a second round (measured: a leader
kill after 4 s of steady state took 1.1-2.0 s to a new leader, term +2;
after 0.5 s, 0.5-1.0 s, term +1; with keep-alives, 0.5-0.8 s after 4 s,
term +1). Every connection that sent nothing for
``KEEPALIVE_PERIOD`` gets a tiny ``caravan_keepalive`` message, which the
receiving transport drops before the node sees it (pysyncobj of an older
build ignores a message type it does not know).

Source address: a connection this server dials leaves from its configured
raft bind host (``CaravanConnection.connect``), not from whatever address
the kernel's routing picks. See ``CaravanConnection`` for why.
"""

from __future__ import annotations

import contextlib
import errno
import pickle
import socket
import struct
import zlib
from typing import Any

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.monotonic import monotonic
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection, _getAddrType
from pysyncobj.transport import TCPTransport

from raft.auth import AuthFailureLog, CheckedLink, LinkAuthenticator

_LENGTH = struct.Struct("i")  # pysyncobj's frame length prefix (native int)
_STORED_BLOCK = struct.Struct("<BHH")  # deflate stored block: BFINAL/BTYPE=00, LEN, NLEN
_ADLER = struct.Struct(">I")
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, no dictionary, "fastest" (valid check bits)
_MAX_STORED = 0xFFFF

#: Seconds a connection may stay silent before it carries a keep-alive: well
#: under pysyncobj's connectionTimeout (at least 3 s here, raft/config.py).
KEEPALIVE_PERIOD = 0.5
KEEPALIVE = "caravan_keepalive"
_KEEPALIVE_MESSAGE = {"type": KEEPALIVE}


def zlib_stored(data: bytes) -> bytes:
    """``data`` as a zlib stream of stored (uncompressed) deflate blocks.

    ``zlib.decompress`` returns ``data`` for it. Costs a copy and an
    Adler-32, not deflate's per-call set-up.
    """
    view = memoryview(data)
    size = len(data)
    parts: list[Any] = [_ZLIB_HEADER]
    offset = 0
    while True:
        chunk = view[offset : offset + _MAX_STORED]
        offset += len(chunk)
        final = offset >= size
        parts.append(_STORED_BLOCK.pack(1 if final else 0, len(chunk), len(chunk) ^ 0xFFFF))
        parts.append(chunk)
        if final:
            break
    parts.append(_ADLER.pack(zlib.adler32(data)))
    return b"".join(parts)


#: Bind hosts that mean "every address": a connection from such a server leaves from wherever routing says.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})
#: Linux's IP_BIND_ADDRESS_NO_PORT: a source bind with port 0 takes its port at connect time, per
#: destination, instead of reserving one from the ephemeral range for the address alone.
_BIND_ADDRESS_NO_PORT: int | None = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", None)


def source_host(bind_address: str | None) -> str | None:
    """The host outgoing raft connections bind to: the bind address's host, or None (no source bind).

    None for an absent bind address and for a wildcard host (0.0.0.0, ::):
    a server listening everywhere has no one address to speak from.
    A host name is resolved the way pysyncobj resolves its listen host.
    """
    if not bind_address:
        return None
    host = bind_address.rpartition(":")[0].strip("[]")
    if host in WILDCARD_HOSTS:
        return None
    try:
        _getAddrType(host)
    except Exception:  # a name, not an IP literal  # noqa: BLE001 (pysyncobj raises a bare Exception)
        resolved = globalDnsResolver().resolve(host)
        return resolved if resolved and resolved not in WILDCARD_HOSTS else None
    return host


class CaravanConnection(TcpConnection):
    """pysyncobj's TcpConnection with a cheaper, wire-compatible ``send`` and a source-bound ``connect``.

    ``caravan_source_host`` (set by the transport from the raft bind
    address; None: no source bind): an outgoing connection binds its socket
    to that host, port 0 (any port), before it connects. On a multi-homed
    host raft traffic then leaves from the configured raft address, not
    from whichever interface the route to the peer happens to use, so the
    peers' firewalls can allow exactly the servers' raft addresses. The
    fault harness relies on the same property: its per-server proxies tell
    which server dialled from the connection's source IP.
    """

    caravan_source_host: str | None = None

    def connect(self, host: str, port: int) -> bool:
        """pysyncobj's ``TcpConnection.connect``, plus the source bind (same fields, same results)."""
        if host is None:
            return False
        self._TcpConnection__state = CONNECTION_STATE.DISCONNECTED
        self._TcpConnection__fileno = None
        family = _getAddrType(host)
        sock = socket.socket(family, socket.SOCK_STREAM)
        self._TcpConnection__socket = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpConnection__sendBufferSize)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpConnection__recvBufferSize)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.setSockoptKeepalive()
        source = self.caravan_source_host
        if source is not None and _family_of(source) == family:
            try:
                if _BIND_ADDRESS_NO_PORT is not None and family == socket.AF_INET:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_IP, _BIND_ADDRESS_NO_PORT, 1)
                sock.bind((source, 0))
            except OSError:  # the host is not (or no longer) this machine's
                sock.close()
                return False  # like a failed connect: the transport retries after connectionRetryTime
        sock.setblocking(False)
        self._TcpConnection__readBuffer = b""
        self._TcpConnection__writeBuffer = b""
        self._TcpConnection__lastReadTime = monotonic()
        try:
            sock.connect((host, port))
        except OSError as e:
            if e.errno not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                return False
        self._TcpConnection__fileno = sock.fileno()
        self._TcpConnection__state = CONNECTION_STATE.CONNECTING
        self._TcpConnection__poller.subscribe(
            self._TcpConnection__fileno,
            self._TcpConnection__processConnection,
            POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
        )
        return True

    def send(self, message: Any) -> None:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = zlib_stored(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(monotonic()))
        self.caravan_sent = monotonic()
        self._TcpConnection__writeBuffer += _LENGTH.pack(len(data)) + data
        self._TcpConnection__trySendBuffer()


class CaravanTransport(TCPTransport):
    """TCPTransport whose receive and send paths call back into the node.

    The hooks are looked up per message (they exist from SyncObj's first
    line, before this transport is built) and pysyncobj's own handlers are
    passed in, so the hot path costs two extra Python calls per message.
    """

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        # SyncObj builds its transport after opening the journal and before
        # starting its tick thread: the one moment the node can adapt the
        # journal (raft/journal.py) with nothing running concurrently.
        prepare = getattr(syncObj, "caravan_before_start", None)
        if prepare is not None:
            prepare()
        log = getattr(syncObj, "log", None)  # the replica's logger (raft/replica_base.py)
        self._auth_failures = AuthFailureLog(log, monotonic) if log is not None else None
        self._next_keepalive = 0.0
        self.keepalives_sent = 0
        conf = getattr(syncObj, "conf", None)
        #: where this server's outgoing raft connections leave from (CaravanConnection)
        self.source_host = source_host(getattr(conf, "bindAddress", None))
        super().__init__(syncObj, selfNode, otherNodes)

    def _onTick(self) -> None:  # noqa: N802 (pysyncobj name)
        super()._onTick()
        now = monotonic()
        if now >= self._next_keepalive:
            self._next_keepalive = now + KEEPALIVE_PERIOD / 2
            self.send_keepalives(now)

    def send_keepalives(self, now: float) -> None:
        """Tick thread: a keep-alive on every connected peer link silent for ``KEEPALIVE_PERIOD``."""
        connected = self._syncObj.isNodeConnected  # only once the handshake is done
        for node, conn in list(self._connections.items()):
            if node not in self._nodes or conn.state != CONNECTION_STATE.CONNECTED:
                continue
            if not connected(node):
                continue
            if now - getattr(conn, "caravan_sent", 0.0) >= KEEPALIVE_PERIOD:
                conn.send(_KEEPALIVE_MESSAGE)
                self.keepalives_sent += 1

    def _check_link(self, conn: Any, peer: str) -> None:
        """Report this connection's authentication failures, naming ``peer``."""
        auth = conn.encryptor
        if self._auth_failures is not None and isinstance(auth, LinkAuthenticator):
            conn.encryptor = CheckedLink(auth, peer, self._auth_failures)

    def addNode(self, node: Any) -> None:  # noqa: N802 (pysyncobj name)
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None and conn.__class__ is TcpConnection:
            conn.__class__ = CaravanConnection  # built by pysyncobj; ``send`` and ``connect`` differ
            conn.caravan_source_host = self.source_host
            self._check_link(conn, node.address)

    def _onNewIncomingConnection(self, conn: Any) -> None:  # noqa: N802 (pysyncobj name)
        if conn.__class__ is TcpConnection:
            conn.__class__ = CaravanConnection
        super()._onNewIncomingConnection(conn)
        self._check_link(conn, _peer_host(conn))

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj name)
        deliver = self._onMessageReceivedCallback
        if deliver is None:
            return
        if message.__class__ is not dict:
            deliver(node, message)
            return
        if message.get("type") == KEEPALIVE:
            return  # reading it kept the link alive; nothing for raft
        hook = getattr(self._syncObj, "caravan_on_message", None)
        if hook is None:
            deliver(node, message)
        else:
            hook(node, message, deliver)

    def send(self, node: Any, message: Any) -> bool:
        hook = getattr(self._syncObj, "caravan_on_send", None)
        if hook is None or message.__class__ is not dict:
            return TCPTransport.send(self, node, message)
        return hook(node, message, self.raw_send)

    def raw_send(self, node: Any, message: Any) -> bool:
        """Send without the hooks (used to release held messages)."""
        return TCPTransport.send(self, node, message)


def _family_of(host: str) -> int | None:
    try:
        return _getAddrType(host)
    except Exception:  # noqa: BLE001 (pysyncobj raises a bare Exception)
        return None


def _peer_host(conn: Any) -> str:
    """The remote host of an accepted connection (its port is ephemeral, so not part of the name)."""
    sock = conn._TcpConnection__socket
    try:
        return str(sock.getpeername()[0])
    except (OSError, AttributeError, IndexError):
        return "unknown"
