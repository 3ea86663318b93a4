"""Translation between Nomad's HTTP conventions and the RPCs' arguments and answers.

Users already have Nomad clients, scripts and ``curl`` habits, so the
``/v1`` API follows Nomad's rules, kept here in one place so every route
follows them alike:

* Errors are text with a status: 400 bad input, 403 permission denied, 404
  missing object, 409 a failed check-and-set, 501 a route whose RPC has not
  landed on this server yet, 503 no leader / overloaded, 504 a timeout, 410
  an event-stream index older than the journal keeps; 500 only for a real
  fault (logged with the request id, never with details in the answer).
* Reads answer with ``X-Nomad-Index``, ``X-Nomad-KnownLeader`` and
  ``X-Nomad-LastContact``; ``?index=N&wait=5s`` blocks, ``?stale`` reads this
  server's local state. Booleans in queries parse as Go's ``strconv.ParseBool``;
  ``namespace`` and ``region`` are accepted and ignored (one of each).
* Lists take ``per_page``, ``next_token``, ``filter``, ``reverse`` and ``prefix``
  and answer ``X-Nomad-NextToken`` (``node.http.paging``).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from node.http.bridge import API_KEY, HTTPError, api_of
from node.spec.units import parse_duration
from node.wire.errors import (
    BAD_REQUEST,
    CONFLICT,
    FRAME_TOO_LARGE,
    INTERNAL,
    MALFORMED,
    NO_LEADER,
    NOT_FOUND,
    NOT_LEADER,
    PERMISSION_DENIED,
    RESET_REQUIRED,
    TIMEOUT,
    TOKEN_HINT,
    UNAVAILABLE,
    UNKNOWN_METHOD,
    UNKNOWN_OUTCOME,
    RPCError,
)

# RPC error codes -> HTTP status (Nomad's where it has one).
STATUS_OF_CODE = {
    BAD_REQUEST: 400,
    MALFORMED: 400,
    PERMISSION_DENIED: 403,
    NOT_FOUND: 404,
    CONFLICT: 409,
    RESET_REQUIRED: 410,
    FRAME_TOO_LARGE: 413,
    UNKNOWN_METHOD: 501,
    NOT_LEADER: 503,
    NO_LEADER: 503,
    UNAVAILABLE: 503,
    TIMEOUT: 504,
    UNKNOWN_OUTCOME: 504,
    INTERNAL: 500,
}
DEFAULT_BLOCKING_WAIT = 300.0  # Nomad: 5 minutes when ?index is given without ?wait
MAX_BLOCKING_WAIT = 300.0  # the server's cap for blocking reads


def bad(message: str) -> HTTPError:
    """A 400 for input the caller must fix (raise it)."""
    return HTTPError(400, message)


# -- query parsing (Go's rules) ------------------------------------------------------------
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str, name: str) -> bool:
    """Go's ``strconv.ParseBool``: 1 t T TRUE true True / 0 f F FALSE false False."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise bad(f"invalid value {text!r} for query parameter {name!r}: use true or false")


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    """A boolean query parameter; present but empty (``?stale``) means true, as Nomad reads it."""
    if name not in request.query:
        return default
    value = request.query.get(name, "")
    return True if value == "" else parse_bool(value, name)


def query_int(request: web.Request, name: str, default: int | None = None) -> int | None:
    """A whole-number query parameter (>= 0); absent or empty gives ``default``."""
    value = request.query.get(name, "")
    if value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise bad(
            f"invalid value {value!r} for query parameter {name!r}: expected a whole number"
        ) from None
    if number < 0:
        raise bad(f"query parameter {name!r} must be >= 0")
    return number


def query_duration(request: web.Request, name: str) -> float | None:
    """A Go duration ("5s", "2m"); a bare number is taken as seconds."""
    value = request.query.get(name, "")
    if value == "":
        return None
    try:
        seconds = float(value) if value.replace(".", "", 1).isdigit() else parse_duration(value)
    except ValueError as exc:
        raise bad(f"invalid value for query parameter {name!r}: {exc}") from None
    if seconds < 0:
        raise bad(f"query parameter {name!r} must not be negative")
    return seconds


def read_args(request: web.Request) -> dict[str, Any]:
    """The read options every GET takes: stale, and a blocking query (index + wait)."""
    args: dict[str, Any] = {}
    if query_bool(request, "stale"):
        args["stale"] = True
    index = query_int(request, "index")
    wait = query_duration(request, "wait")
    if index:
        args["min_index"] = index
        args["wait"] = min(wait if wait is not None else DEFAULT_BLOCKING_WAIT, MAX_BLOCKING_WAIT)
    return args


async def json_body(request: web.Request, *, required: bool = True) -> Any:
    """The request's JSON body; a 400 (or 413) the caller can act on when it is not one."""
    if not request.can_read_body:
        if required:
            raise bad("request body is missing: send a JSON document")
        return None
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise HTTPError(
            413, f"request body is larger than {request.app[API_KEY].max_body} bytes"
        ) from None
    if not raw.strip():
        if required:
            raise bad("request body is empty: send a JSON document")
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"failed to decode the request body as JSON: {exc}") from None


# -- answers ------------------------------------------------------------------------------------
def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def answer(
    data: Any, *, index: int | None = None, request: web.Request | None = None, status: int = 200
) -> web.Response:
    """A JSON answer; with ``index``, the read headers Nomad sends."""
    resp = web.Response(text=_dumps(data), status=status, content_type="application/json")
    if index is not None:
        resp.headers["X-Nomad-Index"] = str(max(int(index), 1))
    if request is not None:
        api = request.app[API_KEY]
        resp.headers["X-Nomad-KnownLeader"] = "true" if api.known_leader() else "false"
        resp.headers["X-Nomad-LastContact"] = "0"
    return resp


async def read(
    request: web.Request, method: str, args: dict[str, Any] | None = None
) -> tuple[Any, int]:
    """(data, index) of a read RPC, with the request's stale / blocking options."""
    out = await api_of(request).call(request, method, {**read_args(request), **(args or {})})
    return out["data"], out["index"]


def reply(request: web.Request, data: Any, index: int) -> web.Response:
    """A read's answer, with Nomad's read headers."""
    return answer(data, index=index, request=request)


async def read_reply(
    request: web.Request, method: str, args: dict[str, Any] | None = None
) -> web.Response:
    """Answer with a read RPC's data as it is (the many routes that reshape nothing)."""
    data, index = await read(request, method, args)
    return reply(request, data, index)


def by_path(request: web.Request, name: str) -> dict[str, str]:
    """The path's ``{name}`` as the RPC argument of the same name (``job_id``, ``node_id``...)."""
    return {name: request.match_info[name]}


def write_reply(request: web.Request, out: dict[str, Any]) -> web.Response:
    """A write's answer in Nomad's shape: the RPC's fields plus LastContact and KnownLeader."""
    out = dict(out)
    out.setdefault("LastContact", 0)
    out.setdefault("KnownLeader", api_of(request).known_leader())
    return answer(out, index=out.get("Index"), request=request)


async def call_write(request: web.Request, method: str, args: dict[str, Any]) -> web.Response:
    """Run write RPC ``method`` and answer as Nomad answers a write."""
    return write_reply(request, await api_of(request).call(request, method, args))


# -- errors -------------------------------------------------------------------------------------
def error_headers(exc: RPCError) -> dict[str, str]:
    """Headers that tell a client how to recover: where the leader is, how far back to reload."""
    headers = {}
    if exc.code == NOT_LEADER and exc.details.get("leader"):
        headers["X-Caravan-Leader"] = str(exc.details["leader"])
    if exc.code == RESET_REQUIRED and exc.details.get("oldest_index") is not None:
        headers["X-Caravan-Oldest-Index"] = str(exc.details["oldest_index"])
    return headers


def rpc_error_response(exc: RPCError) -> web.Response:
    """An RPC's error as Nomad's text answer with its status (500 for codes it has none for)."""
    status = STATUS_OF_CODE.get(exc.code, 500)
    hint = " (X-Nomad-Token header)" if exc.details.get(TOKEN_HINT) else ""
    return web.Response(status=status, text=exc.message + hint, headers=error_headers(exc))
