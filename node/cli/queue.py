"""``caravan queue`` and ``caravan priority-class``: Kueue's ClusterQueues and WorkloadPriorityClasses.

A queue file (HCL or JSON, ``node.spec.queues``) is read and checked here
in full before anything is sent, so a file with one bad queue changes
nothing; the servers check every record again. ``queue status`` answers the
question a team asks ("how much of my quota is used, borrowed, lent?") and
``queue pending`` the one a user asks ("which place is my job in?"); both,
like every list, page through the server's answers (``node.cli.paging``)
and print JSON with the same names as the HTTP API under ``--json``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from tabulate import tabulate

from fsm import codec
from fsm.queues import STOP_HOLD, STOP_HOLD_AND_DRAIN, STOP_NONE, Queue
from node.cli.common import Ctx, blocking_options, client_options, emit, fail, kv, make_ctx
from node.cli.paging import emit_list, list_options
from node.spec.queues import (
    QueueSpecError,
    pending_to_json,
    priority_class_row_to_json,
    queue_row_to_json,
    queue_status_to_json,
    read_priority_classes,
    read_queues,
)


def _nomad_json(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Nomad's single-dash ``-json`` beside Caravan's ``--json``."""
    return click.option("-json", "nomad_json", is_flag=True, hidden=True)(fn)


def _ctx(
    address: str, token: str | None, as_json: bool, nomad_json: bool, stale: bool = False
) -> Ctx:
    return make_ctx(address, token, as_json or nomad_json, stale)


def _index(out: dict[str, Any]) -> Any:
    """A write's index, however the answer spells it."""
    return out.get("index", out.get("Index"))


def _read_file(path: str, kind: str) -> tuple[str, str]:
    """(text, source name) of a definition file (- for stdin); one line on failure."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        fail(f"{path}: cannot read the {kind} definition: {reason}")
    return text, "stdin" if path == "-" else path


# -- queue ------------------------------------------------------------------------------
@click.group("queue")
def queue_group() -> None:
    """Queues with cohorts: quotas, borrowing and lending, admission (Kueue's ClusterQueues)."""


@queue_group.command("apply")
@click.argument("file")
@_nomad_json
@client_options
def queue_apply(
    file: str, nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Create or replace the queues in FILE (HCL queue blocks or JSON; - reads stdin).

    Every queue in the file is checked before any is sent: a bad file changes nothing.
    """
    text, source = _read_file(file, "queue")
    try:
        queues = read_queues(text, source)
    except QueueSpecError as exc:
        fail(str(exc))
    c = _ctx(address, token, as_json, nomad_json)
    applied = []
    for queue in queues:
        out = c.call("queue.upsert", {"queue": codec.to_wire(queue)})
        applied.append({"Name": queue.name, "Index": _index(out)})
    emit(
        c,
        applied,
        lambda d: "\n".join(
            f'Successfully applied queue "{a["Name"]}" (index {a["Index"]})' for a in d
        ),
    )


def _usage(ledger: dict[str, dict[str, Any]]) -> str:
    """A queue's ledger in one cell: used/nominal per resource, and what is borrowed."""
    parts = []
    for resource, row in ledger.items():
        text = f"{resource} {row.get('used', 0)}/{row.get('nominal', 0)}"
        if row.get("borrowed"):
            text += f" (+{row['borrowed']} borrowed)"
        parts.append(text)
    return ", ".join(parts)


QUEUE_COLUMNS = [
    ("Name", "name"),
    ("Cohort", "cohort"),
    ("Strategy", "queueing_strategy"),
    ("Stop Policy", "stop_policy"),
    ("Admitted", "admitted"),
    ("Pending", "pending"),
    ("Usage", "usage"),
]


@queue_group.command("list")
@list_options
@blocking_options
@_nomad_json
@client_options
def queue_list(
    filter_expr: str | None,
    per_page: int | None,
    page_token: str | None,
    nomad_json: bool,
    address: str,
    token: str | None,
    as_json: bool,
    stale: bool,
) -> None:
    """Queues with their counts and usage, every page as it arrives."""
    c = _ctx(address, token, as_json, nomad_json, stale)
    emit_list(
        c,
        "queue.list",
        {},
        QUEUE_COLUMNS,
        lambda r: {**r, "usage": _usage(r.get("ledger") or {})},
        filter_expr=filter_expr,
        per_page=per_page,
        page_token=page_token,
        json_row=queue_row_to_json,
    )


@queue_group.command("status")
@click.argument("name")
@blocking_options
@_nomad_json
@client_options
def queue_status(
    name: str, nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Queue NAME: its settings, its ledger (used, borrowed, lent per resource), admitted and pending counts."""
    c = _ctx(address, token, as_json, nomad_json, stale)
    answer = c.read_answer("queue.get", {"name": name})
    data = answer.get("data", answer)
    if c.as_json:
        emit(c, queue_status_to_json(data), str)
        return
    click.echo(_status_text(codec.from_wire(Queue, data["queue"], "queue"), data))


def _limit_text(value: int | None, unset: str) -> str:
    return unset if value is None else str(value)


def _status_text(queue: Queue, data: dict[str, Any]) -> str:
    """Settings, then the ledger table, then the counts (``queue status``)."""
    settings = {
        "Name": queue.name,
        "Cohort": queue.cohort or "<none>",
        "Queueing Strategy": queue.queueing_strategy,
        "Stop Policy": queue.stop_policy,
        "Reclaim Within Cohort": queue.reclaim_within_cohort,
        "Within Queue": queue.within_queue,
        "Description": queue.description,
        "Create Index": queue.create_index,
        "Modify Index": queue.modify_index,
    }
    head = kv(settings, [(k, k) for k in settings if k != "Description" or queue.description])
    counts = kv(
        {"Admitted": data.get("admitted", 0), "Pending": data.get("pending", 0)},
        [("Admitted", "Admitted"), ("Pending", "Pending")],
    )
    return f"{head}\n\nLedger\n{_ledger_table(queue, data.get('ledger') or {})}\n\n{counts}"


LEDGER_HEADERS = [
    "Resource",
    "Nominal",
    "Borrowing limit",
    "Lending limit",
    "Used",
    "Borrowed",
    "Lent",
]


def _ledger_table(queue: Queue, ledger: dict[str, dict[str, Any]]) -> str:
    """One row per resource, in the queue's order; unset limits as what they mean (Kueue's)."""
    listed = [q.name for q in queue.resources]
    body = []
    for resource in listed + sorted(set(ledger) - set(listed)):
        row = ledger.get(resource, {})
        limit = queue.limit(resource)
        borrowing = row.get("borrowing_limit", limit.borrowing_limit if limit else None)
        lending = row.get("lending_limit", limit.lending_limit if limit else None)
        body.append(
            [
                resource,
                row.get("nominal", limit.nominal if limit else 0),
                _limit_text(borrowing, "unlimited" if queue.cohort else "-"),
                _limit_text(lending, "all" if queue.cohort else "-"),
                row.get("used", 0),
                row.get("borrowed", 0),
                row.get("lent", 0),
            ]
        )
    if not body:
        return "No resources (nothing is limited)"
    return tabulate(body, headers=LEDGER_HEADERS, tablefmt="plain")


@queue_group.command("delete")
@click.argument("name")
@_nomad_json
@client_options
def queue_delete(
    name: str, nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Delete queue NAME."""
    c = _ctx(address, token, as_json, nomad_json)
    out = c.call("queue.delete", {"name": name})
    emit(
        c,
        {"Name": name, "Index": _index(out)},
        lambda d: f'Successfully deleted queue "{name}" (index {d["Index"]})',
    )


_STOPS = {  # verb: (Kueue's stop policy, what the command prints, its help)
    "hold": (
        STOP_HOLD,
        "held: new workloads stay pending, admitted ones keep running",
        "Stop admitting to queue NAME (stop policy Hold); admitted workloads keep running.",
    ),
    "drain": (
        STOP_HOLD_AND_DRAIN,
        "held and draining: admitted workloads are evicted back to pending",
        "Stop queue NAME and evict what it admitted (stop policy HoldAndDrain); they return to pending.",
    ),
    "resume": (
        STOP_NONE,
        "resumed: pending workloads are admitted again",
        "Admit to queue NAME again (stop policy None).",
    ),
}


def _stop_command(verb: str) -> None:
    """``queue hold|drain|resume NAME``: one ``queue.stop`` call with Kueue's stop policy."""
    policy, said, help_text = _STOPS[verb]

    @queue_group.command(verb, help=help_text)
    @click.argument("name")
    @_nomad_json
    @client_options
    def command(
        name: str, nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool
    ) -> None:
        c = _ctx(address, token, as_json, nomad_json)
        out = c.call("queue.stop", {"name": name, "policy": policy})
        data = {"Name": name, "StopPolicy": policy, "Index": _index(out)}
        emit(c, data, lambda d: f'Queue "{name}" {said} (index {d["Index"]})')


for _verb in _STOPS:
    _stop_command(_verb)


PENDING_COLUMNS = [
    ("Position", "position"),
    ("Job", "job"),
    ("Priority", "priority"),
    ("Class", "priority_class"),
    ("Reason", "reason"),
    ("Last Eviction", "eviction"),
]


def _pending_row(row: dict[str, Any]) -> dict[str, Any]:
    namespace = row.get("namespace") or "default"
    job = (
        row.get("job_id", "") if namespace == "default" else f"{namespace}/{row.get('job_id', '')}"
    )
    last = row.get("last_eviction") or {}
    return {**row, "job": job, "eviction": last.get("message", "")}


@queue_group.command("pending")
@click.argument("name")
@list_options
@blocking_options
@_nomad_json
@client_options
def queue_pending(
    name: str,
    filter_expr: str | None,
    per_page: int | None,
    page_token: str | None,
    nomad_json: bool,
    address: str,
    token: str | None,
    as_json: bool,
    stale: bool,
) -> None:
    """Queue NAME's pending workloads in admission order: position, priority, class, reason."""
    c = _ctx(address, token, as_json, nomad_json, stale)
    emit_list(
        c,
        "queue.pending",
        {"name": name},
        PENDING_COLUMNS,
        _pending_row,
        filter_expr=filter_expr,
        per_page=per_page,
        page_token=page_token,
        json_row=pending_to_json,
    )


# -- priority-class ---------------------------------------------------------------------
@click.group("priority-class")
def priority_class_group() -> None:
    """Priority classes: a name and a value that order admission and preemption (not placement)."""


@priority_class_group.command("apply")
@click.argument("file")
@_nomad_json
@client_options
def priority_class_apply(
    file: str, nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Create or replace the priority classes in FILE (HCL priority_class blocks or JSON; - reads stdin)."""
    text, source = _read_file(file, "priority class")
    try:
        classes = read_priority_classes(text, source)
    except QueueSpecError as exc:
        fail(str(exc))
    c = _ctx(address, token, as_json, nomad_json)
    applied = []
    for pc in classes:
        out = c.call("priority_class.upsert", {"priority_class": codec.to_wire(pc)})
        applied.append({"Name": pc.name, "Value": pc.value, "Index": _index(out)})
    emit(
        c,
        applied,
        lambda d: "\n".join(
            f'Successfully applied priority class "{a["Name"]}" = {a["Value"]} (index {a["Index"]})'
            for a in d
        ),
    )


@priority_class_group.command("list")
@list_options
@blocking_options
@_nomad_json
@client_options
def priority_class_list(
    filter_expr: str | None,
    per_page: int | None,
    page_token: str | None,
    nomad_json: bool,
    address: str,
    token: str | None,
    as_json: bool,
    stale: bool,
) -> None:
    """Priority classes, every page as it arrives."""
    c = _ctx(address, token, as_json, nomad_json, stale)
    columns = [("Name", "name"), ("Value", "value"), ("Description", "description")]
    emit_list(
        c,
        "priority_class.list",
        {},
        columns,
        filter_expr=filter_expr,
        per_page=per_page,
        page_token=page_token,
        json_row=priority_class_row_to_json,
    )


@priority_class_group.command("delete")
@click.argument("name")
@_nomad_json
@client_options
def priority_class_delete(
    name: str, nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Delete priority class NAME."""
    c = _ctx(address, token, as_json, nomad_json)
    out = c.call("priority_class.delete", {"name": name})
    emit(
        c,
        {"Name": name, "Index": _index(out)},
        lambda d: f'Successfully deleted priority class "{name}" (index {d["Index"]})',
    )
