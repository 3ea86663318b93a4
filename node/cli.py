"""The ``caravan`` command line.

People get tables; scripts get ``--json`` with Nomad's field names. Every
failure is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from tabulate import tabulate

from node.wire.errors import TOKEN_HINT, RPCError
from node.wire.rpc_client import DEFAULT_TIMEOUT, RPCClient

DEFAULT_ADDRESS = "127.0.0.1:4647"
REFUSED_GRACE = 2.0  # seconds of nothing but refused connections before a command gives up


# -- plumbing -----------------------------------------------------------------
class Ctx:
    def __init__(self, address: str, token: str | None, as_json: bool, stale: bool) -> None:
        self.addresses = [a.strip() for a in address.split(",") if a.strip()]
        self.token = token
        self.as_json = as_json
        self.stale = stale

    def client(self, timeout: float | None = None) -> RPCClient:
        # A person at a terminal: when nothing listens at all, say so in a couple
        # of seconds (as nomad does) instead of retrying for the whole timeout.
        return RPCClient(
            self.addresses, token=self.token, timeout=timeout or DEFAULT_TIMEOUT, refused_grace=REFUSED_GRACE
        )

    def call(self, method: str, args: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        args = dict(args or {})
        if self.stale:
            args["stale"] = True
        with self.client(timeout) as client:
            return client.call(method, args)

    def read(self, method: str, args: dict[str, Any] | None = None) -> Any:
        """A read; the command's first read honours --index/--wait (a blocking query)."""
        args = dict(args or {})
        block = _take_blocking()
        if block is None:
            return self.call(method, args)["data"]
        min_index, wait = block
        out = self.call(method, {**args, "min_index": min_index, "wait": wait}, timeout=wait + BLOCKING_SLACK)
        click.echo(f"Index: {out['index']}", err=True)  # what to pass as --index next time
        return out["data"]


def fail(message: str, code: int = 1) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


class _TTL(click.ParamType):
    """Whole seconds from a Go duration ("30m", "1h30m", as `nomad acl token create -ttl`) or a bare number."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from node.spec.units import parse_duration

        if isinstance(value, int):
            return value
        text = str(value).strip()
        try:
            seconds = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
        except ValueError as exc:
            self.fail(f"{exc} (or a number of seconds)", param, ctx)
        if seconds < 0:
            self.fail(f"{text!r} is negative; use 0 for a token that never expires", param, ctx)
        return math.ceil(seconds)


TTL = _TTL()
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a Go CLI (nomad) killed by SIGPIPE


def _quiet_broken_pipe() -> None:
    """The reader of stdout went away (``caravan ... | head``): stop without an error line.

    stdout is pointed at /dev/null first, so the interpreter's final flush of
    what is still buffered cannot raise a second time on the way out.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(EXIT_BROKEN_PIPE)


class CaravanGroup(click.Group):
    """Turns our errors into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        from node.devcluster import ClusterError

        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except RPCError as exc:
            hint = " (--token or CARAVAN_TOKEN)" if exc.details.get(TOKEN_HINT) else ""
            fail(exc.message + hint, 2 if exc.code == "not_found" else 1)
        except ClusterError as exc:
            fail(str(exc))
        except (OSError, ValueError) as exc:
            fail(str(exc))


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--stale", is_flag=True, help="Read from this server's local state (may lag the leader).")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print JSON with Nomad's field names.")(fn)
    fn = click.option("--token", envvar="CARAVAN_TOKEN", default=None, help="ACL secret (env CARAVAN_TOKEN).")(fn)
    fn = click.option(
        "--address",
        envvar="CARAVAN_ADDRESS",
        default=DEFAULT_ADDRESS,
        show_default=True,
        help="Server RPC address(es), comma-separated (env CARAVAN_ADDRESS).",
    )(fn)
    return fn


BLOCKING_DEFAULT_WAIT = 300.0  # as Nomad's blocking queries (and the server's cap)
BLOCKING_SLACK = 10.0  # client deadline beyond --wait


def _keep_blocking(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        ctx.meta[f"caravan.{param.name}"] = value
    return value


def _take_blocking() -> tuple[int, float] | None:
    """(min_index, wait seconds) from --index/--wait, once per command; None without --index."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    index = ctx.meta.pop("caravan.block_index", None)
    wait_text = ctx.meta.pop("caravan.block_wait", None)
    if index is None:
        if wait_text is not None:
            fail("--wait needs --index (the index to wait past, from an earlier answer)")
        return None
    if index < 0:
        fail("--index must be >= 0")
    wait = BLOCKING_DEFAULT_WAIT
    if wait_text is not None:
        from node.spec.units import parse_duration

        try:
            wait = float(wait_text) if wait_text.replace(".", "", 1).isdigit() else parse_duration(wait_text)
        except ValueError as exc:
            fail(f"--wait: {exc}")
        if not 0 < wait <= BLOCKING_DEFAULT_WAIT:
            fail(f"--wait must be more than 0 and at most {BLOCKING_DEFAULT_WAIT:g}s")
    return index, wait


def blocking_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--index/--wait: a blocking query, answered once the data changes past --index (as Nomad's ?index=&wait=)."""
    fn = click.option(
        "--wait", "block_wait", default=None, expose_value=False, callback=_keep_blocking,
        help="With --index: longest wait, e.g. 30s or 5m (default 5m).",
    )(fn)
    fn = click.option(
        "--index", "block_index", type=int, default=None, expose_value=False, callback=_keep_blocking,
        help="Blocking query: answer once the data's index passes this (printed as 'Index: N' on stderr).",
    )(fn)
    return fn


def make_ctx(address: str, token: str | None, as_json: bool, stale: bool = False) -> Ctx:
    return Ctx(address, token, as_json, stale)


def emit(c: Ctx, data: Any, table: Callable[[Any], str]) -> None:
    if c.as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(table(data))


def rows(items: Iterable[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    body = [[_cell(item.get(key)) for _, key in columns] for item in items]
    if not body:
        return "No results"
    return tabulate(body, headers=[h for h, _ in columns], tablefmt="plain")


def kv(item: dict[str, Any], fields: list[tuple[str, str]]) -> str:
    return tabulate([[label, _cell(item.get(key))] for label, key in fields], tablefmt="plain")


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def short(ident: str) -> str:
    return ident[:8]


def when(ns: int) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@click.group(cls=CaravanGroup)
def main() -> None:
    """Caravan: a Raft-replicated control plane modeled on Nomad's servers."""


# -- servers ------------------------------------------------------------------
@main.command()
@click.option("--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Server TOML config.")
def agent(config_file: str) -> None:
    """Run one server in the foreground."""
    from node.core.config import ConfigError, ServerConfig
    from node.core.logs import configure_logging
    from node.server import run_server

    try:
        config = ServerConfig.load(config_file)
    except ConfigError as exc:
        fail(str(exc))
    configure_logging(config)
    sys.exit(run_server(config))


@main.command()
@click.option("--dir", "directory", default=".caravan/dev", show_default=True, help="Where servers keep data and logs.")
@click.option("--nodes", default=3, show_default=True, type=click.Choice(["1", "3", "5"]), help="Number of servers.")
@click.option("--clients", default=3, show_default=True, type=click.IntRange(0, 1000),
              help="Simulated client nodes started beside the servers (0: none).")
def dev(directory: str, nodes: str, clients: int) -> None:
    """Run a local cluster in the foreground; Ctrl-C stops every server."""
    from node import devcluster as cl

    c = cl.up(directory, int(nodes))
    addresses = ",".join(c.rpc_addresses)
    sim = _start_dev_clients(c.dir, addresses, clients) if clients else None
    if sim is not None:
        c.client_pid = sim.pid  # so 'cluster down' stops it should this process be killed
        c.save()
        click.echo(f"Simulated client: {clients} node(s), pid {sim.pid}, log {Path(c.dir) / 'client-sim.log'}")
    click.echo(f"Caravan dev cluster: {len(c.nodes)} servers in {c.dir}")
    click.echo(rows([{"id": n.id, "rpc": n.rpc_addr, "raft": n.raft_addr, "log": n.log_file} for n in c.nodes],
                    [("Server", "id"), ("RPC", "rpc"), ("Raft", "raft"), ("Log", "log")]))
    click.echo("\nIn another terminal:")
    click.echo(f"  export CARAVAN_ADDRESS={addresses}")
    click.echo("  caravan cluster status --dir " + c.dir)
    click.echo("  caravan job run examples/batch.json")
    click.echo("  caravan job status")
    click.echo("\nPress Ctrl-C to stop.")
    stop = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    # SIGHUP too: closing the terminal must not leave servers behind (they
    # run in sessions of their own, so only this process hears it).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        final = cl.Cluster.load(c.dir)
        if sim is not None:
            click.echo("\nStopping the simulated client...")
            cl.stop_client(final)  # the pid recorded above; reaps our child too
        click.echo("\nStopping servers...")
        cl.down(final)
        click.echo("Stopped.")


def _start_dev_clients(directory: str, addresses: str, nodes: int) -> Any:
    """``caravan client sim`` in the background, so jobs run in ``make run``."""
    import subprocess

    log = open(Path(directory) / "client-sim.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "client", "sim", "--nodes", str(nodes), "--servers", addresses,
         "--name-prefix", "dev", "--state-file", str(Path(directory) / "client-sim.json")],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    log.close()
    return proc


@main.group()
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
    from node import devcluster as cl

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
    """One row per server: role, term, applied index, health."""
    from node import devcluster as cl

    c = cl.Cluster.load(directory)
    out = []
    for node in c.nodes:
        st = cl.status_of(node.rpc_addr) if cl.alive(node.pid) else None
        out.append(
            {
                "Node": node.id,
                "Address": node.rpc_addr,
                "PID": node.pid if cl.alive(node.pid) else 0,
                "Role": (st or {}).get("Role", "down"),
                "Term": (st or {}).get("Term", ""),
                "AppliedIndex": (st or {}).get("AppliedIndex", ""),
                # Answering is not enough: a server that knows no leader cannot serve writes.
                "Healthy": bool(st and st.get("Leader")),
            }
        )
    c2 = make_ctx("", None, as_json)
    emit(c2, out, lambda d: rows(d, [(k, k) for k in ("Node", "Address", "PID", "Role", "Term", "AppliedIndex", "Healthy")]))
    if not any(row["Role"] == "leader" for row in out):
        up = sum(1 for row in out if row["Role"] != "down")
        click.echo(
            f"Warning: no leader, so writes fail until one is elected; {up} of {len(out)} servers are up "
            f"and an election needs {len(out) // 2 + 1} (restart with 'caravan cluster restart NODE')",
            err=True,
        )


@cluster.command("down")
@_dir_option
def cluster_down(directory: str) -> None:
    """Stop every server (SIGTERM, then SIGKILL after 15 s)."""
    from node import devcluster as cl

    cl.down(cl.Cluster.load(directory))
    click.echo("Stopped.")


@cluster.command("kill")
@_dir_option
@click.argument("node")
def cluster_kill(directory: str, node: str) -> None:
    """SIGKILL one server (as a crash would)."""
    from node import devcluster as cl

    c = cl.Cluster.load(directory)
    n = cl.kill(c, node)
    click.echo(f"Killed {n.id} (pid {n.pid})")


@cluster.command("restart")
@_dir_option
@click.argument("node")
def cluster_restart(directory: str, node: str) -> None:
    """Start a killed server again (or restart a running one)."""
    from node import devcluster as cl

    c = cl.Cluster.load(directory)
    n = cl.restart(c, node)
    click.echo(f"Started {n.id} (pid {n.pid})")


# -- jobs -----------------------------------------------------------------------
@main.group()
def job() -> None:
    """Register, inspect and stop jobs."""


def _read_spec(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        fail(f"{path}: cannot read the jobspec: {reason}")
    from node.spec.hcl import HCLError, looks_like_hcl, parse_hcl

    if looks_like_hcl(path, text):  # Nomad HCL2 (FILE.nomad.hcl): parsed here, sent as API JSON
        try:
            parsed = parse_hcl(text, "stdin" if path == "-" else path)
        except HCLError as exc:
            fail(str(exc))
        for warning in parsed.warnings:
            click.echo(f"Warning: {warning}", err=True)
        return parsed.job
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")


@job.command("run")
@click.argument("spec")
@click.option("--check-index", type=int, default=None, help="Register only if the job's modify index equals this (0: only if new).")
@click.option("--detach", is_flag=True, help="Return once the job is registered instead of monitoring its evaluation.")
@client_options
def job_run(spec: str, check_index: int | None, detach: bool, address: str, token: str | None, as_json: bool,
            stale: bool) -> None:
    """Register a job from a jobspec file (JSON, or Nomad HCL2 as FILE.nomad.hcl; - for stdin) and monitor its evaluation.

    As ``nomad job run``: exit 0 when everything was placed, 2 when some
    allocations could not be placed (a blocked evaluation waits for
    capacity), 1 on other errors.
    """
    c = make_ctx(address, token, as_json)
    args: dict[str, Any] = {"job": _read_spec(spec)}
    if check_index is not None:
        args["enforce_index"] = check_index
    out = c.call("job.register", args)
    _follow_registration(c, out, "Job registered", detach)


def _follow_registration(c: Ctx, out: dict[str, Any], said: str, detach: bool) -> None:
    """Say what a registration did and monitor its evaluation (exit 2 when placements failed)."""
    if c.as_json:
        emit(c, out, str)
        return
    if out.get("Warnings"):
        click.echo("Warnings:\n  " + out["Warnings"].replace("\n", "\n  "))
    click.echo(f"{said} at index {out['Index']} (job modify index {out['JobModifyIndex']})")
    _monitor_unless_detached(c, out, detach)


def _monitor_unless_detached(c: Ctx, out: dict[str, Any], detach: bool) -> None:
    """Monitor the answer's eval (exit 2 when placements failed), or just name it with --detach."""
    if not out.get("EvalID"):
        return
    if detach:
        click.echo(f"Evaluation ID: {out['EvalID']}")
        return
    code = monitor_eval(c, out["EvalID"], out["Index"])
    if code:
        sys.exit(code)


@job.command("revert")
@click.argument("job_id")
@click.argument("version", type=int)
@click.option("--detach", is_flag=True, help="Return once the job is registered instead of monitoring its evaluation.")
@client_options
def job_revert(job_id: str, version: int, detach: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Run a kept version of a job again (as its newest version), as ``nomad job revert``; see ``job history``."""
    c = make_ctx(address, token, as_json)
    out = c.call("job.revert", {"job_id": job_id, "job_version": version})
    _follow_registration(c, out, f"Job {job_id} reverted to the spec of version {version}", detach)


@job.command("validate")
@click.argument("spec")
def job_validate(spec: str) -> None:
    """Check a jobspec (JSON or Nomad HCL2; - for stdin) without a cluster, as ``nomad job validate``.

    Runs the parser and checks the servers run on ``job run``, so a spec
    that passes here is refused there only by cluster state (for example
    ``--check-index``). Exit 0 when valid, 1 with the first problem otherwise.
    """
    from node.spec.jobspec import JobSpecError, parse_job

    try:
        job, warnings = parse_job(_read_spec(spec))
    except JobSpecError as exc:
        fail(f"invalid jobspec: {exc}")
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)
    groups = ", ".join(f"{g.name} x{g.count}" for g in job.task_groups)
    click.echo(f'Job validation successful: {job.type} job "{job.id}" ({groups})')


MONITOR_WAIT = 30.0  # seconds per blocking read while monitoring an evaluation


def monitor_eval(c: Ctx, eval_id: str, index: int = 0) -> int:
    """Follow an evaluation until the scheduler finished it (Nomad's monitor); the exit code."""
    click.echo(f'==> Monitoring evaluation "{short(eval_id)}"')
    status, first = "", True
    while True:
        out = c.call("eval.get", {"eval_id": eval_id, "min_index": index, "wait": MONITOR_WAIT},
                     timeout=MONITOR_WAIT + BLOCKING_SLACK)
        ev, index = out["data"], out["index"]
        if first:
            click.echo(f'    Evaluation triggered by job "{ev["JobID"]}"')
            first = False
        if ev["Status"] != status:
            if status:
                click.echo(f'    Evaluation status changed: "{status}" -> "{ev["Status"]}"')
            status = ev["Status"]
        if status == "pending":
            continue
        allocs = c.call("alloc.list", {"job_id": ev["JobID"]})["data"]
        for a in sorted(allocs, key=lambda a: a.get("CreateIndex", 0)):
            if a.get("EvalID") == eval_id:
                # As Nomad's monitor: an alloc older than the eval was updated in place by it.
                verb = "modified" if a.get("CreateIndex", 0) < ev.get("CreateIndex", 0) else "created"
                click.echo(f'    Allocation "{short(a["ID"])}" {verb}: node "{short(a["NodeID"])}", group "{a["TaskGroup"]}"')
        deployment = ev.get("DeploymentID") or ""
        if deployment:
            click.echo(f'    Evaluation within deployment: "{short(deployment)}"')
        failures = ev.get("FailedTGAllocs") or {}
        if failures:
            click.echo(f'==> Evaluation "{short(eval_id)}" finished with status "{status}" but failed to place all allocations:')
            click.echo(_placement_failures(ev))
            return 2
        click.echo(f'==> Evaluation "{short(eval_id)}" finished with status "{status}"')
        return 0 if status == "complete" else 1


def _placement_failures(ev: dict[str, Any]) -> str:
    lines = []
    queued = ev.get("QueuedAllocations") or {}
    for group, why in sorted((ev.get("FailedTGAllocs") or {}).items()):
        n = queued.get(group, 0)
        lines.append(f'    Task Group "{group}" (failed to place {n} allocation{"s" if n != 1 else ""}):')
        for part in why.split("; "):
            lines.append(f"      * {part}")
    if ev.get("BlockedEval"):
        lines.append(f'    Evaluation "{short(ev["BlockedEval"])}" waiting for additional capacity to place remainder')
    elif ev.get("Status") == "blocked":
        lines.append("    This evaluation is blocked: it runs again when capacity changes (a node joins or frees resources)")
    return "\n".join(lines)


@job.command("status")
@click.argument("job_id", required=False)
@blocking_options
@client_options
def job_status(job_id: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """List jobs, or show one job with its allocations."""
    c = make_ctx(address, token, as_json, stale)
    if job_id is None:
        jobs = c.read("job.list")
        emit(c, jobs, lambda d: rows(d, [("ID", "ID"), ("Type", "Type"), ("Priority", "Priority"), ("Status", "Status"), ("Version", "Version")]))
        return
    data = c.read("job.get", {"job_id": job_id})
    if as_json:
        emit(c, data, str)
        return
    click.echo(kv(data, [("ID", "ID"), ("Name", "Name"), ("Type", "Type"), ("Priority", "Priority"), ("Status", "Status"),
                         ("Version", "Version"), ("Stop", "Stop"), ("Datacenters", "Datacenters"), ("ModifyIndex", "ModifyIndex")]))
    summary = c.read("job.summary", {"job_id": job_id})
    groups = [{"Group": g, **s} for g, s in sorted(summary.get("Summary", {}).items())]
    click.echo("\nSummary")
    click.echo(rows(groups, [(k, k) for k in ("Group", "Queued", "Starting", "Running", "Failed", "Complete", "Lost")]))
    deployments = c.read("deployment.list", {"job_id": job_id})
    if deployments:
        latest = max(deployments, key=lambda d: d.get("CreateIndex", 0))
        click.echo("\nLatest Deployment")
        click.echo(kv({**latest, "ID": short(latest["ID"])},
                      [("ID", "ID"), ("Status", "Status"), ("Description", "StatusDescription")]))
        click.echo("\nDeployed")
        click.echo(_deployed_rows(latest))
    allocs = c.read("alloc.list", {"job_id": job_id})
    click.echo("\nAllocations")
    click.echo(_alloc_rows(allocs))


@job.command("stop")
@click.argument("job_id")
@click.option("--purge", is_flag=True, help="Remove the job from state instead of marking it stopped.")
@client_options
def job_stop(job_id: str, purge: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Stop a job (its allocations are stopped by the scheduler)."""
    c = make_ctx(address, token, as_json)
    out = c.call("job.stop", {"job_id": job_id, "purge": purge})
    emit(c, out, lambda d: f"Job {job_id} {'purged' if purge else 'stopped'} at index {d['Index']}; evaluation {d.get('EvalID', '')}")


@job.command("history")
@click.argument("job_id")
@blocking_options
@client_options
def job_history(job_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """The job's kept versions, newest first."""
    c = make_ctx(address, token, as_json, stale)
    data = c.read("job.versions", {"job_id": job_id})
    emit(c, data, lambda d: rows(
        [{**v, "Submitted": when(v.get("SubmitTime", 0))} for v in d["Versions"]],
        [("Version", "Version"), ("Stable", "Stable"), ("Stop", "Stop"), ("Submitted", "Submitted"),
         ("JobModifyIndex", "JobModifyIndex")]))


# -- evals / allocs / deployments / nodes -----------------------------------
@main.group("eval")
def eval_() -> None:
    """Evaluations."""


@eval_.command("list")
@click.option("--job", "job_id", default=None)
@blocking_options
@client_options
def eval_list(job_id: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("eval.list", {"job_id": job_id} if job_id else {})
    emit(c, data, lambda d: rows([{**e, "ID": short(e["ID"])} for e in d],
                                 [("ID", "ID"), ("Priority", "Priority"), ("Triggered By", "TriggeredBy"), ("Job ID", "JobID"), ("Status", "Status")]))


@eval_.command("status")
@click.argument("eval_id")
@blocking_options
@client_options
def eval_status(eval_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """One evaluation, with the reason it could not place everything (why it is blocked)."""
    c = make_ctx(address, token, as_json, stale)
    data = c.read("eval.get", {"eval_id": eval_id})
    emit(c, data, _eval_table)


def _eval_table(d: dict[str, Any]) -> str:
    view = {**d, "PlacementFailures": bool(d.get("FailedTGAllocs")), "Created": when(d.get("CreateTime", 0)),
            "WaitUntilTime": when(d.get("WaitUntil", 0))}
    fields = [("ID", "ID"), ("Create Time", "Created"), ("Status", "Status"), ("Status Description", "StatusDescription"),
              ("Type", "Type"), ("TriggeredBy", "TriggeredBy"), ("Job ID", "JobID"), ("Priority", "Priority"),
              ("Placement Failures", "PlacementFailures")]
    for label, key in (("Node ID", "NodeID"), ("Deployment ID", "DeploymentID"), ("Wait Until", "WaitUntilTime"),
                       ("Previous Eval", "PreviousEval"), ("Next Eval", "NextEval"), ("Blocked Eval", "BlockedEval")):
        if view.get(key):
            fields.append((label, key))
    text = kv(view, fields)
    if d.get("FailedTGAllocs"):
        text += "\n\n==> Failed Placements\n" + _placement_failures(d)
    return text


def _alloc_rows(allocs: list[dict[str, Any]]) -> str:
    return rows([{**a, "ID": short(a["ID"]), "NodeID": short(a["NodeID"])} for a in allocs],
                [("ID", "ID"), ("Node ID", "NodeID"), ("Task Group", "TaskGroup"), ("Version", "JobVersion"),
                 ("Desired", "DesiredStatus"), ("Status", "ClientStatus")])


@main.group()
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
    emit(c, c.read("alloc.list", args), _alloc_rows)


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


@main.group()
def deployment() -> None:
    """Deployments."""


@deployment.command("list")
@click.option("--job", "job_id", default=None)
@blocking_options
@client_options
def deployment_list(job_id: str | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("deployment.list", {"job_id": job_id} if job_id else {})
    emit(c, data, lambda d: rows([{**x, "ID": short(x["ID"])} for x in d],
                                 [("ID", "ID"), ("Job ID", "JobID"), ("Job Version", "JobVersion"), ("Status", "Status")]))


@deployment.command("status")
@click.argument("deployment_id")
@blocking_options
@client_options
def deployment_status(deployment_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("deployment.get", {"deployment_id": deployment_id})
    emit(c, data, _deployment_table)


@deployment.command("fail")
@click.argument("deployment_id")
@client_options
def deployment_fail(deployment_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Mark a running deployment failed; a group with auto_revert rolls back to the last stable version."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.fail", {"deployment_id": deployment_id})

    def text(d: dict[str, Any]) -> str:
        said = f'Deployment "{deployment_id}" failed'
        if "RevertedJobVersion" in d:
            said += f'. Auto-reverted to job version {d["RevertedJobVersion"]}.'
        return said + (f'\nEvaluation "{short(d["EvalID"])}" places the reverted version' if d.get("EvalID") else "")

    emit(c, out, text)


@deployment.command("pause")
@click.argument("deployment_id")
@client_options
def deployment_pause(deployment_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Hold a running rollout where it is: nothing more is replaced until ``deployment resume``."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.pause", {"deployment_id": deployment_id, "pause": True})
    emit(c, out, lambda d: f'Deployment "{d["DeploymentID"]}" paused')


@deployment.command("resume")
@click.argument("deployment_id")
@click.option("--detach", is_flag=True, help="Return at once instead of monitoring the evaluation that places the next batch.")
@client_options
def deployment_resume(deployment_id: str, detach: bool, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Go on with a paused rollout; its progress deadline starts again."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.pause", {"deployment_id": deployment_id, "pause": False})
    _follow_deployment_eval(c, out, "resumed", detach)


@deployment.command("promote")
@click.argument("deployment_id")
@click.option("--group", "groups", multiple=True, help="Promote only this task group's canaries (repeatable); default: all.")
@click.option("--detach", is_flag=True, help="Return at once instead of monitoring the evaluation that replaces the old allocs.")
@client_options
def deployment_promote(deployment_id: str, groups: tuple[str, ...], detach: bool, address: str, token: str | None,
                       as_json: bool, stale: bool) -> None:
    """Promote a rollout's canaries once they are healthy: the old allocs are then replaced, as ``nomad deployment promote``."""
    c = make_ctx(address, token, as_json)
    out = c.call("deployment.promote", {"deployment_id": deployment_id, "groups": list(groups)})
    _follow_deployment_eval(c, out, "promoted", detach)


def _follow_deployment_eval(c: Ctx, out: dict[str, Any], done: str, detach: bool) -> None:
    """Say what happened to the deployment, then monitor the eval that goes on with it."""
    if c.as_json:
        emit(c, out, str)
        return
    click.echo(f'Deployment "{out["DeploymentID"]}" {done}')
    _monitor_unless_detached(c, out, detach)


def _deployment_table(d: dict[str, Any]) -> str:
    """As ``nomad deployment status``: the rollout, then each group's progress."""
    head = kv(d, [("ID", "ID"), ("Job ID", "JobID"), ("Job Version", "JobVersion"), ("Status", "Status"),
                  ("Description", "StatusDescription")])
    return head + "\n\nDeployed\n" + _deployed_rows(d)


def _deployed_rows(d: dict[str, Any]) -> str:
    groups = sorted((d.get("TaskGroups") or {}).items())
    columns = [("Task Group", "Group")]
    if any(s.get("AutoRevert") for _, s in groups):
        columns.append(("Auto Revert", "AutoRevert"))
    canaries = any(s.get("DesiredCanaries") for _, s in groups)
    if canaries:
        columns.append(("Promoted", "Promoted"))
    columns.append(("Desired", "DesiredTotal"))
    if canaries:
        columns.append(("Canaries", "DesiredCanaries"))
    columns += [("Placed", "PlacedAllocs"), ("Healthy", "HealthyAllocs"),
                ("Unhealthy", "UnhealthyAllocs"), ("Progress Deadline", "Deadline")]
    return rows([{**s, "Group": g, "Deadline": when(s.get("RequireProgressBy", 0)) or "<none>"} for g, s in groups], columns)


@main.group()
def node() -> None:
    """Client nodes."""


@node.command("list")
@blocking_options
@client_options
def node_list(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("node.list"), lambda d: rows([{**n, "ID": short(n["ID"])} for n in d],
                                                [("ID", "ID"), ("DC", "Datacenter"), ("Name", "Name"), ("Class", "NodeClass"),
                                                 ("Drain", "Drain"), ("Eligibility", "SchedulingEligibility"), ("Status", "Status")]))


@node.command("status")
@click.argument("node_id")
@blocking_options
@client_options
def node_status(node_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    data = c.read("node.get", {"node_id": node_id})
    emit(c, data, lambda d: kv({**d, "Drain": _drain_text(d)},
                               [("ID", "ID"), ("Name", "Name"), ("Datacenter", "Datacenter"), ("Status", "Status"),
                                ("Eligibility", "SchedulingEligibility"), ("Drain", "Drain")]))


def _drain_text(node: dict[str, Any]) -> str:
    """As ``nomad node status``: false, or true with the drain's deadline."""
    strategy = node.get("DrainStrategy")
    if not strategy:
        return "false"
    deadline = strategy.get("Deadline", 0)
    text = "true; force drain" if deadline < 0 else "true; no deadline" if deadline == 0 else \
        f"true; {when(strategy.get('ForceDeadline', 0))} deadline"
    return text + ("; ignoring system jobs" if strategy.get("IgnoreSystemJobs") else "")


@node.command("eligibility")
@click.argument("node_id")
@click.option("--enable/--disable", "enable", default=None, help="Let the scheduler place new allocations here, or not.")
@client_options
def node_eligibility(node_id: str, enable: bool | None, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Open or close a node to new placements (``nomad node eligibility -enable|-disable``).

    Allocations already on an ineligible node keep running. The setting
    stays when the node's client restarts and registers again.
    """
    if enable is None:
        raise click.UsageError("say --enable or --disable")
    c = make_ctx(address, token, as_json)
    full_id = c.read("node.get", {"node_id": node_id})["ID"]
    value = "eligible" if enable else "ineligible"  # the wire values
    out = c.call("node.eligibility", {"node_id": full_id, "eligibility": value})
    emit(c, out, lambda d: f'Node "{d["NodeID"]}" scheduling eligibility set: {value} for scheduling')


DRAIN_POLL = 0.5  # seconds between looks while monitoring a drain


@node.command("drain")
@click.argument("node_id")
@click.option("--enable", is_flag=True, help="Start draining the node (or change the drain under way).")
@click.option("--disable", is_flag=True, help="Stop draining; the node becomes eligible again unless --keep-ineligible.")
@click.option("--deadline", default="1h", show_default=True,
              help="Move whatever has not moved by then at once (Go duration, e.g. 30m).")
@click.option("--force", is_flag=True, help="Move every allocation at once (no migrate steps, no deadline).")
@click.option("--no-deadline", is_flag=True, help="No deadline: batch allocations may run to the end.")
@click.option("--ignore-system", is_flag=True, help="Leave system job allocations on the node.")
@click.option("--keep-ineligible", is_flag=True, help="With --disable: keep the node closed to new placements.")
@click.option("--detach", is_flag=True, help="Return at once instead of monitoring the drain.")
@click.option("--monitor", "monitor_only", is_flag=True, help="Monitor a drain under way (changes nothing).")
@client_options
def node_drain(node_id: str, enable: bool, disable: bool, deadline: str, force: bool, no_deadline: bool,
               ignore_system: bool, keep_ineligible: bool, detach: bool, monitor_only: bool,
               address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Drain a node: move its allocations elsewhere before it is taken out of service (``nomad node drain``).

    The node is closed to new placements at once. Service allocations move
    in steps of their group's migrate.max_parallel, each step once the
    replacements are healthy; batch allocations are left to finish until
    the deadline; system allocations stop last. At the deadline whatever is
    left moves at once. The node stays ineligible after the drain.
    """
    from node.spec.units import parse_duration

    if sum((enable, disable, monitor_only)) != 1:
        raise click.UsageError("say exactly one of --enable, --disable or --monitor")
    if (force or no_deadline or ignore_system) and not enable:
        raise click.UsageError("--force, --no-deadline and --ignore-system go with --enable")
    if keep_ineligible and not disable:
        raise click.UsageError("--keep-ineligible goes with --disable")
    if force and no_deadline:
        raise click.UsageError("--force and --no-deadline cannot be used together")
    if detach and monitor_only:
        raise click.UsageError("--detach and --monitor cannot be used together")
    try:
        seconds = parse_duration(deadline)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--deadline") from None
    if enable and not force and not no_deadline and seconds <= 0:
        raise click.BadParameter("must be greater than zero (or say --force or --no-deadline)", param_hint="--deadline")
    c = make_ctx(address, token, as_json)
    full_id = c.read("node.get", {"node_id": node_id})["ID"]
    if monitor_only:
        sys.exit(monitor_drain(c, full_id, just_set=False))
    spec = None
    if enable:
        spec = {"Deadline": -1 if force else 0 if no_deadline else int(seconds * 1e9), "IgnoreSystemJobs": ignore_system}
    out = c.call("node.drain", {"node_id": full_id, "drain_spec": spec, "mark_eligible": disable and not keep_ineligible})
    if as_json or detach or disable:
        said = "drain strategy set" if enable else "drain strategy unset"
        emit(c, out, lambda d: f'{_stamp()}: Node "{d["NodeID"]}" {said}')
        return
    click.echo(f'{_stamp()}: Ctrl-C to stop monitoring: will not cancel the node drain')
    click.echo(f'{_stamp()}: Node "{full_id}" drain strategy set')
    sys.exit(monitor_drain(c, full_id, just_set=True))


def _stamp() -> str:
    return when(time.time_ns())


def monitor_drain(c: Ctx, node_id: str, *, just_set: bool) -> int:
    """Follow a drain until it is done and what it moves has stopped (Nomad's drain monitor); the exit code.

    ``just_set``: this command started the drain (it may be done by the first look).
    """
    seen: dict[str, tuple[bool, str, str]] = {}  # alloc id -> (marked, desired status, client status)
    job_types: dict[str, str] = {}
    ignore_system = False
    complete = False
    down = False
    first = True
    try:
        while True:
            node = c.call("node.get", {"node_id": node_id})["data"]
            strategy = node.get("DrainStrategy")
            if first and not just_set:
                if strategy is None:
                    click.echo(f"{_stamp()}: No drain strategy set for node {node_id}")
                    return 0
                click.echo(f'{_stamp()}: Monitoring node "{node_id}": Ctrl-C to detach monitoring')
            first = False
            if strategy is not None:
                ignore_system = bool(strategy.get("IgnoreSystemJobs"))
            if node.get("Status") == "down" and not down:
                click.echo(f'{_stamp()}: Node "{node_id}" down')
            down = node.get("Status") == "down"
            allocs = c.call("alloc.list", {"node_id": node_id})["data"]
            moving = 0
            for a in sorted(allocs, key=lambda a: (a.get("CreateIndex", 0), a["ID"])):
                marked = bool((a.get("DesiredTransition") or {}).get("Migrate"))
                now = (marked, a.get("DesiredStatus", ""), a.get("ClientStatus", ""))
                before = seen.get(a["ID"])
                if before is None and marked and now[2] in ("pending", "running"):
                    before = (False, "run", now[2])  # moved since the drain began: say so
                seen[a["ID"]] = now
                if before is not None:
                    if now[0] and not before[0]:
                        click.echo(f'{_stamp()}: Alloc "{a["ID"]}" marked for migration')
                    if now[1] != "run" and before[1] == "run":
                        click.echo(f'{_stamp()}: Alloc "{a["ID"]}" draining')
                    if now[2] != before[2]:
                        click.echo(f'{_stamp()}: Alloc "{a["ID"]}" status {before[2]} -> {now[2]}')
                if a.get("ClientStatus") not in ("pending", "running"):
                    continue
                if ignore_system and a["JobID"] not in job_types:
                    try:
                        job_types[a["JobID"]] = c.call("job.get", {"job_id": a["JobID"]})["data"].get("Type", "")
                    except RPCError:
                        job_types[a["JobID"]] = ""  # purged: its allocs stop
                if not (ignore_system and job_types.get(a["JobID"]) == "system"):
                    moving += 1
            if strategy is None and not complete:
                complete = True
                click.echo(f"{_stamp()}: Drain complete for node {node_id}")
            if complete and moving == 0:
                click.echo(f'{_stamp()}: All allocations on node "{node_id}" have stopped')
                return 0
            time.sleep(DRAIN_POLL)
    except KeyboardInterrupt:
        click.echo(f'{_stamp()}: monitoring stopped; the drain goes on (caravan node drain --monitor {short(node_id)})')
        return 0


# -- ACL ----------------------------------------------------------------------------
@main.group("client")
def client_group() -> None:
    """Simulated client nodes (for development and load tests)."""


@client_group.command("sim")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=1, show_default=True, help="Client nodes to simulate.")
@click.option("--cpu", type=click.IntRange(1), default=4000, show_default=True, help="CPU of each node (MHz).")
@click.option("--memory", type=click.IntRange(1), default=8192, show_default=True, help="Memory of each node (MB).")
@click.option("--datacenter", default="dc1", show_default=True, help="Datacenter of the nodes.")
@click.option("--servers", envvar="CARAVAN_ADDRESS", required=True,
              help="Server RPC addresses, comma-separated (env CARAVAN_ADDRESS).")
@click.option("--name-prefix", default="", help="Node names are PREFIX-0, PREFIX-1, ... (default: sim-<random>).")
@click.option("--token", envvar="CARAVAN_TOKEN", default=None, help="ACL secret with write policy (env CARAVAN_TOKEN).")
@click.option("--seed", type=int, default=None, help="Seed of the simulated failures (fail_rate).")
@click.option("--verbose", is_flag=True, help="Print each allocation's start and end.")
@click.option("--state-file", default="", help="Keep the node IDs in this file: a restart resumes the same nodes "
              "and their allocations instead of registering new ones.")
def client_sim(nodes: int, cpu: int, memory: int, datacenter: str, servers: str, name_prefix: str, token: str | None,
               seed: int | None, verbose: bool, state_file: str) -> None:
    """Simulate NODES client nodes in one process (as Nomad's nodesim) until Ctrl-C or SIGTERM.

    Registers the nodes, heartbeats them, runs the allocations placed on
    them with the sim driver (Config: run_for, exit_code, fail_rate) and
    reports their status. Killing this process is a client crash: its
    nodes go down after their heartbeat TTL and their allocations are
    replaced elsewhere.
    """
    from client.sim import SimConfig, run_sim

    addresses = [a.strip() for a in servers.split(",") if a.strip()]
    if not addresses:
        fail("--servers needs at least one host:port")
    sys.exit(run_sim(SimConfig(servers=addresses, nodes=nodes, cpu=cpu, memory_mb=memory, datacenter=datacenter,
                               name_prefix=name_prefix, token=token, seed=seed, verbose=verbose,
                               state_file=state_file)))


@main.group("acl")
def acl_group() -> None:
    """ACL bootstrap and tokens."""


def _token_table(d: dict[str, Any]) -> str:
    """Nomad's token layout; the secret only where the server returned it
    (create and bootstrap: it is stored hashed, so later reads cannot)."""
    shown = {**d, "Create Time": when(d.get("CreateTime") or 0),
             "Expiry Time": when(d.get("ExpirationTime") or 0) or "<none>"}
    fields = [("Accessor ID", "AccessorID"), ("Secret ID", "SecretID"), ("Name", "Name"), ("Type", "Type"),
              ("Policies", "Policies"), ("Create Time", "Create Time"), ("Expiry Time", "Expiry Time"),
              ("Create Index", "CreateIndex")]
    return kv(shown, [f for f in fields if f[1] != "SecretID" or d.get("SecretID")])


@acl_group.command("bootstrap")
@client_options
def acl_bootstrap(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Create the initial management token (once per cluster)."""
    c = make_ctx(address, token, as_json)
    emit(c, c.call("acl.bootstrap"), _token_table)


@acl_group.group("token")
def acl_token() -> None:
    """Manage ACL tokens (management token required)."""


@acl_token.command("create")
@click.option("--name", default="")
@click.option("--type", "kind", type=click.Choice(["client", "management"]), default="client", show_default=True)
@click.option("--policy", "policies", multiple=True, type=click.Choice(["read", "write"]))
@click.option("--ttl", "ttl", type=TTL, default="0", help="Expire after this long: a duration (30m, 24h) or seconds; 0: never.")
@client_options
def acl_token_create(name: str, kind: str, policies: tuple[str, ...], ttl: int, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json)
    out = c.call("acl.token.create", {"name": name, "type": kind, "policies": list(policies), "ttl_seconds": ttl})
    emit(c, out, _token_table)


@acl_token.command("list")
@blocking_options
@client_options
def acl_token_list(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("acl.token.list"), lambda d: rows(d, [("Name", "Name"), ("Type", "Type"), ("Accessor ID", "AccessorID"), ("Policies", "Policies")]))


@acl_token.command("info")
@click.argument("accessor_id")
@blocking_options
@client_options
def acl_token_info(accessor_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("acl.token.get", {"accessor_id": accessor_id}), _token_table)


@acl_token.command("self")
@client_options
def acl_token_self(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("acl.token.self"), _token_table)


@acl_token.command("delete")
@click.argument("accessor_id")
@client_options
def acl_token_delete(accessor_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json)
    out = c.call("acl.token.delete", {"accessor_id": accessor_id})
    emit(c, out, lambda d: f"Token {accessor_id} deleted at index {d['Index']}")


# -- operator / debug --------------------------------------------------------------
@main.group()
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


# -- events -------------------------------------------------------------------------
@main.group()
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


@operator.group()
def snapshot() -> None:
    """Save, inspect and restore state snapshots."""


@snapshot.command("save")
@click.argument("file")
@client_options
def snapshot_save(file: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Save a consistent snapshot of the cluster to FILE (management token)."""
    from node.endpoints.snapshot import partial_path
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
    from node.endpoints import snapshot as snapshots
    from snapshot import SnapshotError

    if (directory is None) == (config_file is None):
        fail("give exactly one of --dir (a local cluster) or --config (one stopped server)")
    try:
        if directory is not None:
            out = snapshots.restore_local_cluster(file, directory)
            if not keep_backup:
                snapshots.clean_backups(out["backups"])
            click.echo(f"Restored {directory} to index {out['index']}; servers restarted")
        else:
            from node.core.config import ConfigError, ServerConfig

            try:
                config = ServerConfig.load(config_file)
            except ConfigError as exc:
                fail(str(exc))
            info = snapshots.seed_server(file, str(config.data_dir), [s.raft_addr for s in config.servers])
            click.echo(f"Seeded {config.node_id} ({config.data_dir}) at index {info['Index']}; start it with caravan agent")
    except SnapshotError as exc:
        fail(str(exc))


@main.group()
def debug() -> None:
    """Debugging aids."""


@debug.command("digest")
@client_options
def debug_digest(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """The state digest and the index it reflects (equal on converged replicas)."""
    c = make_ctx(address, token, as_json, stale)
    out = c.call("debug.digest")
    emit(c, {"digest": out["digest"], "index": out["index"]}, lambda d: f"{d['digest']}  index {d['index']}")


# -- system -------------------------------------------------------------------------
GC_TIMEOUT = 600.0  # a forced GC waits for every reap of a large backlog to commit


@main.group()
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


if __name__ == "__main__":
    main()
