"""``caravan alloc status`` shows reschedule attempts and the next reschedule time, as ``nomad alloc status`` does;
and a job-level reschedule block registered over HTTP comes back merged, end to end.

The formatting is Nomad's (command/alloc_status.go, ``Allocation.RescheduleInfo``,
``prettyTimeDiff``), checked here without a cluster. The cluster test
registers a batch job whose tasks crash through ``PUT /v1/jobs`` on a
one-server cluster with a simulated client, reads the merged policy back
through HTTP and ``caravan job status --json``, and reads ``caravan alloc
status`` of the crashed allocs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from fsm.structs import HOUR, MINUTE, SECOND
from node.cli import allocs as cli_allocs
from node.cli.allocs import pretty_time_diff, reschedule_info, reschedule_lines
from node.wire.errors import NOT_FOUND, RPCError
from tests.http.support import HTTPCluster, start_cluster, stop_cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000 * SECOND
LIMITED = {"Attempts": 3, "Interval": HOUR, "Delay": 5 * SECOND, "DelayFunction": "constant", "MaxDelay": 0,
           "Unlimited": False}


def failed_alloc(events: list[int], **kw: Any) -> dict[str, Any]:
    """An alloc as ``alloc.get`` answers, rescheduled at the times ``events``."""
    tracker = {"Events": [{"RescheduleTime": t, "PrevAllocID": "p", "PrevNodeID": "n", "Delay": 5 * SECOND}
                          for t in events]} if events else None
    return {"ID": "a" * 36, "JobID": "j", "JobVersion": 0, "TaskGroup": "g", "ClientStatus": "failed",
            "ModifyTime": NOW, "RescheduleTracker": tracker, "FollowupEvalID": "", "NextAllocation": "", **kw}


@pytest.mark.parametrize(("first", "second", "text"), [
    (NOW + 25 * SECOND, NOW, "25s from now"),
    (NOW, NOW + 25 * SECOND, "25s ago"),
    (NOW + 65 * SECOND, NOW, "1m5s from now"),
    (NOW + HOUR + 5 * SECOND + 7 * MINUTE, NOW, "1h7m from now"),  # the two largest periods only
    (NOW + 3 * 86400 * SECOND + 2 * HOUR, NOW, "3d2h from now"),
    (NOW + 400_000_000, NOW, "0s ago"),  # both round to the same second
    (NOW, NOW, "0s ago"),
])  # fmt: skip
def test_pretty_time_diff_is_nomads(first: int, second: int, text: str) -> None:
    assert pretty_time_diff(first, second) == text


def test_attempts_count_the_events_within_the_interval_before_the_modify_time() -> None:
    events = [{"RescheduleTime": NOW - 2 * HOUR}, {"RescheduleTime": NOW - 30 * MINUTE}, {"RescheduleTime": NOW - SECOND}]
    assert reschedule_info(events, LIMITED, NOW) == (2, 3)
    assert reschedule_info(events, {**LIMITED, "Attempts": 0, "Unlimited": True}, NOW) == (0, 0)


def test_the_lines_nomad_prints_and_when() -> None:
    alloc = failed_alloc([NOW - 10 * MINUTE], NextAllocation="b" * 36)
    assert reschedule_lines(alloc, LIMITED, NOW + 20 * SECOND, NOW) == [
        ("Reschedule Attempts", "1/3"),
        ("Replacement Alloc ID", "bbbbbbbb"),
        ("Reschedule Eligibility", "20s from now"),
    ]
    # Never rescheduled, an unlimited policy, a follow-up already due: nothing to say.
    assert reschedule_lines(failed_alloc([]), LIMITED, 0, NOW) == []
    unlimited = {**LIMITED, "Attempts": 0, "Unlimited": True}
    assert reschedule_lines(failed_alloc([NOW - MINUTE]), unlimited, NOW - SECOND, NOW) == []
    assert reschedule_lines(failed_alloc([NOW - MINUTE]), None, 0, NOW) == []


class FakeCtx:
    """The reads ``alloc status`` makes, answered from maps (a missing eval is NOT_FOUND)."""

    def __init__(self, alloc: dict[str, Any], job: dict[str, Any], evals: dict[str, dict[str, Any]]) -> None:
        self.alloc, self.job, self.evals = alloc, job, evals
        self.as_json = False

    def read(self, method: str, args: dict[str, Any] | None = None) -> Any:
        args = args or {}
        if method == "alloc.get":
            return self.alloc
        if method == "job.get":
            return self.job
        if method == "job.versions":
            return {"Versions": [self.job, {**self.job, "Version": 0, "TaskGroups": [
                {"Name": "g", "ReschedulePolicy": {**LIMITED, "Attempts": 5}}]}]}
        if method == "eval.get":
            if args["eval_id"] not in self.evals:
                raise RPCError(NOT_FOUND, "evaluation not found")
            return self.evals[args["eval_id"]]
        raise AssertionError(method)


def run_status(monkeypatch: pytest.MonkeyPatch, ctx: FakeCtx) -> str:
    monkeypatch.setattr(cli_allocs, "make_ctx", lambda *a, **k: ctx)
    monkeypatch.setattr(cli_allocs.time, "time_ns", lambda: NOW)
    out = CliRunner().invoke(cli_allocs.alloc, ["status", "aaaa", "--address", "127.0.0.1:1"])
    assert out.exit_code == 0, out.output
    return out.output


def test_alloc_status_prints_the_reschedule_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"ID": "j", "Version": 0, "TaskGroups": [{"Name": "g", "ReschedulePolicy": LIMITED}]}
    alloc = failed_alloc([NOW - 10 * MINUTE, NOW - 5 * MINUTE], FollowupEvalID="e1")
    text = run_status(monkeypatch, FakeCtx(alloc, job, {"e1": {"ID": "e1", "WaitUntil": NOW + 65 * SECOND}}))
    lines = {ln.split("  ")[0]: ln.split("  ")[-1].strip() for ln in text.splitlines()}
    assert lines["Reschedule Attempts"] == "2/3"
    assert lines["Reschedule Eligibility"] == "1m5s from now"
    assert lines["Client Status"] == "failed"
    # The alloc runs an older version of the job: that version's policy counts.
    newer = {**job, "Version": 1}
    text = run_status(monkeypatch, FakeCtx(alloc, newer, {}))
    assert "Reschedule Attempts  2/5" in text and "Reschedule Eligibility" not in text


# -- end to end: a real cluster, HTTP registration, the CLI ------------------------------------
@pytest.fixture
def crash_cluster(tmp_path: Path) -> Iterator[HTTPCluster]:
    """One server with short heartbeats and a simulated client of two nodes; stopped afterwards."""
    config = '[scheduler]\nmin_heartbeat_ttl = "2s"\nheartbeat_grace = "2s"\neval_nack_delay = "200ms"\n'
    c = start_cluster(tmp_path / "cluster", 1, config)
    log = open(tmp_path / "sim.log", "wb")  # noqa: SIM115 - handed to the child
    sim = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "client", "sim", "--nodes", "2", "--name-prefix", "crash",
         "--servers", ",".join(c.cluster.rpc_addresses)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
    )  # fmt: skip
    log.close()
    try:
        with c.rpc() as client:
            wait_until(lambda: len([n for n in client.call("node.list", {})["data"] if n["Status"] == "ready"]) == 2,
                       60, "two sim nodes ready")
        yield c
    finally:
        if sim.poll() is None:
            os.kill(sim.pid, signal.SIGTERM)
            try:
                sim.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(sim.pid, signal.SIGKILL)
        stop_cluster(c)


def caravan(c: HTTPCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(c.cluster.rpc_addresses)}
    env.pop("CARAVAN_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)  # fmt: skip


@pytest.mark.cluster
def test_a_job_level_block_registered_over_http_reschedules_as_merged(crash_cluster: HTTPCluster) -> None:
    c = crash_cluster
    base = c.leader_url
    # Job level: 2 attempts in an hour; the group only lengthens the delay (batch defaults fill the rest).
    body = {"Job": {"ID": "crashy", "Type": "batch", "Datacenters": ["dc1"],
                    "Reschedule": {"Attempts": 2, "Interval": HOUR},
                    "TaskGroups": [{"Name": "g", "Count": 1, "ReschedulePolicy": {"Delay": 20 * SECOND},
                                    "Tasks": [{"Name": "t", "Driver": "sim",
                                               "Config": {"run_for": "200ms", "exit_code": 1}}]}]}}  # fmt: skip
    resp = requests.put(f"{base}/v1/jobs", json=body, timeout=15)
    assert resp.status_code == 200, resp.text
    merged = {"Attempts": 2, "Interval": HOUR, "Delay": 20 * SECOND, "DelayFunction": "constant", "MaxDelay": 0,
              "Unlimited": False}
    job = requests.get(f"{base}/v1/job/crashy", timeout=15).json()
    # Merged into the group; the job-level key is Nomad's zero (null), as every api.Job carries it.
    assert job["TaskGroups"][0]["ReschedulePolicy"] == merged and job["Reschedule"] is None
    out = caravan(c, "job", "status", "crashy", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["TaskGroups"][0]["ReschedulePolicy"] == merged
    # A bad job-level block is refused with Nomad's message.
    bad = {"Job": {**body["Job"], "ID": "bad", "Reschedule": {"Attempts": 2, "Interval": 10 * SECOND}}}
    refused = requests.put(f"{base}/v1/jobs", json=bad, timeout=15)
    assert refused.status_code == 400 and "Interval cannot be less than 15s (got 10s)" in refused.text

    def allocs() -> list[dict[str, Any]]:
        return requests.get(f"{base}/v1/job/crashy/allocations", timeout=15).json()

    def crashed_waiting() -> dict[str, Any] | None:
        return next((a for a in allocs() if a["ClientStatus"] == "failed" and a.get("FollowupEvalID")), None)

    first = wait_until(crashed_waiting, 60, "the crash waiting for its 20 s delay")
    status = caravan(c, "alloc", "status", first["ID"])
    assert status.returncode == 0, status.stderr
    assert "Reschedule Eligibility" in status.stdout and "from now" in status.stdout, status.stdout
    assert "Reschedule Attempts" not in status.stdout  # never rescheduled yet: Nomad prints none

    def second_crash() -> dict[str, Any] | None:
        return next((a for a in allocs() if a["ClientStatus"] == "failed" and a["ID"] != first["ID"]), None)

    second = wait_until(second_crash, 90, "the replacement crashing too")
    status = caravan(c, "alloc", "status", second["ID"])
    assert status.returncode == 0, status.stderr
    assert "Reschedule Attempts" in status.stdout and "1/2" in status.stdout, status.stdout
