"""The ``/v1`` routes: each one translates a Nomad HTTP request into the RPC that serves it.

Nothing here decides anything about state: arguments are mapped onto an RPC
method's arguments (``node.endpoints.base`` and the feature modules), and the
RPC's answer is shaped the way Nomad's HTTP API shapes it (list stubs,
``null`` for a job's missing latest deployment, RFC 3339 times on ACL
tokens, ``Periodic: null`` for a non-periodic job). Routes whose RPC is not
on this server (yet) answer 501 with a one-line reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from node.core.metrics import METRICS, PROMETHEUS_CONTENT_TYPE
from node.http.service import (
    API_KEY,
    HTTPAPI,
    HTTPError,
    answer,
    bad,
    json_body,
    prefix_arg,
    query_bool,
    query_int,
    read_args,
)
from node.spec.nomadjson import to_nomad
from node.wire.errors import RESET_REQUIRED, UNAVAILABLE, RPCError

# RPC methods that other engineers add; tried in order (the first registered wins).
SNAPSHOT_SAVE_METHODS = ("operator.snapshot.save", "snapshot.save")
RECONCILE_METHODS = (
    "system.reconcile_summaries",
    "system.reconcile.summaries",
    "job.reconcile_summaries",
)

# Nomad's list stubs: the fields its list endpoints return (ours where we model them).
JOB_STUB = (
    "ID", "ParentID", "Name", "Namespace", "Datacenters", "Type", "Priority", "Periodic", "ParameterizedJob",
    "Stop", "Status", "StatusDescription", "JobSummary", "CreateIndex", "ModifyIndex", "JobModifyIndex", "SubmitTime",
)  # fmt: skip
ALLOC_STUB = (
    "ID", "EvalID", "Name", "Namespace", "NodeID", "NodeName", "JobID", "JobType", "JobVersion", "TaskGroup",
    "DesiredStatus", "DesiredDescription", "ClientStatus", "ClientDescription", "DesiredTransition", "TaskStates",
    "DeploymentStatus", "FollowupEvalID", "RescheduleTracker", "PreviousAllocation", "NextAllocation",
    "CreateIndex", "ModifyIndex", "AllocModifyIndex", "CreateTime", "ModifyTime",
)  # fmt: skip
NODE_STUB = (
    "ID", "Name", "Datacenter", "NodeClass", "Drain", "SchedulingEligibility", "Status", "StatusDescription",
    "CreateIndex", "ModifyIndex",
)  # fmt: skip
TOKEN_STUB = (
    "AccessorID",
    "Name",
    "Type",
    "Policies",
    "Global",
    "CreateTime",
    "ExpirationTime",
    "CreateIndex",
    "ModifyIndex",
)

# Times an index=0 event stream re-reads the oldest retained index before giving up.
MAX_OLDEST_RETRIES = 5
# Event payloads are keyed by topic, as Nomad's are.
PAYLOAD_KEY = {
    "Job": "Job",
    "Evaluation": "Evaluation",
    "Allocation": "Allocation",
    "Deployment": "Deployment",
    "Node": "Node",
    "ACLToken": "ACLToken",
}


def api_of(request: web.Request) -> HTTPAPI:
    return request.app[API_KEY]


def _stub(obj: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {k: obj[k] for k in fields if k in obj}


def nomad_job(job: dict[str, Any]) -> dict[str, Any]:
    """Our job JSON in Nomad's exact shape: Periodic / ParameterizedJob are objects or null."""
    job = dict(job)
    if "Periodic" in job:
        job["Periodic"] = {"Enabled": True} if job["Periodic"] else None
    if "ParameterizedJob" in job:
        job["ParameterizedJob"] = {} if job["ParameterizedJob"] else None
    return job


def _rfc3339(ns: int) -> str:
    return (
        datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{ns % 1_000_000_000:09d}Z"
    )


def nomad_token(token: dict[str, Any]) -> dict[str, Any]:
    """An ACL token with Nomad's RFC 3339 times (ExpirationTime null when it never expires)."""
    token = dict(token)
    token.pop("SecretHash", None)
    if isinstance(token.get("CreateTime"), int):
        token["CreateTime"] = _rfc3339(token["CreateTime"]) if token["CreateTime"] else None
    if "ExpirationTime" in token:
        exp = token["ExpirationTime"]
        token["ExpirationTime"] = _rfc3339(exp) if isinstance(exp, int) and exp else None
    return token


async def _read(
    request: web.Request, method: str, args: dict[str, Any] | None = None
) -> tuple[Any, int]:
    """(data, index) of a read RPC, with the request's stale / blocking options."""
    out = await api_of(request).call(request, method, {**read_args(request), **(args or {})})
    return out["data"], out["index"]


def _reply(request: web.Request, data: Any, index: int) -> web.Response:
    return answer(data, index=index, request=request)


def _write_reply(request: web.Request, out: dict[str, Any]) -> web.Response:
    out = dict(out)
    out.setdefault("LastContact", 0)
    out.setdefault("KnownLeader", api_of(request).known_leader())
    return answer(out, index=out.get("Index"), request=request)


# -- jobs ------------------------------------------------------------------------------------
async def jobs_list(request: web.Request) -> web.Response:
    data, index = await _read(request, "job.list", {"prefix": prefix_arg(request)})
    with_meta = query_bool(request, "meta")
    stubs = []
    for job in data:
        stub = _stub(nomad_job(job), JOB_STUB)
        if with_meta:
            stub["Meta"] = job.get("Meta") or {}
        stubs.append(stub)
    return _reply(request, stubs, index)


def _register_args(body: Any, path_id: str | None) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad('request body must be a JSON object {"Job": {...}}')
    job = body.get("Job")
    if not isinstance(job, dict):
        raise bad("Job must be specified")
    if path_id is not None and job.get("ID") != path_id:
        raise bad("Job ID does not match name")
    args: dict[str, Any] = {"job": job}
    if body.get("EnforceIndex"):
        modify = body.get("JobModifyIndex", 0)
        if isinstance(modify, bool) or not isinstance(modify, int) or modify < 0:
            raise bad("JobModifyIndex must be a whole number >= 0 when EnforceIndex is set")
        args["enforce_index"] = modify
    return args


async def jobs_register(request: web.Request) -> web.Response:
    args = _register_args(await json_body(request), None)
    return _write_reply(request, await api_of(request).call(request, "job.register", args))


async def job_register(request: web.Request) -> web.Response:
    args = _register_args(await json_body(request), request.match_info["job_id"])
    return _write_reply(request, await api_of(request).call(request, "job.register", args))


async def job_get(request: web.Request) -> web.Response:
    data, index = await _read(request, "job.get", {"job_id": request.match_info["job_id"]})
    return _reply(request, nomad_job(data), index)


async def job_deregister(request: web.Request) -> web.Response:
    args = {"job_id": request.match_info["job_id"], "purge": query_bool(request, "purge")}
    out = dict(await api_of(request).call(request, "job.stop", args))
    if out.get("EvalID"):
        out.setdefault(
            "EvalCreateIndex", out.get("Index", 0)
        )  # the eval is created by the same entry
    return _write_reply(request, out)


async def job_revert(request: web.Request) -> web.Response:
    body = await json_body(request)
    job_id = request.match_info["job_id"]
    if not isinstance(body, dict):
        raise bad('the body must be a JSON object: {"JobID": ..., "JobVersion": N}')
    if body.get("JobID", job_id) != job_id:
        raise bad(f"JobID {body.get('JobID')!r} in the body does not match the path's {job_id!r}")
    args: dict[str, Any] = {"job_id": job_id, "job_version": body.get("JobVersion")}
    if body.get("EnforcePriorVersion") is not None:
        args["enforce_prior_version"] = body["EnforcePriorVersion"]
    return _write_reply(request, await api_of(request).call(request, "job.revert", args))


async def job_allocations(request: web.Request) -> web.Response:
    data, index = await _read(request, "alloc.list", {"job_id": request.match_info["job_id"]})
    return _reply(request, [_stub(a, ALLOC_STUB) for a in data], index)


async def job_evaluations(request: web.Request) -> web.Response:
    data, index = await _read(request, "eval.list", {"job_id": request.match_info["job_id"]})
    return _reply(request, data, index)


async def job_deployments(request: web.Request) -> web.Response:
    data, index = await _read(request, "deployment.list", {"job_id": request.match_info["job_id"]})
    return _reply(request, data, index)


async def job_latest_deployment(request: web.Request) -> web.Response:
    data, index = await _read(request, "deployment.list", {"job_id": request.match_info["job_id"]})
    latest = max(data, key=lambda d: d.get("CreateIndex", 0)) if data else None
    return _reply(request, latest, index)


async def job_summary(request: web.Request) -> web.Response:
    data, index = await _read(request, "job.summary", {"job_id": request.match_info["job_id"]})
    data = dict(data)
    data.setdefault("Children", {"Pending": 0, "Running": 0, "Dead": 0})
    return _reply(request, data, index)


async def job_versions(request: web.Request) -> web.Response:
    data, index = await _read(request, "job.versions", {"job_id": request.match_info["job_id"]})
    versions = [nomad_job(j) for j in data.get("Versions", [])]
    return _reply(request, {"Versions": versions, "Diffs": None}, index)


async def jobs_parse(request: web.Request) -> web.Response:
    """HCL -> API job JSON (Nomad's ``POST /v1/jobs/parse``); parsing runs on this server, no state read."""
    from node.spec.hcl import HCLError, parse_hcl
    from node.spec.jobspec import JobSpecError, parse_job

    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("JobHCL"), str):
        raise bad('request body must be {"JobHCL": "<HCL text>", "Canonicalize": false}')
    try:
        parsed = parse_hcl(body["JobHCL"])
    except HCLError as exc:
        raise bad(str(exc)) from None
    job = parsed.job
    if body.get("Canonicalize"):
        try:
            canonical, _ = parse_job(job)
        except JobSpecError as exc:
            raise bad(f"invalid jobspec: {exc}") from None
        job = nomad_job(to_nomad(canonical))
    resp = answer(job)
    if parsed.warnings:
        resp.headers["X-Caravan-Warnings"] = json.dumps(parsed.warnings)
    return resp


# -- evaluations, allocations, deployments, nodes -----------------------------------------
async def evals_list(request: web.Request) -> web.Response:
    data, index = await _read(request, "eval.list", {"prefix": prefix_arg(request)})
    return _reply(request, data, index)


async def eval_get(request: web.Request) -> web.Response:
    data, index = await _read(request, "eval.get", {"eval_id": request.match_info["eval_id"]})
    return _reply(request, data, index)


async def eval_allocations(request: web.Request) -> web.Response:
    ev, _ = await _read(request, "eval.get", {"eval_id": request.match_info["eval_id"]})
    data, index = await _read(request, "alloc.list", {"job_id": ev["JobID"]})
    return _reply(
        request, [_stub(a, ALLOC_STUB) for a in data if a.get("EvalID") == ev["ID"]], index
    )


async def allocs_list(request: web.Request) -> web.Response:
    data, index = await _read(request, "alloc.list", {"prefix": prefix_arg(request)})
    return _reply(request, [_stub(a, ALLOC_STUB) for a in data], index)


async def alloc_get(request: web.Request) -> web.Response:
    data, index = await _read(request, "alloc.get", {"alloc_id": request.match_info["alloc_id"]})
    return _reply(request, data, index)


async def deployments_list(request: web.Request) -> web.Response:
    data, index = await _read(request, "deployment.list")
    prefix = prefix_arg(request)
    return _reply(request, [d for d in data if d.get("ID", "").startswith(prefix)], index)


async def deployment_get(request: web.Request) -> web.Response:
    data, index = await _read(
        request, "deployment.get", {"deployment_id": request.match_info["deployment_id"]}
    )
    return _reply(request, data, index)


async def deployment_fail(request: web.Request) -> web.Response:
    args = {"deployment_id": request.match_info["deployment_id"]}
    return _write_reply(request, await api_of(request).call(request, "deployment.fail", args))


async def deployment_pause(request: web.Request) -> web.Response:
    """Nomad's ``/v1/deployment/pause/:id``: ``{"Pause": true}`` pauses, ``false`` resumes."""
    dep_id = request.match_info["deployment_id"]
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("Pause"), bool):
        raise bad('the body must be a JSON object with a boolean Pause: {"DeploymentID": ..., "Pause": true}')
    if body.get("DeploymentID", dep_id) != dep_id:
        raise bad(f"DeploymentID {body.get('DeploymentID')!r} in the body does not match the path's {dep_id!r}")
    args = {"deployment_id": dep_id, "pause": body["Pause"]}
    return _write_reply(request, await api_of(request).call(request, "deployment.pause", args))


async def deployment_promote(request: web.Request) -> web.Response:
    """Nomad's ``/v1/deployment/promote/:id``: ``{"All": true}`` or ``{"Groups": [...]}``."""
    dep_id = request.match_info["deployment_id"]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad('the body must be a JSON object: {"DeploymentID": ..., "All": true} or {"Groups": ["web"]}')
    if body.get("DeploymentID", dep_id) != dep_id:
        raise bad(f"DeploymentID {body.get('DeploymentID')!r} in the body does not match the path's {dep_id!r}")
    groups = body.get("Groups") or []
    if body.get("All") and groups:
        raise bad("give All or Groups, not both")
    if not body.get("All") and not groups:
        raise bad('say what to promote: "All": true, or "Groups": [names]')
    args = {"deployment_id": dep_id, "groups": groups}
    return _write_reply(request, await api_of(request).call(request, "deployment.promote", args))


async def deployment_allocations(request: web.Request) -> web.Response:
    dep, _ = await _read(
        request, "deployment.get", {"deployment_id": request.match_info["deployment_id"]}
    )
    data, index = await _read(request, "alloc.list", {"job_id": dep["JobID"]})
    return _reply(
        request, [_stub(a, ALLOC_STUB) for a in data if a.get("DeploymentID") == dep["ID"]], index
    )


async def nodes_list(request: web.Request) -> web.Response:
    data, index = await _read(request, "node.list")
    prefix = prefix_arg(request)
    return _reply(
        request, [_stub(n, NODE_STUB) for n in data if n.get("ID", "").startswith(prefix)], index
    )


async def node_get(request: web.Request) -> web.Response:
    data, index = await _read(request, "node.get", {"node_id": request.match_info["node_id"]})
    return _reply(request, data, index)


async def node_allocations(request: web.Request) -> web.Response:
    node, _ = await _read(request, "node.get", {"node_id": request.match_info["node_id"]})
    data, index = await _read(request, "alloc.list", {"node_id": node["ID"]})
    return _reply(request, data, index)


async def node_drain(request: web.Request) -> web.Response:
    """Nomad's ``/v1/node/:id/drain``: ``{"DrainSpec": {"Deadline": ns, "IgnoreSystemJobs": b}}``; null ends it."""
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad('the body must be a JSON object: {"DrainSpec": {"Deadline": 3600000000000}} or {"DrainSpec": null}')
    # node.drain resolves an id prefix itself.
    args = {"node_id": request.match_info["node_id"], "drain_spec": body.get("DrainSpec"),
            "mark_eligible": body.get("MarkEligible", False)}
    return _write_reply(request, await api_of(request).call(request, "node.drain", args))


async def node_eligibility(request: web.Request) -> web.Response:
    """Nomad's ``/v1/node/:id/eligibility``: ``{"Eligibility": "eligible" | "ineligible"}``."""
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("Eligibility"), str):
        raise bad('the body must be a JSON object: {"Eligibility": "eligible"} or {"Eligibility": "ineligible"}')
    node, _ = await _read(request, "node.get", {"node_id": request.match_info["node_id"]})
    args = {"node_id": node["ID"], "eligibility": body["Eligibility"]}
    return _write_reply(request, await api_of(request).call(request, "node.eligibility", args))


# -- system ------------------------------------------------------------------------------------
async def system_gc(request: web.Request) -> web.Response:
    out = await api_of(request).call(request, "system.gc", {})
    return answer(out, index=out.get("Index") if isinstance(out, dict) else None, request=request)


async def system_reconcile(request: web.Request) -> web.Response:
    api = api_of(request)
    for method in RECONCILE_METHODS:
        if api.has(method):
            out = await api.call(request, method, {})
            return answer(
                out, index=out.get("Index") if isinstance(out, dict) else None, request=request
            )
    raise HTTPError(
        501,
        "job summary reconciliation is not available on this server (not implemented in this version)",
    )


# -- ACL -----------------------------------------------------------------------------------------
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


async def acl_tokens(request: web.Request) -> web.Response:
    data, index = await _read(request, "acl.token.list")
    return _reply(request, [_stub(nomad_token(t), TOKEN_STUB) for t in data], index)


def _ttl_seconds(body: dict[str, Any]) -> int:
    """Seconds until expiry from Nomad's ExpirationTTL (ns or a duration string) or ExpirationTime."""
    from node.spec.units import parse_duration

    ttl = body.get("ExpirationTTL")
    if ttl not in (None, 0, ""):
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
    when = body.get("ExpirationTime")
    if when not in (None, ""):
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
    data, index = await _read(request, "acl.token.self")
    return _reply(request, nomad_token(data), index)


async def acl_token_get(request: web.Request) -> web.Response:
    data, index = await _read(
        request, "acl.token.get", {"accessor_id": request.match_info["accessor_id"]}
    )
    return _reply(request, nomad_token(data), index)


async def acl_token_delete(request: web.Request) -> web.Response:
    out = await api_of(request).call(
        request, "acl.token.delete", {"accessor_id": request.match_info["accessor_id"]}
    )
    return answer(out, index=out.get("Index"), request=request)


# -- status and operator -------------------------------------------------------------------
async def status_leader(request: web.Request) -> web.Response:
    out = await api_of(request).call(request, "status", {})
    return answer(out.get("Leader") or "")


async def status_peers(request: web.Request) -> web.Response:
    out = await api_of(request).call(request, "status", {})
    return answer([s["RPCAddress"] for s in out.get("servers", [])])


async def regions(request: web.Request) -> web.Response:
    return answer(["global"])


async def raft_configuration(request: web.Request) -> web.Response:
    api = api_of(request)
    peers = await api.call(request, "operator.raft.peers", {})
    status = await api.call(request, "status", {})
    servers = [
        {
            "ID": p["ID"],
            "Node": p["ID"],
            "Address": p["RaftAddress"],
            "RPCAddress": p["RPCAddress"],
            "Leader": p["Leader"],
            "Voter": p["Voter"],
            "RaftProtocol": "3",
        }
        for p in peers
    ]
    return answer({"Index": status.get("CommitIndex", 0), "Servers": servers}, request=request)


async def operator_snapshot(request: web.Request) -> web.StreamResponse:
    """Stream a snapshot from the snapshot RPC (when this server has one) as Nomad's save does."""
    api = api_of(request)
    method = next((m for m in SNAPSHOT_SAVE_METHODS if api.server.rpc.lookup(m) is not None), None)
    if method is None:
        raise HTTPError(
            501,
            "operator snapshots are not available on this server (not implemented in this version)",
        )
    started = time.monotonic()
    handler, streaming = api.server.rpc.lookup(method) or (None, False)
    ctx = api.context(request, method)
    if not streaming:
        out = await handler(ctx, {})  # type: ignore[misc]
        data = out.get("data") if isinstance(out, dict) else out
        if not isinstance(data, bytes | bytearray):
            raise HTTPError(
                501,
                f"{method} answered no snapshot bytes; save snapshots with 'caravan operator snapshot save'",
            )
        METRICS.observe_snapshot("save_http", time.monotonic() - started)
        return web.Response(body=bytes(data), content_type="application/octet-stream")
    items = handler(ctx, {})  # type: ignore[misc]
    first = await _first(items)
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        item = first
        while item is not None:
            chunk = (
                item
                if isinstance(item, bytes | bytearray)
                else (item.get("data") or item.get("chunk"))
                if isinstance(item, dict)
                else None
            )
            if isinstance(chunk, bytes | bytearray) and chunk:
                await resp.write(bytes(chunk))
            item = await _next(items)
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


async def _first(items: AsyncIterator[Any]) -> Any:
    return await _next(items)


async def _next(items: AsyncIterator[Any]) -> Any:
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return None


# -- event stream ----------------------------------------------------------------------------
def event_json(index: int, record: list[Any]) -> dict[str, Any]:
    """One journal record as a Nomad event (Payload keyed by topic)."""
    topic, kind, key, obj = record[0], record[1], record[2], record[3]
    payload_key = PAYLOAD_KEY.get(topic, topic)
    if obj is None:  # a deletion: the journal keeps no body, Nomad clients still get the id
        body: dict[str, Any] = {"AccessorID": key} if topic == "ACLToken" else {"ID": key}
    else:
        body = to_nomad(obj)
        if topic == "Job":
            body = nomad_job(body)
        elif topic == "ACLToken":
            body = nomad_token(body)
    namespace = (
        body.get("Namespace", "")
        if topic in ("Job", "Evaluation", "Allocation", "Deployment")
        else ""
    )
    return {
        "Topic": topic,
        "Type": kind,
        "Key": key,
        "Namespace": namespace
        or ("default" if topic in ("Job", "Evaluation", "Allocation", "Deployment") else ""),
        "FilterKeys": None,
        "Index": index,
        "Payload": {payload_key: body},
    }


def _event_args(request: web.Request, heartbeat: float) -> dict[str, Any]:
    index = query_int(request, "index", 0) or 0
    topics = [t for t in request.query.getall("topic", []) if t != ""]
    # Nomad starts *at* the given index; the journal's index is exclusive.
    return {"index": max(index - 1, 0), "topics": topics or None, "heartbeat": heartbeat}


async def event_stream(request: web.Request) -> web.StreamResponse:
    """Chunked NDJSON: one line per journal batch, ``{}`` heartbeats; never ends on its own.

    Errors found before the first byte (bad topic, ACL, an index older than
    the journal keeps: 410) are answered with their status; without an
    index the stream starts at the oldest batch kept. Later, a
    subscriber that fell behind is resubscribed from where it stopped (no
    gap, no duplicate); anything else cuts the connection, so the client
    reconnects and gets the error with its status.
    """
    api = api_of(request)
    heartbeat = max(0.05, min(api.heartbeat, 300.0))
    args = _event_args(request, heartbeat)
    from_oldest = args["index"] == 0
    for attempt in range(MAX_OLDEST_RETRIES + 1):
        items = api.stream(request, "event.stream", args)
        try:
            first = await _first(items)  # raises before the response starts: a proper status
            break
        except RPCError as exc:
            if exc.code != RESET_REQUIRED:
                raise
            oldest = int(exc.details.get("oldest_index") or 1)
            if not from_oldest or attempt == MAX_OLDEST_RETRIES:
                raise HTTPError(
                    410,
                    f"index {args['index'] + 1} is older than the oldest retained index {oldest}: "
                    f"reload the state you follow (e.g. GET /v1/jobs) and stream again with index = its X-Nomad-Index + 1",
                    {"X-Caravan-Oldest-Index": str(oldest)},
                ) from None
            # No index asked for: start at the oldest batch kept (Nomad's index=0), not an
            # error; under a busy, tiny journal the oldest may move again before we read it.
            args["index"] = max(oldest - 1, 0)
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    task = asyncio.current_task()
    if task is not None:
        api.streams.add(task)
    METRICS.http_streams.inc()
    last_write = time.monotonic()
    position = args["index"]
    try:
        await resp.write(b"{}\n")  # heartbeat at once: the client knows the stream is up
        item = first
        while True:
            if item is None:  # the RPC stream ended (it never does on its own): resume
                items = api.stream(request, "event.stream", {**args, "index": position})
            elif "progress" in item:
                position = max(position, int(item["progress"]))
                if time.monotonic() - last_write >= heartbeat * 0.5:
                    await resp.write(b"{}\n")
                    last_write = time.monotonic()
            else:
                index = int(item["index"])
                line = {"Index": index, "Events": [event_json(index, r) for r in item["events"]]}
                await resp.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
                last_write = time.monotonic()
                position = index
            try:
                item = await _next(items)
            except RPCError as exc:
                if exc.code == UNAVAILABLE and exc.details.get("reason") == "slow_subscriber":
                    position = int(exc.details.get("resume_index", position))
                    items = api.stream(request, "event.stream", {**args, "index": position})
                    item = await _next(items)
                    continue
                raise
    except RPCError as exc:
        level = (
            api.log.info if exc.code in (RESET_REQUIRED, "permission_denied") else api.log.warning
        )
        level("event stream cut", code=exc.code, error=exc.message, position=position)
        if request.transport is not None:
            request.transport.abort()
        return resp
    except (ConnectionResetError, ConnectionError):
        return resp
    finally:
        METRICS.http_streams.dec()
        if task is not None:
            api.streams.discard(task)
        with contextlib.suppress(Exception):
            await items.aclose()


# -- metrics --------------------------------------------------------------------------------------
async def metrics(request: web.Request) -> web.Response:
    fmt = request.query.get("format", "")
    if fmt == "prometheus":
        return web.Response(
            body=METRICS.prometheus(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE}
        )
    if fmt not in ("", "json"):
        raise bad(f"unknown metrics format {fmt!r}: use format=prometheus, or no format for JSON")
    return answer(METRICS.nomad_json())


# -- the table ------------------------------------------------------------------------------------
def add_routes(app: web.Application) -> None:
    """Nomad's paths. Writes accept PUT and POST alike, as Nomad's do."""
    r = app.router
    write = ("POST", "PUT")

    def both(path: str, handler: Any) -> None:
        for verb in write:
            r.add_route(verb, path, handler)

    r.add_get("/v1/jobs", jobs_list, allow_head=False)
    both("/v1/jobs", jobs_register)
    both("/v1/jobs/parse", jobs_parse)
    r.add_get("/v1/job/{job_id}", job_get, allow_head=False)
    both("/v1/job/{job_id}", job_register)
    r.add_delete("/v1/job/{job_id}", job_deregister)
    r.add_get("/v1/job/{job_id}/allocations", job_allocations, allow_head=False)
    r.add_get("/v1/job/{job_id}/evaluations", job_evaluations, allow_head=False)
    r.add_get("/v1/job/{job_id}/deployments", job_deployments, allow_head=False)
    r.add_get("/v1/job/{job_id}/deployment", job_latest_deployment, allow_head=False)
    r.add_get("/v1/job/{job_id}/summary", job_summary, allow_head=False)
    r.add_get("/v1/job/{job_id}/versions", job_versions, allow_head=False)
    both("/v1/job/{job_id}/revert", job_revert)

    r.add_get("/v1/evaluations", evals_list, allow_head=False)
    r.add_get("/v1/evaluation/{eval_id}", eval_get, allow_head=False)
    r.add_get("/v1/evaluation/{eval_id}/allocations", eval_allocations, allow_head=False)
    r.add_get("/v1/allocations", allocs_list, allow_head=False)
    r.add_get("/v1/allocation/{alloc_id}", alloc_get, allow_head=False)
    r.add_get("/v1/deployments", deployments_list, allow_head=False)
    r.add_get(
        "/v1/deployment/allocations/{deployment_id}", deployment_allocations, allow_head=False
    )
    r.add_get("/v1/deployment/{deployment_id}", deployment_get, allow_head=False)
    both("/v1/deployment/fail/{deployment_id}", deployment_fail)
    both("/v1/deployment/pause/{deployment_id}", deployment_pause)
    both("/v1/deployment/promote/{deployment_id}", deployment_promote)
    r.add_get("/v1/nodes", nodes_list, allow_head=False)
    r.add_get("/v1/node/{node_id}", node_get, allow_head=False)
    r.add_get("/v1/node/{node_id}/allocations", node_allocations, allow_head=False)
    both("/v1/node/{node_id}/drain", node_drain)
    both("/v1/node/{node_id}/eligibility", node_eligibility)

    both("/v1/system/gc", system_gc)
    both("/v1/system/reconcile/summaries", system_reconcile)

    both("/v1/acl/bootstrap", acl_bootstrap)
    r.add_get("/v1/acl/tokens", acl_tokens, allow_head=False)
    both("/v1/acl/token", acl_token_create)
    r.add_get("/v1/acl/token/self", acl_token_self, allow_head=False)
    r.add_get("/v1/acl/token/{accessor_id}", acl_token_get, allow_head=False)
    both("/v1/acl/token/{accessor_id}", acl_token_update)
    r.add_delete("/v1/acl/token/{accessor_id}", acl_token_delete)

    r.add_get("/v1/status/leader", status_leader, allow_head=False)
    r.add_get("/v1/status/peers", status_peers, allow_head=False)
    r.add_get("/v1/regions", regions, allow_head=False)
    r.add_get("/v1/operator/raft/configuration", raft_configuration, allow_head=False)
    r.add_get("/v1/operator/snapshot", operator_snapshot, allow_head=False)
    r.add_get("/v1/event/stream", event_stream, allow_head=False)
    r.add_get("/v1/metrics", metrics, allow_head=False)
