"""A Nomad API job read into ``fsm.structs.Job`` in one pass, standing in for the general path.

The general path (``node.spec.reader.read_general``) walks a spec three
times (``from_nomad``, pruning, the codec) and the codec's general builder
binds ``__init__`` arguments per record: most of a registration's parse cost
on the leader. ``read_fast`` reads the Nomad-shaped spec once, with a
per-class table from Nomad key to field, and builds each record from the
values it read. It accepts only what the general path accepts unchanged
(each value of the exact class msgpack/JSON yields, no two keys naming one
field, every key a string) and raises ``Fallback`` on anything else, so every
invalid or unusual spec gets the general path's result and its error text.
"""

from __future__ import annotations

import threading
import types
import typing
from typing import Any

from fsm import codec
from fsm.record import fields, is_record
from fsm.structs import Job
from node.spec.nomadjson import DATA_MAPS, from_nomad, pascal, snake


class Fallback(Exception):
    """The spec is not one ``read_fast`` can vouch for: run the general path."""

# How a field's value is read (the ``kind`` of a ``_Field``).
_EXACT = 0  # a scalar of one of ``arg``'s classes, taken as is
_RECORD = 1  # a nested record (``arg`` is its ``_Shape``)
_RECORDS = 2  # a list of nested records
_SCALARS = 3  # a list of scalars of ``arg``'s classes
_MAP = 4  # a data map (keys kept) of scalars of ``arg``'s classes
_ANY_MAP = 5  # a data map of any values (task config), snake-cased below the top as from_nomad does
_TRUTH = 6  # Job.Periodic / Job.ParameterizedJob: the block's presence, as a bool
_OTHER = 7  # a type this pass does not handle: the general path does

# The classes the codec takes unchanged for a scalar hint (bool is no int here).
_SCALAR_CLASSES = codec.SCALAR_CLASSES
_PLAIN_VALUES = (str, int, float, bool)  # what from_nomad returns as it is


class _Field(typing.NamedTuple):
    name: str
    nomad: str  # the Nomad spelling, for warning paths
    kind: int
    arg: Any


class _Shape:
    """One record class's table: its fields by every spelling met, and which are required."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.by_name: dict[str, _Field] = {}
        # Nomad spelling (and the snake name itself) -> field; other spellings
        # are looked up through ``snake`` and not remembered (they are user input).
        self.by_key: dict[str, _Field] = {}
        self.required = tuple(f.name for f in fields(cls) if f.required)

    def fill(self) -> None:
        """Work out each field's kind (after registering, so a class may hold itself)."""
        hints = typing.get_type_hints(self.cls)
        for f in fields(self.cls):
            kind, arg = _kind_of(f.name, hints[f.name])
            if self.cls is Job and f.name in ("periodic", "parameterized"):
                kind, arg = _TRUTH, None
            entry = _Field(f.name, pascal(f.name), kind, arg)
            self.by_name[f.name] = entry
            self.by_key[entry.nomad] = entry
            self.by_key[f.name] = entry


_SHAPES: dict[type, _Shape] = {}
_SHAPES_LOCK = threading.RLock()  # RPC threads may parse at once; filling a shape nests


def _shape(cls: type) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        with _SHAPES_LOCK:
            shape = _SHAPES.get(cls)
            if shape is None:
                shape = _Shape(cls)
                _SHAPES[cls] = shape  # before filling: a nested reference to cls finds it
                try:
                    shape.fill()
                except BaseException:
                    del _SHAPES[cls]
                    raise
    return shape


def _kind_of(name: str, hint: Any) -> tuple[int, Any]:
    """How ``read_fast`` reads a field of this hint (None values never get here: they mean the default)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            return _OTHER, None
        hint, origin = args[0], typing.get_origin(args[0])
    if hint in _SCALAR_CLASSES:
        return _EXACT, _SCALAR_CLASSES[hint]
    if is_record(hint):
        return _RECORD, _shape(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if is_record(item):
            return _RECORDS, _shape(item)
        if item in _SCALAR_CLASSES:
            return _SCALARS, _SCALAR_CLASSES[item]
    # Only data maps keep their keys in from_nomad; any other map is the general path's.
    if origin is dict and name in DATA_MAPS:
        value = typing.get_args(hint)[1]
        if value is Any:
            return _ANY_MAP, None
        if value in _SCALAR_CLASSES:
            return _MAP, _SCALAR_CLASSES[value]
    return _OTHER, None


def _keys_plain(value: Any, data_map: bool) -> bool:
    """Whether from_nomad takes ``value`` without raising: every key it snake-cases is a string.

    Values of fields Caravan ignores are not converted here, but the general
    path converts them before pruning, and a non-string key there raises.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            if data_map:
                if isinstance(v, (dict, list)) and not _keys_plain(v, False):
                    return False
                continue
            if k.__class__ is not str:
                return False
            if isinstance(v, dict):
                if not _keys_plain(v, snake(k) in DATA_MAPS):
                    return False
            elif isinstance(v, list) and not _keys_plain(v, False):
                return False
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)) and not _keys_plain(v, False):
                return False
    return True


def _where(path: Any) -> str:
    """A lazily built warning path: ``path`` is "Job" or (parent, Nomad name, index or None)."""
    if isinstance(path, str):
        return path
    parent, nomad, index = path
    return f"{_where(parent)}.{nomad}" + ("" if index is None else f"[{index}]")


def _read(shape: _Shape, data: Any, path: Any, warnings: list[str]) -> Any:
    """One record from its Nomad map, exactly as the general path would build it, or ``Fallback``.

    Scalars are checked inline and everything else goes through ``_value``:
    this loop runs for every field of every registration.
    """
    if data.__class__ is not dict:
        raise Fallback
    by_key = shape.by_key
    values: dict[str, Any] = {}
    seen: set[str] | None = None  # fields given as None, and unknown names: for duplicate spellings
    for key, value in data.items():
        entry = by_key.get(key)
        if entry is None:
            if key.__class__ is not str:
                raise Fallback
            name = snake(key)
            entry = shape.by_name.get(name)
            if entry is None:  # a field Caravan does not model
                seen = _ignore_unknown(name, value, path, warnings, seen)
                continue
        name = entry.name
        if name in values or (seen is not None and name in seen):
            raise Fallback  # two spellings of one field: the general path keeps the last
        kind = entry.kind
        if value is None and kind != _TRUTH:
            if seen is None:
                seen = set()
            seen.add(name)
            continue
        if kind == _EXACT:
            if value.__class__ not in entry.arg:
                raise Fallback
        else:
            value = _value(entry, value, path, warnings)
        values[name] = value
    for name in shape.required:
        if name not in values:
            raise Fallback
    return shape.cls(**values)


def _ignore_unknown(name: str, value: Any, path: Any, warnings: list[str], seen: set[str] | None) -> set[str]:
    """Warn of a field Caravan does not model, as pruning would; returns ``seen`` with ``name`` in it."""
    if seen is None:
        seen = set()
    elif name in seen:
        raise Fallback
    seen.add(name)
    if value is not None and not _keys_plain(value, name in DATA_MAPS):
        raise Fallback
    warnings.append(f"{_where(path)}.{pascal(name)} is not supported by Caravan and was ignored")
    return seen


def _value(entry: _Field, value: Any, path: Any, warnings: list[str]) -> Any:
    """A non-None value of any kind but ``_EXACT``, as the general path would decode it, or ``Fallback``."""
    kind = entry.kind
    if kind == _RECORDS:
        if value.__class__ is not list:
            raise Fallback
        sub = entry.arg
        return [_read(sub, v, (path, entry.nomad, i), warnings) for i, v in enumerate(value)]
    if kind == _RECORD:
        return _read(entry.arg, value, (path, entry.nomad, None), warnings)
    if kind == _MAP:
        if value.__class__ is not dict:
            raise Fallback
        classes = entry.arg
        for k, v in value.items():
            if k.__class__ is not str or v.__class__ not in classes:
                raise Fallback
        return dict(value)
    if kind == _ANY_MAP:
        return _any_map(value)
    if kind == _SCALARS:
        if value.__class__ is not list:
            raise Fallback
        classes = entry.arg
        for v in value:
            if v.__class__ not in classes:
                raise Fallback
        return list(value)
    if kind == _TRUTH:
        if not _keys_plain(value, False):
            raise Fallback
        return bool(value)
    raise Fallback


def _any_map(value: Any) -> dict[str, Any]:
    """A task config: its keys kept, values snake-cased below as from_nomad does (then taken as is)."""
    if value.__class__ is not dict:
        raise Fallback
    out = {}
    for k, v in value.items():
        if k.__class__ is not str:
            raise Fallback
        if v.__class__ in _PLAIN_VALUES or v is None:
            out[k] = v
            continue
        try:
            out[k] = from_nomad(v)
        except Exception:  # whatever from_nomad raises, the general path raises it too
            raise Fallback from None
    return out


def read_fast(spec: dict[str, Any]) -> tuple[Job, list[str]]:
    """(Job, warnings) exactly as the general path would give them, or ``Fallback``."""
    warnings: list[str] = []
    return _read(_shape(Job), spec, "Job", warnings), warnings
