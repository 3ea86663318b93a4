"""``GET /v1/operator/snapshot``: a snapshot of the state, streamed as Nomad's save streams it.

The bytes come from the snapshot RPC when this server has one (501
otherwise), whole or in chunks. A stream that fails after its first byte is
cut, never ended cleanly: a short file must not look like a complete one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from node.core.context import RequestContext
from node.core.metrics import METRICS
from node.http.bridge import HTTPAPI, HTTPError, api_of, next_item
from node.wire.errors import RPCError

# RPC methods that other engineers add; tried in order (the first registered wins).
SNAPSHOT_SAVE_METHODS = ("operator.snapshot.save", "snapshot.save")


async def operator_snapshot(request: web.Request) -> web.StreamResponse:
    """Stream a snapshot from the snapshot RPC (when this server has one) as Nomad's save does."""
    api = api_of(request)
    method = next((m for m in SNAPSHOT_SAVE_METHODS if api.lookup(m) is not None), None)
    if method is None:
        raise HTTPError(
            501,
            "operator snapshots are not available on this server (not implemented in this version)",
        )
    started = time.monotonic()
    handler, streaming = api.lookup(method) or (None, False)
    ctx = api.context(request, method)
    if not streaming:
        return await _whole(handler, ctx, method, started)  # type: ignore[arg-type]
    return await _streamed(api, request, handler(ctx, {}), started)  # type: ignore[misc]


async def _whole(
    handler: Callable[..., Any], ctx: RequestContext, method: str, started: float
) -> web.Response:
    """The answer of a snapshot RPC that returns all its bytes at once."""
    out = await handler(ctx, {})
    data = out.get("data") if isinstance(out, dict) else out
    if not isinstance(data, bytes | bytearray):
        raise HTTPError(
            501,
            f"{method} answered no snapshot bytes; save snapshots with 'caravan operator snapshot save'",
        )
    METRICS.observe_snapshot("save_http", time.monotonic() - started)
    return web.Response(body=bytes(data), content_type="application/octet-stream")


def _chunk_of(item: Any) -> Any:
    """The bytes one streamed item carries (raw bytes, or a dict's ``data`` / ``chunk``)."""
    if isinstance(item, bytes | bytearray):
        return item
    if isinstance(item, dict):
        return item.get("data") or item.get("chunk")
    return None


async def _streamed(
    api: HTTPAPI, request: web.Request, items: Any, started: float
) -> web.StreamResponse:
    """A chunked answer from a streaming snapshot RPC; errors before the first item get a status."""
    first = await next_item(items)
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        item = first
        while item is not None:
            chunk = _chunk_of(item)
            if isinstance(chunk, bytes | bytearray) and chunk:
                await resp.write(bytes(chunk))
            item = await next_item(items)
    except RPCError as exc:
        api.log.warning("snapshot stream failed after it started", error=str(exc))
        if request.transport is not None:
            request.transport.abort()  # a cut stream, never a short file that looks complete
        return resp
    finally:
        with contextlib.suppress(Exception):
            await items.aclose()
    await resp.write_eof()
    METRICS.observe_snapshot("save_http", time.monotonic() - started)
    return resp
