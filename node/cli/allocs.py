"""``caravan alloc``: allocations, and the allocation table ``job status`` shows too."""

from __future__ import annotations

from typing import Any

import click

from node.cli.common import blocking_options, client_options, emit, kv, make_ctx, rows, short


def alloc_rows(allocs: list[dict[str, Any]]) -> str:
    """Allocations as ``nomad alloc status`` lists them (short ids)."""
    return rows([{**a, "ID": short(a["ID"]), "NodeID": short(a["NodeID"])} for a in allocs],
                [("ID", "ID"), ("Node ID", "NodeID"), ("Task Group", "TaskGroup"), ("Version", "JobVersion"),
                 ("Desired", "DesiredStatus"), ("Status", "ClientStatus")])


@click.group()
def alloc() -> None:
    """Allocations."""


@alloc.command("list")
@click.option("--job", "job_id", default=None)
@click.option("--node", "node_id", default=None)
@blocking_options
@client_options
def alloc_list(job_id: str | None, node_id: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    args = {k: v for k, v in (("job_id", job_id), ("node_id", node_id)) if v}
    emit(c, c.read("alloc.list", args), alloc_rows)


@alloc.command("status")
@click.argument("alloc_id")
@blocking_options
@client_options
def alloc_status(alloc_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("alloc.get", {"alloc_id": alloc_id})
    emit(c, data, lambda d: kv(d, [("ID", "ID"), ("Eval ID", "EvalID"), ("Job ID", "JobID"), ("Node ID", "NodeID"),
                                    ("Task Group", "TaskGroup"), ("Desired Status", "DesiredStatus"),
                                    ("Client Status", "ClientStatus"), ("Client Description", "ClientDescription"),
                                    ("Modify Index", "ModifyIndex")]))
