"""One run: start a cluster, run workloads under a nemesis, heal, check, report.

Phases (all times on the run's monotonic clock):

1. set-up -- lay out ``--nodes`` servers under ``OUT/cluster`` with the
   raft proxies, start them, wait for a leader, probe each workload;
2. faults -- client lanes run for ``--time`` seconds while the nemesis
   injects faults;
3. heal -- clients stop, the nemesis undoes its current fault, the runner
   undoes anything left (continue, restart, heal the network), waits for
   a leader and checks every server is up (as the nemesis does after each
   heal: ``jepsen_like.health``);
4. final -- workloads' final reads (the set's read of everything), then the
   convergence observation: poll ``debug.digest`` (stale) on every current
   member until all report one applied index, and read each one's member
   list (after the member nemesis, the set it left);
5. check + report -- ``checkers`` over the recorded files, then
   ``report.write`` (results.json, summary.txt, timeline.html, plot.png).

Everything a checker needs is on disk, so ``python -m jepsen_like check
OUT`` re-checks a run without a cluster.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jepsen_like import availability, checkers
from jepsen_like.catalogue import (
    FAULTS,
    NEEDS_WORKLOAD,
    WORKLOAD_CHECKS,
    WORKLOADS,
)
from jepsen_like.failover_check import check_failover
from jepsen_like.health import NotUp
from jepsen_like.history import load_events, operations_from_events
from jepsen_like.nemesis import Nemesis, Timing
from jepsen_like.recorder import (
    FAULTS_FILE,
    Clock,
    Fault,
    FaultLog,
    HistoryRecorder,
    history_file,
    load_faults,
)
from jepsen_like.testbed import Testbed, TestbedError
from jepsen_like.workloads import JOURNAL_FILE, Lane, RunContext, Workload
from node import devcluster as cl
from node.wire.rpc_client import RPCClient

RUN_FILE = "run.json"
CONVERGENCE_FILE = "convergence.json"
RESULTS_FILE = "results.json"

#: raft_compaction_entries when snapshot-lag runs: the workloads write ~100-300 entries/s, so the
#: others compact past an isolated follower within a 2-6 s hold (filler covers slower runs)
SNAPSHOT_LAG_COMPACTION = 300
#: the clock nemesis: the servers' test-only wall-clock switch and the offset file it names
UNSAFE_WALL_CLOCK_ENV = "CARAVAN_UNSAFE_WALL_CLOCK_FILE"
CLOCK_FILE = "clock-offset"

EXIT_OK = 0
EXIT_ANOMALY = 1
EXIT_UNKNOWN = 2


class RunError(RuntimeError):
    """The run could not be carried out (bad options, cluster would not start)."""


@dataclass
class RunOptions:
    out: str
    seed: int = 0
    nodes: int = 3
    time: float = 60.0
    nemeses: list[str] = field(default_factory=lambda: ["kill", "pause", "partition"])
    workloads: list[str] = field(default_factory=lambda: ["register", "set"])
    register_lanes: int = 4
    set_lanes: int = 2
    op_timeout: float = 5.0
    think: float = 0.02
    quiet: tuple[float, float] = (2.0, 5.0)
    hold: tuple[float, float] = (2.0, 6.0)
    #: sometimes hold two different faults at once
    overlap: bool = False
    checker_timeout: float = 120.0
    convergence_wait: float = 60.0
    #: the servers' raft_compaction_entries; None: SNAPSHOT_LAG_COMPACTION when snapshot-lag or member is enabled,
    #: else the profile's default
    compaction_entries: int | None = None
    #: extra environment for the server processes (test-only switches)
    server_env: dict[str, str] = field(default_factory=dict)
    keep_cluster_data: bool = True

    def validate(self) -> None:
        if self.nodes not in (3, 5):
            raise RunError("--nodes must be 3 or 5")
        if self.time <= 0:
            raise RunError("--time must be positive")
        unknown = [n for n in self.nemeses if n not in FAULTS and n != "none"]
        if unknown:
            raise RunError(
                f"unknown nemesis {', '.join(unknown)}; choose from {', '.join(FAULTS)} or none"
            )
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise RunError(
                f"unknown workload {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
            )
        if not self.workloads:
            raise RunError("give at least one workload")
        if "lifecycle" in self.workloads and {"set", "register"} & set(self.workloads):
            raise RunError(
                "the lifecycle workload forces GC, which collects the set/register workloads' dead jobs; "
                "run it on its own (or with journal)"
            )
        if self.op_timeout <= 0:
            raise RunError("--op-timeout must be positive")
        if self.think < 0:
            raise RunError("--think must be zero or positive")
        if self.compaction_entries is not None and self.compaction_entries < 1:
            raise RunError("--compaction-entries must be positive")
        if self.register_lanes < 1 or self.set_lanes < 1:
            raise RunError("--register-clients and --set-clients must be at least 1")
        out = Path(self.out)
        if out.exists() and any(out.iterdir()):
            raise RunError(f"{out} is not empty; give a new directory for the run")


@contextmanager
def _server_env(extra: dict[str, str]) -> Iterator[None]:
    """Server processes inherit the harness's environment; set the extras around the run."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def workload_names(options: RunOptions) -> list[str]:
    """The workloads asked for, plus those an enabled nemesis's checker needs (``catalogue.NEEDS_WORKLOAD``)."""
    names = list(options.workloads)
    for nemesis in options.nemeses:
        needed = NEEDS_WORKLOAD.get(nemesis)
        if needed and needed not in names:
            names.append(needed)
    return names


def merge_server_configs(configs: list[str]) -> str:
    """Workloads' server configs as one TOML text: a table several of them set appears once, later keys winning.

    Joined as they were, two workloads that both set ``[scheduler]`` keys
    (lifecycle and failover) made a config the servers refuse. Only what
    workload configs use is understood: top-level keys and ``[table]``
    sections of one-line ``key = value`` entries; comments are dropped.
    """
    tables: dict[str, dict[str, str]] = {"": {}}
    for text in configs:
        table = ""
        for line in text.splitlines():
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            if entry.startswith("[") and entry.endswith("]"):
                table = entry[1:-1].strip()
                tables.setdefault(table, {})
                continue
            tables.setdefault(table, {})[entry.partition("=")[0].strip()] = entry
    lines = list(tables.pop("").values())
    for table, entries in tables.items():
        lines += ["", f"[{table}]", *entries.values()]
    return "\n".join(lines) + "\n" if lines else ""


def _build_workloads(options: RunOptions) -> list[Workload]:
    built: list[Workload] = []
    for name in workload_names(options):
        workload = WORKLOADS[name]()
        if name == "register":
            workload.lanes = options.register_lanes
        elif name == "set":
            workload.lanes = options.set_lanes
        built.append(workload)
    return built


def compaction_entries(options: RunOptions) -> int | None:
    """The servers' compaction threshold: as given, or small when snapshot-lag or member runs.

    Small, so a lagging follower (snapshot-lag) and a new member (member)
    catch up by snapshot install, the path worth testing.
    """
    if options.compaction_entries is not None:
        return options.compaction_entries
    return SNAPSHOT_LAG_COMPACTION if {"snapshot-lag", "member"} & set(options.nemeses) else None


def code_version() -> str:
    """The commit of the server code under test (``+dirty`` with local edits), or ``unknown``.

    Servers run from the source tree the harness imports ``node`` from, so a
    campaign against a moving work tree says so in every run.json.
    """
    root = Path(cl.__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run(options: RunOptions, log: Any = print) -> int:
    """Carry out one run; returns the exit code (0 ok, 1 anomaly, 2 unknown)."""
    options.validate()
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    nemesis_rng = random.Random(rng.getrandbits(64))
    clock = Clock()
    meta: dict[str, Any] = {
        "options": {**asdict(options), "quiet": list(options.quiet), "hold": list(options.hold)},
        "seed": options.seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "code": code_version(),
    }
    workloads = _build_workloads(options)
    lane = 0
    for workload in workloads:
        workload.configure(options.nodes)
        workload.first_lane = lane
        lane += workload.lanes
    final_lane = lane
    total_lanes = lane + 1
    meta["lanes"] = {w.name: [w.first_lane, w.lanes] for w in workloads} | {
        "final": [final_lane, 1]
    }
    meta["total_lanes"] = total_lanes
    (out / RUN_FILE).write_text(json.dumps(meta, indent=2))

    clock_file = CLOCK_FILE if "clock" in options.nemeses else None
    env = options.server_env | ({UNSAFE_WALL_CLOCK_ENV: CLOCK_FILE} if clock_file else {})
    with _server_env(env):
        extra = merge_server_configs([w.server_config for w in workloads if w.server_config])
        testbed = Testbed.create(
            out / "cluster",
            options.nodes,
            extra_config=extra,
            compaction_entries=compaction_entries(options),
            clock_file=clock_file,
        )
        try:
            return _run_on(
                testbed,
                options,
                workloads,
                out,
                clock,
                nemesis_rng,
                rng,
                meta,
                total_lanes,
                final_lane,
                log,
            )
        finally:
            testbed.teardown()
            if not options.keep_cluster_data:
                for node in testbed.cluster.nodes:
                    shutil.rmtree(node.data_dir, ignore_errors=True)


def _run_on(
    testbed: Testbed,
    options: RunOptions,
    workloads: list[Workload],
    out: Path,
    clock: Clock,
    nemesis_rng: random.Random,
    rng: random.Random,
    meta: dict[str, Any],
    total_lanes: int,
    final_lane: int,
    log: Any,
) -> int:
    try:
        testbed.start_all(timeout=60.0)
    except TestbedError as exc:
        raise RunError(str(exc)) from None
    log(f"cluster of {options.nodes} up in {testbed.directory}; leader {testbed.leader()}")

    # Probe workloads and faults; skipped ones are reported, not run.
    skipped: dict[str, str] = {}
    with RPCClient(testbed.rpc_addresses, timeout=5.0) as probe_client:
        active: list[Workload] = []
        for workload in workloads:
            reason = workload.probe(probe_client)
            if reason:
                skipped[f"workload {workload.name}"] = reason
                log(f"workload {workload.name}: {reason}")
            else:
                active.append(workload)
    client_nodes = max((w.client_nodes for w in active), default=0)
    if client_nodes:
        testbed.start_client_sim(client_nodes, seed=options.seed)
        log(f"simulated client with {client_nodes} nodes started")
    faults = []
    for name in options.nemeses:
        if name == "none":
            continue
        fault = FAULTS[name]()
        reason = fault.unavailable(testbed)
        if reason:
            skipped[f"nemesis {name}"] = reason
            log(f"nemesis {name}: {reason}")
        else:
            faults.append(fault)

    stop = threading.Event()
    ctx = RunContext(
        addresses=testbed.client_addresses,  # the testbed keeps both current when a server is replaced
        clock=clock,
        stop=stop,
        servers=testbed.client_names,
        out=str(out),
        op_timeout=options.op_timeout,
        think=options.think,
        total_lanes=total_lanes,
    )
    recorders = {w.name: HistoryRecorder(out / history_file(w.name), clock) for w in active}
    fault_log = FaultLog(out / FAULTS_FILE, clock)
    nemesis = Nemesis(
        testbed,
        faults,
        nemesis_rng,
        fault_log,
        stop,
        Timing(quiet=options.quiet, hold=options.hold),
        overlap=options.overlap,
        report=log,
    )

    threads: list[threading.Thread] = []
    lingering: list[threading.Thread] = []  # lanes that run on until their workload's final phase
    crashes: list[str] = []
    for workload in active:
        for i in range(workload.lanes):
            lane = Lane(workload.first_lane + i, ctx, recorders[workload.name])
            lane_rng = random.Random(rng.getrandbits(64))

            def body(w: Workload = workload, ln: Lane = lane, r: random.Random = lane_rng) -> None:
                try:
                    w.run_lane(ln, ctx, r)
                except Exception as exc:  # noqa: BLE001 - a crashed client is a harness bug: report it
                    crashes.append(f"{w.name} lane {ln.lane}: {type(exc).__name__}: {exc}")

            thread = threading.Thread(target=body, name=f"{workload.name}-{i}", daemon=True)
            (lingering if workload.runs_past_stop else threads).append(thread)
    meta["phases"] = {"faults_start": clock.now()}
    for thread in threads + lingering:
        thread.start()
    nemesis.start()
    log(
        f"running {', '.join(w.name for w in active) or 'no workload'} for {options.time:g}s under "
        f"{', '.join(f.name for f in faults) or 'no faults'} (seed {options.seed})"
    )
    stop.wait(options.time)
    stop.set()
    for thread in threads:
        thread.join(options.op_timeout * 3 + 10)
    nemesis.join(60.0)
    meta["phases"]["faults_end"] = clock.now()

    leader, still_down = _final_heal(testbed, nemesis, crashes)
    meta["phases"]["healed"] = clock.now()
    log(f"healed; leader {leader}")

    final_ctx = RunContext(
        addresses=testbed.rpc_addresses,
        clock=clock,
        stop=threading.Event(),
        servers=list(testbed.names),
        out=str(out),
        op_timeout=max(options.op_timeout, 10.0),
        total_lanes=total_lanes,
    )
    for workload in active:
        workload.final(
            Lane(final_lane, final_ctx, recorders[workload.name]),
            final_ctx,
            time.monotonic() + 60.0,
        )
    for thread in lingering:
        thread.join(30.0)
    for workload in active:
        workload.close()
    meta["phases"]["final_reads"] = clock.now()
    skip = {
        miss.server for miss in still_down if miss.kind == "harness"
    }  # not waited for: they cannot answer
    observation = observe_convergence(testbed, options.convergence_wait, skip)
    (out / CONVERGENCE_FILE).write_text(json.dumps(observation, indent=2))
    meta["phases"]["end"] = clock.now()
    for recorder in recorders.values():
        recorder.close()

    meta["skipped"] = skipped
    meta["harness_errors"] = crashes + nemesis.errors
    meta["heal_checks"] = nemesis.heal_checks
    meta["not_up"] = [miss.to_json() for miss in nemesis.not_up]
    meta["down_at_end"] = [miss.to_json() for miss in still_down]
    meta["members"] = {"final": testbed.names, "retired": [n.id for n in testbed.retired]}
    meta["notes"] = ctx.notes
    meta["proxies"] = testbed.proxies.stats() if testbed.proxies else {}
    meta["compaction_entries"] = testbed.compaction_entries
    meta["nemesis_stats"] = {f.name: f.stats() for f in faults if f.stats()}
    meta["active_workloads"] = [w.name for w in active]
    (out / RUN_FILE).write_text(json.dumps(meta, indent=2))
    return check_dir(out, log=log, checker_timeout=options.checker_timeout)


def _final_heal(
    testbed: Testbed, nemesis: Nemesis, crashes: list[str]
) -> tuple[str | None, list[NotUp]]:
    """Undo every fault left, wait for a leader, and check every server is up: (the leader or None, those not up).

    A server not up here is reported like one after any heal; one the
    harness could not bring back (its port held elsewhere) is excused from
    the convergence verdict (``excused_servers``), since the run cannot say
    whether it would have converged.
    """
    try:
        testbed.heal_all()
    except Exception as exc:  # noqa: BLE001 - a server the harness could not start is reported below
        crashes.append(f"healing: {type(exc).__name__}: {exc}")
    leader = None
    try:
        leader = testbed.wait_for_leader(60.0)
    except TestbedError as exc:
        crashes.append(f"after healing: {exc}")
    return leader, nemesis.check_healed([], after="the end of the run")


def excused_servers(meta: dict[str, Any]) -> dict[str, str]:
    """Servers the final heal found down for the harness's own failure: name -> cause."""
    return {
        m["server"]: m["cause"] for m in meta.get("down_at_end") or [] if m.get("kind") == "harness"
    }


def observe_convergence(
    testbed: Testbed, wait: float, skip: set[str] | None = None
) -> dict[str, Any]:
    """Poll every member's stale digest until all report one applied index (or ``wait`` passes); then their member lists."""
    started = time.monotonic()
    polls = 0
    final: dict[str, Any] = {}
    while True:
        polls += 1
        final = {}
        for name in [n for n in testbed.names if n not in (skip or set())]:
            d = testbed.digest(name)
            final[name] = {"digest": d["digest"], "index": d["index"]} if d else None
        answered = [o for o in final.values() if o]
        if len(answered) == len(final) and len({o["index"] for o in answered}) == 1:
            break
        if time.monotonic() - started > wait:
            break
        time.sleep(0.2)  # polling a condition with a deadline
    members = {
        name: sorted(ids) if (ids := testbed.peer_ids(name)) is not None else None
        for name in testbed.names
    }
    return {
        "final": final,
        "polls": polls,
        "waited": round(time.monotonic() - started, 3),
        "members": members,
        "expected_members": sorted(testbed.names),
    }


def check_dir(out: str | Path, log: Any = print, checker_timeout: float = 120.0) -> int:
    """Check a recorded run directory; writes results and the report; returns the exit code."""
    from jepsen_like import report

    out = Path(out)
    if not (out / RUN_FILE).exists():
        raise RunError(
            f"{out} has no {RUN_FILE}; is it a run directory written by 'jepsen_like run'?"
        )
    meta = json.loads((out / RUN_FILE).read_text())
    results: list[checkers.CheckerResult] = []
    for name, reason in (meta.get("skipped") or {}).items():
        kind, _, what = name.partition(" ")
        results.append(
            checkers.CheckerResult(kind, what if kind == "workload" else None, "skipped", reason)
        )
    events: dict[str, list[Any]] = {}
    for name in meta.get("active_workloads", []):
        path = out / history_file(name)
        events[name] = load_events(path) if path.exists() else []
    if "register" in events:
        results.append(checkers.check_register(events["register"], timeout=checker_timeout))
    if "set" in events:
        results.append(checkers.check_set(events["set"]))
    if "lifecycle" in events:
        results.append(checkers.check_gc(events["lifecycle"]))
    if "journal" in events:
        results.append(checkers.check_journal(out / JOURNAL_FILE))
    if "failover" in events:
        windows = ((meta.get("nemesis_stats") or {}).get("clients") or {}).get("windows") or []
        results.append(check_failover(events["failover"], windows))
    for name, check in WORKLOAD_CHECKS.items():  # workloads that bring their own checker (catalogue)
        if name in events:
            results.append(check(events[name]))
    convergence = None
    if (out / CONVERGENCE_FILE).exists():
        convergence = json.loads((out / CONVERGENCE_FILE).read_text())
    results.append(checkers.check_convergence(convergence, excused_servers(meta)))
    results += checkers.check_heals(meta)
    if (out / "cluster").exists():
        results.append(checkers.check_server_logs(out / "cluster"))
    for error in meta.get("harness_errors") or []:
        results.append(checkers.CheckerResult(checkers.HARNESS, None, "unknown", error))
    faults = load_faults(out / FAULTS_FILE)
    if faults:  # informational figures, recomputed from the recorded files alone
        results.append(availability.result(availability_of(meta, events, faults)))
    (out / RESULTS_FILE).write_text(
        json.dumps([r.to_json() for r in results], indent=2, default=str)
    )
    code = exit_code(results)
    report.write(out, meta, events, faults, results, code)
    for r in results:
        log(f"  {r.status:8} {r.checker}{'/' + r.workload if r.workload else ''}: {r.summary}")
    log(f"verdict: {verdict_word(code)} -- report in {out}")
    return code


def availability_of(
    meta: dict[str, Any], events: dict[str, list[Any]], faults: list[Fault]
) -> list[availability.WindowAvailability]:
    """Each fault window's availability (``jepsen_like.availability``) from a run's files."""
    ops = {name: operations_from_events(evs) for name, evs in events.items()}
    return availability.windows(ops, faults, (meta.get("phases") or {}).get("faults_end"))


def exit_code(results: list[checkers.CheckerResult]) -> int:
    if any(r.status == "anomaly" for r in results):
        return EXIT_ANOMALY
    if any(r.status == "unknown" for r in results):
        return EXIT_UNKNOWN
    return EXIT_OK


def verdict_word(code: int) -> str:
    return {EXIT_OK: "VALID", EXIT_ANOMALY: "ANOMALY", EXIT_UNKNOWN: "UNKNOWN"}.get(code, "?")
