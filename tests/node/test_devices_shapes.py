"""Devices in Nomad's HTTP shapes, and node registrations that carry them in either shape.

Caravan keeps devices as name -> count maps; ``/v1`` serves a task's as
Nomad's RequestedDevice list and a node's as NodeDeviceResource groups, and
``node.register`` takes a node's back in that shape as well as the map.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fsm.structs import Allocation, Job, Node, Resources, Task, TaskGroup
from node.cli.common import devices_text
from node.endpoints.nodes import device_counts
from node.http.shapes import node_devices, nomad_alloc, nomad_job, nomad_node, requested_devices
from node.spec.nomadjson import to_nomad

NODE_KEYS = st.from_regex(r"[a-z]{1,6}/[a-z]{1,6}(/[a-z0-9]{1,6})?", fullmatch=True)


@given(devices=st.dictionaries(NODE_KEYS, st.integers(0, 8), max_size=4))
def test_a_nodes_devices_survive_nomads_shape_and_back(devices: dict[str, int]) -> None:
    # A model named as its type reads back as no model (how a node without one is served).
    want = {}
    for key, count in devices.items():
        parts = key.split("/")
        name = "/".join(parts[:2]) if len(parts) == 3 and parts[2] == parts[1] else key
        want[name] = want.get(name, 0) + count
    assert device_counts(node_devices(devices)) == want


def test_node_shapes_carry_nomads_device_groups() -> None:
    node = Node(
        id="n1",
        resources=Resources(cpu=1000, memory_mb=512, devices={"nvidia/gpu": 2, "amd/gpu/mi300": 1}),
    )
    shaped = nomad_node(to_nomad(node))
    groups = shaped["NodeResources"]["Devices"]
    assert [(g["Vendor"], g["Type"], g["Name"], len(g["Instances"])) for g in groups] == [
        ("amd", "gpu", "mi300", 1),
        ("nvidia", "gpu", "gpu", 2),
    ]
    assert groups[1]["Instances"][0] == {
        "ID": "nvidia-gpu-0",
        "Healthy": True,
        "HealthDescription": "",
        "Locality": None,
    }
    assert nomad_node(to_nomad(Node(id="n2")))["NodeResources"]["Devices"] is None
    assert shaped == nomad_node(shaped)  # shapers are idempotent


def test_task_and_alloc_devices_are_requested_device_lists() -> None:
    task = Task(name="t", resources=Resources(devices={"nvidia/gpu": 2}))
    job = nomad_job(to_nomad(Job(id="j", task_groups=[TaskGroup(name="g", tasks=[task])])))
    assert job["TaskGroups"][0]["Tasks"][0]["Resources"]["Devices"] == [
        {"Name": "nvidia/gpu", "Count": 2, "Constraints": None, "Affinities": None}
    ]
    assert (job["Queue"], job["PriorityClass"]) == ("", "")
    assert nomad_job(job) == job
    alloc = Allocation(
        id="a",
        eval_id="e",
        job_id="j",
        node_id="n",
        task_group="g",
        resources=Resources(devices={"gpu": 1}),
    )
    shaped = nomad_alloc(to_nomad(alloc))
    assert shaped["Resources"]["Devices"][0]["Name"] == "gpu"
    assert requested_devices({"CPU": 1, "Devices": {}})["Devices"] is None


def test_the_cli_prints_devices_from_either_shape() -> None:
    assert devices_text({"Devices": {"nvidia/gpu": 2, "amd/gpu": 1}}) == "amd/gpu=1, nvidia/gpu=2"
    assert devices_text(requested_devices({"Devices": {"nvidia/gpu": 2}})) == "nvidia/gpu=2"
    assert devices_text({"CPU": 100}) == "" and devices_text(None) == ""


def test_a_registration_takes_a_map_or_nomads_list() -> None:
    assert device_counts({"nvidia/gpu": 4}) == {"nvidia/gpu": 4}
    assert device_counts(None) == {}
    listed = [
        {
            "Vendor": "nvidia",
            "Type": "gpu",
            "Name": "a100",
            "Instances": [{"ID": "x", "Healthy": True}, {"ID": "y", "Healthy": False}],
        }
    ]
    assert device_counts(listed) == {"nvidia/gpu/a100": 1}


def test_client_sim_device_options_are_checked_at_the_prompt() -> None:
    from click.testing import CliRunner

    from node.cli.client import client_group

    for value, words in (
        ("gpu=2", "vendor/type"),
        ("nvidia/gpu", "count of at least 1"),
        ("nvidia/gpu=0", "count"),
    ):
        out = CliRunner().invoke(
            client_group, ["sim", "--servers", "127.0.0.1:1", "--device", value]
        )
        assert out.exit_code == 2 and words in out.output, out.output
    out = CliRunner().invoke(
        client_group,
        [
            "sim",
            "--servers",
            "127.0.0.1:1",
            "--device",
            "nvidia/gpu=1",
            "--device",
            "nvidia/gpu/a100=1",
        ],
    )
    assert out.exit_code == 2 and "name each model" in out.output
