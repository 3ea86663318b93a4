"""Nomad's ``/v1`` HTTP API, served by every Caravan server (aiohttp, on the server's loop).

Users already have Nomad clients, scripts and ``curl`` habits; each server
answers them as a Nomad server would, on the same paths, with the same JSON
shapes (PascalCase) and status codes. The API is a translation layer only:
every route calls the very RPC handler that ``caravan`` and the RPC clients
use (``RPCServer.lookup``), with a request context that carries the
``X-Nomad-Token``. So validation, ACL checks, linearizable / stale /
blocking reads, and forwarding of writes from a follower to the leader are
the RPC's own: a follower serves every request itself, never with an HTTP
redirect.

Translation rules (Nomad's):

* Errors are text with a status: 400 bad input, 403 permission denied, 404
  missing object, 409 a failed check-and-set, 501 a route whose RPC has not
  landed on this server yet, 503 no leader / overloaded, 504 a timeout, 410
  an event-stream index older than the journal keeps; 500 only for a real
  fault (logged with the request id, never with details in the answer).
* Reads answer with ``X-Nomad-Index``, ``X-Nomad-KnownLeader`` and
  ``X-Nomad-LastContact``; ``?index=N&wait=5s`` blocks, ``?stale`` reads this
  server's local state. Booleans in queries parse as Go's ``strconv.ParseBool``;
  ``namespace`` and ``region`` are accepted and ignored (one of each).
* Tokens come in ``X-Nomad-Token`` (or ``Authorization: Bearer``).

The routes themselves are in ``node.http.routes``. The server starts this
module as a feature service (``SERVICES``) on ``http_addr`` (default
``<rpc host>:4646``; the default is skipped with a warning if the port is
taken, an explicit address that cannot be bound stops the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fsm.ids import new_request_id
from node.core.metrics import METRICS
from node.core.rpc_server import RequestContext
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
from node.wire.framing import format_address, parse_address

if TYPE_CHECKING:
    from node.server import Server

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
BLOCKING_SLACK = 10.0  # a write or read may take this long past its own wait

API_KEY: web.AppKey[HTTPAPI] = web.AppKey("caravan_http_api")


class HTTPError(Exception):
    """An answer other than 200, raised by route code: ``status`` and a one-line text."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def bad(message: str) -> HTTPError:
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
    from node.spec.units import parse_duration

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


def prefix_arg(request: web.Request) -> str:
    """``?prefix=``: empty means no filter."""
    return request.query.get("prefix", "")


async def json_body(request: web.Request, *, required: bool = True) -> Any:
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


# -- the service --------------------------------------------------------------------------------
class HTTPAPI:
    """One server's HTTP listener: routes, middleware, and the bridge to its RPC handlers."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.log = server.log.bind(component="http")
        self.max_body = server.config.rpc_max_frame
        self.heartbeat = server.config.http_event_heartbeat
        self.address = ""
        self._runner: web.AppRunner | None = None
        self.streams: set[asyncio.Task[Any]] = set()

    # -- calling the RPC handlers ----------------------------------------------------------
    def context(
        self, request: web.Request, method: str, token: str | None = None
    ) -> RequestContext:
        """The RPC request context: the caller's token (or ``token``), a fresh request id."""
        if token is None:
            token = request.headers.get("X-Nomad-Token") or None
            auth = request.headers.get("Authorization", "")
            if token is None and auth.lower().startswith("bearer "):
                token = auth[7:].strip() or None
        # Cheap and process-unique (uuid4 per request showed in profiles); "h"
        # marks ids the HTTP API made. Forwarding keeps the id, so the leader
        # applies each HTTP write once.
        request_id = "h" + new_request_id()
        peer = request.remote or "unknown"
        return RequestContext(
            request_id, method, token, peer, asyncio.get_running_loop(), self.log, request.transport
        )  # type: ignore[arg-type]

    def handler(self, method: str, *, streaming: bool = False) -> Callable[..., Any]:
        found = self.server.rpc.lookup(method)
        if found is None or found[1] != streaming:
            raise HTTPError(
                501, f"{method} is not available on this server (not implemented in this version)"
            )
        return found[0]

    def has(self, method: str) -> bool:
        return self.server.rpc.lookup(method) is not None

    async def call(
        self,
        request: web.Request,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        token: str | None = None,
    ) -> Any:
        """Run RPC ``method`` in-process, exactly as an RPC client's request would run."""
        fn = self.handler(method)
        return await fn(self.context(request, method, token), dict(args or {}))

    def stream(self, request: web.Request, method: str, args: dict[str, Any]) -> Any:
        fn = self.handler(method, streaming=True)
        return fn(self.context(request, method), dict(args))

    def known_leader(self) -> bool:
        raft = getattr(self.server, "raft", None)
        try:
            return bool(raft is not None and raft.leader_address)
        except Exception:  # noqa: BLE001 - raft stopping
            return False

    # -- lifecycle -------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        from node.http import routes as http_routes

        app = web.Application(middlewares=[self._middleware], client_max_size=self.max_body)
        app[API_KEY] = self
        http_routes.add_routes(app)
        return app

    async def start(self, bind: str) -> str:
        host, port = parse_address(bind)
        runner = web.AppRunner(
            self.build_app(),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=2.0,  # requests still running at shutdown get 2 s, not 60
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            bound_host, bound_port = sockets[0].getsockname()[:2]
            self.address = format_address(bound_host, bound_port)
        else:
            self.address = bind
        self.log.info("http api listening", address=self.address)
        return self.address

    async def stop(self) -> None:
        for task in list(self.streams):
            task.cancel()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            self.log.info("http api stopped", address=self.address)

    # -- middleware ------------------------------------------------------------------------
    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.monotonic()
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except HTTPError as exc:
            status = exc.status
            return web.Response(status=exc.status, text=exc.message, headers=exc.headers)
        except RPCError as exc:
            status = STATUS_OF_CODE.get(exc.code, 500)
            if status == 500:
                self.log.warning(
                    "http request failed", path=request.path, code=exc.code, error=exc.message
                )
            hint = " (X-Nomad-Token header)" if exc.details.get(TOKEN_HINT) else ""
            return web.Response(status=status, text=exc.message + hint, headers=_error_headers(exc))
        except (
            web.HTTPException
        ) as exc:  # aiohttp's own: unknown path (404), method not allowed (405)
            status = exc.status
            if status == 404:
                raise web.HTTPNotFound(text=f"Invalid URL path: {request.path}") from None
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status = 499  # the client went away (nginx's convention)
            raise
        except Exception:
            request_id = uuid.uuid4().hex
            self.log.exception("http handler crashed", path=request.path, request_id=request_id)
            return web.Response(
                status=500,
                text=f"internal error; the server logged the details under request id {request_id}",
            )
        finally:
            route = _route_of(request)
            with contextlib.suppress(Exception):
                METRICS.observe_http(route, request.method, status, time.monotonic() - started)


def _route_of(request: web.Request) -> str:
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", None)
    return canonical or "unmatched"


def _error_headers(exc: RPCError) -> dict[str, str]:
    headers = {}
    if exc.code == NOT_LEADER and exc.details.get("leader"):
        headers["X-Caravan-Leader"] = str(exc.details["leader"])
    if exc.code == RESET_REQUIRED and exc.details.get("oldest_index") is not None:
        headers["X-Caravan-Oldest-Index"] = str(exc.details["oldest_index"])
    return headers


# -- the feature service -----------------------------------------------------------------------
async def start_service(server: Server) -> Callable[[], Awaitable[None]]:
    """Start the HTTP API (and metrics) with the server; returns its stop()."""
    METRICS.bind(server)
    bind = server.config.http_bind
    if bind is None:
        server.log.info('http api turned off (http_addr = "off")')
        return _nothing
    api = HTTPAPI(server)
    try:
        await api.start(bind)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if server.config.http_addr is None:  # the default port: best effort
            server.log.warning(
                "http api not started: the default address is taken; set http_addr",
                address=bind,
                error=reason,
            )
            return _nothing
        raise OSError(exc.errno, f"http_addr {bind}: {reason}") from None
    return api.stop


async def _nothing() -> None:
    return None


SERVICES = [start_service]
