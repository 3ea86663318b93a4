"""HCL2 jobspecs (node.spec.hcl) against fixture files, and ``caravan job run FILE.nomad.hcl``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.spec.hcl import HCLError, looks_like_hcl, parse_hcl
from node.spec.jobspec import parse_job
from tests.http.support import HTTPCluster

FIXTURES = Path(__file__).parent / "fixtures"
SECOND = 1_000_000_000


def load(name: str):  # noqa: ANN201 - test helper
    return parse_hcl((FIXTURES / name).read_text(), name)


def test_seed_example_reschedule_values() -> None:
    parsed = load("docs.nomad.hcl")
    assert parsed.warnings == []
    assert parsed.job["ID"] == "docs" and parsed.job["Name"] == "docs"
    (group,) = parsed.job["TaskGroups"]
    assert group["Name"] == "example" and group["Count"] == 1
    assert group["ReschedulePolicy"] == {
        "Attempts": 15,
        "Interval": 3600 * SECOND,
        "Delay": 30 * SECOND,
        "DelayFunction": "exponential",
        "MaxDelay": 120 * SECOND,
        "Unlimited": False,
    }


def test_every_modelled_field_and_warnings_for_the_rest() -> None:
    parsed = load("web.nomad.hcl")
    job = parsed.job
    assert (
        job["Datacenters"] == ["dc1", "dc2"] and job["Type"] == "service" and job["Priority"] == 70
    )
    assert job["Meta"] == {"team": "platform", "tier": "1"}  # meta values are strings
    assert job["Constraints"] == [
        {"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="}
    ]
    front, worker = job["TaskGroups"]
    assert front["Count"] == 3  # var.replicas default
    assert {"LTarget": "", "RTarget": "", "Operand": "distinct_hosts"} in front["Constraints"]
    # A task's constraint joins its group's.
    assert {"LTarget": "${attr.cpu.arch}", "RTarget": "amd64|arm64", "Operand": "regexp"} in front[
        "Constraints"
    ]
    # Job-level update/reschedule are defaults under each group's own block.
    assert front["Update"] == {
        "MaxParallel": 1,
        "MinHealthyTime": 15 * SECOND,
        "HealthyDeadline": 180 * SECOND,
        "AutoRevert": True,
    }
    assert worker["Update"]["MaxParallel"] == 2
    assert (
        front["ReschedulePolicy"]["Delay"] == 10 * SECOND
        and front["ReschedulePolicy"]["Unlimited"] is True
    )
    (task,) = front["Tasks"]
    assert task["Driver"] == "sim" and task["Resources"] == {"CPU": 500, "MemoryMB": 256}
    assert task["Meta"] == {"version": "1.25"}
    assert task["Config"]["run_for"] == "30s" and task["Config"]["mount"] == [
        {"type": "bind", "target": "/etc/nginx"}
    ]
    blocks = " ".join(parsed.warnings)
    for name, line in (("network", 47), ("service", 53), ("template", 86)):
        assert f'block "{name}" at line {line}' in blocks
    # What node.spec.jobspec makes of it: a valid Caravan job.
    model, warnings = parse_job(job)
    assert model.task_groups[0].count == 3 and model.task_groups[0].update.max_parallel == 1
    assert warnings == []


def test_batch_defaults_for_a_partial_reschedule_block() -> None:
    text = 'job "b" {\n  type = "batch"\n  group "g" {\n    reschedule {\n      attempts = 3\n    }\n    task "t" {\n      driver = "sim"\n    }\n  }\n}\n'
    policy = parse_hcl(text).job["TaskGroups"][0]["ReschedulePolicy"]
    assert (
        policy["Attempts"] == 3
        and policy["DelayFunction"] == "constant"
        and policy["Unlimited"] is False
    )


def test_unknown_block_is_a_warning_naming_it() -> None:
    parsed = load("unknown_block.nomad.hcl")
    assert parsed.warnings == [
        'block "frobnicate" at line 3 in group "g" is not supported by Caravan and was ignored'
    ]
    assert parsed.job["TaskGroups"][0]["Tasks"] == [{"Name": "t", "Driver": "sim"}]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("invalid.nomad.hcl", "invalid.nomad.hcl:7:20: invalid HCL at line 7, column 20"),
        ("wrong_type.nomad.hcl", "wrong_type.nomad.hcl:3: count: must be a whole number"),
    ],
)
def test_errors_carry_the_position(name: str, text: str) -> None:
    with pytest.raises(HCLError) as info:
        load(name)
    assert str(info.value).startswith(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('job "x" {\n  count = 1\n  count = 2\n}\n', "set twice"),
        ('job "a" {}\njob "b" {}\n', "exactly one job"),
        ('group "g" {}\n', "no job block"),
        ('job "x" {\n  group {\n  }\n}\n', "takes 1 label"),
        (
            'job "x" {\n  group "g" {\n    reschedule {\n      delay = 30\n    }\n  }\n}\n',
            'duration string like "30s"',
        ),
        (
            'job "x" {\n  group "g" {\n    reschedule {\n      delay = "30 parsecs"\n    }\n  }\n}\n',
            "line 4",
        ),
        ('job "x" {\n  datacenters = "dc1"\n}\n', "list of strings"),
        ('job "x" {\n  group "g" {\n    count = \n  }\n}\n', "line 3, column"),
    ],
)
def test_bad_jobspecs(text: str, message: str) -> None:
    with pytest.raises(HCLError) as info:
        parse_hcl(text)
    assert message in str(info.value)


def test_interpolations_stay_literal_and_escapes_resolve() -> None:
    text = 'job "x" {\n  meta {\n    a = "${node.datacenter}"\n    b = "$${literal}"\n    c = true\n  }\n}\n'
    assert parse_hcl(text).job["Meta"] == {
        "a": "${node.datacenter}",
        "b": "${literal}",
        "c": "true",
    }


def test_hcl_or_json_by_name_and_content() -> None:
    assert looks_like_hcl("a.nomad.hcl", "{}") and looks_like_hcl("a.nomad", "")
    assert not looks_like_hcl("a.json", "job {}") and not looks_like_hcl("-", '  {"ID": "x"}')
    assert looks_like_hcl("-", 'job "x" {}')


# -- the CLI -------------------------------------------------------------------------------------------
def caravan(c: HTTPCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(c.cluster.rpc_addresses)}
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, env=env, timeout=120,
        cwd=str(Path(__file__).resolve().parents[2]),
    )  # fmt: skip


@pytest.mark.cluster
def test_cli_job_run_hcl(http_cluster: HTTPCluster) -> None:
    out = caravan(http_cluster, "job", "run", "--detach", str(FIXTURES / "batch.nomad.hcl"))
    assert out.returncode == 0, out.stderr
    assert "Job registered" in out.stdout
    with http_cluster.rpc() as client:
        job = client.call("job.get", {"job_id": "nightly"})["data"]
    assert job["Type"] == "batch" and job["TaskGroups"][0]["Count"] == 2
    assert job["TaskGroups"][0]["ReschedulePolicy"]["Attempts"] == 1  # batch defaults

    odd = caravan(http_cluster, "job", "run", "--detach", str(FIXTURES / "unknown_block.nomad.hcl"))
    assert odd.returncode == 0, odd.stderr
    assert 'Warning: block "frobnicate" at line 3' in odd.stderr

    bad = caravan(http_cluster, "job", "run", str(FIXTURES / "invalid.nomad.hcl"))
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == [
        f"Error: {FIXTURES / 'invalid.nomad.hcl'}:7:20: invalid HCL at line 7, column 20: unexpected end of file (an unclosed block, string or list?)"
    ]


def test_canary_settings_of_an_update_block() -> None:
    text = ('job "c" {\n  group "g" {\n    update {\n      canary = 2\n      auto_promote = true\n    }\n'
            '    task "t" {\n      driver = "sim"\n    }\n  }\n}\n')
    parsed = parse_hcl(text, "c.nomad.hcl")
    assert parsed.warnings == []
    assert parsed.job["TaskGroups"][0]["Update"] == {"Canary": 2, "AutoPromote": True}
    model, warnings = parse_job(parsed.job)
    assert (model.task_groups[0].update.canary, model.task_groups[0].update.auto_promote, warnings) == (2, True, [])


def test_a_migrate_block_in_a_group_and_in_the_job() -> None:
    text = ('job "m" {\n  migrate {\n    max_parallel = 2\n  }\n  group "g" {\n    migrate {\n'
            '      min_healthy_time = "5s"\n      healthy_deadline = "1m"\n      health_check = "task_states"\n    }\n'
            '    task "t" {\n      driver = "sim"\n    }\n  }\n}\n')
    parsed = parse_hcl(text, "m.nomad.hcl")
    assert parsed.warnings == []
    assert parsed.job["TaskGroups"][0]["Migrate"] == {
        "MaxParallel": 2, "MinHealthyTime": 5 * SECOND, "HealthyDeadline": 60 * SECOND, "HealthCheck": "task_states"}
    model, _ = parse_job(parsed.job)
    migrate = model.task_groups[0].migrate
    assert (migrate.max_parallel, migrate.min_healthy_time, migrate.health_check) == (2, 5 * SECOND, "task_states")
