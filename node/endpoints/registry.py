"""The RPC method table and the argument helpers every endpoint shares.

Each endpoint module registers its methods with ``method`` (forwarded to the
leader when they must run there) or ``stream_method`` (served locally) when
it is imported; ``node.endpoints`` imports them all, and the server wraps
each entry of ``METHODS`` and ``STREAMS`` as it starts. Handlers are typed
against ``node.core.api.ServerAPI``, never the server class.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from node.core.context import RequestContext
from node.spec.nomadjson import to_nomad
from node.wire.errors import BAD_REQUEST, NOT_FOUND, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


Method = Callable[["ServerAPI", RequestContext, dict[str, Any]], Awaitable[Any]]
METHODS: dict[str, Method] = {}


def method(name: str) -> Callable[[Method], Method]:
    def register(fn: Method) -> Method:
        METHODS[name] = fn
        return fn

    return register


StreamMethod = Callable[["ServerAPI", RequestContext, dict[str, Any]], AsyncIterator[Any]]
STREAMS: dict[str, StreamMethod] = {}


def stream_method(name: str) -> Callable[[StreamMethod], StreamMethod]:
    """Register a streaming method: an async generator, served locally by every server (never forwarded)."""

    def register(fn: StreamMethod) -> StreamMethod:
        STREAMS[name] = fn
        return fn

    return register


def bad(message: str) -> RPCError:
    return RPCError(BAD_REQUEST, message)


def arg(args: dict[str, Any], name: str, kind: type = str, *, required: bool = True, default: Any = None) -> Any:
    value = args.get(name, default)
    if value is None:
        if required:
            raise bad(f"missing argument {name!r}")
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad(f"argument {name!r} must be a {kind.__name__}")
    return value


def id_arg(args: dict[str, Any], name: str) -> str:
    """A required id: an empty one would be a prefix of every id, so it is refused."""
    value = arg(args, name)
    if not value.strip():
        raise bad(f"argument {name!r} must not be empty")
    return value


def found(obj: Any, what: str) -> Any:
    if obj is None:
        raise RPCError(NOT_FOUND, f"{what} not found")
    return to_nomad(obj)


# A prefix lookup reads at most this many objects, so that it stays a point
# read (served on the loop, see ServerAPI.read) however short the prefix.
PREFIX_MATCH_LIMIT = 20


def by_prefix(get: Callable[[str], Any], scan: Callable[[str, int], list], ident: str) -> Any:
    """Exact id, or a unique prefix of one (as Nomad's CLI accepts short ids)."""
    obj = get(ident)
    if obj is not None:
        return obj
    rows = scan(ident, PREFIX_MATCH_LIMIT + 1)
    if len(rows) > PREFIX_MATCH_LIMIT:
        raise bad(f"prefix {ident!r} matches more than {PREFIX_MATCH_LIMIT} objects; give more characters")
    if len(rows) > 1:
        ids = ", ".join(row.id for row in rows)
        raise bad(f"prefix {ident!r} matches {len(rows)} objects ({ids}); give more characters")
    return rows[0] if rows else None
