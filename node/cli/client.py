"""``caravan client sim``: simulated client nodes, many in one process.

For development and load tests: ``caravan dev`` starts one beside its
servers, and the fault-injection harness kills and restarts it.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from node.cli.client_gc import client_gc, gc_options, gc_settings
from node.cli.common import fail


def _devices(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    """``--device vendor/type[/model]=COUNT`` options as one name -> count map (a repeated name adds up).

    Checked here so a typo is one line at the prompt, not a registration the leader refuses.
    """
    out: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition("=")
        parts = name.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise click.BadParameter(f"{value!r}: name the device vendor/type or vendor/type/model, as nvidia/gpu=4")
        if not sep or not count.isdigit() or int(count) < 1:
            raise click.BadParameter(f"{value!r}: give a count of at least 1 after '=', as nvidia/gpu=4")
        out[name] = out.get(name, 0) + int(count)
    if any(len(n.split("/")) == 3 and n.rsplit("/", 1)[0] in out for n in out):
        raise click.BadParameter("name each model of a vendor/type, or none (not both nvidia/gpu and nvidia/gpu/MODEL)")
    return out


@click.group("client")
def client_group() -> None:
    """Simulated client nodes (for development and load tests)."""


@client_group.command("sim")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=1, show_default=True, help="Client nodes to simulate.")
@click.option("--cpu", type=click.IntRange(1), default=4000, show_default=True, help="CPU of each node (MHz).")
@click.option("--memory", type=click.IntRange(1), default=8192, show_default=True, help="Memory of each node (MB).")
@click.option("--datacenter", default="dc1", show_default=True, help="Datacenter of the nodes.")
@click.option("--device", "devices", multiple=True, callback=_devices, metavar="VENDOR/TYPE[/MODEL]=COUNT",
              help="Devices every node advertises, e.g. nvidia/gpu=4 (repeatable); "
              'tasks ask with device "nvidia/gpu" { count = 1 }.')
@click.option("--servers", envvar="CARAVAN_ADDRESS", required=True,
              help="Server RPC addresses, comma-separated (env CARAVAN_ADDRESS).")
@click.option("--name-prefix", default="", help="Node names are PREFIX-0, PREFIX-1, ... (default: sim-<random>).")
@click.option("--token", envvar="CARAVAN_TOKEN", default=None, help="ACL secret with write policy (env CARAVAN_TOKEN).")
@click.option("--seed", type=int, default=None, help="Seed of the simulated failures (fail_rate).")
@click.option("--verbose", is_flag=True, help="Print each allocation's start and end.")
@click.option("--state-file", default="", help="Keep the node IDs in this file: a restart resumes the same nodes "
              "and their allocations instead of registering new ones.")
@click.option("--clusters", type=click.IntRange(0, 10_000), default=0, show_default=True,
              help="Spread the nodes over N clusters (attribute meta.cluster = c0, c1, ...); 0: no topology.")
@click.option("--racks", type=click.IntRange(0, 10_000), default=0, show_default=True,
              help="Racks per cluster (attribute meta.rack = c<i>-r<j>).")
@click.option("--heartbeat-batch", type=click.IntRange(1, 10_000), default=500, show_default=True,
              help="Node IDs per heartbeat call.")
@click.option("--register-concurrency", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Registrations in flight at once.")
@click.option("--status-interval", type=click.FloatRange(0), default=60.0, show_default=True,
              help="Seconds between status lines (heartbeat calls, TTLs, errors); 0: none.")
@gc_options
def client_sim(nodes: int, cpu: int, memory: int, datacenter: str, devices: dict[str, int], servers: str, name_prefix: str, token: str | None,
               seed: int | None, verbose: bool, state_file: str, clusters: int, racks: int, heartbeat_batch: int,
               register_concurrency: int, status_interval: float, **gc: Any) -> None:
    """Simulate NODES client nodes in one process (as Nomad's nodesim) until Ctrl-C or SIGTERM.

    Registers the nodes, heartbeats them in batches spread over the TTL
    the leader grants (tens of thousands of nodes per process), runs the
    allocations placed on them with the sim driver (Config: run_for,
    exit_code, fail_rate) and reports their status. Killing this process
    is a client crash: its nodes go down after their heartbeat TTL and
    their allocations are replaced elsewhere.
    """
    from client.sim import SimConfig, run_sim

    addresses = [a.strip() for a in servers.split(",") if a.strip()]
    if not addresses:
        fail("--servers needs at least one host:port")
    sys.exit(run_sim(SimConfig(servers=addresses, nodes=nodes, cpu=cpu, memory_mb=memory, datacenter=datacenter, devices=devices,
                               name_prefix=name_prefix, token=token, seed=seed, verbose=verbose,
                               state_file=state_file, clusters=clusters, racks=racks, heartbeat_batch=heartbeat_batch,
                               register_concurrency=register_concurrency, status_interval=status_interval,
                               **gc_settings(gc))))


client_group.add_command(client_gc)
