"""Nomad's ``/v1/acl/...`` routes: bootstrap, and ACL tokens (list, create, read, update, delete).

Tokens are answered in Nomad's shape (RFC 3339 times, no secret hash). A
created token is read back once, so its answer carries the CreateTime the
leader applied, as Nomad's does.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

from aiohttp import web

from node.http.bridge import HTTPError, api_of, caller_token
from node.http.paging import list_reply
from node.http.shapes import TOKEN_STUB, nomad_token, stub
from node.http.translate import answer, bad, by_path, json_body, read, reply
from node.spec.units import parse_duration
from node.wire.errors import RPCError


async def _stored_token(
    request: web.Request, created: dict[str, Any], secret: str | None
) -> dict[str, Any]:
    """A just-created token as stored (with the leader's CreateTime), its secret kept.

    The create RPCs answer before they know the apply time; one read with a
    management secret fills it in. If that read fails, the answer stands.
    """
    try:
        out = await api_of(request).call(
            request, "acl.token.get", {"accessor_id": created["AccessorID"]}, token=secret
        )
    except RPCError:
        return created
    return {**out["data"], "SecretID": created.get("SecretID")}


async def acl_bootstrap(request: web.Request) -> web.Response:
    try:
        out = await api_of(request).call(request, "acl.bootstrap", {})
    except RPCError as exc:
        if exc.code == "conflict":  # Nomad answers a second bootstrap with 400
            raise bad(exc.message) from None
        raise
    out = await _stored_token(request, out, out.get("SecretID", ""))
    return answer(nomad_token(out), index=out.get("CreateIndex"), request=request)


async def acl_tokens(request: web.Request) -> web.StreamResponse:
    return await list_reply(
        request, "acl.token.list", shape=lambda page: [stub(nomad_token(t), TOKEN_STUB) for t in page]
    )


def _ttl_of_duration(ttl: Any) -> int:
    """Whole seconds (at least 1) of Nomad's ExpirationTTL: ns as a number, or a duration string."""
    if isinstance(ttl, bool):
        raise bad("ExpirationTTL must be a duration")
    if isinstance(ttl, int | float):
        seconds = ttl / 1e9
    elif isinstance(ttl, str):
        try:
            seconds = parse_duration(ttl)
        except ValueError as exc:
            raise bad(f"ExpirationTTL: {exc}") from None
    else:
        raise bad("ExpirationTTL must be a duration")
    if seconds <= 0:
        raise bad("ExpirationTTL must be positive")
    return max(1, math.ceil(seconds))


def _ttl_until(when: Any) -> int:
    """Whole seconds (at least 1) from now until Nomad's ExpirationTime, an RFC 3339 time."""
    if not isinstance(when, str):
        raise bad("ExpirationTime must be an RFC 3339 time")
    try:
        at = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        raise bad(f"ExpirationTime {when!r} is not an RFC 3339 time") from None
    seconds = at.timestamp() - time.time()
    if seconds <= 0:
        raise bad("ExpirationTime must be in the future")
    return max(1, math.ceil(seconds))


def _ttl_seconds(body: dict[str, Any]) -> int:
    """Seconds until expiry from Nomad's ExpirationTTL (ns or a duration string) or ExpirationTime."""
    ttl = body.get("ExpirationTTL")
    if ttl not in (None, 0, ""):
        return _ttl_of_duration(ttl)
    when = body.get("ExpirationTime")
    if when not in (None, ""):
        return _ttl_until(when)
    return 0


async def acl_token_create(request: web.Request) -> web.Response:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad(
            'request body must be a JSON object {"Name": ..., "Type": "client", "Policies": [...]}'
        )
    if body.get("AccessorID"):
        raise bad(
            "AccessorID must be empty when creating a token; use POST /v1/acl/token/<accessor> to update one"
        )
    args: dict[str, Any] = {
        "name": body.get("Name") or "",
        "type": body.get("Type") or "client",
        "policies": body.get("Policies") or [],
        "ttl_seconds": _ttl_seconds(body),
    }
    out = await api_of(request).call(request, "acl.token.create", args)
    out = await _stored_token(request, out, None)  # the caller's token could create, so it can read
    return answer(nomad_token(out), index=out.get("CreateIndex"), request=request)


async def acl_token_update(request: web.Request) -> web.Response:
    api = api_of(request)
    if not api.has("acl.token.update"):
        raise HTTPError(
            501,
            "updating an ACL token is not available on this server (not implemented in this version); create a new token",
        )
    body = await json_body(request)
    out = await api.call(
        request,
        "acl.token.update",
        {"accessor_id": request.match_info["accessor_id"], "token": body},
    )
    return answer(nomad_token(out), index=out.get("ModifyIndex"), request=request)


async def acl_token_self(request: web.Request) -> web.Response:
    """The caller's own token; its SecretID is the one the caller sent (we keep only a hash)."""
    data, index = await read(request, "acl.token.self")
    return reply(request, nomad_token({**data, "SecretID": caller_token(request) or ""}), index)


async def acl_token_get(request: web.Request) -> web.Response:
    data, index = await read(request, "acl.token.get", by_path(request, "accessor_id"))
    return reply(request, nomad_token(data), index)


async def acl_token_delete(request: web.Request) -> web.Response:
    out = await api_of(request).call(request, "acl.token.delete", by_path(request, "accessor_id"))
    return answer(out, index=out.get("Index"), request=request)
