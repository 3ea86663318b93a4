"""The base class of every stored record and log message, and the few helpers that look inside one.

Records are msgspec Structs, not dataclasses. Every replica decodes every
log entry into records and encodes every record it stores, and msgspec
builds and packs a Struct in C without going through an instance
``__dict__``: decoding a registration's job took 4.7 us as a dataclass and
1.9 us as a Struct, packing it 1.9 and 0.9 us.

A record packs as a map of its fields in definition order. A
``CompactRecord`` leaves out the fields that hold their default: a
registration's job has 40 of its 48 fields at their defaults, and its log
entry (with its eval) shrank from 995 to 283 bytes, which every server decodes, stores
twice (the job and its version) and sends or receives through raft. A
plain ``Record`` packs every field: the apply path edits the stored maps
of allocations and job summaries in place, and the leader's loops read
node, alloc and deployment maps from the journal, by key.

Code that walks a record's fields (the strict decoder, the jobspec parser,
Nomad's JSON names) goes through ``fields`` here rather than through
msgspec directly, so the one place that knows what a record is stays here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from msgspec import field

__all__ = ["Record", "CompactRecord", "Field", "field", "fields", "is_record", "replace", "copy_record", "NO_DEFAULT"]

T = TypeVar("T")

#: A field without a default (what ``Field.default`` and ``Field.default_factory`` hold then).
NO_DEFAULT: Any = msgspec.NODEFAULT


class Record(msgspec.Struct, forbid_unknown_fields=True):
    """A stored record or log message: packed as a map of every field, in definition order.

    msgspec refuses a field the class does not have instead of dropping it:
    a field from a newer version deep inside a job must not vanish on this
    replica and not on one that knows it (``codec.decode_typed``).
    """


class CompactRecord(Record, omit_defaults=True):
    """A record packed without the fields that hold their default.

    Decoding fills them in again, so only code that reads the packed map
    itself (``codec.unpack``, a journal record) sees the difference; that
    code goes through ``codec.full_map`` or reads each field with its default.
    """


@dataclass(frozen=True)
class Field:
    """One field of a record class: its name and its default."""

    name: str
    default: Any
    default_factory: Callable[[], Any] | Any

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT and self.default_factory is NO_DEFAULT


_FIELDS: dict[type, tuple[Field, ...]] = {}


def is_record(obj: Any) -> bool:
    """Is ``obj`` a record class (not an instance)?"""
    return isinstance(obj, type) and issubclass(obj, msgspec.Struct)


def fields(cls: type) -> tuple[Field, ...]:
    """``cls``'s fields in definition order (worked out once per class)."""
    out = _FIELDS.get(cls)
    if out is None:
        out = _FIELDS[cls] = tuple(
            Field(f.name, f.default, f.default_factory) for f in msgspec.structs.fields(cls)
        )
    return out


def replace(obj: T, **changes: Any) -> T:
    """A copy of ``obj`` with ``changes`` (``dataclasses.replace`` for records)."""
    return msgspec.structs.replace(obj, **changes)


def copy_record(obj: T) -> T:
    """A shallow copy: the fields' values are shared."""
    return obj.__copy__()  # type: ignore[attr-defined]
