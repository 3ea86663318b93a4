"""Queues and priority classes over the CLI and HTTP: apply, list, status, hold, resume, delete, and bad input.

The first tests need no cluster: the CLI's tables over canned RPC answers,
and the HTTP routes over a stub server (what each route sends to its RPC).
The rest run against one real cluster per module, with ACLs bootstrapped,
so every command and route also shows it needs its token.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import structlog
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from fsm import codec
from fsm.queues import Queue, QuotaLimit
from node.cli import main
from node.cli.common import Ctx
from node.http.service import HTTPService
from tests.http.support import HTTPCluster, start_cluster, stop_cluster, wait_until

TIMEOUT = 30
REPO = Path(__file__).resolve().parents[2]

LAB_HCL = """
queue "team-a" {
  cohort      = "lab"
  description = "team a"
  resource "nvidia/gpu" {
    nominal         = 2
    borrowing_limit = 2
  }
  resource "cpu" { nominal = 20000 }
  preemption {
    reclaim_within_cohort = "Any"
    within_queue          = "LowerPriority"
  }
}

queue "team-b" {
  cohort = "lab"
  resource "nvidia/gpu" { nominal = 2 }
  preemption {
    reclaim_within_cohort = "Any"
    within_queue          = "LowerPriority"
  }
}
"""

CLASSES_HCL = """
priority_class "high" {
  value       = 1000
  description = "on call"
}

priority_class "low" {
  value = 10
}
"""

LEDGER = {
    "nvidia/gpu": {
        "nominal": 2,
        "borrowing_limit": 2,
        "lending_limit": None,
        "used": 3,
        "borrowed": 1,
        "lent": 0,
    },
    "cpu": {
        "nominal": 20000,
        "borrowing_limit": None,
        "lending_limit": None,
        "used": 0,
        "borrowed": 0,
        "lent": 0,
    },
}
TEAM_A = Queue(
    name="team-a",
    cohort="lab",
    resources=[
        QuotaLimit(name="nvidia/gpu", nominal=2, borrowing_limit=2),
        QuotaLimit(name="cpu", nominal=20000),
    ],
)


# -- the CLI over canned answers (no cluster) -------------------------------------------------------
@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """RPC answers by method, and the calls made (Ctx.call replaced)."""
    answers: dict[str, Any] = {"calls": []}

    def call(
        self: Ctx, method: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        answers["calls"].append((method, args or {}))
        return answers[method]

    monkeypatch.setattr(Ctx, "call", call)
    return answers


def test_status_prints_settings_then_the_ledger_then_the_counts(canned: dict[str, Any]) -> None:
    canned["queue.get"] = {
        "data": {"queue": codec.to_wire(TEAM_A), "ledger": LEDGER, "admitted": 3, "pending": 1},
        "index": 5,
    }
    out = CliRunner().invoke(main, ["queue", "status", "team-a"])
    assert out.exit_code == 0, out.output
    text = out.output
    assert text.index("Cohort") < text.index("Ledger") < text.index("Admitted")
    header = next(line for line in text.splitlines() if line.startswith("Resource"))
    assert header.split() == [
        "Resource",
        "Nominal",
        "Borrowing",
        "limit",
        "Lending",
        "limit",
        "Used",
        "Borrowed",
        "Lent",
    ]
    gpu = next(line for line in text.splitlines() if line.startswith("nvidia/gpu")).split()
    assert gpu == ["nvidia/gpu", "2", "2", "all", "3", "1", "0"]
    cpu = next(line for line in text.splitlines() if line.startswith("cpu")).split()
    assert cpu == ["cpu", "20000", "unlimited", "all", "0", "0", "0"]
    as_json = json.loads(CliRunner().invoke(main, ["queue", "status", "team-a", "-json"]).output)
    assert as_json["Ledger"]["nvidia/gpu"]["Borrowed"] == 1 and as_json["Cohort"] == "lab"
    assert as_json["Admitted"] == 3 and as_json["Pending"] == 1


def test_pending_prints_positions_and_the_last_eviction(canned: dict[str, Any]) -> None:
    eviction = {
        "reason": "InCohortReclamation",
        "message": "Preempted to accommodate a workload",
        "preemptor": "b",
        "index": 9,
        "time": 1,
    }
    canned["queue.pending"] = {
        "data": [
            {
                "job_id": "train-3",
                "namespace": "default",
                "position": 1,
                "priority": 0,
                "priority_class": "",
                "reason": "insufficient unused quota",
                "create_index": 4,
                "evictions": 1,
                "last_eviction": eviction,
            },
            {
                "job_id": "train-4",
                "namespace": "ml",
                "position": 2,
                "priority": 10,
                "priority_class": "low",
                "reason": "waiting",
                "create_index": 5,
                "evictions": 0,
                "last_eviction": None,
            },
        ],
        "index": 9,
        "next_token": "",
    }
    out = CliRunner().invoke(main, ["queue", "pending", "team-a"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split()[:5] == ["Position", "Job", "Priority", "Class", "Reason"]
    assert lines[1].split()[:2] == ["1", "train-3"] and "Preempted to accommodate" in lines[1]
    assert "ml/train-4" in lines[2] and "low" in lines[2]
    assert canned["calls"][0] == ("queue.pending", {"name": "team-a"})
    rows = json.loads(CliRunner().invoke(main, ["queue", "pending", "team-a", "--json"]).output)
    assert rows[0]["Position"] == 1 and rows[0]["LastEviction"]["Reason"] == "InCohortReclamation"


def test_apply_sends_each_queue_and_hold_drain_resume_send_the_stop_policy(
    canned: dict[str, Any], tmp_path: Path
) -> None:
    canned["queue.upsert"] = {"index": 11}
    canned["queue.stop"] = {"index": 12}
    spec = tmp_path / "lab.hcl"
    spec.write_text(LAB_HCL)
    out = CliRunner().invoke(main, ["queue", "apply", str(spec)])
    assert out.exit_code == 0 and out.output.count("Successfully applied queue") == 2, out.output
    sent = [codec.from_wire(Queue, args["queue"]) for method, args in canned["calls"]]
    assert [q.name for q in sent] == ["team-a", "team-b"] and sent[0].resources[
        0
    ].borrowing_limit == 2
    for verb, policy in (("hold", "Hold"), ("drain", "HoldAndDrain"), ("resume", "None")):
        out = CliRunner().invoke(main, ["queue", verb, "team-a"])
        assert out.exit_code == 0 and "index 12" in out.output, out.output
        assert canned["calls"][-1] == ("queue.stop", {"name": "team-a", "policy": policy})


def test_a_bad_file_is_one_line_and_sends_nothing(canned: dict[str, Any], tmp_path: Path) -> None:
    spec = tmp_path / "lab.hcl"
    spec.write_text(LAB_HCL + 'queue "team-c" {\n  resource "cpu" { nominal = -1 }\n}\n')
    out = CliRunner().invoke(main, ["queue", "apply", str(spec)])
    assert out.exit_code == 1 and canned["calls"] == []
    assert (
        out.output.strip().count("\n") == 0
        and 'queue "team-c": resource "cpu": nominal must be' in out.output
    )


# -- the HTTP routes over a stub server (no cluster) ---------------------------------------------------
def _stub(methods: dict[str, Any]) -> Any:
    config = SimpleNamespace(rpc_max_frame=1 << 20, http_event_heartbeat=1.0)
    rpc = SimpleNamespace(lookup=lambda m: (methods[m], False) if m in methods else None)
    raft = SimpleNamespace(leader_address="127.0.0.1:1")
    return SimpleNamespace(log=structlog.get_logger(), config=config, rpc=rpc, raft=raft)


def _fetch(methods: dict[str, Any], verb: str, path: str, body: Any = None) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        app = HTTPService(_stub(methods)).build_app()
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(verb, path, json=body)
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    return asyncio.run(go())


def _recorder(answer: Any) -> tuple[list[dict[str, Any]], Any]:
    calls: list[dict[str, Any]] = []

    async def handler(ctx: Any, args: dict[str, Any]) -> Any:
        calls.append(args)
        return answer

    return calls, handler


def test_http_put_checks_the_body_and_sends_the_record() -> None:
    calls, upsert = _recorder({"index": 21, "name": "team-a"})
    body = {
        "Name": "team-a",
        "Cohort": "lab",
        "Resources": [{"Name": "nvidia/gpu", "Nominal": 2, "BorrowingLimit": 2}],
    }
    status, out = _fetch({"queue.upsert": upsert}, "PUT", "/v1/queue/team-a", body)
    assert status == 200 and out["Index"] == 21
    assert codec.from_wire(Queue, calls[0]["queue"]).resources == [
        QuotaLimit(name="nvidia/gpu", nominal=2, borrowing_limit=2)
    ]
    status, out = _fetch({"queue.upsert": upsert}, "POST", "/v1/queue/other", body)
    assert status == 400 and "does not match the path's 'other'" in out
    status, out = _fetch(
        {"queue.upsert": upsert}, "PUT", "/v1/queue/team-a", {**body, "Cohort": ""}
    )
    assert status == 400 and "needs a cohort to borrow or lend" in out and "\n" not in out
    assert len(calls) == 1


def test_http_reads_answer_in_the_definitions_json_names() -> None:
    _, get = _recorder(
        {
            "data": {"queue": codec.to_wire(TEAM_A), "ledger": LEDGER, "admitted": 3, "pending": 1},
            "index": 8,
        }
    )
    status, out = _fetch({"queue.get": get}, "GET", "/v1/queue/team-a")
    assert status == 200 and out["Name"] == "team-a" and out["Ledger"]["nvidia/gpu"]["Used"] == 3
    row = {
        "job_id": "j",
        "namespace": "default",
        "position": 1,
        "priority": 0,
        "priority_class": "",
        "reason": "r",
        "create_index": 3,
        "evictions": 0,
        "last_eviction": None,
    }
    calls, pending = _recorder({"data": [row], "index": 8, "next_token": "2"})
    status, out = _fetch({"queue.pending": pending}, "GET", "/v1/queue/team-a/pending?per_page=1")
    assert status == 200 and out == [
        {
            "JobID": "j",
            "Namespace": "default",
            "Position": 1,
            "Priority": 0,
            "PriorityClass": "",
            "Reason": "r",
            "CreateIndex": 3,
            "Evictions": 0,
            "LastEviction": None,
        }
    ]
    assert calls[0]["name"] == "team-a" and calls[0]["per_page"] == 1
    calls, stop = _recorder({"index": 9})
    for verb, policy in (("hold", "Hold"), ("drain", "HoldAndDrain"), ("resume", "None")):
        assert _fetch({"queue.stop": stop}, "PUT", f"/v1/queue/team-a/{verb}")[0] == 200
        assert calls[-1] == {"name": "team-a", "policy": policy}


def test_http_priority_class_get_is_found_in_the_list() -> None:
    rows = [
        {"name": "high", "value": 1000, "description": "", "create_index": 2, "modify_index": 2}
    ]
    _, listing = _recorder({"data": rows, "index": 4, "next_token": ""})
    status, out = _fetch({"priority_class.list": listing}, "GET", "/v1/priority-class/high")
    assert status == 200 and out["Value"] == 1000
    status, out = _fetch({"priority_class.list": listing}, "GET", "/v1/priority-class/nope")
    assert status == 404
    status, out = _fetch({}, "PUT", "/v1/priority-class/high", {"Value": "x"})
    assert status == 400 and "Value must be an integer" in out


# -- against a real cluster --------------------------------------------------------------------------------
class Lab:
    """One server with ACLs bootstrapped: its HTTP base, RPC addresses and management token."""

    def __init__(self, cluster: HTTPCluster) -> None:
        self.cluster = cluster
        self.base = cluster.leader_url
        boot = requests.post(f"{self.base}/v1/acl/bootstrap", timeout=TIMEOUT)
        assert boot.status_code == 200, boot.text
        self.token = boot.json()["SecretID"]

    def http(
        self, verb: str, path: str, body: Any = None, token: str | None = ""
    ) -> requests.Response:
        token = self.token if token == "" else token
        headers = {"X-Nomad-Token": token} if token else {}
        return requests.request(
            verb, f"{self.base}{path}", json=body, headers=headers, timeout=TIMEOUT
        )

    def cli(
        self, *args: str, token: str | None = "", stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CARAVAN_ADDRESS": ",".join(self.cluster.cluster.rpc_addresses)}
        env.pop("CARAVAN_TOKEN", None)
        if token is not None:
            env["CARAVAN_TOKEN"] = self.token if token == "" else token
        return subprocess.run(
            [sys.executable, "-m", "node.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=env,
            input=stdin,
        )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    cluster = start_cluster(tmp_path_factory.mktemp("queues"), 1)
    try:
        yield Lab(cluster)
    finally:
        stop_cluster(cluster)


def _names(lab: Lab) -> set[str]:
    out = lab.cli("queue", "list", "--json")
    assert out.returncode == 0, out.stderr
    return {row["Name"] for row in json.loads(out.stdout)}


@pytest.mark.cluster
def test_cli_apply_list_status_hold_resume_delete(lab: Lab, tmp_path: Path) -> None:
    spec = tmp_path / "lab.hcl"
    spec.write_text(LAB_HCL)
    applied = lab.cli("queue", "apply", str(spec))
    assert applied.returncode == 0 and 'Successfully applied queue "team-b"' in applied.stdout, (
        applied.stderr
    )
    listed = lab.cli("queue", "list")
    assert (
        listed.returncode == 0 and "team-a" in listed.stdout and "nvidia/gpu 0/2" in listed.stdout
    ), listed.stdout
    status = lab.cli("queue", "status", "team-a")
    assert status.returncode == 0, status.stderr
    assert (
        "Borrowing limit" in status.stdout
        and "Admitted" in status.stdout
        and "team a" in status.stdout
    )
    as_json = json.loads(lab.cli("queue", "status", "team-a", "-json").stdout)
    assert as_json["Cohort"] == "lab" and as_json["Ledger"]["nvidia/gpu"]["Nominal"] == 2
    assert as_json["Preemption"] == {"ReclaimWithinCohort": "Any", "WithinQueue": "LowerPriority"}
    for verb, policy in (("hold", "Hold"), ("drain", "HoldAndDrain"), ("resume", "None")):
        out = lab.cli("queue", verb, "team-a")
        assert out.returncode == 0, out.stderr
        assert (
            json.loads(lab.cli("queue", "status", "team-a", "--json").stdout)["StopPolicy"]
            == policy
        )
    pending = lab.cli("queue", "pending", "team-a", "--json")
    assert pending.returncode == 0 and json.loads(pending.stdout) == [], pending.stderr
    assert lab.cli("queue", "delete", "team-b").returncode == 0
    assert "team-b" not in _names(lab)
    gone = lab.cli("queue", "status", "team-b")
    assert gone.returncode == 2 and "not found" in gone.stderr


@pytest.mark.cluster
def test_cli_bad_input_is_one_line_nonzero_and_changes_nothing(lab: Lab, tmp_path: Path) -> None:
    before = _names(lab)
    spec = tmp_path / "bad.hcl"
    spec.write_text(
        'queue "fine" { resource "cpu" { nominal = 1 } }\nqueue "broken" {\n  stop_policy = "Paused"\n}\n'
    )
    for args, stdin in (
        ((str(spec),), None),
        (("-",), 'queue "x" {'),
        (("-",), '{"Name": "x", "Resources": 3}'),
    ):
        out = lab.cli("queue", "apply", *args, stdin=stdin)
        assert out.returncode != 0 and out.stdout == ""
        assert out.stderr.startswith("Error: ") and out.stderr.count("\n") == 1, out.stderr
    assert _names(lab) == before
    denied = lab.cli("queue", "list", token=None)
    assert denied.returncode != 0 and "token" in denied.stderr


@pytest.mark.cluster
def test_cli_priority_class_apply_list_delete(lab: Lab, tmp_path: Path) -> None:
    spec = tmp_path / "classes.hcl"
    spec.write_text(CLASSES_HCL)
    applied = lab.cli("priority-class", "apply", str(spec))
    assert applied.returncode == 0 and 'priority class "high" = 1000' in applied.stdout, (
        applied.stderr
    )
    listed = lab.cli("priority-class", "list")
    assert listed.returncode == 0 and "high" in listed.stdout and "on call" in listed.stdout
    rows = {r["Name"]: r for r in json.loads(lab.cli("priority-class", "list", "--json").stdout)}
    assert rows["low"]["Value"] == 10
    bad = lab.cli("priority-class", "apply", "-", stdin='priority_class "x" { value = "high" }')
    assert bad.returncode != 0 and "value must be an integer" in bad.stderr
    assert lab.cli("priority-class", "delete", "low").returncode == 0
    assert "low" not in {
        r["Name"] for r in json.loads(lab.cli("priority-class", "list", "--json").stdout)
    }


@pytest.mark.cluster
def test_http_queue_crud_hold_resume_and_paging(lab: Lab) -> None:
    body = {
        "Name": "web-a",
        "Cohort": "web",
        "Resources": [{"Name": "cpu", "Nominal": 4000, "LendingLimit": 1000}],
    }
    for name in ("web-a", "web-b", "web-c"):
        put = lab.http("PUT", f"/v1/queue/{name}", {**body, "Name": name})
        assert put.status_code == 200 and put.json()["Index"] > 0, put.text
    got = lab.http("GET", "/v1/queue/web-a").json()
    assert got["Resources"] == [
        {"Name": "cpu", "Nominal": 4000, "BorrowingLimit": None, "LendingLimit": 1000}
    ]
    assert got["Ledger"]["cpu"]["Used"] == 0 and got["Admitted"] == 0 and got["Pending"] == 0
    assert (
        lab.http("PUT", "/v1/queue/web-a", {**got, "Description": "round trip"}).status_code == 200
    )
    assert lab.http("GET", "/v1/queue/web-a").json()["Description"] == "round trip"
    first = lab.http("GET", "/v1/queues?per_page=1")
    assert (
        first.status_code == 200
        and len(first.json()) == 1
        and first.headers.get("X-Nomad-NextToken")
    )
    assert {"web-a", "web-b", "web-c"} <= {q["Name"] for q in lab.http("GET", "/v1/queues").json()}
    assert lab.http("POST", "/v1/queue/web-a/hold").status_code == 200
    assert lab.http("GET", "/v1/queue/web-a").json()["StopPolicy"] == "Hold"
    assert lab.http("POST", "/v1/queue/web-a/resume").status_code == 200
    assert lab.http("GET", "/v1/queue/web-a").json()["StopPolicy"] == "None"
    pending = lab.http("GET", "/v1/queue/web-a/pending")
    assert pending.status_code == 200 and pending.json() == []
    assert lab.http("DELETE", "/v1/queue/web-c").status_code == 200
    wait_until(lambda: lab.http("GET", "/v1/queue/web-c").status_code == 404, 10, "web-c gone")
    assert lab.http("GET", "/v1/queue/web-c/pending").status_code == 404


@pytest.mark.cluster
def test_http_bad_bodies_and_missing_tokens_change_nothing(lab: Lab) -> None:
    bad = lab.http(
        "PUT",
        "/v1/queue/web-x",
        {"Name": "web-x", "Resources": [{"Name": "cpu", "Nominal": 1, "LendingLimit": 1}]},
    )
    assert (
        bad.status_code == 400
        and "needs a cohort to borrow or lend" in bad.text
        and "\n" not in bad.text.strip()
    )
    mismatch = lab.http("PUT", "/v1/queue/web-x", {"Name": "web-y"})
    assert mismatch.status_code == 400 and "does not match" in mismatch.text
    assert lab.http("PUT", "/v1/queue/web-x", None).status_code == 400
    assert lab.http("GET", "/v1/queue/web-x").status_code == 404
    assert lab.http("PUT", "/v1/queue/web-x", {"Name": "web-x"}, token=None).status_code == 403
    assert lab.http("GET", "/v1/queues", token=None).status_code == 403
    assert lab.http("GET", "/v1/queue/web-x").status_code == 404


@pytest.mark.cluster
def test_http_priority_class_crud(lab: Lab) -> None:
    put = lab.http(
        "PUT", "/v1/priority-class/urgent", {"Value": 5000, "Description": "pages someone"}
    )
    assert put.status_code == 200, put.text
    got = lab.http("GET", "/v1/priority-class/urgent")
    assert (
        got.status_code == 200
        and got.json()["Value"] == 5000
        and got.json()["Description"] == "pages someone"
    )
    assert "urgent" in {p["Name"] for p in lab.http("GET", "/v1/priority-classes").json()}
    bad = lab.http("PUT", "/v1/priority-class/urgent", {"Value": 1.5})
    assert bad.status_code == 400 and "Value must be an integer" in bad.text
    assert lab.http("GET", "/v1/priority-class/urgent").json()["Value"] == 5000
    assert lab.http("PUT", "/v1/priority-class/urgent", {"Value": 1}, token=None).status_code == 403
    assert lab.http("DELETE", "/v1/priority-class/urgent").status_code == 200
    assert lab.http("GET", "/v1/priority-class/urgent").status_code == 404
