"""Command line: ``python -m jepsen_like run|check|campaign``.

Exit codes: 0 valid, 1 anomaly found, 2 inconclusive (a checker could not
decide), 3 the run could not be carried out (bad options, no cluster).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import click

from jepsen_like.runner import (
    EXIT_ANOMALY,
    EXIT_OK,
    EXIT_UNKNOWN,
    RESULTS_FILE,
    RunError,
    RunOptions,
    check_dir,
    run,
    verdict_word,
)

EXIT_ERROR = 3


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--server-env")
        env[name] = value
    return env


def _range(value: str, name: str) -> tuple[float, float]:
    try:
        low, _, high = value.partition(":")
        pair = (float(low), float(high or low))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not SECONDS or MIN:MAX", param_hint=name) from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise click.BadParameter(f"{value!r}: need 0 <= MIN <= MAX", param_hint=name)
    return pair


run_options = [
    click.option("--nodes", type=int, default=3, show_default=True, help="servers (3 or 5)"),
    click.option(
        "--time",
        "duration",
        type=float,
        default=60.0,
        show_default=True,
        help="seconds of faults and load",
    ),
    click.option(
        "--nemesis",
        default="kill,pause,partition",
        show_default=True,
        help="comma list: kill, kill-all, pause, partition, snapshot-lag, clock, client-kill, drain, member, "
        "clients (adds the failover workload), none",
    ),
    click.option(
        "--workload",
        default="register,set",
        show_default=True,
        help="comma list: register, set, lifecycle, journal, failover, quota",
    ),
    click.option("--register-clients", type=int, default=4, show_default=True),
    click.option("--set-clients", type=int, default=2, show_default=True),
    click.option(
        "--op-timeout", type=float, default=5.0, show_default=True, help="seconds per client call"
    ),
    click.option(
        "--think",
        type=float,
        default=0.02,
        show_default=True,
        help="mean seconds between one client's operations (0: back to back, for pipelined load)",
    ),
    click.option("--overlap", is_flag=True, help="sometimes hold two different faults at once"),
    click.option(
        "--quiet", default="2:5", show_default=True, help="seconds between faults, MIN:MAX"
    ),
    click.option("--hold", default="2:6", show_default=True, help="seconds a fault lasts, MIN:MAX"),
    click.option("--checker-timeout", type=float, default=120.0, show_default=True),
    click.option(
        "--compaction-entries",
        type=int,
        default=None,
        help="servers' raft_compaction_entries (default: 300 with snapshot-lag, else the profile's)",
    ),
    click.option(
        "--server-env",
        multiple=True,
        metavar="NAME=VALUE",
        help="environment for the server processes (test-only switches)",
    ),
]


def _with_run_options(fn):  # type: ignore[no-untyped-def]
    for option in reversed(run_options):
        fn = option(fn)
    return fn


def _options(out: str, seed: int, kw: dict) -> RunOptions:  # type: ignore[type-arg]
    return RunOptions(
        out=out,
        seed=seed,
        nodes=kw["nodes"],
        time=kw["duration"],
        nemeses=_split(kw["nemesis"]),
        workloads=_split(kw["workload"]),
        register_lanes=kw["register_clients"],
        set_lanes=kw["set_clients"],
        op_timeout=kw["op_timeout"],
        think=kw["think"],
        overlap=bool(kw["overlap"]),
        quiet=_range(kw["quiet"], "--quiet"),
        hold=_range(kw["hold"], "--hold"),
        checker_timeout=kw["checker_timeout"],
        compaction_entries=kw["compaction_entries"],
        server_env=_env(kw["server_env"]),
    )


@click.group()
def cli() -> None:
    """Fault-injection runs against a real Caravan cluster, checked for anomalies."""


@cli.command("run")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="new directory for the run"
)
@_with_run_options
def run_cmd(seed: int, out: str, **kw: object) -> None:
    """One run: cluster up, load + faults, heal, check, report into OUT."""
    options = _options(out, seed, kw)
    sys.exit(run(options))


@cli.command("check")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--checker-timeout", type=float, default=120.0, show_default=True)
def check_cmd(directory: str, checker_timeout: float) -> None:
    """Re-check a recorded run directory (rewrites results and reports)."""
    sys.exit(check_dir(directory, checker_timeout=checker_timeout))


@cli.command("campaign")
@click.option(
    "--seeds", default="1,2,3", show_default=True, help="comma list of seeds, or FIRST:COUNT"
)
@click.option(
    "--rotate/--mixed",
    default=False,
    show_default=True,
    help="--rotate: one nemesis per run, cycling through --nemesis; --mixed: all of them in every run",
)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="directory for the runs"
)
@_with_run_options
def campaign_cmd(seeds: str, rotate: bool, out: str, **kw: object) -> None:
    """Several seeded runs; a table of verdicts in OUT/campaign.json. Exits 1 if any run found an anomaly.

    Create the file OUT/STOP to stop after the run in progress.
    """
    try:
        if ":" in seeds:
            first, _, count = seeds.partition(":")
            seed_list = list(range(int(first), int(first) + int(count)))
        else:
            seed_list = [int(s) for s in _split(seeds)]
    except ValueError:
        raise click.BadParameter(
            f"{seeds!r} is not a comma list of integers or FIRST:COUNT", param_hint="--seeds"
        ) from None
    if not seed_list:
        raise click.BadParameter("no seeds given", param_hint="--seeds")
    nemeses = _split(str(kw["nemesis"]))
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    table = []
    worst = EXIT_OK
    for i, seed in enumerate(seed_list):
        if (root / "STOP").exists():  # `touch OUT/STOP` ends a campaign cleanly between runs
            click.echo(f"{root / 'STOP'} exists: not starting more runs")
            break
        nemesis = nemeses[i % len(nemeses)] if rotate and nemeses else ",".join(nemeses)
        run_dir = root / f"seed{seed}-{nemesis.replace(',', '+')}"
        options = _options(str(run_dir), seed, {**kw, "nemesis": nemesis})
        started = time.monotonic()
        click.echo(f"== run seed {seed}, nemesis {nemesis} -> {run_dir}")
        code = run(options)
        results = (
            json.loads((run_dir / RESULTS_FILE).read_text())
            if (run_dir / RESULTS_FILE).exists()
            else []
        )
        table.append(
            {
                "seed": seed,
                "nemesis": nemesis,
                "dir": str(run_dir),
                "verdict": verdict_word(code),
                "seconds": round(time.monotonic() - started, 1),
                "operations": sum(r.get("operations", 0) for r in results),
                "anomalies": [
                    f"{r['checker']}: {r['summary']}" for r in results if r["status"] == "anomaly"
                ],
            }
        )
        (root / "campaign.json").write_text(json.dumps(table, indent=2))
        if code == EXIT_ANOMALY or (code == EXIT_UNKNOWN and worst == EXIT_OK):
            worst = code
    click.echo("")
    for row in table:
        click.echo(
            f"  seed {row['seed']:>4} {row['nemesis']:28} {row['verdict']:8} {row['operations']:>6} ops  {row['dir']}"
        )
    click.echo(
        f"campaign: {len(table)} runs, {sum(r['operations'] for r in table)} operations checked, "
        f"{sum(1 for r in table if r['verdict'] == 'ANOMALY')} with anomalies"
    )
    sys.exit(worst)


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (a CI timeout, ``kill``) stops a run as Ctrl-C does, so its teardown stops the cluster."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        cli.main(args=argv, prog_name="python -m jepsen_like", standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return EXIT_ERROR
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return EXIT_ERROR
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_ERROR
    except RunError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_ERROR
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
