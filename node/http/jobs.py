"""Nomad's ``/v1/jobs`` and ``/v1/job/:id`` routes, and HCL parsing (``/v1/jobs/parse``).

Each route maps the request onto a ``job.*`` (or list) RPC's arguments and
shapes the answer as Nomad does; nothing here decides anything about state.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from node.http.bridge import api_of
from node.http.paging import list_reply, read_all
from node.http.shapes import JOB_STUB, alloc_stubs, nomad_job, stub
from node.http.translate import (
    answer,
    bad,
    by_path,
    call_write,
    json_body,
    query_bool,
    read,
    reply,
    write_reply,
)
from node.spec.hcl import HCLError, parse_hcl
from node.spec.jobspec import JobSpecError, parse_job
from node.spec.nomadjson import to_nomad


async def jobs_list(request: web.Request) -> web.StreamResponse:
    """Job stubs; ``?meta`` adds each job's Meta, as Nomad's ``-meta`` listing does."""
    with_meta = query_bool(request, "meta")

    def stubs(page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for job in page:
            job_stub = stub(nomad_job(job), JOB_STUB)
            if with_meta:
                job_stub["Meta"] = job.get("Meta") or {}
            out.append(job_stub)
        return out

    return await list_reply(request, "job.list", shape=stubs)


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
    """``PUT /v1/jobs``: register the body's job."""
    args = _register_args(await json_body(request), None)
    return await call_write(request, "job.register", args)


async def job_register(request: web.Request) -> web.Response:
    """``PUT /v1/job/:id``: register the body's job, whose ID must be the path's."""
    args = _register_args(await json_body(request), request.match_info["job_id"])
    return await call_write(request, "job.register", args)


async def job_get(request: web.Request) -> web.Response:
    data, index = await read(request, "job.get", by_path(request, "job_id"))
    return reply(request, nomad_job(data), index)


async def job_deregister(request: web.Request) -> web.Response:
    """``DELETE /v1/job/:id`` (``?purge``): stop the job, answering with its eval."""
    args = {"job_id": request.match_info["job_id"], "purge": query_bool(request, "purge")}
    out = dict(await api_of(request).call(request, "job.stop", args))
    if out.get("EvalID"):
        out.setdefault(
            "EvalCreateIndex", out.get("Index", 0)
        )  # the eval is created by the same entry
    return write_reply(request, out)


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
    return await call_write(request, "job.revert", args)


async def job_allocations(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "alloc.list", by_path(request, "job_id"), alloc_stubs)


async def job_evaluations(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "eval.list", by_path(request, "job_id"))


async def job_deployments(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "deployment.list", by_path(request, "job_id"))


async def job_latest_deployment(request: web.Request) -> web.Response:
    """The job's newest deployment, or ``null`` when it has none (as Nomad answers)."""
    data, index = await read_all(request, "deployment.list", by_path(request, "job_id"))
    latest = max(data, key=lambda d: d.get("CreateIndex", 0)) if data else None
    return reply(request, latest, index)


async def job_summary(request: web.Request) -> web.Response:
    data, index = await read(request, "job.summary", by_path(request, "job_id"))
    data = dict(data)
    data.setdefault("Children", {"Pending": 0, "Running": 0, "Dead": 0})
    return reply(request, data, index)


async def job_versions(request: web.Request) -> web.Response:
    data, index = await read(request, "job.versions", by_path(request, "job_id"))
    versions = [nomad_job(j) for j in data.get("Versions", [])]
    return reply(request, {"Versions": versions, "Diffs": None}, index)


async def jobs_parse(request: web.Request) -> web.Response:
    """HCL -> API job JSON (Nomad's ``POST /v1/jobs/parse``); parsing runs on this server, no state read."""
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
