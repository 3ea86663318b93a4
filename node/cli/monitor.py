"""Following an evaluation to its end, as Nomad's CLI monitor does.

``job run``, ``job revert``, ``deployment resume`` and ``deployment promote``
each create an evaluation and watch it; ``eval status`` explains a failed
placement the same way. The exit code says whether everything was placed.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from node.cli.common import BLOCKING_SLACK, Ctx, short
from node.cli.paging import every_item

MONITOR_WAIT = 30.0  # seconds per blocking read while monitoring an evaluation


def monitor_unless_detached(c: Ctx, out: dict[str, Any], detach: bool) -> None:
    """Monitor the answer's eval (exit 2 when placements failed), or just name it with --detach."""
    if not out.get("EvalID"):
        return
    if detach:
        click.echo(f"Evaluation ID: {out['EvalID']}")
        return
    code = monitor_eval(c, out["EvalID"], out["Index"])
    if code:
        sys.exit(code)


def monitor_eval(c: Ctx, eval_id: str, index: int = 0) -> int:
    """Follow an evaluation until the scheduler finished it (Nomad's monitor); the exit code."""
    click.echo(f'==> Monitoring evaluation "{short(eval_id)}"')
    status, first = "", True
    while True:
        out = c.call("eval.get", {"eval_id": eval_id, "min_index": index, "wait": MONITOR_WAIT},
                     timeout=MONITOR_WAIT + BLOCKING_SLACK)
        ev, index = out["data"], out["index"]
        if first:
            click.echo(f'    Evaluation triggered by job "{ev["JobID"]}"')
            first = False
        if ev["Status"] != status:
            if status:
                click.echo(f'    Evaluation status changed: "{status}" -> "{ev["Status"]}"')
            status = ev["Status"]
        if status == "pending":
            continue
        return _report_finished(c, ev, eval_id, status)


def _report_finished(c: Ctx, ev: dict[str, Any], eval_id: str, status: str) -> int:
    """What a finished evaluation did: its allocations, deployment and failures; the exit code."""
    allocs = list(every_item(c, "alloc.list", {"job_id": ev["JobID"]}))
    for a in sorted(allocs, key=lambda a: a.get("CreateIndex", 0)):
        if a.get("EvalID") == eval_id:
            # As Nomad's monitor: an alloc older than the eval was updated in place by it.
            verb = "modified" if a.get("CreateIndex", 0) < ev.get("CreateIndex", 0) else "created"
            click.echo(f'    Allocation "{short(a["ID"])}" {verb}: node "{short(a["NodeID"])}", group "{a["TaskGroup"]}"')
    deployment = ev.get("DeploymentID") or ""
    if deployment:
        click.echo(f'    Evaluation within deployment: "{short(deployment)}"')
    failures = ev.get("FailedTGAllocs") or {}
    if failures:
        click.echo(f'==> Evaluation "{short(eval_id)}" finished with status "{status}" but failed to place all allocations:')
        click.echo(placement_failures(ev))
        return 2
    click.echo(f'==> Evaluation "{short(eval_id)}" finished with status "{status}"')
    return 0 if status == "complete" else 1


def placement_failures(ev: dict[str, Any]) -> str:
    """Why an evaluation could not place every allocation, group by group."""
    lines = []
    queued = ev.get("QueuedAllocations") or {}
    for group, why in sorted((ev.get("FailedTGAllocs") or {}).items()):
        n = queued.get(group, 0)
        lines.append(f'    Task Group "{group}" (failed to place {n} allocation{"s" if n != 1 else ""}):')
        for part in why.split("; "):
            lines.append(f"      * {part}")
    if ev.get("BlockedEval"):
        lines.append(f'    Evaluation "{short(ev["BlockedEval"])}" waiting for additional capacity to place remainder')
    elif ev.get("Status") == "blocked":
        lines.append("    This evaluation is blocked: it runs again when capacity changes (a node joins or frees resources)")
    return "\n".join(lines)
