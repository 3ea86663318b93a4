"""``caravan event stream``: the change journal as NDJSON.

It follows the journal from any server and resumes on another when one
goes away, so a script can keep a copy of every change in order.
"""

from __future__ import annotations

import json
import sys

import click

from node.cli.common import DEFAULT_ADDRESS, fail, make_ctx


@click.group()
def event() -> None:
    """The change journal: every change, in order, from any server."""


@event.command("stream")
@click.option("--index", "index", type=int, default=0, show_default=True,
              help="Deliver batches AFTER this index (exclusive): the last index you received; 0 = oldest retained.")
@click.option("--topic", "topics", multiple=True,
              help="Topic or Topic:Key (Job, Evaluation, Allocation, Deployment, Node, ACLToken; * = all). Repeatable.")
@click.option("--heartbeat", type=float, default=10.0, show_default=True, help="Seconds of quiet before a progress notification.")
@click.option("--progress", "show_progress", is_flag=True, help='Also print progress notifications as {"Progress": N}.')
@click.option("--limit", type=int, default=0, help="Exit after printing this many batches (0: never).")
@click.option("--no-follow", is_flag=True, help="Exit once caught up with the journal's tail.")
@click.option("--token", envvar="CARAVAN_TOKEN", default=None, help="ACL secret (env CARAVAN_TOKEN).")
@click.option("--address", envvar="CARAVAN_ADDRESS", default=DEFAULT_ADDRESS, show_default=True,
              help="Server RPC address(es), comma-separated (env CARAVAN_ADDRESS); any server will do.")
def event_stream(index: int, topics: tuple[str, ...], heartbeat: float, show_progress: bool, limit: int,
                 no_follow: bool, token: str | None, address: str) -> None:
    """Print journal batches as NDJSON, one batch per line; resumes on another server if one goes away."""
    from node.wire.events import follow, record_events

    if index < 0:
        fail("--index must be >= 0 (the last index you received)")
    if limit < 0:
        fail("--limit must be >= 0")
    c = make_ctx(address, token, True)
    printed = 0
    try:
        for item in follow(c.addresses, index=index, topics=list(topics), heartbeat=heartbeat, token=token):
            if "index" in item:
                line = {"Index": item["index"], "Events": record_events(item["index"], item["events"])}
                click.echo(json.dumps(line, sort_keys=True, default=repr))
                printed += 1
                if limit and printed >= limit:
                    return
            elif show_progress:
                click.echo(json.dumps({"Progress": item["progress"]}))
            if no_follow and "progress" in item:
                return
    except KeyboardInterrupt:
        sys.exit(130)
