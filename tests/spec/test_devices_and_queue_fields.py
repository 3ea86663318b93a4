"""Reading task devices and the job's queue fields from HCL and from Nomad's API JSON.

``device "nvidia/gpu" { count = 2 }`` in HCL and ``"Devices": [{"Name":
"nvidia/gpu", "Count": 2}]`` in JSON mean the same job; Count defaults to 1
as in Nomad; a bad ask is one line naming the field. ``queue`` and
``priority_class`` (JSON ``Queue``, ``PriorityClass``) are names.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsm.structs import Job
from node.spec import reader
from node.spec.devices import devices_as_maps
from node.spec.errors import HCLError
from node.spec.hcl import parse_hcl
from node.spec.jobspec import JobSpecError, parse_job

HCL = """
job "train" {
  queue          = "team-a"
  priority_class = "high"
  group "g" {
    count = 2
    task "t" {
      driver = "sim"
      resources {
        cpu    = 500
        memory = 256
        device "nvidia/gpu" {
          count = 2
        }
        device "fpga" {}
      }
    }
  }
}
"""


def _json_job(devices: Any, **extra: Any) -> dict[str, Any]:
    task = {
        "Name": "t",
        "Driver": "sim",
        "Resources": {"CPU": 500, "MemoryMB": 256, "Devices": devices},
    }
    return {
        "Job": {"ID": "train", "TaskGroups": [{"Name": "g", "Count": 2, "Tasks": [task]}], **extra}
    }


def _devices(job: Job) -> dict[str, int]:
    return job.task_groups[0].tasks[0].resources.devices


def test_hcl_devices_and_queue_fields_read_as_nomads_json_does() -> None:
    parsed = parse_hcl(HCL, "train.nomad.hcl")
    assert parsed.job["Queue"] == "team-a" and parsed.job["PriorityClass"] == "high"
    resources = parsed.job["TaskGroups"][0]["Tasks"][0]["Resources"]
    assert resources["Devices"] == [
        {"Name": "nvidia/gpu", "Count": 2},
        {"Name": "fpga", "Count": 1},
    ]
    from_hcl, warnings = parse_job(parsed.job)
    assert not warnings
    assert _devices(from_hcl) == {"nvidia/gpu": 2, "fpga": 1}
    assert (from_hcl.queue, from_hcl.priority_class) == ("team-a", "high")
    spec = _json_job(
        [{"Name": "nvidia/gpu", "Count": 2}, {"Name": "fpga"}], Queue="team-a", PriorityClass="high"
    )
    from_json, _ = parse_job(spec)
    assert from_json == from_hcl


def test_the_fast_and_general_readers_agree_on_devices() -> None:
    spec, _ = devices_as_maps(_json_job([{"Name": "nvidia/gpu", "Count": 3}])["Job"])
    fast = reader.read_job(spec)
    general = reader.read_general(spec)
    assert fast == general and _devices(fast[0]) == {"nvidia/gpu": 3}


def test_requests_of_one_name_add_up_and_a_map_is_taken_as_it_is() -> None:
    job, _ = parse_job(_json_job([{"Name": "gpu", "Count": 1}, {"Name": "gpu", "Count": 2}]))
    assert _devices(job) == {"gpu": 3}
    job, _ = parse_job(_json_job({"nvidia/gpu": 2}))  # a Caravan job read back over RPC
    assert _devices(job) == {"nvidia/gpu": 2}
    job, _ = parse_job(_json_job(None))
    assert _devices(job) == {}


def test_device_constraints_and_affinities_are_dropped_with_a_warning() -> None:
    spec = _json_job(
        [{"Name": "nvidia/gpu", "Count": 1, "Constraints": [{"LTarget": "x"}], "Affinities": None}]
    )
    job, warnings = parse_job(spec)
    assert _devices(job) == {"nvidia/gpu": 1}
    assert warnings == [
        "Job.TaskGroups[0].Tasks[0].Resources.Devices[0].Constraints is not supported by Caravan and was ignored"
    ]


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (
            [{"Name": "nvidia/gpu", "Count": 0}],
            "job train: task t: device 'nvidia/gpu': count 0 must be >= 1",
        ),
        (
            [{"Name": "nvidia/gpu", "Count": -2}],
            "job train: task t: device 'nvidia/gpu': count -2 must be >= 1",
        ),
        (
            [{"Name": "", "Count": 1}],
            "job train: task t: a device name is empty: name it type, vendor/type or vendor/type/model",
        ),
        (
            [{"Name": "a/b/c/d"}],
            "job train: task t: device 'a/b/c/d' must be named type, vendor/type or vendor/type/model",
        ),
        (
            [{"Count": 1}],
            "Job.TaskGroups[0].Tasks[0].Resources.Devices[0].Name: missing; name the device as type, vendor/type or vendor/type/model",
        ),
        (
            [{"Name": 7}],
            "Job.TaskGroups[0].Tasks[0].Resources.Devices[0].Name: expected string, got integer",
        ),
        (
            [{"Name": "gpu", "Count": "2"}],
            "Job.TaskGroups[0].Tasks[0].Resources.Devices[0].Count: expected integer, got string",
        ),
        (
            ["nvidia/gpu"],
            'Job.TaskGroups[0].Tasks[0].Resources.Devices[0]: expected an object such as {"Name": "nvidia/gpu", "Count": 1}, got string',
        ),
    ],
)
def test_a_bad_device_ask_is_one_line_naming_it(devices: Any, message: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job(_json_job(devices))
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_a_bad_device_count_in_hcl() -> None:
    with pytest.raises(HCLError) as err:
        parse_hcl(
            HCL.replace("count = 2\n        }", 'count = "two"\n        }'), "train.nomad.hcl"
        )
    assert "count" in str(err.value) and "whole number" in str(err.value)
    parsed = parse_hcl(HCL.replace("count = 2\n        }", "count = 0\n        }"))
    with pytest.raises(JobSpecError, match="device 'nvidia/gpu': count 0 must be >= 1"):
        parse_job(parsed.job)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"Queue": "team a"},
            "job train: queue 'team a' must be a name of at most 200 bytes without spaces or slashes",
        ),
        (
            {"Queue": "lab/team-a"},
            "job train: queue 'lab/team-a' must be a name of at most 200 bytes without spaces or slashes",
        ),
        (
            {"PriorityClass": "x" * 201},
            "job train: priority class '" + "x" * 201 + "' must be a name of at most 200 bytes",
        ),
        ({"Queue": 3}, "Job.Queue: expected string, got int"),
    ],
)
def test_queue_fields_must_be_names(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job(_json_job(None, **extra))
    assert str(err.value).startswith(message)


def test_a_job_without_queue_fields_is_as_before() -> None:
    job, warnings = parse_job(_json_job(None))
    assert (job.queue, job.priority_class, warnings) == ("", "", [])
    # "" is none: what Caravan serves for a job without them (/v1/jobs/parse, /v1/job/:id) registers as is.
    same, _ = parse_job(_json_job(None, Queue="", PriorityClass=""))
    assert same == job
    hcl_job, _ = parse_job(
        parse_hcl('job "x" {\n  queue = "team-a"\n  group "g" {\n    task "t" {}\n  }\n}\n').job
    )
    assert hcl_job.queue == "team-a" and hcl_job.priority_class == ""


def test_hcl_device_constraint_blocks_are_dropped_with_a_warning_naming_the_line() -> None:
    text = HCL.replace(
        "count = 2\n        }",
        'count = 2\n          constraint {\n            attribute = "${device.model}"\n            value = "a100"\n          }\n        }',
    )
    parsed = parse_hcl(text, "train.nomad.hcl")
    assert parsed.warnings == [
        'block "constraint" at line 14 in device "nvidia/gpu" is not supported by Caravan and was ignored'
    ]
    job, _ = parse_job(parsed.job)
    assert _devices(job) == {"nvidia/gpu": 2, "fpga": 1}
