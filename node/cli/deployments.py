"""``caravan deployment``: rollouts, and the per-group progress ``job status`` shows too."""

from __future__ import annotations

from typing import Any

import click

from node.cli.common import (
    Ctx,
    blocking_options,
    client_options,
    emit,
    kv,
    make_ctx,
    rows,
    short,
    when,
)
from node.cli.monitor import monitor_unless_detached
from node.cli.paging import emit_list, list_options


@click.group()
def deployment() -> None:
    """Deployments."""


@deployment.command("list")
@click.option("--job", "job_id", default=None)
@list_options
@blocking_options
@client_options
def deployment_list(job_id: str | None, filter_expr: str | None, per_page: int | None, page_token: str | None,
                    address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Deployments (of one job), every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    columns = [("ID", "ID"), ("Job ID", "JobID"), ("Job Version", "JobVersion"), ("Status", "Status")]
    emit_list(c, "deployment.list", {"job_id": job_id} if job_id else {}, columns, lambda x: {**x, "ID": short(x["ID"])},
              filter_expr=filter_expr, per_page=per_page, page_token=page_token)


@deployment.command("status")
@click.argument("deployment_id")
@blocking_options
@client_options
def deployment_status(deployment_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("deployment.get", {"deployment_id": deployment_id})
    emit(c, data, _deployment_table)


@deployment.command("fail")
@click.argument("deployment_id")
@client_options
def deployment_fail(deployment_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Mark a running deployment failed; a group with auto_revert rolls back to the last stable version."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.fail", {"deployment_id": deployment_id})

    def text(d: dict[str, Any]) -> str:
        said = f'Deployment "{deployment_id}" failed'
        if "RevertedJobVersion" in d:
            said += f'. Auto-reverted to job version {d["RevertedJobVersion"]}.'
        return said + (f'\nEvaluation "{short(d["EvalID"])}" places the reverted version' if d.get("EvalID") else "")

    emit(c, out, text)


@deployment.command("pause")
@click.argument("deployment_id")
@client_options
def deployment_pause(deployment_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Hold a running rollout where it is: nothing more is replaced until ``deployment resume``."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.pause", {"deployment_id": deployment_id, "pause": True})
    emit(c, out, lambda d: f'Deployment "{d["DeploymentID"]}" paused')


@deployment.command("resume")
@click.argument("deployment_id")
@click.option("--detach", is_flag=True, help="Return at once instead of monitoring the evaluation that places the next batch.")
@client_options
def deployment_resume(deployment_id: str, detach: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Go on with a paused rollout; its progress deadline starts again."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.pause", {"deployment_id": deployment_id, "pause": False})
    _follow_deployment_eval(c, out, "resumed", detach)


@deployment.command("promote")
@click.argument("deployment_id")
@click.option("--group", "groups", multiple=True, help="Promote only this task group's canaries (repeatable); default: all.")
@click.option("--detach", is_flag=True, help="Return at once instead of monitoring the evaluation that replaces the old allocs.")
@client_options
def deployment_promote(deployment_id: str, groups: tuple[str, ...], detach: bool, address: str, token: str | None,
                       as_json: bool, stale: bool) -> None:
    """Promote a rollout's canaries once they are healthy: the old allocs are then replaced, as ``nomad deployment promote``."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.promote", {"deployment_id": deployment_id, "groups": list(groups)})
    _follow_deployment_eval(c, out, "promoted", detach)


def _follow_deployment_eval(c: Ctx, out: dict[str, Any], done: str, detach: bool) -> None:
    """Say what happened to the deployment, then monitor the eval that goes on with it."""
    if c.as_json:
        emit(c, out, str)
        return
    click.echo(f'Deployment "{out["DeploymentID"]}" {done}')
    monitor_unless_detached(c, out, detach)


def _deployment_table(d: dict[str, Any]) -> str:
    """As ``nomad deployment status``: the rollout, then each group's progress."""
    head = kv(d, [("ID", "ID"), ("Job ID", "JobID"), ("Job Version", "JobVersion"), ("Status", "Status"),
                  ("Description", "StatusDescription")])
    return head + "\n\nDeployed\n" + deployed_rows(d)


def deployed_rows(d: dict[str, Any]) -> str:
    """Each task group's rollout progress; canary and auto-revert columns only where they apply."""
    groups = sorted((d.get("TaskGroups") or {}).items())
    columns = [("Task Group", "Group")]
    if any(s.get("AutoRevert") for _, s in groups):
        columns.append(("Auto Revert", "AutoRevert"))
    canaries = any(s.get("DesiredCanaries") for _, s in groups)
    if canaries:
        columns.append(("Promoted", "Promoted"))
    columns.append(("Desired", "DesiredTotal"))
    if canaries:
        columns.append(("Canaries", "DesiredCanaries"))
    columns += [("Placed", "PlacedAllocs"), ("Healthy", "HealthyAllocs"),
                ("Unhealthy", "UnhealthyAllocs"), ("Progress Deadline", "Deadline")]
    return rows([{**s, "Group": g, "Deadline": when(s.get("RequireProgressBy", 0)) or "<none>"} for g, s in groups], columns)
