"""RPC methods for jobs: register, stop, revert, and reads of jobs, versions and summaries.

Writes go through ``ServerAPI.write`` (forwarded to the leader, stamped, put
on the log, answered with the apply result). Reads go through
``ServerAPI.read`` (linearizable by default; ``stale`` on any server;
blocking with ``min_index``/``wait``). Objects come back in Nomad's JSON shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import Job
from node.core.acl import Need
from node.core.context import RequestContext
from node.core.paging import table_rows
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, bad, found, id_arg, method
from node.spec.jobspec import JobSpecError, parse_job
from node.spec.nomadjson import to_nomad
from node.wire.errors import CONFLICT, NOT_FOUND, RPCError
from scheduler.evals import new_eval

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- jobs ---------------------------------------------------------------------------
@method("job.register")
async def job_register(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    # A follower sends the request on as it came, as Nomad's endpoints forward first: the
    # leader parses and validates it anyway. Parsing it here too was most of a follower's
    # work on a registration (bench-placement at 30,000 nodes: 5.8% of its GIL samples,
    # of 8.5% for the whole handler).
    server.ensure_leader()
    try:
        job, warnings = parse_job(args.get("job"))
    except JobSpecError as exc:
        raise bad(f"invalid jobspec: {exc}") from None
    enforce = arg(args, "enforce_index", int, required=False)
    return await _register(server, ctx, job, enforce, warnings)


async def _register(server: ServerAPI, ctx: RequestContext, job: Job, enforce: int | None, warnings: list[str]) -> Any:
    """Put a registration on the log, with the eval that places it; Nomad's JobRegisterResponse.

    A job waiting in its queue gets no eval: there is nothing to place until it is
    admitted, and the admission's entry carries the eval that places it.
    """
    ev = None
    if not (job.periodic or job.parameterized) and (not job.queue or await server.local(lambda r: r.workload_admitted(job.id))):
        ev = new_eval(job, "job-register", job_modify_index=0)
    result = await server.write(ctx, Need.WRITE, m.JobRegister(job=job, eval=ev, enforce_index=enforce))
    value = result["value"]
    return {
        "EvalID": value.get("eval_id", ""),
        "EvalCreateIndex": value.get("eval_create_index", 0),
        "JobModifyIndex": value["job_modify_index"],
        "Index": result["index"],
        "Warnings": "\n".join(warnings),
    }


@method("job.stop")
async def job_stop(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")
    purge = bool(args.get("purge", False))
    server.ensure_leader()  # the job is read from state: read the leader's
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists
    job = await server.local(lambda r: r.job(job_id))
    if job is None:
        raise RPCError(NOT_FOUND, f"job {job_id} not found")
    body = m.JobDeregister(job_id=job_id, purge=purge, eval=new_eval(job, "job-deregister", job_modify_index=0))
    result = await server.write(ctx, Need.WRITE, body)
    return {"EvalID": result["value"].get("eval_id", ""), "JobModifyIndex": result["value"]["job_modify_index"], "Index": result["index"]}


@method("job.revert")
async def job_revert(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Register a kept version's spec again as the job's newest version, as ``nomad job revert``."""
    job_id = id_arg(args, "job_id")
    version = arg(args, "job_version", int)
    prior = arg(args, "enforce_prior_version", int, required=False)
    server.ensure_leader()  # the versions are read from state: read the leader's
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists

    def target(r: StateReader) -> tuple[Job, Job]:
        current = r.job(job_id)
        if current is None:
            raise RPCError(NOT_FOUND, f"job {job_id} not found")
        if version == current.version:
            raise bad(f"job {job_id} is at version {version} already; can't revert to the current version")
        if prior is not None and prior != current.version:
            raise RPCError(CONFLICT, f"job {job_id} is at version {current.version}, not {prior}; read it again and retry")
        kept = r.job_version(job_id, version)
        if kept is None:
            raise RPCError(NOT_FOUND, f"job {job_id} has no version {version} (job history lists the kept versions)")
        return current, kept

    current, kept = await server.local(target)
    # Over the version just read only: a registration in between wins, as with --check-index.
    return await _register(server, ctx, kept, current.job_modify_index, [])


@method("job.get")
async def job_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")
    return await server.read(ctx, args, ("jobs",), lambda r: found(r.job(job_id), f"job {job_id}"), point=True)


@method("job.list")
async def job_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of jobs in id order (``prefix``, ``per_page``, ``next_token``, ``filter``, ``reverse``)."""
    return await list_page(server, ctx, args, ("jobs",), lambda r, req: table_rows(r, "jobs", req))


@method("job.versions")
async def job_versions(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")

    def versions(r: StateReader) -> Any:
        rows = r.job_versions(job_id)
        if not rows:
            raise RPCError(NOT_FOUND, f"job {job_id} not found")
        return {"Versions": [to_nomad(j) for j in rows]}

    return await server.read(ctx, args, ("job_versions",), versions)


@method("job.summary")
async def job_summary(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")
    return await server.read(ctx, args, ("job_summary",), lambda r: found(r.job_summary(job_id), f"job {job_id}"), point=True)
