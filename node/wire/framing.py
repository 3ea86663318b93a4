"""Wire framing shared by the RPC server and both clients.

A frame is a 4-byte big-endian length followed by that many bytes of
msgpack. The length is checked against a maximum *before* the body is read,
so a peer that announces a huge frame costs us nothing but the answer. The
same limit applies when sending, so an oversized request fails locally with
the same code the server would have used.

Addresses are "host:port" strings with IPv6 hosts in brackets
("[::1]:4647"), as operators write them in configs and on command lines.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from fsm import codec
from fsm.errors import CodecError
from node.wire.errors import FRAME_TOO_LARGE, MALFORMED, RPCError

DEFAULT_MAX_FRAME = 4 * 1024 * 1024
HEADER = struct.Struct(">I")


class ConnectionLost(ConnectionError):
    """The peer closed the connection in the middle of a frame, or mid-exchange."""


def parse_address(address: str) -> tuple[str, int]:
    """Split "host:port" / "[v6]:port"; raises ValueError naming the problem."""
    if not isinstance(address, str) or not address:
        raise ValueError(f"invalid address {address!r}: expected host:port")
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1 : end + 2] != ":":
            raise ValueError(f"invalid address {address!r}: expected [ipv6]:port")
        host, port_text = address[1:end], address[end + 2 :]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"invalid address {address!r}: missing :port")
        if ":" in host:
            raise ValueError(
                f"invalid address {address!r}: put IPv6 hosts in brackets, e.g. [::1]:4647"
            )
    if not host:
        raise ValueError(f"invalid address {address!r}: missing host")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid address {address!r}: port must be a number from 0 to 65535")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def frame_too_large(size: int, limit: int, what: str) -> RPCError:
    return RPCError(
        FRAME_TOO_LARGE,
        f"{what} of {size} bytes exceeds the frame limit of {limit} bytes; "
        f"split it into smaller requests or raise rpc_max_frame on every server",
        size=size,
        limit=limit,
    )


def pack_frame(message: Any, max_frame: int, what: str = "message") -> bytes:
    """Encode one message with its length prefix.

    Raises ``TypeError`` for values msgpack cannot encode (a programming
    error on our side) and ``RPCError(frame_too_large)`` for oversize ones.
    Packed by msgspec (``codec.pack``), in C: every request and answer
    passes here, on the leader's loop and in every client.
    """
    body = codec.pack(message)
    if len(body) > max_frame:
        raise frame_too_large(len(body), max_frame, what)
    return HEADER.pack(len(body)) + body


class SharedItem(dict[str, Any]):
    """A stream item that many subscribers get: encoded once, spliced into each one's frame.

    Still a plain mapping for in-process consumers (the HTTP event stream,
    tests). Never mutate one after it is made: its encoding is cached.
    """

    _packed: bytes | None = None

    def packed(self) -> bytes:
        if self._packed is None:
            self._packed = codec.pack(self)
        return self._packed


def _array_header(n: int) -> bytes:
    if n <= 15:
        return bytes((0x90 | n,))
    if n <= 0xFFFF:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


_BATCHES_MAP = b"\x81" + codec.pack("batches")
_STREAM_HEAD = b"\x82" + codec.pack("id")
_STREAM_KEY = codec.pack("stream")


def encode_item(item: Any) -> bytes:
    """msgpack of a stream item, reusing the cached encodings of shared items.

    A ``{"batches": [...]}`` group of shared items (a subscriber's own run of
    them) is spliced from their encodings: fanning a batch out to many
    subscribers costs a copy of its bytes each, not an encoding each.
    """
    if isinstance(item, SharedItem):
        return item.packed()
    if type(item) is dict and len(item) == 1:
        group = item.get("batches")
        if isinstance(group, list) and group and all(isinstance(i, SharedItem) for i in group):
            return b"".join([_BATCHES_MAP, _array_header(len(group)), *(i.packed() for i in group)])
    return codec.pack(item)


def pack_stream_frame(request_id: str, item: Any, max_frame: int) -> bytes:
    """The frame ``{"id": request_id, "stream": item}`` (see ``encode_item``), length-prefixed."""
    body = b"".join((_STREAM_HEAD, codec.pack(request_id), _STREAM_KEY, encode_item(item)))
    if len(body) > max_frame:
        raise frame_too_large(len(body), max_frame, "stream item")
    return HEADER.pack(len(body)) + body


def unpack_body(body: bytes) -> Any:
    try:
        return codec.unpack(body)
    except CodecError as exc:
        detail = str(exc).removeprefix("malformed msgpack: ")
        raise RPCError(
            MALFORMED,
            f"frame is not valid msgpack ({detail}); send one msgpack map per frame",
        ) from None


# The first four bytes of an HTTP answer or request, read as a length prefix,
# are a frame of about 1 GiB: name the mix-up instead of the size.
_HTTP_ANSWER = b"HTTP"
_HTTP_REQUESTS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC")


def check_length(header: bytes | bytearray | memoryview, max_frame: int) -> int:
    """The body length a frame header announces; an error for one over ``max_frame`` (or HTTP)."""
    (length,) = HEADER.unpack_from(header)
    if length > max_frame:
        prefix = bytes(header[: HEADER.size])
        if prefix == _HTTP_ANSWER:
            raise RPCError(
                MALFORMED,
                "the server answered in HTTP: that is its HTTP API address (NOMAD_ADDR), not its RPC "
                "address; use the RPC address (CARAVAN_ADDRESS, printed by 'caravan cluster up')",
            )
        if prefix in _HTTP_REQUESTS:
            raise RPCError(
                MALFORMED,
                "an HTTP request reached the msgpack RPC port; HTTP clients (nomad, curl) use the "
                "server's http_addr",
            )
        raise frame_too_large(length, max_frame, "frame")
    return length


class FrameBuffer:
    """Frame bodies cut from a stream's bytes as they arrive.

    The RPC server reads what the socket has (a pipelining client's many
    frames at once) and takes the frames from here, instead of two
    ``readexactly`` awaits per frame, which cost the leader's loop about
    1 us a request. A header over ``max_frame`` is refused as soon as it is
    in, as ``read_frame`` refuses it.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0  # start of the first frame not yet taken

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next(self) -> bytes | None:
        """The next complete frame's body, or None until more bytes arrive; RPCError for a bad header."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER.size:
            return None
        length = check_length(bytes(buf[pos : pos + HEADER.size]), self.max_frame)
        start = pos + HEADER.size
        end = start + length
        if end > len(buf):
            return None
        body = bytes(buf[start:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return body


async def read_frame(reader: asyncio.StreamReader, max_frame: int) -> bytes | None:
    """Read one frame body; None at a clean end of stream between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ConnectionLost("connection closed inside a frame header") from None
    length = check_length(header, max_frame)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ConnectionLost("connection closed inside a frame body") from None


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1 << 20))
        if not chunk:
            if not chunks:
                return None
            raise ConnectionLost("connection closed inside a frame")
        chunks += chunk
    return bytes(chunks)


def recv_frame(sock: socket.socket, max_frame: int) -> bytes | None:
    """Blocking twin of ``read_frame`` for the synchronous client."""
    header = _recv_exactly(sock, HEADER.size)
    if header is None:
        return None
    length = check_length(header, max_frame)
    if length == 0:
        return b""
    body = _recv_exactly(sock, length)
    if body is None:
        raise ConnectionLost("connection closed inside a frame body")
    return body
