"""``caravan node``: client nodes, their eligibility, and draining them.

A drain is set with one write; the leader's drainer does the moving. The
monitor here only watches (node and alloc reads every ``DRAIN_POLL``
seconds), so Ctrl-C stops the watching, never the drain.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from node.cli.client_gc import node_gc_fields
from node.cli.common import (
    Ctx,
    blocking_options,
    client_options,
    devices_text,
    emit,
    kv,
    make_ctx,
    short,
    when,
)
from node.cli.paging import emit_list, every_item, list_options
from node.wire.errors import RPCError

DRAIN_POLL = 0.5  # seconds between looks while monitoring a drain


@click.group()
def node() -> None:
    """Client nodes."""


@node.command("list")
@list_options
@blocking_options
@client_options
def node_list(filter_expr: str | None, per_page: int | None, page_token: str | None,
              address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Client nodes, every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    columns = [("ID", "ID"), ("DC", "Datacenter"), ("Name", "Name"), ("Class", "NodeClass"),
               ("Drain", "Drain"), ("Eligibility", "SchedulingEligibility"), ("Status", "Status")]
    emit_list(c, "node.list", {}, columns, lambda n: {**n, "ID": short(n["ID"])},
              filter_expr=filter_expr, per_page=per_page, page_token=page_token)


@node.command("status")
@click.argument("node_id")
@blocking_options
@client_options
def node_status(node_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("node.get", {"node_id": node_id})
    fields = [("ID", "ID"), ("Name", "Name"), ("Datacenter", "Datacenter"), ("Status", "Status"),
              ("Eligibility", "SchedulingEligibility"), ("Drain", "Drain")]
    devices = devices_text(data.get("Resources"))
    if devices:  # as the rest of the output: only what the node has
        fields.append(("Devices", "Devices"))
    gc = node_gc_fields(data)  # what its client keeps: terminal allocs and disk use (client.gc.* attributes)
    fields += [(label, label) for label in gc]
    emit(c, data, lambda d: kv({**d, "Drain": _drain_text(d), "Devices": devices, **gc}, fields))


def _drain_text(node: dict[str, Any]) -> str:
    """As ``nomad node status``: false, or true with the drain's deadline."""
    strategy = node.get("DrainStrategy")
    if not strategy:
        return "false"
    deadline = strategy.get("Deadline", 0)
    text = "true; force drain" if deadline < 0 else "true; no deadline" if deadline == 0 else \
        f"true; {when(strategy.get('ForceDeadline', 0))} deadline"
    return text + ("; ignoring system jobs" if strategy.get("IgnoreSystemJobs") else "")


@node.command("eligibility")
@click.argument("node_id")
@click.option("--enable/--disable", "enable", default=None, help="Let the scheduler place new allocations here, or not.")
@client_options
def node_eligibility(node_id: str, enable: bool | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Open or close a node to new placements (``nomad node eligibility -enable|-disable``).

    Allocations already on an ineligible node keep running. The setting
    stays when the node's client restarts and registers again.
    """
    if enable is None:
        raise click.UsageError("say --enable or --disable")
    c = make_ctx(address, token, as_json)
    full_id = c.read("node.get", {"node_id": node_id})["ID"]
    value = "eligible" if enable else "ineligible"  # the wire values
    out = c.call("node.eligibility", {"node_id": full_id, "eligibility": value})
    emit(c, out, lambda d: f'Node "{d["NodeID"]}" scheduling eligibility set: {value} for scheduling')


@node.command("drain")
@click.argument("node_id")
@click.option("--enable", is_flag=True, help="Start draining the node (or change the drain under way).")
@click.option("--disable", is_flag=True, help="Stop draining; the node becomes eligible again unless --keep-ineligible.")
@click.option("--deadline", default="1h", show_default=True,
              help="Move whatever has not moved by then at once (Go duration, e.g. 30m).")
@click.option("--force", is_flag=True, help="Move every allocation at once (no migrate steps, no deadline).")
@click.option("--no-deadline", is_flag=True, help="No deadline: batch allocations may run to the end.")
@click.option("--ignore-system", is_flag=True, help="Leave system job allocations on the node.")
@click.option("--keep-ineligible", is_flag=True, help="With --disable: keep the node closed to new placements.")
@click.option("--detach", is_flag=True, help="Return at once instead of monitoring the drain.")
@click.option("--monitor", "monitor_only", is_flag=True, help="Monitor a drain under way (changes nothing).")
@client_options
def node_drain(node_id: str, enable: bool, disable: bool, deadline: str, force: bool, no_deadline: bool,
               ignore_system: bool, keep_ineligible: bool, detach: bool, monitor_only: bool,
               address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Drain a node: move its allocations elsewhere before it is taken out of service (``nomad node drain``).

    The node is closed to new placements at once. Service allocations move
    in steps of their group's migrate.max_parallel, each step once the
    replacements are healthy; batch allocations are left to finish until
    the deadline; system allocations stop last. At the deadline whatever is
    left moves at once. The node stays ineligible after the drain.
    """
    _check_drain_flags(enable, disable, force, no_deadline, ignore_system, keep_ineligible, detach, monitor_only)
    seconds = _drain_deadline(deadline, enable, force, no_deadline)
    c = make_ctx(address, token, as_json)
    full_id = c.read("node.get", {"node_id": node_id})["ID"]
    if monitor_only:
        sys.exit(monitor_drain(c, full_id, just_set=False))
    spec = None
    if enable:
        spec = {"Deadline": -1 if force else 0 if no_deadline else int(seconds * 1e9), "IgnoreSystemJobs": ignore_system}
    out = c.call("node.drain", {"node_id": full_id, "drain_spec": spec, "mark_eligible": disable and not keep_ineligible})
    if as_json or detach or disable:
        said = "drain strategy set" if enable else "drain strategy unset"
        emit(c, out, lambda d: f'{_stamp()}: Node "{d["NodeID"]}" {said}')
        return
    click.echo(f'{_stamp()}: Ctrl-C to stop monitoring: will not cancel the node drain')
    click.echo(f'{_stamp()}: Node "{full_id}" drain strategy set')
    sys.exit(monitor_drain(c, full_id, just_set=True))


def _check_drain_flags(enable: bool, disable: bool, force: bool, no_deadline: bool, ignore_system: bool,
                       keep_ineligible: bool, detach: bool, monitor_only: bool) -> None:
    """Refuse combinations of ``node drain`` flags that say two things at once."""
    if sum((enable, disable, monitor_only)) != 1:
        raise click.UsageError("say exactly one of --enable, --disable or --monitor")
    if (force or no_deadline or ignore_system) and not enable:
        raise click.UsageError("--force, --no-deadline and --ignore-system go with --enable")
    if keep_ineligible and not disable:
        raise click.UsageError("--keep-ineligible goes with --disable")
    if force and no_deadline:
        raise click.UsageError("--force and --no-deadline cannot be used together")
    if detach and monitor_only:
        raise click.UsageError("--detach and --monitor cannot be used together")


def _drain_deadline(deadline: str, enable: bool, force: bool, no_deadline: bool) -> float:
    """--deadline in seconds; a drain that waits for it needs one above zero."""
    from node.spec.units import parse_duration

    try:
        seconds = parse_duration(deadline)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--deadline") from None
    if enable and not force and not no_deadline and seconds <= 0:
        raise click.BadParameter("must be greater than zero (or say --force or --no-deadline)", param_hint="--deadline")
    return seconds


def _stamp() -> str:
    return when(time.time_ns())


def monitor_drain(c: Ctx, node_id: str, *, just_set: bool) -> int:
    """Follow a drain until it is done and what it moves has stopped (Nomad's drain monitor); the exit code.

    ``just_set``: this command started the drain (it may be done by the first look).
    """
    seen: dict[str, tuple[bool, str, str]] = {}  # alloc id -> (marked, desired status, client status)
    job_types: dict[str, str] = {}
    ignore_system = False
    complete = False
    down = False
    first = True
    try:
        while True:
            node = c.call("node.get", {"node_id": node_id})["data"]
            strategy = node.get("DrainStrategy")
            if first and not just_set:
                if strategy is None:
                    click.echo(f"{_stamp()}: No drain strategy set for node {node_id}")
                    return 0
                click.echo(f'{_stamp()}: Monitoring node "{node_id}": Ctrl-C to detach monitoring')
            first = False
            if strategy is not None:
                ignore_system = bool(strategy.get("IgnoreSystemJobs"))
            if node.get("Status") == "down" and not down:
                click.echo(f'{_stamp()}: Node "{node_id}" down')
            down = node.get("Status") == "down"
            allocs = list(every_item(c, "alloc.list", {"node_id": node_id}))
            moving = _report_allocs(c, allocs, seen, job_types, ignore_system)
            if strategy is None and not complete:
                complete = True
                click.echo(f"{_stamp()}: Drain complete for node {node_id}")
            if complete and moving == 0:
                click.echo(f'{_stamp()}: All allocations on node "{node_id}" have stopped')
                return 0
            time.sleep(DRAIN_POLL)
    except KeyboardInterrupt:
        click.echo(f'{_stamp()}: monitoring stopped; the drain goes on (caravan node drain --monitor {short(node_id)})')
        return 0


def _report_allocs(c: Ctx, allocs: list[dict[str, Any]], seen: dict[str, tuple[bool, str, str]],
                   job_types: dict[str, str], ignore_system: bool) -> int:
    """Print what changed on each alloc since the last look; how many the drain still has to move."""
    moving = 0
    for a in sorted(allocs, key=lambda a: (a.get("CreateIndex", 0), a["ID"])):
        marked = bool((a.get("DesiredTransition") or {}).get("Migrate"))
        now = (marked, a.get("DesiredStatus", ""), a.get("ClientStatus", ""))
        before = seen.get(a["ID"])
        if before is None and marked and now[2] in ("pending", "running"):
            before = (False, "run", now[2])  # moved since the drain began: say so
        seen[a["ID"]] = now
        if before is not None:
            _report_alloc_change(a["ID"], before, now)
        if a.get("ClientStatus") not in ("pending", "running"):
            continue
        if ignore_system and a["JobID"] not in job_types:
            try:
                job_types[a["JobID"]] = c.call("job.get", {"job_id": a["JobID"]})["data"].get("Type", "")
            except RPCError:
                job_types[a["JobID"]] = ""  # purged: its allocs stop
        if not (ignore_system and job_types.get(a["JobID"]) == "system"):
            moving += 1
    return moving


def _report_alloc_change(alloc_id: str, before: tuple[bool, str, str], now: tuple[bool, str, str]) -> None:
    """One line per change of an alloc's (migrate mark, desired status, client status)."""
    if now[0] and not before[0]:
        click.echo(f'{_stamp()}: Alloc "{alloc_id}" marked for migration')
    if now[1] != "run" and before[1] == "run":
        click.echo(f'{_stamp()}: Alloc "{alloc_id}" draining')
    if now[2] != before[2]:
        click.echo(f'{_stamp()}: Alloc "{alloc_id}" status {before[2]} -> {now[2]}')
