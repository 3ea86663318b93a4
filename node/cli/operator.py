"""``caravan operator``: raft peers and leadership, and state snapshots.

``snapshot save`` writes ``FILE.partial`` and renames it only once the
file verifies, so a FILE that exists is always a whole snapshot.
``snapshot restore`` seeds stopped servers through ``node.devcluster_restore``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from node.cli.common import client_options, emit, fail, make_ctx, rows
from node.wire.rpc_client import RPCClient


@click.group()
def operator() -> None:
    """Cluster operations."""


@operator.group()
def raft() -> None:
    """Raft peers and leadership."""


@raft.command("list-peers")
@client_options
def raft_list_peers(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json)
    emit(c, c.call("operator.raft.peers"), lambda d: rows(d, [("Node", "ID"), ("Raft Address", "RaftAddress"), ("RPC Address", "RPCAddress"), ("Leader", "Leader"), ("Voter", "Voter")]))


@raft.command("transfer-leadership")
@click.option("--to", "target", default=None, help="Server id or address to hand leadership to (default: any).")
@client_options
def raft_transfer(target: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json)
    out = c.call("operator.raft.transfer", {"to": target} if target else {})
    emit(c, out, lambda d: f"Leadership transferred to {d['Leader']}")


@operator.group()
def snapshot() -> None:
    """Save, inspect and restore state snapshots."""


def partial_path(path: str) -> str:
    """Where ``snapshot save`` writes before the file verifies and is renamed to ``path``."""
    return str(Path(path)) + ".partial"


@snapshot.command("save")
@click.argument("file")
@client_options
def snapshot_save(file: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Save a consistent snapshot of the cluster to FILE (management token)."""
    from snapshot import inspect as inspect_file

    c = make_ctx(address, token, as_json)
    leader = c.call("status")["Leader"] or c.addresses[0]
    partial = partial_path(file)
    try:
        with open(partial, "wb") as out, RPCClient([leader], token=token, timeout=60) as client:
            for item in client.stream("operator.snapshot.save", {}):
                if "chunk" in item:
                    out.write(item["chunk"])
            out.flush()
            os.fsync(out.fileno())
        info = inspect_file(partial)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    os.replace(partial, file)
    emit(c, info.to_json() | {"Path": file}, lambda d: f"Saved snapshot of index {d['Index']} (term {d['Term']}, {d['Size']} bytes) to {file}")


@snapshot.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def snapshot_inspect(file: str, as_json: bool) -> None:
    """Show a snapshot's ID, size, index, term, version and per-type counts (also reads raft.dump)."""
    from snapshot import SnapshotError, format_info
    from snapshot import inspect as inspect_file

    try:
        info = inspect_file(file)
    except SnapshotError as exc:
        fail(str(exc))
    click.echo(json.dumps(info.to_json(), indent=2) if as_json else format_info(info))


@snapshot.command("restore")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--dir", "directory", default=None, help="A local cluster directory (caravan cluster up): stop, seed every server, start.")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False), help="One stopped server's config: seed its data dir (run on every server).")
@click.option("--keep-backup", is_flag=True, help="Keep the pre-restore data directories (local cluster).")
def snapshot_restore(file: str, directory: str | None, config_file: str | None, keep_backup: bool) -> None:
    """Bring servers to FILE's state (servers are stopped while seeded; see node/snapshots.py)."""
    from node import devcluster_restore as seeding
    from snapshot import SnapshotError

    if (directory is None) == (config_file is None):
        fail("give exactly one of --dir (a local cluster) or --config (one stopped server)")
    try:
        if directory is not None:
            out = seeding.restore_local_cluster(file, directory)
            if not keep_backup:
                seeding.clean_backups(out["backups"])
            click.echo(f"Restored {directory} to index {out['index']}; servers restarted")
        else:
            from node.core.config import ConfigError, ServerConfig

            try:
                config = ServerConfig.load(config_file)
            except ConfigError as exc:
                fail(str(exc))
            info = seeding.seed_server(file, str(config.data_dir), [s.raft_addr for s in config.servers])
            click.echo(f"Seeded {config.node_id} ({config.data_dir}) at index {info['Index']}; start it with caravan agent")
    except SnapshotError as exc:
        fail(str(exc))
