"""``caravan alloc``: allocations, and the allocation table ``job status`` shows too."""

from __future__ import annotations

import time
from typing import Any

import click

from node.cli.common import (
    Ctx,
    blocking_options,
    client_options,
    devices_text,
    emit,
    kv,
    make_ctx,
    rows,
    short,
)
from node.cli.paging import emit_list, list_options
from node.wire.errors import RPCError

ALLOC_COLUMNS = [("ID", "ID"), ("Node ID", "NodeID"), ("Task Group", "TaskGroup"), ("Version", "JobVersion"),
                 ("Desired", "DesiredStatus"), ("Status", "ClientStatus")]


def alloc_row(a: dict[str, Any]) -> dict[str, Any]:
    """An allocation as a table row: short ids, as Nomad prints them."""
    return {**a, "ID": short(a["ID"]), "NodeID": short(a["NodeID"])}


def alloc_rows(allocs: list[dict[str, Any]]) -> str:
    """Allocations as ``nomad alloc status`` lists them (short ids)."""
    return rows([alloc_row(a) for a in allocs], ALLOC_COLUMNS)


@click.group()
def alloc() -> None:
    """Allocations."""


@alloc.command("list")
@click.option("--job", "job_id", default=None)
@click.option("--node", "node_id", default=None)
@list_options
@blocking_options
@client_options
def alloc_list(job_id: str | None, node_id: str | None, filter_expr: str | None, per_page: int | None,
               page_token: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Allocations (of one job or node), every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    args = {k: v for k, v in (("job_id", job_id), ("node_id", node_id)) if v}
    emit_list(c, "alloc.list", args, ALLOC_COLUMNS, alloc_row, filter_expr=filter_expr, per_page=per_page,
              page_token=page_token)


@alloc.command("status")
@click.argument("alloc_id")
@blocking_options
@client_options
def alloc_status(alloc_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("alloc.get", {"alloc_id": alloc_id})
    if c.as_json:
        emit(c, data, str)
        return
    extra = reschedule_lines(data, _group_policy(c, data), _wait_until(c, data), time.time_ns())
    devices = devices_text(data.get("Resources"))
    if devices:  # the node's devices it holds
        extra.insert(0, ("Devices", devices))
    fields = STATUS_FIELDS + [(label, label) for label, _ in extra]
    emit(c, {**data, **dict(extra)}, lambda d: kv(d, fields))


STATUS_FIELDS = [("ID", "ID"), ("Eval ID", "EvalID"), ("Job ID", "JobID"), ("Node ID", "NodeID"),
                 ("Task Group", "TaskGroup"), ("Desired Status", "DesiredStatus"), ("Client Status", "ClientStatus"),
                 ("Client Description", "ClientDescription"), ("Modify Index", "ModifyIndex")]


def reschedule_lines(
    alloc: dict[str, Any], policy: dict[str, Any] | None, wait_until: int, now: int
) -> list[tuple[str, str]]:
    """The reschedule lines ``nomad alloc status`` prints, as (label, value), in its order.

    * "Reschedule Attempts n/m": only once the alloc was rescheduled and its
      group's policy limits the attempts; n counts the tracker's events
      within the policy's interval before the alloc's modify time (Nomad's
      ``Allocation.RescheduleInfo``).
    * "Replacement Alloc ID": the alloc that replaced this one.
    * "Reschedule Eligibility": when the follow-up eval waiting to
      reschedule it is due, while that is still ahead ("25s from now").
    """
    out: list[tuple[str, str]] = []
    events = (alloc.get("RescheduleTracker") or {}).get("Events") or []
    if events and policy:
        attempted, total = reschedule_info(events, policy, int(alloc.get("ModifyTime") or 0))
        if total > 0:
            out.append(("Reschedule Attempts", f"{attempted}/{total}"))
    if alloc.get("NextAllocation"):
        out.append(("Replacement Alloc ID", short(alloc["NextAllocation"])))
    if wait_until and wait_until > now:
        out.append(("Reschedule Eligibility", pretty_time_diff(wait_until, now)))
    return out


def reschedule_info(events: list[dict[str, Any]], policy: dict[str, Any], at: int) -> tuple[int, int]:
    """(attempts made within the interval before ``at``, attempts allowed): Nomad's ``RescheduleInfo``."""
    allowed, interval = int(policy.get("Attempts") or 0), int(policy.get("Interval") or 0)
    if allowed <= 0 or interval <= 0:
        return 0, allowed
    return sum(1 for e in events if at - int(e.get("RescheduleTime") or 0) < interval), allowed


_PERIODS = (("s", 60), ("m", 60), ("h", 24), ("d", 30), ("mo", 12), ("y", 0))


def pretty_time_diff(first: int, second: int) -> str:
    """Nomad's ``prettyTimeDiff``: the two largest periods of ``first - second`` ("1m5s from now", "2d3h ago").

    Both times are rounded to the second first, as Nomad does, so the text
    does not flicker with the sub-second part of the clock.
    """
    a, b = _round_second(first), _round_second(second)
    suffix = "ago" if b >= a else "from now"
    left = abs(a - b) // 1_000_000_000
    parts: list[str] = []
    for unit, size in _PERIODS:
        value = left % size if size else left
        if value:
            parts.append(f"{value}{unit}")
        left = left // size if size else 0
        if not left:
            break
    text = "".join(reversed(parts[-2:])) or "0s"
    return f"{text} {suffix}"


def _round_second(ns: int) -> int:
    """Go's ``Time.Round(time.Second)``: to the nearest second, halves up."""
    return (ns + 500_000_000) // 1_000_000_000 * 1_000_000_000


def _group_policy(c: Ctx, alloc: dict[str, Any]) -> dict[str, Any] | None:
    """The reschedule policy of the alloc's group in the job version it runs (None: the job is gone)."""
    try:
        job = c.read("job.get", {"job_id": alloc.get("JobID", "")})
        if job.get("Version") != alloc.get("JobVersion"):
            versions = c.read("job.versions", {"job_id": alloc.get("JobID", "")}).get("Versions") or []
            job = next((v for v in versions if v.get("Version") == alloc.get("JobVersion")), job)
    except RPCError:
        return None
    group = next((g for g in job.get("TaskGroups") or [] if g.get("Name") == alloc.get("TaskGroup")), None)
    return (group or {}).get("ReschedulePolicy")


def _wait_until(c: Ctx, alloc: dict[str, Any]) -> int:
    """When the alloc's follow-up eval may run (0: none, or it is gone)."""
    eval_id = alloc.get("FollowupEvalID")
    if not eval_id:
        return 0
    try:
        return int(c.read("eval.get", {"eval_id": eval_id}).get("WaitUntil") or 0)
    except RPCError:
        return 0
