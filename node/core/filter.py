"""List filters in Nomad's expression language (HashiCorp's go-bexpr), parsed with lark.

Nomad's list endpoints take ``?filter=`` with go-bexpr's syntax, and users
paste the same expressions into Caravan: ``Status == "running"``,
``ClientStatus in ["running", "pending"]``, ``"web" in Tags``,
``Meta.team is not empty``, ``not (JobID matches "^batch-")``. The grammar
below follows go-bexpr's PEG (``grammar/grammar.peg``) in lark's notation;
lark is a maintained parser library whose LALR parser reports where an
expression goes wrong, so a bad filter answers 400 with its column.

Selectors name fields of the Nomad API object (``JobID``, ``Meta.team``,
``Meta["team"]``, ``TaskGroups.0.Name``, or a quoted JSON pointer
``"/Meta/team"``). Values are coerced to the selected field's type, as
go-bexpr coerces them: ``JobVersion == 2``, ``Drain == false``.

Where go-bexpr fails on a selector that finds nothing, the filter answers
as Boundary documents for the same library: the negative operators (!=,
not in, not contains, not matches, is empty) are true, the others false. So
``Meta.team == "x"`` skips objects without that key instead of failing the
whole list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr (_OR and_expr)*        -> any_of
?and_expr: not_expr (_AND not_expr)*      -> all_of
?not_expr: _NOT not_expr                  -> negate
         | atom
?atom: "(" or_expr ")"
     | match

match: selector "==" value               -> eq
     | selector "!=" value               -> ne
     | selector _CONTAINS value          -> contains
     | selector _NOT_CONTAINS value      -> not_contains
     | selector _MATCHES value           -> matches
     | selector _NOT_MATCHES value       -> not_matches
     | selector _IS_EMPTY                -> is_empty
     | selector _IS_NOT_EMPTY            -> is_not_empty
     | operand _IN operand               -> in_
     | operand _NOT_IN operand           -> not_in

selector: path | STRING
operand: path | literal | list
value: path | literal
literal: STRING | RAW | NUMBER
list: "[" [value ("," value)*] "]"
path: IDENT segment*
?segment: "." IDENT                      -> field
        | "." INT                        -> field
        | "[" STRING "]"                 -> key

_OR: "or"
_AND: "and"
_NOT: "not"
_IN: "in"
_CONTAINS: "contains"
_MATCHES: "matches"
_NOT_IN.2: /not\s+in\b/
_NOT_CONTAINS.2: /not\s+contains\b/
_NOT_MATCHES.2: /not\s+matches\b/
_IS_EMPTY.2: /is\s+empty\b/
_IS_NOT_EMPTY.2: /is\s+not\s+empty\b/

IDENT: /[a-zA-Z][a-zA-Z0-9_\/]*/
INT: /[0-9]+/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?(?![a-zA-Z0-9_])/
STRING: /"(\\.|[^"\\])*"/
RAW: /`[^`]*`/

%import common.WS
%ignore WS
"""

_PARSER = Lark(GRAMMAR, parser="lalr", maybe_placeholders=False)
MAX_FILTER_LENGTH = 4096  # a filter is a line a person writes, not a document


class FilterError(ValueError):
    """A filter that cannot be parsed or applied: the one-line reason, with its column where known."""


@dataclass(frozen=True)
class Literal:
    """A value as written: its text, and whether it was a number (go-bexpr keeps the raw text too)."""

    raw: str
    number: bool = False


Path = tuple[str, ...]
Predicate = Callable[[Any], bool]
_MISSING = object()


def compile_filter(text: str) -> Filter:
    """Parse ``text``; raises ``FilterError`` naming the column where it goes wrong."""
    if len(text) > MAX_FILTER_LENGTH:
        raise FilterError(f"filter expression is {len(text)} characters long; the limit is {MAX_FILTER_LENGTH}")
    if not text.strip():
        raise FilterError("filter expression is empty")
    try:
        tree = _PARSER.parse(text)
        predicate = _Build().transform(tree)
    except UnexpectedInput as exc:
        raise FilterError(_position_message(text, exc)) from None
    except VisitError as exc:
        raise FilterError(str(exc.orig_exc)) from None
    return Filter(text, predicate)


@dataclass(frozen=True)
class Filter:
    """A compiled filter: ``matches(obj)`` on an object in Nomad's JSON shape."""

    text: str
    predicate: Predicate

    def matches(self, obj: Any) -> bool:
        return self.predicate(obj)


def _position_message(text: str, exc: UnexpectedInput) -> str:
    column = getattr(exc, "column", None)
    if isinstance(exc, UnexpectedEOF) or column is None or column < 1:
        return f"invalid filter expression: it ends early (after {text.strip()[-20:]!r})"
    if isinstance(exc, UnexpectedToken):
        if exc.token.type == "$END":
            return f"invalid filter expression at column {len(text.rstrip()) + 1}: it ends early"
        what = f"unexpected {str(exc.token)!r}"
    elif isinstance(exc, UnexpectedCharacters):
        what = f"unexpected character {text[exc.pos_in_stream]!r}"
    else:
        what = "syntax error"
    return f"invalid filter expression at column {column}: {what}"


# -- building predicates ---------------------------------------------------------------
def _unquote(token: Token) -> str:
    text = str(token)
    if text.startswith("`"):
        return text[1:-1]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise FilterError(f"invalid string {text} at column {token.column}") from None


@v_args(inline=True)
class _Build(Transformer):
    """The parse tree -> a predicate over one object (closures, so a page's scan runs no tree walk)."""

    # -- operands --
    def path(self, first: Token, *rest: str) -> Path:
        return (str(first), *rest)

    def field(self, name: Token) -> str:
        return str(name)

    def key(self, name: Token) -> str:
        return _unquote(name)

    def selector(self, item: Path | Token) -> Path:
        if isinstance(item, tuple):
            return item
        pointer = _unquote(item)  # a quoted selector is a JSON pointer: "/Meta/team"
        if not pointer.startswith("/"):
            raise FilterError(f"selector {item} at column {item.column} must be a JSON pointer starting with /")
        return tuple(p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/"))

    def literal(self, token: Token) -> Literal:
        if token.type == "NUMBER":
            return Literal(str(token), number=True)
        return Literal(_unquote(token))

    def value(self, item: Path | Literal) -> Literal:
        return item if isinstance(item, Literal) else Literal(".".join(item))  # a bare word is its text

    def list(self, *items: Literal) -> list[Literal]:
        return list(items)

    def operand(self, item: Any) -> Any:
        return item

    # -- matches --
    def eq(self, path: Path, value: Literal) -> Predicate:
        return _on(path, lambda v: _equal(v, value, path), missing=False)

    def ne(self, path: Path, value: Literal) -> Predicate:
        return _on(path, lambda v: not _equal(v, value, path), missing=True)

    def contains(self, path: Path, value: Literal) -> Predicate:
        return _on(path, lambda v: _has(v, value, path), missing=False)

    def not_contains(self, path: Path, value: Literal) -> Predicate:
        return _on(path, lambda v: not _has(v, value, path), missing=True)

    def matches(self, path: Path, value: Literal) -> Predicate:
        pattern = _regex(value)
        return _on(path, lambda v: _search(pattern, v, path), missing=False)

    def not_matches(self, path: Path, value: Literal) -> Predicate:
        pattern = _regex(value)
        return _on(path, lambda v: not _search(pattern, v, path), missing=True)

    def is_empty(self, path: Path) -> Predicate:
        return _on(path, lambda v: _size(v, path) == 0, missing=True)

    def is_not_empty(self, path: Path) -> Predicate:
        return _on(path, lambda v: _size(v, path) != 0, missing=False)

    def in_(self, left: Any, right: Any) -> Predicate:
        return _membership(left, right, negate=False)

    def not_in(self, left: Any, right: Any) -> Predicate:
        return _membership(left, right, negate=True)

    # -- logic --
    def negate(self, inner: Predicate) -> Predicate:
        return lambda obj: not inner(obj)

    def all_of(self, *parts: Predicate) -> Predicate:
        return lambda obj: all(p(obj) for p in parts)

    def any_of(self, *parts: Predicate) -> Predicate:
        return lambda obj: any(p(obj) for p in parts)


def _membership(left: Any, right: Any, *, negate: bool) -> Predicate:
    """``"v" in Selector`` (the selector holds v), or ``Selector in ["a", "b"]`` (its value is one of them)."""
    if isinstance(right, list):
        if not isinstance(left, tuple):
            raise FilterError("the left side of 'in [...]' must be a field selector")
        options = right
        return _on(left, lambda v: any(_equal(v, o, left) for o in options) != negate, missing=negate)
    if not isinstance(right, tuple):
        raise FilterError("the right side of 'in' must be a field selector or a [list]")
    value = left if isinstance(left, Literal) else Literal(".".join(left))
    return _on(right, lambda v: _has(v, value, right) != negate, missing=negate)


def _on(path: Path, test: Callable[[Any], bool], *, missing: bool) -> Predicate:
    """A predicate that selects ``path`` from the object, then tests it (``missing`` when nothing is there)."""

    def predicate(obj: Any) -> bool:
        value = _select(obj, path)
        return missing if value is _MISSING or value is None else test(value)

    return predicate


def _select(obj: Any, path: Path) -> Any:
    for part in path:
        if isinstance(obj, dict):
            obj = obj.get(part, _MISSING)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return _MISSING
        if obj is _MISSING:
            return obj
    return obj


def _name(path: Path) -> str:
    return ".".join(path)


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _coerce(value: Literal, like: Any, path: Path) -> Any:
    """``value`` as the type of the field it is compared with, as go-bexpr coerces it."""
    if isinstance(like, bool):
        if value.raw in _TRUE or value.raw in _FALSE:
            return value.raw in _TRUE
        raise FilterError(f"{_name(path)} is a bool; {value.raw!r} is not true or false")
    if isinstance(like, int | float):
        try:
            return int(value.raw) if isinstance(like, int) else float(value.raw)
        except ValueError:
            raise FilterError(f"{_name(path)} is a number; {value.raw!r} is not one") from None
    return value.raw


def _equal(field: Any, value: Literal, path: Path) -> bool:
    if isinstance(field, dict | list):
        raise FilterError(f"{_name(path)} is a collection; compare it with 'contains' or 'is empty', not ==")
    return field == _coerce(value, field, path)


def _has(field: Any, value: Literal, path: Path) -> bool:
    if isinstance(field, str):
        return value.raw in field
    if isinstance(field, dict):
        return value.raw in field
    if isinstance(field, list):
        return any(not isinstance(item, dict | list) and item == _coerce(value, item, path) for item in field)
    raise FilterError(f"{_name(path)} is a {type(field).__name__}; 'in' and 'contains' need a string, list or map")


def _size(field: Any, path: Path) -> int:
    if isinstance(field, str | list | dict):
        return len(field)
    raise FilterError(f"{_name(path)} is a {type(field).__name__}; 'is empty' needs a string, list or map")


def _regex(value: Literal) -> re.Pattern[str]:
    try:
        return re.compile(value.raw)
    except re.error as exc:
        raise FilterError(f"invalid regular expression {value.raw!r}: {exc}") from None


def _search(pattern: re.Pattern[str], field: Any, path: Path) -> bool:
    if not isinstance(field, str):
        raise FilterError(f"{_name(path)} is a {type(field).__name__}; 'matches' needs a string")
    return pattern.search(field) is not None
