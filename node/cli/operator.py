"""``caravan operator``: raft peers and leadership, state snapshots, and the scheduler configuration.

``snapshot save`` writes ``FILE.partial`` and renames it only once the
file verifies, so a FILE that exists is always a whole snapshot.
``snapshot restore`` seeds stopped servers through ``node.devcluster_restore``.
``scheduler get-config`` / ``set-config`` are Nomad's, with Caravan's
placement policy beside them: set-config reads the configuration, changes
what its flags say, and writes the whole of it back (as Nomad's does), with
``-check-index`` making that write a compare-and-set.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from node.cli.common import Ctx, client_options, emit, fail, make_ctx, rows
from node.cli.progress import FileReads, Reporter, interval, watching
from node.wire.rpc_client import RPCClient
from scheduler.policy import ALGORITHMS, PolicyError
from scheduler.policy_json import (
    parse_preference,
    parse_validation,
    preference_text,
    switch_algorithm,
)

GET_CONFIG, SET_CONFIG = "operator.scheduler.get_config", "operator.scheduler.set_config"


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


@raft.command("remove-peer")
@click.option("--id", "peer_id", default=None, help="Id of the server to remove (see list-peers).")
@click.option("--peer-address", "peer_address", default=None, help="Its raft or RPC address, instead of --id.")
@client_options
def raft_remove_peer(
    peer_id: str | None, peer_address: str | None, address: str, token: str | None, as_json: bool, stale: bool
) -> None:
    """Remove a server from the raft configuration, as one committed entry (management token)."""
    if bool(peer_id) == bool(peer_address):
        fail("name the server to remove with exactly one of --id or --peer-address")
    c = make_ctx(address, token, as_json)
    args = {"id": peer_id} if peer_id else {"address": peer_address}
    out = c.call("operator.raft.remove_peer", args, timeout=30.0)
    emit(c, out, lambda d: f"Removed peer {d['Removed']['id']} ({d['Removed']['raft']}); "
         f"voters now: {', '.join(m['id'] for m in d['Members'])}")


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
        with Reporter("snapshot save", unit="bytes") as progress:
            _stream_snapshot(leader, token, partial, progress)
            progress.say(f"verifying {partial}")
            info = inspect_file(partial)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    os.replace(partial, file)
    emit(c, info.to_json() | {"Path": file}, lambda d: f"Saved snapshot of index {d['Index']} (term {d['Term']}, {d['Size']} bytes) to {file}")


def _stream_snapshot(leader: str, token: str | None, partial: str, progress: Reporter) -> None:
    """Write the leader's snapshot stream to ``partial``, counting bytes as they arrive.

    The server sends no total ahead (it streams as it reads its store), so
    the progress is bytes and rate; a watcher repeats the count while the
    leader is still preparing the first chunk.
    """
    with (
        open(partial, "wb") as out,
        RPCClient([leader], token=token, timeout=60) as client,
        watching(lambda: progress.update(progress.done), interval()),
    ):
        for item in client.stream("operator.snapshot.save", {}):
            if "chunk" in item:
                out.write(item["chunk"])
                progress.advance(len(item["chunk"]))
        out.flush()
        os.fsync(out.fileno())


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
    from snapshot import SnapshotError

    if (directory is None) == (config_file is None):
        fail("give exactly one of --dir (a local cluster) or --config (one stopped server)")
    try:
        with _restore_progress(file, directory):
            message = _restore(file, directory, config_file, keep_backup)
    except SnapshotError as exc:
        fail(str(exc))
    click.echo(message)


def _restore(file: str, directory: str | None, config_file: str | None, keep_backup: bool) -> str:
    """Seed the servers from FILE; what was done, in one line."""
    from node import devcluster_restore as seeding

    if directory is not None:
        out = seeding.restore_local_cluster(file, directory)
        if not keep_backup:
            seeding.clean_backups(out["backups"])
        return f"Restored {directory} to index {out['index']}; servers restarted"
    from node.core.config import ConfigError, ServerConfig

    try:
        config = ServerConfig.load(config_file)
    except ConfigError as exc:
        fail(str(exc))
    info = seeding.seed_server(file, str(config.data_dir), [s.raft_addr for s in config.servers])
    return f"Seeded {config.node_id} ({config.data_dir}) at index {info['Index']}; start it with caravan agent"


def _expected_passes(directory: str | None) -> int:
    """How often a restore reads FILE: once to check it, then twice per server (verify, load)."""
    from node import devcluster as cl

    if directory is None:
        return 2
    try:
        return 1 + 2 * len(cl.Cluster.load(directory).nodes)
    except Exception:  # noqa: BLE001 - the restore itself says what is wrong with DIR
        return 3


@contextlib.contextmanager
def _restore_progress(file: str, directory: str | None) -> Iterator[None]:
    """Bytes of FILE read so far over every pass of the restore, observed from outside it.

    The seeding code reports nothing while it runs (see ``FileReads``);
    more passes than expected just extend the total.
    """
    if not os.path.isfile(file):
        yield  # the restore refuses it with its own message
        return
    reads, passes = FileReads(file), _expected_passes(directory)
    progress = Reporter("snapshot restore", unit="bytes", total=reads.size * passes)

    def poll() -> None:
        done = reads.total_read()
        note = f"pass {min(reads.passes + 1, passes)} of {passes}"
        progress.update(done, total=max(progress.total or 0, done), note=note)

    with progress, watching(poll, min(interval(), 0.5)):
        yield
        progress.update(progress.total or 0)  # every pass finished, even those too quick to see


@operator.group()
def scheduler() -> None:
    """The scheduler configuration: the placement policy every server schedules with."""


def _nomad_json(fn: Any) -> Any:
    """Nomad's single-dash ``-json`` beside Caravan's ``--json``."""
    return click.option("-json", "nomad_json", is_flag=True, hidden=True)(fn)


@scheduler.command("get-config")
@_nomad_json
@client_options
def scheduler_get_config(nomad_json: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Show the scheduler configuration (read token; --stale reads this server's copy)."""
    c = make_ctx(address, token, as_json or nomad_json, stale)
    emit(c, c.call(GET_CONFIG)["data"]["SchedulerConfig"], _config_table)


def _config_table(cfg: dict[str, Any]) -> str:
    placement = cfg["PlacementPolicy"]
    cluster_top = placement["ClusterTop"]
    lines = [
        ("Scheduler Algorithm", cfg["SchedulerAlgorithm"]),
        ("Validation Rules", ", ".join(placement["Validation"])),
        ("Preference Rules", preference_text(placement["Preference"]) or "(none: ties broken at random)"),
        ("Cluster Top", f"{cluster_top}" if cluster_top else "0 (two-level selection off)"),
        ("Top-K Max", str(placement["TopKMax"])),
        ("Memory Oversubscription", "false"),
        ("Preemption", "false (Caravan's schedulers do not preempt by job type)"),
        ("Create Index", str(cfg["CreateIndex"])),
        ("Modify Index", str(cfg["ModifyIndex"])),
    ]
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}} = {value}" for label, value in lines)


@scheduler.command("set-config")
@click.option("--scheduler-algorithm", "-scheduler-algorithm", "algorithm", default=None, metavar="binpack|spread",
              help="binpack packs nodes tightly (best-fit); spread leaves them as empty as possible (worst-fit).")
@click.option("--check-index", "-check-index", "check_index", default=None, metavar="N",
              help="Only update if the configuration's ModifyIndex is still N (0: never set).")
@click.option("--validation", default=None, metavar="RULES", help="Validation rules in order, e.g. node-status,resources.")
@click.option("--preference", default=None, metavar="RULES",
              help="Preference rules in priority order, with buckets, e.g. best-fit:3,job-anti-affinity.")
@click.option("--cluster-top", default=None, metavar="N", help="Clusters kept by two-level selection (0: off).")
@click.option("--top-k-max", default=None, metavar="N", help="Most candidates a worker picks among when plans conflict.")
@_nomad_json
@client_options
def scheduler_set_config(algorithm: str | None, check_index: str | None, validation: str | None, preference: str | None,
                         cluster_top: str | None, top_k_max: str | None, nomad_json: bool,
                         address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Change the scheduler configuration (management token); flags left out keep their values."""
    c = make_ctx(address, token, as_json or nomad_json)
    cas = None if check_index is None else _whole(check_index, "-check-index")
    if algorithm is not None and algorithm not in ALGORITHMS:
        fail(f"-scheduler-algorithm must be binpack or spread, not {algorithm!r}")
    changes: dict[str, Any] = {}
    try:
        if validation is not None:
            changes["Validation"] = parse_validation(validation)
        if preference is not None:
            changes["Preference"] = parse_preference(preference)
    except PolicyError as exc:
        fail(str(exc))
    if cluster_top is not None:
        changes["ClusterTop"] = _whole(cluster_top, "--cluster-top")
    if top_k_max is not None:
        changes["TopKMax"] = _whole(top_k_max, "--top-k-max")
    if algorithm is None and not changes:
        fail("say what to change: -scheduler-algorithm, --validation, --preference, --cluster-top or --top-k-max")
    out = _set(c, _merged(c, algorithm, changes), cas)
    emit(c, out, lambda d: f"Scheduler configuration updated! (index {d['Index']})")


def _whole(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        fail(f"{flag} must be a whole number, not {text!r}")
    if value < 0:
        fail(f"{flag} must be >= 0")
    return value


def _merged(c: Ctx, algorithm: str | None, changes: dict[str, Any]) -> dict[str, Any]:
    """The whole configuration to write: the current one with the flags' changes (Nomad's set-config merges alike)."""
    current = c.call(GET_CONFIG)["data"]["SchedulerConfig"]
    placement = {**current["PlacementPolicy"], **changes}
    body: dict[str, Any] = {"PlacementPolicy": placement}
    if algorithm is not None:
        body["SchedulerAlgorithm"] = algorithm
        if "Preference" not in changes:
            try:
                placement["Preference"] = switch_algorithm(placement["Preference"], algorithm)
            except PolicyError as exc:
                fail(str(exc))
    return body


def _set(c: Ctx, body: dict[str, Any], cas: int | None) -> dict[str, Any]:
    args: dict[str, Any] = {"config": body}
    if cas is not None:
        args["cas_index"] = cas
    out = c.call(SET_CONFIG, args)
    if not out["Updated"]:
        fail(
            f"Scheduler configuration could not be atomically updated: its ModifyIndex is {out['ModifyIndex']}, "
            f"not {cas}; read it again (caravan operator scheduler get-config) and retry"
        )
    return out
