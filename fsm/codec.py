"""msgpack codec for records and log entries.

An entry on the log is ``type byte | msgpack payload``. Decoding an entry is
strict: an unknown field, a wrong type or a missing required field is a
``CodecError``, so a malformed payload is rejected instead of half-applied.
Records read back from our own store were checked when they entered the log,
so ``load`` rebuilds them without re-checking (the apply hot path).

msgspec does the work in C: packing, ``load``, and decoding every entry
every replica applies (``decode_typed``), where it builds what the strict
path would. What msgspec refuses takes the strict path written here in
Python (``from_wire``), which decides it and names what is wrong.
Its conversion plans are built once per record class from its type hints.
"""

from __future__ import annotations

import threading
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from fsm.errors import CodecError
from fsm.record import Record, fields, is_record

SCHEMA_VERSION = 1

T = TypeVar("T")
Converter = Callable[[Any], Any]

_STRICT: dict[type, tuple[dict[str, Converter], tuple[str, ...]]] = {}
_DUMPERS: dict[type, Callable[[Any], dict]] = {}


class _PathError(CodecError):
    """A CodecError that still collects the path of the bad value."""

    def __init__(self, message: str, path: list[str]) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


# One encoder and decoders shared by every thread, reused across calls
# (msgspec.msgpack.encode sets one up on every call). Sharing is safe: a
# call keeps its state on the C stack and holds the GIL throughout (we pass
# no hooks that could call back into Python). A thread-local lookup per call
# cost each server about 1 us a registration.
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
_TYPED_DECODERS: dict[type, msgspec.msgpack.Decoder] = {}


def pack(obj: Any) -> bytes:
    """msgpack of any value; records in it pack as ``encode`` packs them."""
    return _ENCODER.encode(obj)


def unpack(data: bytes | memoryview) -> Any:
    """A plain value from msgpack: maps, lists, str (msgpack str), bytes (bin), numbers."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise CodecError(f"malformed msgpack: {exc}") from None


# A journal batch with each record's object left packed: ``unpack_shallow``.
_RECORDS_DECODER = msgspec.msgpack.Decoder(list[tuple[str, str, Any, msgspec.Raw]])


def unpack_shallow(data: bytes | memoryview) -> list[Any]:
    """A packed journal batch's records ``(topic, type, key, object)``, each object still packed.

    ``unpack_object`` decodes one object; ``pack`` writes a record back with
    the object's bytes as they were. Skipping the objects nobody reads (the
    job specs of a batch of registrations, for a cache of allocations) costs
    a fifth of a full decode. A batch that is not a list of 4-item records
    comes back fully decoded, as ``unpack`` gives it.
    """
    try:
        return _RECORDS_DECODER.decode(data)
    except msgspec.ValidationError:
        return unpack(data)
    except msgspec.DecodeError as exc:
        raise CodecError(f"malformed msgpack: {exc}") from None


def unpack_object(obj: Any) -> Any:
    """A record's object from ``unpack_shallow``, decoded."""
    return _DECODER.decode(obj) if type(obj) is msgspec.Raw else obj


def unpack_record(record: Any) -> list[Any]:
    """A record from ``unpack_shallow`` as ``unpack`` gives it: ``[topic, type, key, object]``, the object decoded.

    A list is one ``unpack_shallow`` decoded whole already (its batch was not
    all 4-item records) and is returned as it is.
    """
    if type(record) is list:
        return record
    return [record[0], record[1], record[2], unpack_object(record[3])]


def unpack_records(data: bytes | memoryview, topics: frozenset[str]) -> list[list[Any]]:
    """The records ``[topic, type, key, object]`` of a packed journal batch whose topic is in ``topics``.

    The objects of the other records are never decoded (``unpack_shallow``).
    Equal to filtering ``unpack(data)``.
    """
    return [unpack_record(r) for r in unpack_shallow(data) if r[0] in topics]


def _fail(message: str) -> _PathError:
    return _PathError(message, [])


def _scalar(kind: tuple[type, ...], name: str) -> Converter:
    allow_bool = bool in kind
    exact = kind[0]  # what msgpack produces for a valid value

    def convert(value: Any) -> Any:
        if value.__class__ is exact:
            return value
        if not isinstance(value, kind) or (not allow_bool and value.__class__ is bool):
            raise _fail(f"expected {name}, got {type(value).__name__}")
        return value

    return convert


def _strict_converter(hint: Any) -> Converter:
    origin = typing.get_origin(hint)
    if hint is Any:
        return lambda value: value
    if hint is int:
        return _scalar((int,), "integer")
    if hint is str:
        return _scalar((str,), "string")
    if hint is bool:
        return _scalar((bool,), "boolean")
    if hint is float:
        return _scalar((int, float), "number")
    if hint is bytes:
        return _scalar((bytes,), "bytes")
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _strict_converter(args[0]) if len(args) == 1 else (lambda value: value)
        return lambda value: None if value is None else inner(value)
    if origin is list:
        (item_hint,) = typing.get_args(hint)
        item = _strict_converter(item_hint)

        def as_list(value: Any) -> Any:
            if not isinstance(value, list):
                raise _fail(f"expected list, got {type(value).__name__}")
            out = []
            for i, v in enumerate(value):
                try:
                    out.append(item(v))
                except _PathError as exc:
                    exc.path.append(f"[{i}]")
                    raise
            return out

        return as_list
    if origin is dict:
        _key_hint, value_hint = typing.get_args(hint)
        item = _strict_converter(value_hint)

        def as_dict(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _fail(f"expected map, got {type(value).__name__}")
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _fail("map keys must be strings")
                try:
                    out[k] = item(v)
                except _PathError as exc:
                    exc.path.append(f".{k}")
                    raise
            return out

        return as_dict
    if is_record(hint):
        return lambda value: _strict_build(hint, value)
    raise TypeError(f"codec cannot handle type hint {hint!r}")


_ANY_VALUE = (str, int, bool, float, bytes, type(None), list, dict)
# The classes a scalar hint accepts unchanged (bool is no int here); node.spec.onepass reads it too.
SCALAR_CLASSES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    str: (str,),
    bool: (bool,),
    float: (float, int),
    bytes: (bytes,),
}


def _accepted_as_is(hint: Any) -> tuple[type, ...]:
    """Classes whose values ``_strict_converter(hint)`` returns unchanged, checked inline."""
    if hint is Any:
        return _ANY_VALUE
    if hint in SCALAR_CLASSES:
        return SCALAR_CLASSES[hint]
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = SCALAR_CLASSES.get(args[0], ()) if len(args) == 1 else _ANY_VALUE
        return (*inner, type(None))
    return ()


StrictPlan = tuple[dict[str, Converter], tuple[str, ...], tuple[tuple[str, tuple[type, ...], Converter], ...]]


def _strict_plan(cls: type) -> StrictPlan:
    plan = _STRICT.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        record_fields = fields(cls)
        converters = {f.name: _strict_converter(hints[f.name]) for f in record_fields}
        required = tuple(f.name for f in record_fields if f.required)
        ordered = tuple((f.name, _accepted_as_is(hints[f.name]), converters[f.name]) for f in record_fields)
        plan = (converters, required, ordered)
        _STRICT[cls] = plan
    return plan


def _strict_build(cls: type[T], data: Any) -> T:
    if not isinstance(data, dict):
        raise _fail(f"expected map, got {type(data).__name__}")
    converters, required, ordered = _strict_plan(cls)
    if data.keys() == converters.keys():
        # Every field and nothing else (what encode_entry sends): convert in
        # field order and pass them by position.
        # Values of a class the field takes as-is (most scalars) skip the call.
        values = []
        for key, as_is, convert in ordered:
            value = data[key]
            if value.__class__ in as_is:
                values.append(value)
                continue
            try:
                values.append(convert(value))
            except _PathError as exc:
                exc.path.append(f".{key}")
                raise
        return cls(*values)
    kwargs = {}
    for key, value in data.items():
        convert = converters.get(key)
        if convert is None:
            raise _fail(f"unknown field {key!r}")
        try:
            kwargs[key] = convert(value)
        except _PathError as exc:
            exc.path.append(f".{key}")
            raise
    for name in required:
        if name not in kwargs:
            raise _fail(f"missing required field {name!r}")
    return cls(**kwargs)


# -- generated exact-shape builders ---------------------------------------------
# What the leader's ``encode_entry`` sends is always the exact shape: every
# field, each value of the one class msgpack produces for it. For each
# record class a builder specialised to that shape is generated once (straight-
# line Python, no per-field converter calls). It accepts only values the
# general path above accepts, and builds the same object from them; on
# anything else it raises ``_Slow`` and ``from_wire`` runs the general path,
# which builds the object or reports the error with its path, as before.


class _Slow(Exception):
    """The value is not in the exact shape a generated builder handles."""


_FAST: dict[type, Callable[[Any], Any]] = {}
_FAST_LOCK = threading.RLock()  # RPC threads and apply may build the same class's builder at once
_GENERATING: set[type] = set()  # classes whose builder is being generated (under the lock)
_EXACT_CLASS = {int: "int", str: "str", bool: "bool", bytes: "bytes"}


def _fast_builder(cls: type) -> Callable[[Any], Any]:
    fn = _FAST.get(cls)
    if fn is None:
        with _FAST_LOCK:
            fn = _FAST.get(cls)
            if fn is None:
                _GENERATING.add(cls)
                try:
                    fn = _FAST[cls] = _generate_builder(cls)
                finally:
                    _GENERATING.discard(cls)
    return fn


def _lazy_builder(cls: type) -> Callable[[Any], Any]:
    """A class's builder looked up when called (for a class that holds itself)."""
    return lambda value: _FAST[cls](value)


class _Emitter:
    """Lines of one generated builder and the names its code refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_Slow": _Slow, "_PathError": _PathError}
        self._n = 0

    def name(self, prefix: str, value: Any = None) -> str:
        self._n += 1
        name = f"{prefix}{self._n}"
        if value is not None:
            self.names[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def builder(self, cls: type) -> str:
        """The name of ``cls``'s builder in the generated code."""
        if cls in _GENERATING:  # being generated (it holds itself): look it up at call time
            return self.name("build", _lazy_builder(cls))
        return self.name("build", _fast_builder(cls))

    def check(self, hint: Any, var: str, indent: int) -> None:
        """Emit code that checks ``var`` against ``hint`` and rebinds it to the converted value."""
        origin = typing.get_origin(hint)
        if hint is Any:
            pass
        elif hint in _EXACT_CLASS:
            self.emit(indent, f"if {var}.__class__ is not {_EXACT_CLASS[hint]}: raise _Slow")
        elif hint is float:
            self.emit(indent, f"if {var}.__class__ is not float and {var}.__class__ is not int: raise _Slow")
        elif origin in (types.UnionType, typing.Union):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) == 1:  # X | None; several types are taken as is, as ``_strict_converter`` does
                self.emit(indent, f"if {var} is not None:")
                mark = len(self.lines)
                self.check(args[0], var, indent + 1)
                if len(self.lines) == mark:
                    self.lines.pop()  # nothing to check inside
        elif is_record(hint):
            self.emit(indent, f"{var} = {self.builder(hint)}({var})")
        elif origin is list:
            self._check_list(typing.get_args(hint)[0], var, indent)
        elif origin is dict:
            self._check_dict(typing.get_args(hint)[1], var, indent)
        else:  # the general converter, whose error means "take the general path"
            convert = self.name("convert", _strict_converter(hint))
            self.emit(indent, "try:")
            self.emit(indent + 1, f"{var} = {convert}({var})")
            self.emit(indent, "except _PathError:")
            self.emit(indent + 1, "raise _Slow from None")

    def _check_list(self, item_hint: Any, var: str, indent: int) -> None:
        self.emit(indent, f"if {var}.__class__ is not list: raise _Slow")
        if is_record(item_hint):
            build = self.builder(item_hint)
            # (an empty list skips the comprehension's function call)
            self.emit(indent, f"{var} = [{build}(v) for v in {var}] if {var} else []")
            return
        item, out = self.name("v"), self.name("out")
        self.emit(indent, f"{out} = []")  # a new list, as the general path makes
        self.emit(indent, f"for {item} in {var}:")
        self.check(item_hint, item, indent + 1)
        self.emit(indent + 1, f"{out}.append({item})")
        self.emit(indent, f"{var} = {out}")

    def _check_dict(self, value_hint: Any, var: str, indent: int) -> None:
        self.emit(indent, f"if {var}.__class__ is not dict: raise _Slow")
        key, item, out = self.name("k"), self.name("v"), self.name("out")
        self.emit(indent, f"if not {var}:")  # most maps are empty
        self.emit(indent + 1, f"{var} = {{}}")  # a new map, as the general path makes
        self.emit(indent, "else:")
        self.emit(indent + 1, f"{out} = {{}}")
        self.emit(indent + 1, f"for {key}, {item} in {var}.items():")
        self.emit(indent + 2, f"if {key}.__class__ is not str: raise _Slow")
        self.check(value_hint, item, indent + 2)
        self.emit(indent + 2, f"{out}[{key}] = {item}")
        self.emit(indent + 1, f"{var} = {out}")


def _generate_builder(cls: type) -> Callable[[Any], Any]:
    """Source of ``build(data)`` for ``cls``'s exact shape, compiled."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    e = _Emitter()
    e.names.update(_cls=cls)
    e.emit(0, "def build(data):")
    # Exactly the fields: as many keys as fields, and each field found
    # (cheaper than comparing key sets).
    e.emit(1, f"if data.__class__ is not dict or len(data) != {len(names)}: raise _Slow")
    local = {}
    if names:
        e.emit(1, "try:")
        for i, name in enumerate(names):
            local[name] = var = f"f{i}"
            e.emit(2, f"{var} = data[{name!r}]")
            e.check(hints[name], var, 2)
        e.emit(1, "except KeyError:")
        e.emit(2, "raise _Slow from None")
    e.emit(1, "return _cls(" + ", ".join(local.values()) + ")")
    source = "\n".join(e.lines)
    exec(compile(source, f"<codec builder {cls.__qualname__}>", "exec"), e.names)
    return e.names["build"]


def from_wire(cls: type[T], data: Any, path: str | None = None) -> T:
    """Build ``cls`` from a decoded msgpack map, checking every field."""
    try:
        return (_FAST.get(cls) or _fast_builder(cls))(data)
    except _Slow:
        pass  # not the exact shape: the general path builds it or says what is wrong
    try:
        return _strict_build(cls, data)
    except _PathError as exc:
        where = (path or cls.__name__) + "".join(reversed(exc.path))
        raise CodecError(f"{where}: {exc.message}") from None


def _nested_kind(hint: Any) -> tuple[str, type] | None:
    """How a field holds records, if it does: ('one'|'opt'|'list'|'dict', cls)."""
    origin = typing.get_origin(hint)
    if is_record(hint):
        return ("one", hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            # X | None, list[X] | None, dict[str, X] | None: None is passed through.
            inner = _nested_kind(args[0])
            if inner is not None and inner[0] == "one":
                return ("opt", inner[1])
            return inner
    if origin is list:
        (item,) = typing.get_args(hint)
        if is_record(item):
            return ("list", item)
    if origin is dict:
        item = typing.get_args(hint)[1]
        if is_record(item):
            return ("dict", item)
    return None


def _nested_fields(cls: type) -> list[tuple[str, str, type]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        kind = _nested_kind(hints[f.name])
        if kind is not None:
            out.append((f.name, kind[0], kind[1]))
    return out


def _dumper(cls: type) -> Callable[[Any], dict]:
    fn = _DUMPERS.get(cls)
    if fn is None:
        nested = _nested_fields(cls)

        def fn(obj: Any) -> dict:
            data = msgspec.structs.asdict(obj)
            for name, kind, _sub in nested:
                value = data[name]
                if value is None:
                    continue
                if kind in ("one", "opt"):
                    data[name] = _dumper(type(value))(value)
                elif kind == "list":
                    data[name] = [_dumper(type(v))(v) for v in value]
                else:
                    data[name] = {k: _dumper(type(v))(v) for k, v in value.items()}
            return data

        _DUMPERS[cls] = fn
    return fn


def to_wire(obj: Any) -> Any:
    """Records to plain maps, recursively."""
    if isinstance(obj, Record):
        return _dumper(type(obj))(obj)
    if isinstance(obj, list):
        return [to_wire(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_wire(v) for k, v in obj.items()}
    return obj


def dump(obj: Any) -> dict:
    """One record's wire map, every field (``encode`` leaves a ``CompactRecord``'s defaults out)."""
    return _dumper(type(obj))(obj)


def full_map(cls: type, data: dict) -> dict:
    """A packed record's map with every field, as ``dump`` gives it.

    A ``CompactRecord``'s packed map leaves out the fields at their default:
    code that shows a stored map (an event stream) fills them in here.
    """
    if not cls.__struct_config__.omit_defaults:  # type: ignore[attr-defined]
        return data
    return dump(msgspec.convert(data, cls))


def encode(obj: Any) -> bytes:
    """A record as stored: msgpack of its fields in definition order.

    msgspec packs a record in C. The bytes are those of ``pack(dump(obj))``
    for a plain ``Record``, and of that map without the fields at their
    default for a ``CompactRecord`` (tests/fsm/test_invariants.py checks
    both, for every record and message class).
    """
    return _ENCODER.encode(obj)


def _typed_decoder(cls: type) -> msgspec.msgpack.Decoder:
    decoder = _TYPED_DECODERS.get(cls)
    if decoder is None:  # two threads may both build one: either will do
        decoder = _TYPED_DECODERS[cls] = msgspec.msgpack.Decoder(cls)
    return decoder


def decode_typed(cls: type[T], data: bytes | memoryview) -> T | None:
    """``cls`` from bytes when msgspec builds it as the strict path would, else None.

    msgspec checks every type in C (strict mode: no str for an int, no bool
    for an int), refuses unknown fields (``Record`` forbids them) and fills
    an omitted field with the default the strict path gives it. The one
    conversion it makes, an int for a float field, cannot happen: no record
    has a float (tests/fsm/test_invariants.py checks). Whatever it refuses
    (None here), the strict path decides, and names what is wrong.

    This used to pack the result again and take it only if that gave back
    the same bytes: on a 1 KiB registration that check cost more than the
    decoding (4.4 against 2.7 us), on every server, for every entry.
    tests/fsm/test_invariants.py's hypothesis property feeds both paths
    payloads with fields added, dropped, reordered and set to odd values.
    """
    try:
        return _typed_decoder(cls).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def decode(cls: type[T], data: bytes) -> T:
    """Strictly decode bytes from outside (an entry, a request)."""
    return from_wire(cls, unpack(data))


def load(cls: type[T], data: bytes) -> T:
    """Rebuild a record we stored ourselves; it was checked on its way in.

    msgspec builds it in C. Any-typed fields (task config) may hold maps with
    non-string keys that the strict decoder let in; msgspec takes those too.
    """
    try:
        return _typed_decoder(cls).decode(data)
    except msgspec.ValidationError:
        # Records refuse unknown fields (for ``decode_typed``), but a record
        # stored before an upgrade removed one of its fields must still load:
        # an upgrade is every server restarted on its data directory.
        return msgspec.convert(_known_fields_only(cls, unpack(data)), cls)


def _known_fields_only(cls: type, data: Any) -> Any:
    """A stored record's wire map without the fields ``cls`` does not have, at any depth (a rare path)."""
    if not isinstance(data, dict):
        return data
    known = {f.name for f in fields(cls)}
    out = {k: v for k, v in data.items() if k in known}
    for name, kind, sub in _nested_fields(cls):
        if name not in out:
            continue
        value = out[name]
        if kind in ("one", "opt"):
            out[name] = _known_fields_only(sub, value)
        elif kind == "list" and isinstance(value, list):
            out[name] = [_known_fields_only(sub, v) for v in value]
        elif kind == "dict" and isinstance(value, dict):
            out[name] = {k: _known_fields_only(sub, v) for k, v in value.items()}
    return out
