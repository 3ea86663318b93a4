"""Nomad's ``/v1`` HTTP API, served by every Caravan server (aiohttp, on the server's loop).

Users already have Nomad clients, scripts and ``curl`` habits; each server
answers them as a Nomad server would, on the same paths, with the same JSON
shapes (PascalCase) and status codes. The API is a translation layer only:
every route calls the very RPC handler that ``caravan`` and the RPC clients
use (``node.http.bridge``), so a follower serves every request itself,
never with an HTTP redirect. Nomad's translation rules are in
``node.http.translate``, the routes in ``node.http.table``; tokens come in
``X-Nomad-Token`` (or ``Authorization: Bearer``).

This module is the top of the room: the aiohttp app, its error middleware,
and the listener's start and stop. The server starts it as a feature
service (``SERVICES``) on ``http_addr`` (default ``<rpc host>:4646``; the
default is skipped with a warning if the port is taken, an explicit address
that cannot be bound stops the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from node.core.api import ServerAPI
from node.core.metrics import METRICS
from node.http.bridge import API_KEY, HTTPAPI, HTTPError, api_of
from node.http.table import add_routes
from node.http.translate import STATUS_OF_CODE, rpc_error_response
from node.wire.errors import RPCError
from node.wire.framing import format_address, parse_address

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def translate_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as Nomad answers it (text with a status), and every request in the metrics."""
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
            api_of(request).log.warning(
                "http request failed", path=request.path, code=exc.code, error=exc.message
            )
        return rpc_error_response(exc)
    except web.HTTPException as exc:  # aiohttp's own: unknown path (404), method not allowed (405)
        status = exc.status
        if status == 404:
            raise web.HTTPNotFound(text=f"Invalid URL path: {request.path}") from None
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = 499  # the client went away (nginx's convention)
        raise
    except Exception:
        return _crashed(request)
    finally:
        with contextlib.suppress(Exception):
            METRICS.observe_http(
                route_of(request), request.method, status, time.monotonic() - started
            )


def _crashed(request: web.Request) -> web.Response:
    """A 500 for a handler's bug: the details go to the log under an id, never to the caller."""
    request_id = uuid.uuid4().hex
    api_of(request).log.exception("http handler crashed", path=request.path, request_id=request_id)
    return web.Response(
        status=500,
        text=f"internal error; the server logged the details under request id {request_id}",
    )


def route_of(request: web.Request) -> str:
    """The route's path pattern (``/v1/job/{job_id}``), so metrics are per route, not per id."""
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", None)
    return canonical or "unmatched"


class HTTPService:
    """One server's HTTP listener: the app with its routes, bound to an address until stopped."""

    def __init__(self, server: ServerAPI) -> None:
        self.api = HTTPAPI(server)
        self.log = self.api.log
        self.address = ""
        self._runner: web.AppRunner | None = None

    def build_app(self) -> web.Application:
        """The aiohttp app: routes, the error middleware, the body limit (the RPC frame limit)."""
        app = web.Application(middlewares=[translate_errors], client_max_size=self.api.max_body)
        app[API_KEY] = self.api
        add_routes(app)
        return app

    async def start(self, bind: str) -> str:
        """Listen on ``bind``; returns the address bound (the real port when ``bind`` asks for 0)."""
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
        self.address = _bound_address(runner) or bind
        self.log.info("http api listening", address=self.address)
        return self.address

    async def stop(self) -> None:
        """Cut the event streams (they never end on their own), then close the listener."""
        for task in list(self.api.streams):
            task.cancel()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            self.log.info("http api stopped", address=self.address)


def _bound_address(runner: web.AppRunner) -> str | None:
    """The address ``runner``'s one site listens on, as host:port (None if it shows no socket)."""
    addresses = runner.addresses
    if not addresses:
        return None
    bound_host, bound_port = addresses[0][:2]
    return format_address(bound_host, bound_port)


# -- the feature service -----------------------------------------------------------------------
async def start_service(server: ServerAPI) -> Callable[[], Awaitable[None]]:
    """Start the HTTP API (and metrics) with the server; returns its stop()."""
    METRICS.bind(server)
    bind = server.config.http_bind
    if bind is None:
        server.log.info('http api turned off (http_addr = "off")')
        return _nothing
    service = HTTPService(server)
    try:
        await service.start(bind)
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
    return service.stop


async def _nothing() -> None:
    return None


SERVICES = [start_service]
