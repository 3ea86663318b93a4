"""The member nemesis, and the check after each heal that every server came back.

One short real run of ``member`` on three servers must stay valid with the
new member set converged; a server that cannot come back after a heal must
be reported at once, with its cause, and classified: a port held by someone
else is the harness's failure, a server that will not start on free ports
is the product's anomaly.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jepsen_like import runner
from jepsen_like.health import diagnose
from jepsen_like.nemesis import Fault
from jepsen_like.runner import EXIT_OK, EXIT_UNKNOWN, RESULTS_FILE, RUN_FILE, RunOptions, run
from jepsen_like.testbed import Testbed
from tests.jepsen.support import short_run


@pytest.mark.cluster
@pytest.mark.slow  # a whole run (CI time): `make test-slow`
def test_member_nemesis_keeps_the_checkers_valid_and_converges_on_the_new_members(
    tmp_path: Path,
) -> None:
    result = short_run(tmp_path / "run", seed=7, nemeses=["member"], time=18.0, hold=(1.0, 2.0))
    assert result.code == EXIT_OK, result.explain()
    # the journal subscriber of a replaced server's place follows the new server
    assert result.checker("journal")["status"] == "ok", result.explain()
    windows = [f for f in result.faults if f["kind"] == "member"]
    assert windows and all(f["end"] is not None for f in windows), result.explain()
    # every removal was followed by a join, and the new member caught up
    assert all("joined" in f["detail"] for f in windows), result.explain()
    assert not any("NOT caught up" in f["detail"] for f in windows), result.explain()
    members = result.meta["members"]
    convergence = result.checker("convergence")
    assert convergence["status"] == "ok" and set(convergence["details"]["final"]) == set(
        members["final"]
    )
    assert all(
        view == sorted(members["final"]) for view in convergence["details"]["members"].values()
    )
    # after a replacement, a new server is among the members
    if any("place" in f["detail"] for f in windows):
        assert members["retired"] and set(members["final"]) - {"server1", "server2", "server3"}
    assert result.checker("up-after-heal")["status"] == "ok"
    assert result.meta["nemesis_stats"]["member"]["changes"]


class HoldItsPort(Fault):
    """Test fault: kill -9 a follower and listen on its RPC port, so its restart cannot bind it."""

    name = "hold-port"

    def __init__(self) -> None:
        self.held: socket.socket | None = None
        self.victim = ""

    def inject(
        self, testbed: Testbed, rng: random.Random
    ) -> tuple[Callable[[], str], list[str], str]:
        if self.held is not None:  # once is enough: the server stays down for the rest of the run
            return (lambda: "nothing to undo"), [], "nothing (a port is held already)"
        leader = testbed.wait_for_leader(10.0)
        self.victim = next(n for n in testbed.names if n != leader)
        testbed.kill(self.victim)
        host, _, port = testbed.node(self.victim).rpc_addr.rpartition(":")
        self.held = _listen(host, int(port))

        def undo() -> str:
            testbed.start(self.victim)
            return f"restarted {self.victim}"

        return undo, [self.victim], f"kill -9 {self.victim} and hold its RPC port"


def _listen(host: str, port: int, timeout: float = 10.0) -> socket.socket:
    """A socket listening on the killed server's port, retried briefly.

    A killed server's threads may still be closing its sockets when its
    main thread is already reaped, so the first binds can fail.
    """
    deadline = time.monotonic() + timeout
    while True:
        held = socket.socket()
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past its TIME_WAITs
        try:
            held.bind((host, port))
            held.listen()
            return held
        except OSError:
            held.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def hold_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldItsPort]:
    fault = HoldItsPort()
    monkeypatch.setitem(runner.FAULTS, HoldItsPort.name, lambda: fault)
    yield fault
    if fault.held is not None:
        fault.held.close()


@pytest.mark.cluster
def test_a_server_that_cannot_come_back_is_reported_at_once_as_a_harness_failure(
    tmp_path: Path, hold_port: HoldItsPort
) -> None:
    said: list[str] = []
    out = tmp_path / "run"
    options = RunOptions(
        out=str(out),
        seed=3,
        nemeses=[HoldItsPort.name],
        workloads=["register"],
        time=6.0,
        quiet=(0.5, 0.5),
        hold=(1.0, 1.0),
        convergence_wait=20.0,
        keep_cluster_data=False,
    )
    code = run(options, log=lambda line="": said.append(str(line)))
    reported = [i for i, line in enumerate(said) if "is not up after healing hold-port" in line]
    healed = next(i for i, line in enumerate(said) if line.startswith("healed"))
    assert reported and reported[0] < healed, said  # during the run, not at its end
    line = said[reported[0]]
    assert line.startswith("harness failure:") and hold_port.victim in line, line
    assert "address already in use" in line.lower(), line  # the cause, from the server's own output
    results = json.loads((out / RESULTS_FILE).read_text())
    assert not [r for r in results if r["status"] == "anomaly"], results
    harness = [r for r in results if r["checker"] == "harness"]
    assert harness and all(hold_port.victim in r["summary"] for r in harness), harness
    # The final convergence check leaves it out instead of calling it silent: the harness held its port.
    convergence = next(r for r in results if r["checker"] == "convergence")
    assert convergence["status"] == "ok" and hold_port.victim in convergence["details"]["excused"]
    assert code == EXIT_UNKNOWN
    summary = (out / "summary.txt").read_text()
    assert "product anomalies: 0" in summary and "harness failures: " in summary
    assert json.loads((out / RUN_FILE).read_text())["not_up"][0]["kind"] == "harness"


def _dead_server(tmp_path: Path, said: str) -> tuple[Testbed, str]:
    """A laid-out, never-started testbed whose server1 "exited" saying ``said``."""
    tb = Testbed.create(tmp_path / "cluster", 3, proxies=False)
    node = tb.node("server1")
    Path(node.log_file).with_suffix(".out").write_text(f"starting\n{said}\n")
    Path(node.log_file).write_text(
        json.dumps({"level": "error", "event": "raft port check failed", "error": "x"}) + "\n"
    )
    return tb, "server1"


def test_a_server_that_exits_on_free_ports_is_an_anomaly(tmp_path: Path) -> None:
    tb, name = _dead_server(tmp_path, "caravan agent: cannot start: members.json is unreadable")
    try:
        miss = diagnose(tb, name, 1.0)
    finally:
        tb.teardown()
    assert miss.kind == "anomaly", miss
    assert (
        "exited though its ports are free" in miss.cause
        and "members.json is unreadable" in miss.cause
    )
    assert "raft port check failed: x" in miss.cause  # its last error log event too


def test_a_server_whose_port_is_held_elsewhere_is_a_harness_failure(tmp_path: Path) -> None:
    tb, name = _dead_server(
        tmp_path, "caravan agent: cannot start: [Errno 98] Address already in use"
    )
    host, _, port = tb.node(name).raft_addr.rpartition(":")
    with socket.socket() as held:
        # As a server listens (SO_REUSEADDR): a plain bind fails on a port an earlier test's
        # server left in TIME_WAIT, which the address book rightly counts as free.
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind((host, int(port)))
        held.listen()
        try:
            miss = diagnose(tb, name, 1.0)
        finally:
            tb.teardown()
    assert miss.kind == "harness", miss
    assert tb.node(name).raft_addr in miss.cause and "Address already in use" in miss.cause


def test_the_testbed_takes_its_ports_from_the_launchers_address_book(tmp_path: Path) -> None:
    tb = Testbed.create(tmp_path / "cluster", 5, proxies=False)
    try:
        addresses = [a for n in tb.cluster.nodes for a in (n.rpc_addr, n.raft_addr, n.http_address)]
        assert len(set(addresses)) == len(addresses)
        # the book remembers them: a port drawn later (a server added mid-run) is never one of them
        later = {tb.book.get("127.0.0.1") for _ in range(20)}
        assert not later & set(addresses)
    finally:
        tb.teardown()


def test_old_runs_without_heal_checks_still_check(tmp_path: Any) -> None:
    from jepsen_like.checkers import check_convergence, check_heals

    assert check_heals({}) == []
    observed = {"final": {"a": {"digest": "d", "index": 3}, "b": {"digest": "d", "index": 3}}}
    assert check_convergence(observed).status == "ok"
    observed |= {"members": {"a": ["a", "b"], "b": ["a"]}, "expected_members": ["a", "b"]}
    verdict = check_convergence(observed)
    assert verdict.status == "anomaly" and "b lists a" in verdict.summary


def test_a_membership_change_is_never_held_with_another_fault() -> None:
    import threading

    from jepsen_like.catalogue import FAULTS
    from jepsen_like.nemesis import Nemesis

    faults = [FAULTS[name]() for name in ("kill", "pause", "member")]
    nemesis = Nemesis(None, faults, random.Random(5), None, threading.Event(), overlap=True)  # type: ignore[arg-type]
    picks = [[f.name for f in nemesis._pick()] for _ in range(400)]
    assert ["member"] in picks and any(len(p) == 2 for p in picks)
    assert all(p == ["member"] for p in picks if "member" in p)
