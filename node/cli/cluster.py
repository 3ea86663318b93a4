"""``caravan dev`` and ``caravan cluster``: local clusters on this machine.

Both drive ``node.devcluster``, which starts each server (and the simulated
client beside ``dev``) as a process of its own; these commands only say
what happened and wait for Ctrl-C.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from node import devcluster as cl
from node.cli.common import emit, make_ctx, rows
from node.wire.rpc_client import RPCClient


@click.command()
@click.option("--dir", "directory", default=".caravan/dev", show_default=True, help="Where servers keep data and logs.")
@click.option("--nodes", default=3, show_default=True, type=click.Choice(["1", "3", "5"]), help="Number of servers.")
@click.option("--clients", default=3, show_default=True, type=click.IntRange(0, 1000),
              help="Simulated client nodes started beside the servers (0: none).")
def dev(directory: str, nodes: str, clients: int) -> None:
    """Run a local cluster in the foreground; Ctrl-C stops every server."""
    c = cl.up(directory, int(nodes))
    addresses = ",".join(c.rpc_addresses)
    sim = _start_dev_clients(c.dir, addresses, clients) if clients else None
    if sim is not None:
        c.client_pid = sim.pid  # so 'cluster down' stops it should this process be killed
        c.save()
        click.echo(f"Simulated client: {clients} node(s), pid {sim.pid}, log {Path(c.dir) / 'client-sim.log'}")
    _say_how_to_use(c, addresses)
    try:
        _wait_for_stop_signal()
    finally:
        final = cl.Cluster.load(c.dir)
        if sim is not None:
            click.echo("\nStopping the simulated client...")
            cl.stop_client(final)  # the pid recorded above; reaps our child too
        click.echo("\nStopping servers...")
        cl.down(final)
        click.echo("Stopped.")


def _say_how_to_use(c: cl.Cluster, addresses: str) -> None:
    """The servers ``dev`` started, and what to type in another terminal."""
    click.echo(f"Caravan dev cluster: {len(c.nodes)} servers in {c.dir}")
    click.echo(rows([{"id": n.id, "rpc": n.rpc_addr, "raft": n.raft_addr, "log": n.log_file} for n in c.nodes],
                    [("Server", "id"), ("RPC", "rpc"), ("Raft", "raft"), ("Log", "log")]))
    click.echo("\nIn another terminal:")
    click.echo(f"  export CARAVAN_ADDRESS={addresses}")
    click.echo("  caravan cluster status --dir " + c.dir)
    click.echo("  caravan job run examples/batch.json")
    click.echo("  caravan job status")
    click.echo("\nPress Ctrl-C to stop.")


def _wait_for_stop_signal() -> None:
    """Sleep until SIGINT, SIGTERM or SIGHUP.

    SIGHUP too: closing the terminal must not leave servers behind (they
    run in sessions of their own, so only this process hears it).
    """
    stop = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    while not stop["now"]:
        time.sleep(0.2)


def _start_dev_clients(directory: str, addresses: str, nodes: int) -> subprocess.Popen[bytes]:
    """``caravan client sim`` in the background, so jobs run in ``make run``."""
    return cl.launch(
        ["client", "sim", "--nodes", str(nodes), "--servers", addresses,
         "--name-prefix", "dev", "--state-file", str(Path(directory) / "client-sim.json")],
        Path(directory) / "client-sim.log",
    )


@click.group()
def cluster() -> None:
    """Start, inspect and break a local cluster (fault testing by hand)."""


def _dir_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--dir", "directory", default=".caravan/cluster", show_default=True, help="Cluster directory.")(fn)


@cluster.command("up")
@_dir_option
@click.option("--nodes", default="3", show_default=True, type=click.Choice(["1", "3", "5"]))
@click.option("--acl", is_flag=True, help="Bootstrap ACLs and print the management token.")
def cluster_up(directory: str, nodes: str, acl: bool) -> None:
    """Start servers in the background and wait for a leader."""
    c = cl.up(directory, int(nodes))
    addresses = ",".join(c.rpc_addresses)
    click.echo(f"Started {len(c.nodes)} servers in {c.dir} (state in {Path(c.dir) / cl.CLUSTER_FILE})")
    click.echo(f"export CARAVAN_ADDRESS={addresses}")
    if c.http_addresses:
        click.echo(f"export NOMAD_ADDR=http://{c.http_addresses[0]}")
    if acl and c.acl:
        click.echo("# ACLs were bootstrapped by an earlier 'cluster up --acl' of this directory: "
                   "export CARAVAN_TOKEN with the management token printed then")
    elif acl:
        with RPCClient(c.rpc_addresses) as client:
            token = client.call("acl.bootstrap", {})
        c.acl = True
        c.save()
        click.echo(f"export CARAVAN_TOKEN={token['SecretID']}")


@cluster.command("status")
@_dir_option
@click.option("--json", "as_json", is_flag=True)
def cluster_status(directory: str, as_json: bool) -> None:
    """One row per server: role, term, applied index, how busy its raft thread is, health."""
    c = cl.Cluster.load(directory)
    out = [_server_row(node) for node in c.nodes]
    c2 = make_ctx("", None, as_json)
    columns = ("Node", "Address", "PID", "Role", "Term", "AppliedIndex", "RaftBusy", "Healthy")
    emit(c2, out, lambda d: rows(d, [(k, k) for k in columns]))
    if not any(row["Role"] == "leader" for row in out):
        up = sum(1 for row in out if row["Role"] != "down")
        click.echo(
            f"Warning: no leader, so writes fail until one is elected; {up} of {len(out)} servers are up "
            f"and an election needs {len(out) // 2 + 1} (restart with 'caravan cluster restart NODE')",
            err=True,
        )


def _server_row(node: cl.ClusterNode) -> dict[str, Any]:
    """``cluster status``'s row of one server, asked over RPC when its process runs."""
    st = cl.status_of(node.rpc_addr) if cl.alive(node.pid) else None
    return {
        "Node": node.id,
        "Address": node.rpc_addr,
        "PID": node.pid if cl.alive(node.pid) else 0,
        "Role": (st or {}).get("Role", "down"),
        "Term": (st or {}).get("Term", ""),
        "AppliedIndex": (st or {}).get("AppliedIndex", ""),
        # How much of the last second its raft thread worked: near 100%, writes wait whole ticks.
        "RaftBusy": f"{st['RaftTickBusy']:.0%}" if st and "RaftTickBusy" in st else "",
        # Answering is not enough: a server that knows no leader cannot serve writes.
        "Healthy": bool(st and st.get("Leader")),
    }


@cluster.command("down")
@_dir_option
def cluster_down(directory: str) -> None:
    """Stop every server (SIGTERM, then SIGKILL after 15 s)."""
    cl.down(cl.Cluster.load(directory))
    click.echo("Stopped.")


@cluster.command("kill")
@_dir_option
@click.argument("node")
def cluster_kill(directory: str, node: str) -> None:
    """SIGKILL one server (as a crash would)."""
    c = cl.Cluster.load(directory)
    n = cl.kill(c, node)
    click.echo(f"Killed {n.id} (pid {n.pid})")


@cluster.command("restart")
@_dir_option
@click.argument("node")
def cluster_restart(directory: str, node: str) -> None:
    """Start a killed server again (or restart a running one)."""
    c = cl.Cluster.load(directory)
    n = cl.restart(c, node)
    click.echo(f"Started {n.id} (pid {n.pid})")
