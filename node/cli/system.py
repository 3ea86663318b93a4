"""``caravan system gc`` and ``caravan debug``: maintenance and debugging aids.

A forced GC can reap a large backlog, so it gets a long client timeout of
its own instead of the usual one, and shows progress: the RPC answers only
at the end, so the CLI counts what is left to collect (a dry run, which
changes nothing) before and while the GC runs.
"""

from __future__ import annotations

from typing import Any

import click

from node.cli.common import Ctx, client_options, emit, fail, make_ctx, rows
from node.cli.progress import Reporter, interval, watching
from node.wire.errors import RPCError
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
    if detach or dry_run:
        with RPCClient(c.addresses, token=c.token, timeout=GC_TIMEOUT) as client:
            out = client.call("system.gc", {"detach": detach, "dry_run": dry_run})
    else:
        out = _forced_gc_with_progress(c)
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


def _collectable(client: RPCClient) -> int | None:
    """How many objects a forced GC would remove now (a dry run); None when it cannot say."""
    try:
        out = client.call("system.gc", {"dry_run": True})
    except RPCError:
        return None
    return sum(out.get("Collected", {}).values())


def _forced_gc_with_progress(c: Ctx) -> dict[str, Any]:
    """Run the forced GC, reporting objects collected so far on stderr.

    Progress is the drop in the collectable count, polled by a watcher on
    its own connection while the GC call waits; the answer's counts close it.
    """
    with RPCClient(c.addresses, token=c.token, timeout=GC_TIMEOUT) as client:
        total = _collectable(client)
        with Reporter("system gc", unit="objects", total=total or None) as progress:
            with RPCClient(c.addresses, token=c.token, timeout=GC_TIMEOUT) as watcher:

                def poll() -> None:
                    left = _collectable(watcher)
                    if total is not None and left is not None:
                        progress.update(max(0, total - left))
                    else:
                        progress.update(progress.done)

                with watching(poll, interval()):
                    out = client.call("system.gc", {"detach": False, "dry_run": False})
            collected = sum(out.get("Collected", {}).values())
            progress.update(collected, total=max(total or 0, collected))
    return out
