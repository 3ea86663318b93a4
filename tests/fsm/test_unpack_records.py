"""``codec.unpack_records`` decodes only the records of the topics asked for, and equals filtering a full decode."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm import codec

TOPICS = ("Job", "Evaluation", "Allocation", "Node")
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
records = st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(("Put", "Del")), values, values).map(list),
                   max_size=6)
# Anything else a batch could hold: a plain decode says what is there.
odd = st.lists(st.one_of(st.lists(st.sampled_from(TOPICS), min_size=1, max_size=5), st.just(["Job", "Put", "k"])),
               min_size=1, max_size=4)


@given(st.one_of(records, odd), st.frozensets(st.sampled_from(TOPICS)))
def test_unpack_records_equals_filtering_a_full_decode(batch: list[Any], topics: frozenset[str]) -> None:
    raw = codec.pack(batch)
    assert codec.unpack_records(raw, topics) == [r for r in codec.unpack(raw) if r[0] in topics]


def test_a_malformed_batch_is_a_codec_error() -> None:
    with pytest.raises(codec.CodecError, match="malformed msgpack"):
        codec.unpack_records(b"\x94\xa3Job", frozenset({"Job"}))


@given(records)
def test_a_shallow_batch_packs_back_to_its_own_bytes_and_decodes_to_the_full_one(batch: list[Any]) -> None:
    raw = codec.pack(batch)
    shallow = codec.unpack_shallow(raw)
    assert codec.pack(shallow) == raw
    assert [codec.unpack_record(r) for r in shallow] == codec.unpack(raw)
