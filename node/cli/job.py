"""``caravan job``: register, validate, inspect and stop jobs.

A jobspec is read here (JSON, or Nomad HCL2 turned into API JSON) and sent
whole; the servers validate it again, so ``job validate`` and ``job run``
refuse the same specs.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from node.cli.allocs import ALLOC_COLUMNS, alloc_row
from node.cli.common import (
    Ctx,
    blocking_options,
    client_options,
    emit,
    fail,
    kv,
    make_ctx,
    rows,
    short,
    when,
)
from node.cli.deployments import deployed_rows
from node.cli.monitor import monitor_unless_detached
from node.cli.paging import emit_list, every_item, list_options
from node.cli.progress import Reporter, interval, watching
from node.wire.errors import RPCError


@click.group()
def job() -> None:
    """Register, inspect and stop jobs."""


def _read_spec(path: str) -> Any:
    """The jobspec at ``path`` (- for stdin) as API JSON; HCL warnings go to stderr."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        fail(f"{path}: cannot read the jobspec: {reason}")
    from node.spec.hcl import HCLError, looks_like_hcl, parse_hcl

    if looks_like_hcl(path, text):  # Nomad HCL2 (FILE.nomad.hcl): parsed here, sent as API JSON
        try:
            parsed = parse_hcl(text, "stdin" if path == "-" else path)
        except HCLError as exc:
            fail(str(exc))
        for warning in parsed.warnings:
            click.echo(f"Warning: {warning}", err=True)
        return parsed.job
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")


@job.command("run")
@click.argument("spec")
@click.option("--check-index", type=int, default=None, help="Register only if the job's modify index equals this (0: only if new).")
@click.option("--detach", is_flag=True, help="Return once the job is registered instead of monitoring its evaluation.")
@client_options
def job_run(spec: str, check_index: int | None, detach: bool, address: str, token: str | None, as_json: bool,
            stale: bool) -> None:
    """Register a job from a jobspec file (JSON, or Nomad HCL2 as FILE.nomad.hcl; - for stdin) and monitor its evaluation.

    As ``nomad job run``: exit 0 when everything was placed, 2 when some
    allocations could not be placed (a blocked evaluation waits for
    capacity), 1 on other errors.
    """
    c = make_ctx(address, token, as_json)
    args: dict[str, Any] = {"job": _read_spec(spec)}
    if check_index is not None:
        args["enforce_index"] = check_index
    out = c.call("job.register", args)
    _follow_registration(c, out, "Job registered", detach)


def _follow_registration(c: Ctx, out: dict[str, Any], said: str, detach: bool) -> None:
    """Say what a registration did and monitor its evaluation (exit 2 when placements failed)."""
    if c.as_json:
        emit(c, out, str)
        return
    if out.get("Warnings"):
        click.echo("Warnings:\n  " + out["Warnings"].replace("\n", "\n  "))
    click.echo(f"{said} at index {out['Index']} (job modify index {out['JobModifyIndex']})")
    if detach or not out.get("EvalID"):
        monitor_unless_detached(c, out, detach)
        return
    with _placement_progress(c, out["EvalID"]):
        monitor_unless_detached(c, out, detach)


@contextlib.contextmanager
def _placement_progress(c: Ctx, eval_id: str) -> Iterator[None]:
    """Allocations placed so far for the eval's job (its summary, polled on a connection of its own).

    A large job takes the scheduler a while; the monitor's lines come only
    when the evaluation finishes, so this counts placements meanwhile. If
    the job cannot be read, the monitor runs without it.
    """
    try:
        job_id = c.call("eval.get", {"eval_id": eval_id, "stale": True})["data"]["JobID"]
        job = c.call("job.get", {"job_id": job_id, "stale": True})["data"]
    except RPCError:
        yield
        return
    wanted = sum(g.get("Count", 0) for g in job.get("TaskGroups") or [])
    with Reporter("job run", unit="allocations", total=wanted or None) as progress, c.client() as watcher:

        def poll() -> None:
            summary = watcher.call("job.summary", {"job_id": job_id, "stale": True})["data"]
            groups = summary.get("Summary", {}).values()
            placed = sum(n for g in groups for k, n in g.items() if k != "Queued")
            progress.update(min(placed, wanted) if wanted else placed)

        with watching(poll, interval()):
            try:
                yield
            except SystemExit:  # the monitor's exit status (2: not all placed) ends a finished run
                _last_look(poll)
                progress.close(ok=True)
                raise
            _last_look(poll)


def _last_look(poll: Callable[[], None]) -> None:
    """One more count when the monitor is done, so the closing line says where it ended."""
    try:
        poll()
    except (RPCError, OSError):
        pass


@job.command("revert")
@click.argument("job_id")
@click.argument("version", type=int)
@click.option("--detach", is_flag=True, help="Return once the job is registered instead of monitoring its evaluation.")
@client_options
def job_revert(job_id: str, version: int, detach: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Run a kept version of a job again (as its newest version), as ``nomad job revert``; see ``job history``."""
    c = make_ctx(address, token, as_json)
    out = c.call("job.revert", {"job_id": job_id, "job_version": version})
    _follow_registration(c, out, f"Job {job_id} reverted to the spec of version {version}", detach)


@job.command("validate")
@click.argument("spec")
def job_validate(spec: str) -> None:
    """Check a jobspec (JSON or Nomad HCL2; - for stdin) without a cluster, as ``nomad job validate``.

    Runs the parser and checks the servers run on ``job run``, so a spec
    that passes here is refused there only by cluster state (for example
    ``--check-index``). Exit 0 when valid, 1 with the first problem otherwise.
    """
    from node.spec.jobspec import JobSpecError, parse_job

    try:
        job, warnings = parse_job(_read_spec(spec))
    except JobSpecError as exc:
        fail(f"invalid jobspec: {exc}")
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)
    groups = ", ".join(f"{g.name} x{g.count}" for g in job.task_groups)
    click.echo(f'Job validation successful: {job.type} job "{job.id}" ({groups})')


JOB_COLUMNS = [("ID", "ID"), ("Type", "Type"), ("Priority", "Priority"), ("Status", "Status"), ("Version", "Version")]


@job.command("list")
@click.option("--prefix", default="", help="Only jobs whose ID starts with this.")
@list_options
@blocking_options
@client_options
def job_list(prefix: str, filter_expr: str | None, per_page: int | None, page_token: str | None,
             address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Jobs, every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    emit_list(c, "job.list", {"prefix": prefix} if prefix else {}, JOB_COLUMNS,
              filter_expr=filter_expr, per_page=per_page, page_token=page_token)


@job.command("status")
@click.argument("job_id", required=False)
@blocking_options
@client_options
def job_status(job_id: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """List jobs, or show one job with its allocations."""
    c = make_ctx(address, token, as_json, stale)
    if job_id is None:
        emit_list(c, "job.list", {}, JOB_COLUMNS)
        return
    data = c.read("job.get", {"job_id": job_id})
    if as_json:
        emit(c, data, str)
        return
    fields = [("ID", "ID"), ("Name", "Name"), ("Type", "Type"), ("Priority", "Priority"), ("Status", "Status"),
              ("Version", "Version"), ("Stop", "Stop"), ("Datacenters", "Datacenters"), ("ModifyIndex", "ModifyIndex")]
    # Caravan's queue fields, only when the job names them (most jobs have no queue).
    fields[4:4] = [(label, key) for label, key in (("Queue", "Queue"), ("Priority Class", "PriorityClass")) if data.get(key)]
    click.echo(kv(data, fields))
    if data.get("Queue"):
        _print_workload(c, job_id)
    _print_job_details(c, job_id)


def _print_workload(c: Ctx, job_id: str) -> None:
    """Where a queued job stands: admitted or waiting (its place in line and why), and its evictions."""
    wl = c.read("queue.workload", {"job_id": job_id})
    state = wl["state"]
    if state == "pending":
        state = f"pending, position {wl['position']} in queue {wl['queue']}: {wl.get('reason', '')}"
    click.echo(f"\nAdmission\n{kv({'State': state}, [('State', 'State')])}")
    if wl["evictions"]:
        click.echo("\nEvictions")
        click.echo(rows(wl["evictions"], [("Index", "index"), ("Reason", "reason"), ("Message", "message")]))


def _print_job_details(c: Ctx, job_id: str) -> None:
    """The rest of ``job status JOB``: group summary, latest deployment, allocations."""
    summary = c.read("job.summary", {"job_id": job_id})
    groups = [{"Group": g, **s} for g, s in sorted(summary.get("Summary", {}).items())]
    click.echo("\nSummary")
    click.echo(rows(groups, [(k, k) for k in ("Group", "Queued", "Starting", "Running", "Failed", "Complete", "Lost")]))
    deployments = list(every_item(c, "deployment.list", {"job_id": job_id}))
    if deployments:
        latest = max(deployments, key=lambda d: d.get("CreateIndex", 0))
        click.echo("\nLatest Deployment")
        click.echo(kv({**latest, "ID": short(latest["ID"])},
                      [("ID", "ID"), ("Status", "Status"), ("Description", "StatusDescription")]))
        click.echo("\nDeployed")
        click.echo(deployed_rows(latest))
    click.echo("\nAllocations")
    emit_list(c, "alloc.list", {"job_id": job_id}, ALLOC_COLUMNS, alloc_row)


@job.command("stop")
@click.argument("job_id")
@click.option("--purge", is_flag=True, help="Remove the job from state instead of marking it stopped.")
@client_options
def job_stop(job_id: str, purge: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Stop a job (its allocations are stopped by the scheduler)."""
    c = make_ctx(address, token, as_json)
    out = c.call("job.stop", {"job_id": job_id, "purge": purge})
    emit(c, out, lambda d: f"Job {job_id} {'purged' if purge else 'stopped'} at index {d['Index']}; evaluation {d.get('EvalID', '')}")


@job.command("history")
@click.argument("job_id")
@blocking_options
@client_options
def job_history(job_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """The job's kept versions, newest first."""
    c = make_ctx(address, token, as_json, stale)
    data = c.read("job.versions", {"job_id": job_id})
    emit(c, data, lambda d: rows(
        [{**v, "Submitted": when(v.get("SubmitTime", 0))} for v in d["Versions"]],
        [("Version", "Version"), ("Stable", "Stable"), ("Stop", "Stop"), ("Submitted", "Submitted"),
         ("JobModifyIndex", "JobModifyIndex")]))
