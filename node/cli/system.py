"""``caravan system gc`` and ``caravan debug``: maintenance and debugging aids.

A forced GC can reap a large backlog, so it gets a long client timeout of
its own instead of the usual one.
"""

from __future__ import annotations

import click

from node.cli.common import client_options, emit, fail, make_ctx, rows
from node.wire.rpc_client import RPCClient

GC_TIMEOUT = 600.0  # a forced GC waits for every reap of a large backlog to commit


@click.group()
def debug() -> None:
    """Debugging aids."""


@debug.command("digest")
@client_options
def debug_digest(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """The state digest and the index it reflects (equal on converged replicas)."""
    c = make_ctx(address, token, as_json, stale)
    out = c.call("debug.digest")
    emit(c, {"digest": out["digest"], "index": out["index"]}, lambda d: f"{d['digest']}  index {d['index']}")


@click.group()
def system() -> None:
    """System maintenance."""


@system.command("gc")
@click.option("--detach", is_flag=True, help="Return at once; the leader collects in the background.")
@click.option("--dry-run", is_flag=True, help="List what a forced GC would remove; change nothing.")
@client_options
def system_gc(detach: bool, dry_run: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Garbage-collect now: every collector, time thresholds zero, node GC last (management token)."""
    if detach and dry_run:
        fail("--detach and --dry-run cannot be combined: a dry run writes nothing to wait for")
    c = make_ctx(address, token, as_json)
    with RPCClient(c.addresses, token=c.token, timeout=GC_TIMEOUT) as client:
        out = client.call("system.gc", {"detach": detach, "dry_run": dry_run})
    if as_json:
        emit(c, out, str)
        return
    if out.get("Detached"):
        click.echo(f"Garbage collection started on the leader (state at index {out['Index']})")
        return
    counts = [{"Kind": kind, "Count": n} for kind, n in out["Collected"].items()]
    if dry_run:
        click.echo(f"Dry run at index {out['Index']}; nothing was changed. A forced GC would remove:")
        click.echo(rows(counts, [("Kind", "Kind"), ("Count", "Count")]))
        for kind, ids in out["IDs"].items():
            if ids:
                click.echo(f"\n{kind}\n  " + "\n  ".join(ids))
        if out.get("Truncated"):
            click.echo("\n(id lists are truncated; the counts are complete)")
        return
    click.echo(f"Garbage collected at index {out['Index']} ({out['Entries']} reap entries, {out['Skipped']} skipped):")
    click.echo(rows(counts, [("Kind", "Kind"), ("Count", "Count")]))
