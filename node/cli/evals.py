"""``caravan eval``: evaluations, and why one could not place everything."""

from __future__ import annotations

from typing import Any

import click

from node.cli.common import blocking_options, client_options, emit, kv, make_ctx, short, when
from node.cli.monitor import placement_failures
from node.cli.paging import emit_list, list_options


@click.group("eval")
def eval_() -> None:
    """Evaluations."""


@eval_.command("list")
@click.option("--job", "job_id", default=None)
@list_options
@blocking_options
@client_options
def eval_list(job_id: str | None, filter_expr: str | None, per_page: int | None, page_token: str | None,
              address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Evaluations (of one job), every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    columns = [("ID", "ID"), ("Priority", "Priority"), ("Triggered By", "TriggeredBy"), ("Job ID", "JobID"), ("Status", "Status")]
    emit_list(c, "eval.list", {"job_id": job_id} if job_id else {}, columns, lambda e: {**e, "ID": short(e["ID"])},
              filter_expr=filter_expr, per_page=per_page, page_token=page_token)


@eval_.command("status")
@click.argument("eval_id")
@blocking_options
@client_options
def eval_status(eval_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """One evaluation, with the reason it could not place everything (why it is blocked)."""
    c = make_ctx(address, token, as_json, stale)
    data = c.read("eval.get", {"eval_id": eval_id})
    emit(c, data, _eval_table)


def _eval_table(d: dict[str, Any]) -> str:
    view = {**d, "PlacementFailures": bool(d.get("FailedTGAllocs")), "Created": when(d.get("CreateTime", 0)),
            "WaitUntilTime": when(d.get("WaitUntil", 0))}
    fields = [("ID", "ID"), ("Create Time", "Created"), ("Status", "Status"), ("Status Description", "StatusDescription"),
              ("Type", "Type"), ("TriggeredBy", "TriggeredBy"), ("Job ID", "JobID"), ("Priority", "Priority"),
              ("Placement Failures", "PlacementFailures")]
    for label, key in (("Node ID", "NodeID"), ("Deployment ID", "DeploymentID"), ("Wait Until", "WaitUntilTime"),
                       ("Previous Eval", "PreviousEval"), ("Next Eval", "NextEval"), ("Blocked Eval", "BlockedEval")):
        if view.get(key):
            fields.append((label, key))
    text = kv(view, fields)
    if d.get("FailedTGAllocs"):
        text += "\n\n==> Failed Placements\n" + placement_failures(d)
    return text
