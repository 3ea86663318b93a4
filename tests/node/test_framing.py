"""Stream frames that splice shared items' cached encodings: the same bytes a plain encoding gives."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.wire.errors import FRAME_TOO_LARGE, RPCError
from node.wire.framing import (
    HEADER,
    FrameBuffer,
    SharedItem,
    check_length,
    pack_stream_frame,
    unpack_body,
)

records = st.lists(st.tuples(st.sampled_from(["Job", "Node"]), st.text(max_size=8), st.binary(max_size=40)), max_size=5)


def decoded(frame: bytes) -> Any:
    (length,) = HEADER.unpack(frame[: HEADER.size])
    assert length == len(frame) - HEADER.size
    return unpack_body(frame[HEADER.size :])


def plain(item: Any) -> Any:
    """The item as a client decodes it when it was encoded without any sharing."""
    return msgpack.unpackb(msgpack.packb(item, use_bin_type=True), raw=False)


@given(st.text(min_size=1, max_size=40), st.lists(records, min_size=1, max_size=40), st.booleans())
def test_spliced_frames_decode_as_plain_ones(request_id: str, batches: list[Any], group: bool) -> None:
    shared = [SharedItem(index=i + 1, events=[list(r) for r in recs]) for i, recs in enumerate(batches)]
    item: Any = {"batches": shared} if group else shared[0]
    frame = pack_stream_frame(request_id, item, 1 << 22)
    assert decoded(frame) == {"id": request_id, "stream": plain(item)}


def test_a_shared_item_is_encoded_once_for_every_frame() -> None:
    item = SharedItem(index=7, raw=b"\x93\x01\x02\x03")
    first = item.packed()
    for rid in ("a", "b", "c"):
        assert decoded(pack_stream_frame(rid, item, 1 << 20))["stream"] == {"index": 7, "raw": b"\x93\x01\x02\x03"}
    assert item.packed() is first


def test_items_that_are_not_shared_are_encoded_as_they_are() -> None:
    mixed = {"batches": [SharedItem(index=1, events=[]), {"index": 2, "events": []}]}
    for item in ({"progress": 5}, mixed):
        assert decoded(pack_stream_frame("r", item, 1 << 20)) == {"id": "r", "stream": plain(item)}


def test_an_oversized_stream_item_is_refused_by_size() -> None:
    with pytest.raises(RPCError) as info:
        pack_stream_frame("r", SharedItem(index=1, raw=b"x" * 2000), 1000)
    assert info.value.code == "frame_too_large"


@pytest.mark.parametrize(
    ("header", "code", "fragment"),
    [
        (b"HTTP", "malformed", "that is its HTTP API address (NOMAD_ADDR)"),  # an answer, read by a client
        (b"GET ", "malformed", "HTTP clients (nomad, curl) use the server's http_addr"),  # a request, read by a server
        (b"POST", "malformed", "HTTP clients (nomad, curl) use the server's http_addr"),
        (HEADER.pack(1 << 30), "frame_too_large", "exceeds the frame limit"),
    ],
)
def test_an_impossible_length_names_http_when_that_is_what_it_is(header: bytes, code: str, fragment: str) -> None:
    """Read as a length, "HTTP" is a frame of 1.2 GB: the mix-up of ports, not the size, is the news."""
    with pytest.raises(RPCError) as info:
        check_length(header, 1 << 22)
    assert info.value.code == code and fragment in info.value.message


def test_a_length_within_the_limit_is_returned() -> None:
    assert check_length(HEADER.pack(1234), 1 << 22) == 1234


@settings(max_examples=200, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=12),
    cuts=st.lists(st.integers(0, 4000), max_size=20),
)
def test_frame_buffer_cuts_the_same_frames_however_the_bytes_arrive(bodies: list[bytes], cuts: list[int]) -> None:
    """The RPC server reads what the socket has: frames split or joined anywhere come out whole, in order."""
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    frames = FrameBuffer(1 << 20)
    got = []
    for start, end in zip(points, points[1:], strict=False):
        frames.feed(stream[start:end])
        while (body := frames.next()) is not None:
            got.append(body)
    assert got == bodies


def test_frame_buffer_refuses_an_oversized_or_http_header_as_soon_as_it_is_in() -> None:
    frames = FrameBuffer(100)
    frames.feed(struct.pack(">I", 50) + b"x" * 50)
    assert frames.next() == b"x" * 50
    frames.feed(struct.pack(">I", 101)[:3])
    assert frames.next() is None  # not a whole header yet
    frames.feed(struct.pack(">I", 101)[3:])
    with pytest.raises(RPCError) as err:
        frames.next()
    assert err.value.code == FRAME_TOO_LARGE
    http = FrameBuffer(100)
    http.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(RPCError, match="HTTP request reached the msgpack RPC port"):
        http.next()
