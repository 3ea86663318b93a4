"""Devices in ``fsm.structs.Resources``: the arithmetic, matching Nomad's request names, the codec and apply's checks.

Properties where they fit: adding then subtracting device counts gives the
record back, ``exhausted`` agrees with a reference that checks each
dimension on its own (devices by brute force over every way to hand the
node's devices to the asks), and records without devices behave exactly as
before (``tests/fsm/test_resources.py`` holds those properties too).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm.errors import ApplyRejected
from fsm.structs import Job, Node, Resources, Task, TaskGroup, assign_devices, device_matches
from fsm.validate import check_job, check_node

NODE_NAMES = [
    "nvidia/gpu",
    "amd/gpu",
    "nvidia/fpga",
    "intel/gpu/arc",
    "intel/gpu/max",
    "xilinx/fpga/u50",
]
ASK_NAMES = [
    "gpu",
    "fpga",
    "nvidia/gpu",
    "amd/gpu",
    "intel/gpu",
    "intel/gpu/arc",
    "xilinx/fpga/u50",
    "tpu",
]

counts = st.integers(1, 4)
node_devices = st.dictionaries(st.sampled_from(NODE_NAMES), st.integers(0, 4), max_size=4)
used_devices = st.dictionaries(st.sampled_from(NODE_NAMES), counts, max_size=3)
ask_devices = st.dictionaries(st.sampled_from(ASK_NAMES), counts, max_size=3)
amounts = st.integers(-(2**20), 2**20)
sizes = st.integers(0, 2**12)
with_devices = st.builds(
    Resources, cpu=amounts, memory_mb=amounts, disk_mb=amounts, devices=used_devices
)


def test_device_names_match_as_nomad_reads_a_request() -> None:
    assert device_matches("nvidia/gpu", "nvidia/gpu")
    assert device_matches("gpu", "nvidia/gpu") and device_matches("gpu", "intel/gpu/arc")
    assert device_matches("intel/gpu", "intel/gpu/arc")
    assert device_matches("intel/gpu/arc", "intel/gpu/arc")
    assert not device_matches("intel/gpu/max", "intel/gpu/arc")
    assert not device_matches("nvidia/gpu/a100", "nvidia/gpu")  # the node names no model
    assert not device_matches("amd/gpu", "nvidia/gpu")
    assert not device_matches("fpga", "nvidia/gpu")


@settings(max_examples=300, deadline=None)
@given(a=with_devices, b=with_devices)
def test_adding_then_subtracting_devices_gives_the_record_back(a: Resources, b: Resources) -> None:
    before = a.copy()
    a.add(b)
    for name in set(before.devices) | set(b.devices):
        assert a.devices.get(name, 0) == before.devices.get(name, 0) + b.devices.get(name, 0)
    a.subtract(b)
    assert a == before  # zero counts are dropped, so the maps are equal too
    a.subtract(b)
    a.add(b)
    assert a == before


@settings(max_examples=200, deadline=None)
@given(a=with_devices, b=with_devices)
def test_copy_and_total_never_share_a_devices_map(a: Resources, b: Resources) -> None:
    copied = a.copy()
    assert copied == a and copied.devices is not a.devices
    copied.add(b)
    copied.devices["extra/thing"] = 1
    assert "extra/thing" not in a.devices
    total = Resources.total([a, b])
    assert total.devices is not a.devices and total.devices is not b.devices
    assert (
        Resources.zero().devices == {} and Resources.zero().devices is not Resources.zero().devices
    )


def reference_shortfall(
    asks: dict[str, int], capacity: dict[str, int], used: dict[str, int]
) -> bool:
    """Whether no way of handing the node's free devices, one at a time, to the asks serves them all
    (brute force: every assignment of each requested device to a matching node device)."""
    free = {name: capacity[name] - used.get(name, 0) for name in capacity}
    wanted = [ask for ask, n in sorted(asks.items()) for _ in range(n)]
    options = [[name for name in sorted(free) if device_matches(ask, name)] for ask in wanted]
    for choice in itertools.product(*options):
        taken: dict[str, int] = {}
        for name in choice:
            taken[name] = taken.get(name, 0) + 1
        if all(taken[name] <= free[name] for name in taken):
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(capacity=node_devices, used=used_devices, asks=ask_devices, cpu=sizes, cap_cpu=sizes)
def test_exhausted_agrees_with_a_per_dimension_reference(
    capacity: dict[str, int], used: dict[str, int], asks: dict[str, int], cpu: int, cap_cpu: int
) -> None:
    used = {
        k: min(v, capacity.get(k, 0)) for k, v in used.items() if capacity.get(k, 0)
    }  # a node's usage fits it
    ask = Resources(cpu=cpu, memory_mb=0, devices=asks)
    node = Resources(cpu=cap_cpu, memory_mb=0, devices=capacity)
    in_use = Resources(cpu=0, memory_mb=0, devices=used)
    got = ask.exhausted(node, in_use)
    if cpu > cap_cpu:
        assert got == "cpu"  # devices come after cpu, memory and disk
        return
    short = reference_shortfall(asks, capacity, used)
    assert (got is not None) == short
    if got is not None:
        assert got.startswith("device ") and got[len("device ") :] in asks
    else:
        bound = ask.bound(
            node, in_use
        )  # what the placed alloc claims: node names only, within what is free
        assert sum(bound.devices.values()) == sum(asks.values())
        assert all(bound.devices[k] <= capacity[k] - used.get(k, 0) for k in bound.devices)
        in_use.add(bound)
        assert Resources(cpu=0, memory_mb=0, devices=in_use.devices).exhausted(node) is None


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.builds(Resources, cpu=sizes, memory_mb=sizes, disk_mb=sizes, devices=node_devices),
    ask=st.builds(Resources, cpu=sizes, memory_mb=sizes, disk_mb=sizes),
)
def test_an_ask_without_devices_ignores_the_nodes_devices(
    capacity: Resources, ask: Resources
) -> None:
    """Device-less asks (nearly all) fit exactly as before, whatever devices the node has."""
    plain = Resources(cpu=capacity.cpu, memory_mb=capacity.memory_mb, disk_mb=capacity.disk_mb)
    assert ask.exhausted(capacity) == ask.exhausted(plain)
    assert ask.bound(capacity) == ask and ask.bound(capacity) is not ask


def test_exhausted_names_the_device_that_is_short() -> None:
    node = Resources(cpu=4000, memory_mb=8192, devices={"nvidia/gpu": 2})
    two = Resources(cpu=100, memory_mb=64, devices={"nvidia/gpu": 2})
    assert two.exhausted(node) is None
    assert (
        two.exhausted(node, Resources(cpu=0, memory_mb=0, devices={"nvidia/gpu": 1}))
        == "device nvidia/gpu"
    )
    assert Resources(devices={"tpu": 1}).exhausted(node) == "device tpu"
    assert Resources(cpu=5000, devices={"tpu": 1}).exhausted(node) == "cpu"


def test_the_most_specific_asks_are_served_first() -> None:
    """ "gpu" can take any GPU, "intel/gpu/arc" only the Arc: asked together, both fit one of each."""
    capacity = {"intel/gpu/arc": 1, "nvidia/gpu": 1}
    assert assign_devices({"gpu": 1, "intel/gpu/arc": 1}, capacity, {}) == capacity
    assert assign_devices({"gpu": 2, "intel/gpu/arc": 1}, capacity, {}) == "gpu"


@settings(max_examples=200, deadline=None)
@given(r=with_devices)
def test_devices_round_trip_through_the_codec(r: Resources) -> None:
    data = codec.encode(r)
    assert codec.load(Resources, data) == r
    assert codec.decode(Resources, data) == r
    node = Node(id="n1", resources=r)
    assert codec.decode(Node, codec.encode(node)) == node


def test_records_written_before_devices_still_decode() -> None:
    """A stored alloc or node from before the field: no devices, nothing else changes."""
    old = codec.pack({"cpu": 500, "memory_mb": 256, "disk_mb": 0})
    for read in (codec.load, codec.decode):
        r = read(Resources, old)
        assert r == Resources(cpu=500, memory_mb=256, disk_mb=0) and r.devices == {}
    assert codec.from_wire(Resources, {"cpu": 1, "memory_mb": 2, "disk_mb": 3}).devices == {}


def test_job_queue_fields_round_trip_and_are_left_out_when_unset() -> None:
    job = Job(id="j", queue="team-a", priority_class="high")
    assert codec.decode(Job, codec.encode(job)) == job
    packed = codec.unpack(codec.encode(Job(id="j")))
    assert "queue" not in packed and "priority_class" not in packed  # a CompactRecord's defaults


def _job(devices: dict[str, int], **kw: str) -> Job:
    task = Task(name="t", resources=Resources(devices=devices))
    return Job(id="j", task_groups=[TaskGroup(name="g", tasks=[task])], **kw)


@pytest.mark.parametrize(
    ("devices", "kw", "message"),
    [
        ({"nvidia/gpu": 0}, {}, "job j: task t: device 'nvidia/gpu': count 0 must be >= 1"),
        (
            {"": 1},
            {},
            "job j: task t: a device name is empty: name it type, vendor/type or vendor/type/model",
        ),
        (
            {"a/b/c/d": 1},
            {},
            "job j: task t: device 'a/b/c/d' must be named type, vendor/type or vendor/type/model",
        ),
        (
            {"nvidia//x": 1},
            {},
            "job j: task t: device 'nvidia//x' must be named type, vendor/type or vendor/type/model",
        ),
        ({}, {"queue": "team a"}, "job j: queue 'team a' must be a name of at most"),
        ({}, {"priority_class": "a/b"}, "job j: priority class 'a/b' must be a name of at most"),
    ],
)
def test_apply_refuses_bad_device_asks_and_names(
    devices: dict[str, int], kw: dict[str, str], message: str
) -> None:
    with pytest.raises(ApplyRejected) as err:
        check_job(_job(devices, **kw))
    assert err.value.message.startswith(message)


def test_apply_accepts_nomads_request_names_and_queue_names() -> None:
    check_job(
        _job(
            {"gpu": 1, "nvidia/gpu": 2, "nvidia/gpu/a100": 1}, queue="team-a", priority_class="high"
        )
    )


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ({"gpu": 1}, "node n1: device 'gpu' must be named vendor/type or vendor/type/model"),
        ({"nvidia/gpu": -1}, "node n1: device 'nvidia/gpu': count -1 must be >= 0"),
        (
            {"nvidia/gpu": 1, "nvidia/gpu/a100": 1},
            "node n1: device 'nvidia/gpu/a100' and 'nvidia/gpu': name each model",
        ),
    ],
)
def test_apply_refuses_node_devices_that_are_not_one_pool_each(
    devices: dict[str, int], message: str
) -> None:
    with pytest.raises(ApplyRejected) as err:
        check_node(Node(id="n1", resources=Resources(cpu=1000, memory_mb=1000, devices=devices)))
    assert err.value.message.startswith(message)
