"""The simulated client's alloc GC settings (``caravan client sim --gc-*``) and ``caravan client gc``.

The settings carry Nomad's client names and defaults (``gc_interval``,
``gc_max_allocs``, ``gc_disk_usage_threshold``, ``gc_inode_usage_threshold``,
``gc_parallel_destroys``). ``client gc`` forces a GC now: of one node, of one
alloc on its node, or of every node (Nomad's ``PUT /v1/client/gc`` and
``/v1/client/allocation/:id/gc``); the request is replicated and reaches the
clients on their event streams, so it answers once it is committed, not once
the clients have collected (as Nomad's forced GC, asynchronous).
"""

from __future__ import annotations

from typing import Any

import click

from node.cli.common import client_options, emit, fail, make_ctx

#: The data dir, the node's disk, and Nomad's client GC settings, as ``client sim`` options.
GC_OPTIONS = [
    click.option(
        "--data-dir",
        default="",
        help="Alloc directories go under DIR/<node id>/alloc "
        "(default: a temporary directory, removed on exit).",
    ),
    click.option(
        "--disk",
        type=click.IntRange(1),
        default=10240,
        show_default=True,
        help="Disk of each node (MB): its DiskMB, and what GC disk usage is a percentage of.",
    ),
    click.option(
        "--inodes",
        type=click.IntRange(1),
        default=655360,
        show_default=True,
        help="Inodes of each node: what GC inode usage is a percentage of.",
    ),
    click.option(
        "--gc-interval", default="1m", show_default=True, help="How often each node's GC runs."
    ),
    click.option(
        "--gc-max-allocs",
        type=click.IntRange(1),
        default=50,
        show_default=True,
        help="Allocs (live and terminal) a node keeps before its GC evicts terminal ones.",
    ),
    click.option(
        "--gc-disk-usage-threshold",
        type=click.FloatRange(0, 100),
        default=80.0,
        show_default=True,
        help="Disk usage (percent) above which the GC evicts terminal allocs.",
    ),
    click.option(
        "--gc-inode-usage-threshold",
        type=click.FloatRange(0, 100),
        default=70.0,
        show_default=True,
        help="Inode usage (percent) above which the GC evicts terminal allocs.",
    ),
    click.option(
        "--gc-parallel-destroys",
        type=click.IntRange(1),
        default=2,
        show_default=True,
        help="Alloc directories a node's GC removes at once.",
    ),
    click.option(
        "--gc-report-interval",
        default="10s",
        show_default=True,
        help="How often a node whose kept allocs changed re-registers with client.gc.* "
        "attributes (shown by 'caravan node status'); 0: never.",
    ),
]


def gc_options(fn: Any) -> Any:
    """Add ``GC_OPTIONS`` to a command (``client sim``)."""
    for option in reversed(GC_OPTIONS):
        fn = option(fn)
    return fn


def gc_settings(values: dict[str, Any]) -> dict[str, Any]:
    """``SimConfig`` fields from the ``gc_options`` values; a bad one ends the command with one line."""
    from client.gc import GCConfig, GCConfigError

    try:
        cfg = GCConfig(
            interval=_seconds(values["gc_interval"], "--gc-interval"),
            max_allocs=values["gc_max_allocs"],
            disk_usage_threshold=values["gc_disk_usage_threshold"],
            inode_usage_threshold=values["gc_inode_usage_threshold"],
            parallel_destroys=values["gc_parallel_destroys"],
        )
    except GCConfigError as exc:
        fail(str(exc))
    report = _seconds(values["gc_report_interval"], "--gc-report-interval", allow_zero=True)
    return {
        "data_dir": values["data_dir"],
        "disk_mb": values["disk"],
        "inodes": values["inodes"],
        "gc": cfg,
        "gc_report_interval": report,
    }


def _seconds(value: str, flag: str, *, allow_zero: bool = False) -> float:
    """A Go duration flag ("1m", "500ms") in seconds."""
    from client.driver import DriverError, parse_duration

    try:
        seconds = parse_duration(value.strip(), flag)
    except DriverError as exc:
        fail(str(exc))
    if seconds <= 0 and not allow_zero:
        fail(f"{flag} must be longer than 0s")
    return seconds


@click.command("gc")
@click.option(
    "--node",
    "node_id",
    default="",
    help="Only this node (an ID or unique prefix); default: every node.",
)
@click.option(
    "--alloc",
    "alloc_id",
    default="",
    help="Only this terminal allocation (an ID or unique prefix), on its node.",
)
@client_options
def client_gc(
    node_id: str, alloc_id: str, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Garbage-collect terminal allocations on client nodes now (Nomad's PUT /v1/client/gc).

    Each node asked evicts its terminal allocations (oldest first), logging
    each eviction with reason "forced"; live allocations are kept. Needs
    node:write (--alloc: submit-job), as Nomad's client GC does.
    """
    if node_id and alloc_id:
        fail("give --node or --alloc, not both (an allocation's node is known)")
    c = make_ctx(address, token, as_json)
    if alloc_id:
        out = c.call("client.allocation.gc", {"alloc_id": alloc_id})
        emit(c, out, _alloc_text)
        return
    out = c.call("client.gc", {"node_id": node_id} if node_id else {})
    target = f"node {out['NodeID']}" if out["NodeID"] else "every node"
    emit(c, out, lambda d: f"Client GC requested from {target} (index {d['Index']})")


def _alloc_text(out: dict[str, Any]) -> str:
    text = f"Client GC of allocation {out['AllocID']} requested from node {out['NodeID']} (index {out['Index']})"
    if not out["Terminal"]:
        text += "\nNote: the allocation is not terminal; its node keeps it (only terminal allocations are collected)"
    return text


def node_gc_fields(node: dict[str, Any]) -> dict[str, str]:
    """What a node's client keeps, from its ``client.gc.*`` attributes, as ``node status`` lines ({} without them).

    The simulated client re-registers a node with these attributes after
    its kept allocs change (at most every ``--gc-report-interval``), so they
    are as of the node's last registration.
    """
    attrs = node.get("Attributes") or {}
    if "client.gc.allocs_held" not in attrs:
        return {}
    mb = 1 << 20
    held = attrs.get("client.gc.held", "")
    evicted = attrs.get("client.gc.evicted", "0")
    last = attrs.get("client.gc.last_eviction", "")
    return {
        "Allocs Held": f"{attrs['client.gc.allocs_held']} terminal"
        + (f" (oldest first: {held})" if held else ""),
        "Disk Used": f"{int(attrs.get('client.gc.disk_used_bytes', 0)) / mb:.1f} MB of "
        f"{int(attrs.get('client.gc.disk_bytes', 0)) // mb} MB ({attrs.get('client.gc.disk_used_percent', '0')}%)",
        "Inodes Used": f"{attrs.get('client.gc.inodes_used', '0')} of {attrs.get('client.gc.inodes', '0')} "
        f"({attrs.get('client.gc.inodes_used_percent', '0')}%)",
        "GC Evicted": evicted + (f" (last: {last})" if last else ""),
    }
