"""What every command group shares: the RPC client factory, output and failure.

One place decides how a command talks to the servers (``Ctx``), how it
prints (a table for people, ``--json`` with Nomad's field names for
scripts) and how it fails (one line on stderr and an exit code, never a
traceback), so each command group reads the same and a change to any of
these is made once.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
from tabulate import tabulate

from node.devcluster import ClusterError
from node.wire.errors import TOKEN_HINT, RPCError
from node.wire.rpc_client import DEFAULT_TIMEOUT, RPCClient

DEFAULT_ADDRESS = "127.0.0.1:4647"
REFUSED_GRACE = 2.0  # seconds of nothing but refused connections before a command gives up
BLOCKING_DEFAULT_WAIT = 300.0  # as Nomad's blocking queries (and the server's cap)
BLOCKING_SLACK = 10.0  # client deadline beyond --wait
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a Go CLI (nomad) killed by SIGPIPE


# -- talking to the servers ------------------------------------------------------
class Ctx:
    """One command's connection settings: addresses, token, output mode, staleness."""

    def __init__(self, address: str, token: str | None, as_json: bool, stale: bool) -> None:
        self.addresses = [a.strip() for a in address.split(",") if a.strip()]
        self.token = token
        self.as_json = as_json
        self.stale = stale

    def client(self, timeout: float | None = None) -> RPCClient:
        """An RPC client for this command's servers.

        A person at a terminal: when nothing listens at all, say so in a
        couple of seconds (as nomad does) instead of retrying for the whole
        timeout.
        """
        return RPCClient(
            self.addresses, token=self.token, timeout=timeout or DEFAULT_TIMEOUT, refused_grace=REFUSED_GRACE
        )

    def call(self, method: str, args: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """One RPC call on a fresh connection (``--stale`` reads are marked as such)."""
        args = dict(args or {})
        if self.stale:
            args["stale"] = True
        with self.client(timeout) as client:
            return client.call(method, args)

    def read(self, method: str, args: dict[str, Any] | None = None) -> Any:
        """A read; the command's first read honours --index/--wait (a blocking query)."""
        return self.read_answer(method, args)["data"]

    def read_answer(self, method: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """A read's whole answer (data, index, a list's next_token); the first honours --index/--wait."""
        args = dict(args or {})
        block = _take_blocking()
        if block is None:
            return self.call(method, args)
        min_index, wait = block
        out = self.call(method, {**args, "min_index": min_index, "wait": wait}, timeout=wait + BLOCKING_SLACK)
        click.echo(f"Index: {out['index']}", err=True)  # what to pass as --index next time
        return out


def make_ctx(address: str, token: str | None, as_json: bool, stale: bool = False) -> Ctx:
    """The ``Ctx`` of a command from its ``client_options`` values."""
    return Ctx(address, token, as_json, stale)


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--address, --token, --json and --stale: how a command reaches the servers and prints."""
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


# -- blocking queries --------------------------------------------------------------
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


# -- failing ----------------------------------------------------------------------
def fail(message: str, code: int = 1) -> NoReturn:
    """Stop the command with one ``Error:`` line on stderr and exit ``code``."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def _quiet_broken_pipe() -> NoReturn:
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


# -- printing ---------------------------------------------------------------------
def emit(c: Ctx, data: Any, table: Callable[[Any], str]) -> None:
    """Print ``data`` as JSON under --json, else as ``table`` renders it."""
    if c.as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(table(data))


def rows(items: Iterable[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain table: one row per item, ``columns`` as (header, key)."""
    body = [[cell(item.get(key)) for _, key in columns] for item in items]
    if not body:
        return "No results"
    return tabulate(body, headers=[h for h, _ in columns], tablefmt="plain")


def kv(item: dict[str, Any], fields: list[tuple[str, str]]) -> str:
    """One object as label/value lines, ``fields`` as (label, key)."""
    return tabulate([[label, cell(item.get(key))] for label, key in fields], tablefmt="plain")


def devices_text(resources: Any) -> str:
    """A Resources' devices as ``nvidia/gpu=2, amd/gpu/mi300=1`` ("" for none): the RPC's name -> count
    map, or Nomad's list of {Name, Count} (what the HTTP API serves)."""
    devices = resources.get("Devices") if isinstance(resources, dict) else None
    if isinstance(devices, list):
        devices = {d.get("Name", ""): d.get("Count", 1) for d in devices if isinstance(d, dict)}
    if not isinstance(devices, dict):
        return ""
    return ", ".join(f"{name}={count}" for name, count in sorted(devices.items()))


def cell(value: Any) -> str:
    """A value as a table cell: bools as Go prints them, lists comma-joined, None as nothing."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def short(ident: str) -> str:
    """An id as Nomad prints it in tables: its first 8 characters."""
    return ident[:8]


def when(ns: int) -> str:
    """A nanosecond Unix time as UTC RFC 3339 ("" for 0: never set)."""
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
