"""Reschedule policies merged as Nomad's canonicalisation merges them, by every path a job arrives on.

The batch cases are Nomad's own (``internal/testing/apitests/tasks_test.go``,
``TestTaskGroup_Canonicalize_ReschedulePolicy``); the service, system and
``null`` cases follow the same code (``api/tasks.go``). Each must come out
the same through ``merge_policy``, the JSON reader (``parse_job``, what the
``job.register`` RPC runs), an HCL file (``parse_hcl`` then ``parse_job``),
and ``PUT /v1/jobs`` into the real ``job.register`` endpoint.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from fsm import messages as m
from fsm.structs import HOUR, MINUTE, SECOND
from node.endpoints.jobs import job_register
from node.http.service import HTTPService
from node.spec.hcl import parse_hcl
from node.spec.jobspec import JobSpecError, parse_job
from node.spec.nomadjson import to_nomad
from node.spec.reschedule import merge_policy, nomad_default
from node.spec.units import go_duration

BATCH = {"Attempts": 1, "Interval": 24 * HOUR, "Delay": 5 * SECOND, "DelayFunction": "constant", "MaxDelay": 0,
         "Unlimited": False}
SERVICE = {"Attempts": 0, "Interval": 0, "Delay": 30 * SECOND, "DelayFunction": "exponential", "MaxDelay": HOUR,
           "Unlimited": True}

# (case, job type, job-level Reschedule, group ReschedulePolicy, Nomad's canonical policy)
CASES: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]] = [
    ("Default", "batch", None, None, BATCH),
    ("Empty job reschedule policy", "batch",
     {"Attempts": 0, "Interval": 0, "Delay": 0, "MaxDelay": 0, "DelayFunction": "", "Unlimited": False}, None,
     {"Attempts": 0, "Interval": 0, "Delay": 0, "MaxDelay": 0, "DelayFunction": "", "Unlimited": False}),
    ("Inherit from job", "batch",
     {"Attempts": 1, "Interval": 20 * SECOND, "Delay": 20 * SECOND, "MaxDelay": 10 * MINUTE,
      "DelayFunction": "constant", "Unlimited": False}, None,
     {"Attempts": 1, "Interval": 20 * SECOND, "Delay": 20 * SECOND, "MaxDelay": 10 * MINUTE,
      "DelayFunction": "constant", "Unlimited": False}),
    ("Set in task", "batch", None,
     {"Attempts": 5, "Interval": 2 * MINUTE, "Delay": 20 * SECOND, "MaxDelay": 10 * MINUTE,
      "DelayFunction": "constant", "Unlimited": False},
     {"Attempts": 5, "Interval": 2 * MINUTE, "Delay": 20 * SECOND, "MaxDelay": 10 * MINUTE,
      "DelayFunction": "constant", "Unlimited": False}),
    ("Merge from job", "batch",
     {"Attempts": 1, "Delay": 20 * SECOND, "MaxDelay": 10 * MINUTE},
     {"Interval": 5 * MINUTE, "DelayFunction": "constant", "Unlimited": False},
     {"Attempts": 1, "Interval": 5 * MINUTE, "Delay": 20 * SECOND, "MaxDelay": 10 * MINUTE,
      "DelayFunction": "constant", "Unlimited": False}),
    ("Override from group", "batch",
     {"Attempts": 1, "MaxDelay": 10 * SECOND},
     {"Attempts": 5, "Delay": 20 * SECOND, "MaxDelay": 20 * MINUTE, "DelayFunction": "constant", "Unlimited": False},
     {"Attempts": 5, "Interval": 24 * HOUR, "Delay": 20 * SECOND, "MaxDelay": 20 * MINUTE,
      "DelayFunction": "constant", "Unlimited": False}),
    ("Attempts from job, default interval", "batch", {"Attempts": 1}, None, BATCH),
    # The example: a partial batch group policy is completed from the batch defaults.
    ("Partial batch group", "batch", None, {"Attempts": 3}, {**BATCH, "Attempts": 3}),
    ("Service default", "service", None, None, SERVICE),
    ("Service job-level delay", "service", {"Delay": 10 * SECOND}, None, {**SERVICE, "Delay": 10 * SECOND}),
    ("Service limited by the group", "service", {"Delay": 10 * SECOND},
     {"Attempts": 3, "Interval": HOUR, "Unlimited": False},
     {**SERVICE, "Attempts": 3, "Interval": HOUR, "Delay": 10 * SECOND, "Unlimited": False}),
    ("null is unset, 0 is set", "service", {"Delay": None, "MaxDelay": 2 * HOUR},
     {"Attempts": None, "Interval": 0, "Delay": 45 * SECOND},
     {**SERVICE, "Delay": 45 * SECOND, "MaxDelay": 2 * HOUR}),
    ("System: nothing to merge", "system", None, None, None),
]  # fmt: skip
VALID = [c for c in CASES if c[0] not in ("Empty job reschedule policy", "System: nothing to merge")]


def spec(job_type: str, job_level: dict[str, Any] | None, group: dict[str, Any] | None) -> dict[str, Any]:
    """A Nomad API job with the given blocks (absent when None)."""
    g: dict[str, Any] = {"Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "sim"}]}
    if group is not None:
        g["ReschedulePolicy"] = group
    job: dict[str, Any] = {"ID": "j", "Type": job_type, "TaskGroups": [g]}
    if job_level is not None:
        job["Reschedule"] = job_level
    return job


def hcl_block(name: str, block: dict[str, Any] | None, indent: str) -> str:
    """A ``reschedule`` block in HCL (durations as Go strings), or nothing."""
    if block is None:
        return ""
    names = {"Attempts": "attempts", "Interval": "interval", "Delay": "delay", "DelayFunction": "delay_function",
             "MaxDelay": "max_delay", "Unlimited": "unlimited"}
    lines = []
    for key, value in block.items():
        if value is None:
            continue  # HCL has no null for these
        if key in ("Interval", "Delay", "MaxDelay"):
            text = f'"{go_duration(value)}"'
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = f'"{value}"'
        else:
            text = str(value)
        lines.append(f"{indent}  {names[key]} = {text}\n")
    return f"{indent}{name} {{\n{''.join(lines)}{indent}}}\n"


def hcl(job_type: str, job_level: dict[str, Any] | None, group: dict[str, Any] | None) -> str:
    return (f'job "j" {{\n  type = "{job_type}"\n{hcl_block("reschedule", job_level, "  ")}'
            f'  group "g" {{\n{hcl_block("reschedule", group, "    ")}    task "t" {{\n      driver = "sim"\n'
            "    }\n  }\n}\n")


@pytest.mark.parametrize(("case", "job_type", "job_level", "group", "want"), CASES, ids=[c[0] for c in CASES])
def test_merge_policy_is_nomads_canonicalisation(
    case: str, job_type: str, job_level: dict[str, Any] | None, group: dict[str, Any] | None, want: Any
) -> None:
    assert merge_policy(job_type, job_level, group) == want


@pytest.mark.parametrize(("case", "job_type", "job_level", "group", "want"), VALID, ids=[c[0] for c in VALID])
def test_json_and_hcl_register_the_merged_policy(
    case: str, job_type: str, job_level: dict[str, Any] | None, group: dict[str, Any] | None, want: Any
) -> None:
    job, warnings = parse_job(spec(job_type, job_level, group))
    assert to_nomad(job.task_groups[0].reschedule_policy) == want and warnings == []
    parsed = parse_hcl(hcl(job_type, job_level, group))
    assert parsed.warnings == []
    if job_level is not None or group is not None:  # the HCL reader merges what the file wrote
        assert parsed.job["TaskGroups"][0]["ReschedulePolicy"] == want
    job, _ = parse_job(parsed.job)
    assert to_nomad(job.task_groups[0].reschedule_policy) == want


def test_the_callers_spec_is_left_as_it_was() -> None:
    body = spec("batch", {"Attempts": 2}, {"Delay": 10 * SECOND})
    before = repr(body)
    parse_job({"Job": body})
    assert repr(body) == before


def test_a_disabled_policy_is_accepted_as_nomad_does() -> None:
    """Attempts 0 and not unlimited: Nomad does not validate what it never uses."""
    job, _ = parse_job(spec("batch", {"Attempts": 0, "Interval": 0, "Delay": 0, "MaxDelay": 0, "DelayFunction": "",
                                      "Unlimited": False}, None))
    assert job.task_groups[0].reschedule_policy.attempts == 0


@pytest.mark.parametrize(("job_level", "group"), [({"Attempts": 1}, None), (None, {"Attempts": 1}), (None, None)])
def test_system_jobs_take_no_policy(job_level: dict[str, Any] | None, group: dict[str, Any] | None) -> None:
    body = spec("system", job_level, group)
    if job_level is None and group is None:
        job, _ = parse_job(body)
        assert job.task_groups[0].reschedule_policy is None
        return
    with pytest.raises(JobSpecError, match="System or sysbatch jobs should not have a reschedule policy"):
        parse_job(body)
    with pytest.raises(JobSpecError, match="System or sysbatch jobs should not have a reschedule policy"):
        parse_job(parse_hcl(hcl("system", job_level, group)).job)


def test_a_job_level_block_of_the_wrong_type_is_named() -> None:
    with pytest.raises(JobSpecError, match=r"^Job\.Reschedule: expected map, got str$"):
        parse_job({**spec("batch", None, None), "Reschedule": "often"})


# -- PUT /v1/jobs into the real job.register endpoint --------------------------------------------
class _Server:
    """What ``job.register`` reads of the server: ``ensure_leader`` (this one leads) and ``write``,
    which keeps the entry it was given."""

    def __init__(self) -> None:
        self.entries: list[Any] = []

    def ensure_leader(self) -> None:
        """The leader: nothing to forward."""

    async def write(self, ctx: Any, need: Any, entry: Any) -> dict[str, Any]:
        self.entries.append(entry)
        return {"index": 7, "value": {"eval_id": "e", "eval_create_index": 7, "job_modify_index": 7}}


def http_register(body: dict[str, Any]) -> tuple[int, str, list[Any]]:
    """(status, text, entries written) of ``PUT /v1/jobs`` with ``body``, on a stub server running the real endpoint."""
    server = _Server()

    async def register(ctx: Any, args: dict[str, Any]) -> Any:
        return await job_register(server, ctx, args)  # type: ignore[arg-type]

    stub = SimpleNamespace(
        log=structlog.get_logger(), config=SimpleNamespace(rpc_max_frame=1 << 20, http_event_heartbeat=1.0),
        rpc=SimpleNamespace(lookup=lambda name: (register, False) if name == "job.register" else None),
        raft=SimpleNamespace(leader_address="127.0.0.1:1"),
    )

    async def go() -> tuple[int, str]:
        async with TestClient(TestServer(HTTPService(stub).build_app())) as client:
            resp = await client.put("/v1/jobs", json=body)
            return resp.status, await resp.text()

    status, text = asyncio.run(go())
    return status, text, server.entries


@pytest.mark.parametrize(("case", "job_type", "job_level", "group", "want"), VALID, ids=[c[0] for c in VALID])
def test_http_registration_merges_the_job_level_block(
    case: str, job_type: str, job_level: dict[str, Any] | None, group: dict[str, Any] | None, want: Any
) -> None:
    status, text, entries = http_register({"Job": spec(job_type, job_level, group)})
    assert status == 200, text
    (entry,) = entries
    assert isinstance(entry, m.JobRegister)
    assert to_nomad(entry.job.task_groups[0].reschedule_policy) == want


def test_http_registration_refuses_with_nomads_message() -> None:
    status, text, entries = http_register({"Job": spec("service", {"MaxDelay": 10 * SECOND}, None)})
    assert status == 400 and entries == []
    assert "Max Delay cannot be less than Delay 30s (got 10s)" in text


def test_defaults_are_fresh_maps() -> None:
    d = nomad_default("batch")
    d["Attempts"] = 99
    assert nomad_default("batch") == BATCH
