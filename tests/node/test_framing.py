"""Stream frames that splice shared items' cached encodings: the same bytes a plain encoding gives."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.errors import RPCError
from node.framing import HEADER, SharedItem, check_length, pack_stream_frame, unpack_body

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
