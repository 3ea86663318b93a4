"""Our objects in the exact shapes Nomad's HTTP API gives them: the one conversion layer.

The RPCs answer with Caravan's records renamed to Nomad's spelling
(``node.spec.nomadjson.to_nomad``); that is not yet what a Nomad client
reads. Code written against Nomad indexes keys its ``api`` structs always
carry, and a Go client refuses a number where Nomad sends a ``time.Time``.
So every object the ``/v1`` API serves passes through one shaper here:

* every key of Nomad's struct is present: ours where Caravan has the data,
  else Nomad's zero value (``""``, ``0``, ``false``, ``null``; a zero
  ``time.Time`` is ``"0001-01-01T00:00:00Z"``);
* ``time.Time`` fields are RFC 3339 strings, as Go prints them;
* list stubs carry exactly Nomad's stub fields (plus the few we always sent).

The bridge applies ``READ_SHAPES`` to every read RPC's answer, so routes,
lists and blocking reads all agree; the event stream uses the same
functions. Each shaper is idempotent: a route may shape an object again.
The contract tests (``tests/http/test_field_contract.py``) hold the keys
to Nomad's field lists in ``tests/data/nomad_fields/``.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time in JSON


# -- times ------------------------------------------------------------------------------------
def rfc3339(ns: int) -> str:
    """A time in ns since the epoch as Go prints a UTC ``time.Time`` in JSON.

    ``time.gmtime`` rather than ``datetime``: lists shape a time per
    allocation, and this is a few times cheaper.
    """
    seconds, fraction = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds)) + f"{fraction:09d}Z"


def go_time(value: Any) -> Any:
    """A ``time.Time`` field: ns -> RFC 3339, 0 -> Go's zero time; a string is already one."""
    if isinstance(value, bool) or not isinstance(value, int):
        return ZERO_TIME if value is None else value
    return rfc3339(value) if value > 0 else ZERO_TIME


def _times(obj: Obj, *names: str) -> None:
    for name in names:
        if name in obj:
            obj[name] = go_time(obj[name])


def _filled(obj: Obj, zeros: Obj) -> Obj:
    """``obj`` with every key of ``zeros`` it lacks (zeros are immutable: None, "", 0, False).

    Three C-level dict operations, ``obj``'s keys first: lists shape every item.
    """
    out = dict(obj)
    out.update(zeros)
    out.update(obj)
    return out


def _picked(obj: Obj, keys: tuple[str, ...], getter: Callable[[Obj], tuple[Any, ...]]) -> Obj:
    """``obj``'s ``keys`` (None for one it lacks); ``getter`` is their itemgetter, the fast path."""
    try:
        return dict(zip(keys, getter(obj), strict=True))
    except KeyError:
        return {key: obj.get(key) for key in keys}


# -- jobs -------------------------------------------------------------------------------------
JOB_ZEROS: Obj = {
    "Region": "global", "NodePool": "default", "AllAtOnce": False, "Affinities": None,
    "Update": None, "Multiregion": None, "Spreads": None, "Reschedule": None, "Migrate": None,
    "UI": None, "ParentID": "", "Dispatched": False, "DispatchIdempotencyToken": "",
    "Payload": None, "ConsulNamespace": "", "VaultNamespace": "", "NomadTokenID": "",
    "VersionTag": None, "Meta": None, "Constraints": None, "TaskGroups": None,
}  # fmt: skip


def requested_devices(resources: Any) -> Any:
    """A Resources map with its ``Devices`` as Nomad's RequestedDevice list (ours keeps name -> count).

    Sorted by name; constraints and affinities are not modelled, so null.
    Anything else (None, a list already shaped) is returned as it is.
    """
    if not isinstance(resources, dict) or not isinstance(resources.get("Devices"), dict):
        return resources
    devices = [
        {"Name": name, "Count": count, "Constraints": None, "Affinities": None}
        for name, count in sorted(resources["Devices"].items())
    ]
    return {**resources, "Devices": devices or None}


def _job_devices(groups: Any) -> Any:
    """The job's groups with each task's Resources.Devices in Nomad's shape (groups untouched if none asks)."""
    if not isinstance(groups, list):
        return groups
    out = []
    for group in groups:
        tasks = group.get("Tasks") if isinstance(group, dict) else None
        if isinstance(tasks, list) and any(isinstance((t.get("Resources") or {}).get("Devices"), dict) for t in tasks):
            tasks = [{**t, "Resources": requested_devices(t.get("Resources"))} for t in tasks]
            group = {**group, "Tasks": tasks}
        out.append(group)
    return out


def nomad_job(job: Obj) -> Obj:
    """A whole job: Periodic / ParameterizedJob are objects or null (our records keep a flag), tasks'
    devices as Nomad's RequestedDevice lists; Queue and PriorityClass are Caravan's (always present)."""
    job = dict(job)
    job["TaskGroups"] = _job_devices(job.get("TaskGroups"))
    job.setdefault("Queue", "")
    job.setdefault("PriorityClass", "")
    periodic = job.get("Periodic")
    if not isinstance(periodic, dict):
        job["Periodic"] = {"Enabled": True} if periodic else None
    parameterized = job.get("ParameterizedJob")
    if not isinstance(parameterized, dict):
        job["ParameterizedJob"] = {} if parameterized else None
    return _filled(job, JOB_ZEROS)


def job_stub(job: Obj, summary: Obj | None = None) -> Obj:
    """Nomad's JobListStub of a whole job: flags as booleans, its summary (the bridge attaches it)."""
    job = nomad_job(job)
    out = {key: job.get(key) for key in _JOB_STUB_KEYS}
    out["Periodic"] = job["Periodic"] is not None
    out["ParameterizedJob"] = job["ParameterizedJob"] is not None
    out["JobSummary"] = summary if summary is not None else job.get("JobSummary")
    return out


_JOB_STUB_KEYS = (
    "ID", "ParentID", "Name", "Namespace", "Datacenters", "NodePool", "Multiregion", "Type",
    "Priority", "Stop", "Status", "StatusDescription", "CreateIndex", "ModifyIndex",
    "JobModifyIndex", "SubmitTime", "Queue", "PriorityClass",
)  # fmt: skip


def nomad_job_summary(summary: Obj) -> Obj:
    """A job summary with Nomad's Children (we run no parent jobs: all zero)."""
    return _filled(summary, {"Children": {"Pending": 0, "Running": 0, "Dead": 0}})


# -- nodes ------------------------------------------------------------------------------------
NODE_ZEROS: Obj = {
    "HTTPAddr": "", "TLSEnabled": False, "Attributes": None, "Resources": None, "Reserved": None,
    "ReservedResources": None, "Links": None, "Meta": None, "NodeClass": "", "NodePool": "default",
    "CgroupParent": "", "DrainStrategy": None, "Events": None, "HostVolumes": None,
    "GCVolumesOnNodeGC": False, "HostNetworks": None, "CSIControllerPlugins": None,
    "CSINodePlugins": None, "LastDrain": None, "NodeMaxAllocs": 0,
}  # fmt: skip


def _node_resources(resources: Obj | None) -> Obj | None:
    """Nomad's NodeResources from our one Resources (CPU shares, memory, disk, devices)."""
    if not resources:
        return None
    devices = resources.get("Devices")
    return {
        "Cpu": {"CpuShares": resources.get("CPU", 0), "TotalCpuCores": 0, "ReservableCpuCores": None},
        "Memory": {"MemoryMB": resources.get("MemoryMB", 0)},
        "Disk": {"DiskMB": resources.get("DiskMB", 0)},
        "Networks": None,
        "Devices": node_devices(devices) if isinstance(devices, dict) and devices else None,
        "MinDynamicPort": 0,
        "MaxDynamicPort": 0,
    }


def node_devices(devices: dict[str, int]) -> list[Obj]:
    """Nomad's NodeDeviceResource list from a node's ``vendor/type[/model]`` -> count map.

    Nomad names a device group vendor, type and name (the model); a node that
    names no model gets its type as the name. Caravan tracks counts, not
    instances, so the instances are numbered (``nvidia-gpu-0``, ...) and healthy.
    """
    out = []
    for key, count in sorted(devices.items()):
        parts = key.split("/")
        vendor, kind = (parts + ["", ""])[:2]
        name = parts[2] if len(parts) > 2 else kind
        prefix = key.replace("/", "-")
        instances = [{"ID": f"{prefix}-{i}", "Healthy": True, "HealthDescription": "", "Locality": None} for i in range(count)]
        out.append({"Vendor": vendor, "Type": kind, "Name": name, "Attributes": None, "Instances": instances})
    return out


def _drivers(attributes: Obj | None, updated: Any) -> Obj:
    """Nomad's Drivers map from our ``driver.<name>`` attributes (a listed driver is healthy)."""
    drivers = {}
    for key, value in (attributes or {}).items():
        name = key[len("driver.") :] if key.startswith("driver.") else ""
        if name and "." not in name:
            detected = str(value).lower() not in ("0", "false", "")
            drivers[name] = {
                "Attributes": None,
                "Detected": detected,
                "Healthy": detected,
                "HealthDescription": "Healthy" if detected else "Undetected",
                "UpdateTime": updated,
            }
    return drivers


def _drain_strategy(strategy: Obj | None) -> Obj | None:
    if not strategy:
        return strategy
    out = dict(strategy)
    _times(out, "ForceDeadline", "StartedAt")
    return out


def nomad_node(node: Obj) -> Obj:
    """A whole node: NodeResources and Drivers from what we keep, Nomad's time units.

    The node's secret (or its hash) never leaves: Nomad sanitizes it from every read.
    """
    node = dict(node)
    node.pop("SecretHash", None)
    node.pop("SecretID", None)
    updated = node.get("StatusUpdatedAt")
    if isinstance(updated, int) and updated > 10**12:  # ours is ns; Nomad's is Unix seconds
        node["StatusUpdatedAt"] = updated // 1_000_000_000
        node.setdefault("Drivers", _drivers(node.get("Attributes"), rfc3339(updated)))
    node.setdefault("Drivers", _drivers(node.get("Attributes"), ZERO_TIME))
    node.setdefault("NodeResources", _node_resources(node.get("Resources")))
    if "Resources" in node:  # Nomad's legacy Resources: devices as the same RequestedDevice list
        node["Resources"] = requested_devices(node["Resources"])
    node["DrainStrategy"] = _drain_strategy(node.get("DrainStrategy"))
    return _filled(node, NODE_ZEROS)


_NODE_STUB_KEYS = (
    "ID", "Datacenter", "Name", "NodeClass", "NodePool", "Drain", "SchedulingEligibility",
    "Status", "StatusDescription", "Drivers", "LastDrain", "CreateIndex", "ModifyIndex",
)  # fmt: skip


def node_stub(node: Obj) -> Obj:
    """Nomad's NodeListStub: Address is the HTTP address's host, Version the agent's."""
    if "NodeMaxAllocs" not in node:  # not shaped yet (the bridge shapes every read)
        node = nomad_node(node)
    out = {key: node.get(key) for key in _NODE_STUB_KEYS}
    out["Address"] = node.get("HTTPAddr", "").rsplit(":", 1)[0]
    out["Version"] = (node.get("Attributes") or {}).get("nomad.version", "")
    return out


# -- allocations ------------------------------------------------------------------------------
ALLOC_ZEROS: Obj = {
    "Job": None, "NodeName": "", "JobType": "", "TaskResources": None, "AllocatedResources": None,
    "Services": None, "Metrics": None, "DeploymentStatus": None, "NetworkStatus": None,
    "PreemptedAllocations": None, "PreemptedByAllocation": "", "TaskStates": None,
    "RescheduleTracker": None, "DesiredTransition": None, "DeploymentID": "",
    "FollowupEvalID": "", "PreviousAllocation": "", "NextAllocation": "",
}  # fmt: skip


def _task_state(state: Obj) -> Obj:
    out = _filled(state, {"LastRestart": 0, "StartedAt": 0, "FinishedAt": 0, "Events": None})
    _times(out, "LastRestart", "StartedAt", "FinishedAt")
    return out


def nomad_alloc(alloc: Obj) -> Obj:
    """A whole allocation: its task states and deployment status with Go times."""
    alloc = dict(alloc)
    if "Resources" in alloc:
        alloc["Resources"] = requested_devices(alloc["Resources"])
    if alloc.get("TaskStates"):
        alloc["TaskStates"] = {t: _task_state(s) for t, s in alloc["TaskStates"].items()}
    status = alloc.get("DeploymentStatus")
    if isinstance(status, dict):
        status = _filled(status, {"ModifyIndex": alloc.get("ModifyIndex", 0)})
        _times(status, "Timestamp")
        alloc["DeploymentStatus"] = status
    return _filled(alloc, ALLOC_ZEROS)


_ALLOC_STUB_KEYS = (
    "ID", "EvalID", "Name", "Namespace", "NodeID", "NodeName", "JobID", "JobType", "JobVersion",
    "TaskGroup", "DesiredStatus", "DesiredDescription", "ClientStatus", "ClientDescription",
    "DesiredTransition", "TaskStates", "DeploymentStatus", "FollowupEvalID", "RescheduleTracker",
    "PreemptedAllocations", "PreemptedByAllocation", "PreviousAllocation", "NextAllocation",
    "CreateIndex", "ModifyIndex", "AllocModifyIndex", "CreateTime", "ModifyTime",
)  # fmt: skip


_ALLOC_STUB_GET = operator.itemgetter(*_ALLOC_STUB_KEYS)


def alloc_stub(alloc: Obj) -> Obj:
    """Nomad's AllocationListStub of an allocation."""
    if "NetworkStatus" not in alloc:  # not shaped yet (the bridge shapes every read)
        alloc = nomad_alloc(alloc)
    return _picked(alloc, _ALLOC_STUB_KEYS, _ALLOC_STUB_GET)


def alloc_stubs(allocs: list[Obj]) -> list[Obj]:
    """Allocations as Nomad lists them."""
    return [alloc_stub(a) for a in allocs]


# -- evaluations and deployments -------------------------------------------------------------
EVAL_ZEROS: Obj = {
    "NodeModifyIndex": 0, "Wait": 0, "RelatedEvals": None, "PlanAnnotations": None,
    "ClassEligibility": None, "EscapedComputedClass": False, "QuotaLimitReached": "",
    "MissingNonNodeResources": None, "AnnotatePlan": False, "SnapshotIndex": 0,
    "FailedTGAllocs": None, "QueuedAllocations": None,
}  # fmt: skip
METRIC_ZEROS: Obj = {
    "NodesEvaluated": 0, "NodesFiltered": 0, "NodesInPool": 0, "NodePool": "default",
    "NodesAvailable": None, "ClassFiltered": None, "ConstraintFiltered": None,
    "NodesExhausted": 0, "ClassExhausted": None, "DimensionExhausted": None,
    "QuotaExhausted": None, "ResourcesExhausted": None, "Scores": None, "AllocationTime": 0,
    "CoalescedFailures": 0, "ScoreMetaData": None,
}  # fmt: skip


def _metric(failure: Any) -> Obj:
    """Nomad's AllocationMetric for a group that failed to place; we keep only the reason."""
    if isinstance(failure, dict):
        return _filled(failure, METRIC_ZEROS)
    return {**METRIC_ZEROS, "Reason": str(failure)}  # Caravan's own: the scheduler's words


def nomad_eval(ev: Obj) -> Obj:
    """A whole evaluation: WaitUntil a Go time, failed groups as AllocationMetrics."""
    ev = dict(ev)
    _times(ev, "WaitUntil")
    if ev.get("FailedTGAllocs"):
        ev["FailedTGAllocs"] = {g: _metric(f) for g, f in ev["FailedTGAllocs"].items()}
    ev.setdefault("WaitUntil", ZERO_TIME)
    return _filled(ev, EVAL_ZEROS)


def _deployment_state(state: Obj) -> Obj:
    out = dict(state)
    _times(out, "RequireProgressBy")
    return out


def nomad_deployment(dep: Obj) -> Obj:
    """A whole deployment: JobSpecModifyIndex is the job's spec index we record, Go times."""
    dep = dict(dep)
    dep.setdefault("JobSpecModifyIndex", dep.get("JobModifyIndex", 0))
    if dep.get("TaskGroups"):
        dep["TaskGroups"] = {g: _deployment_state(s) for g, s in dep["TaskGroups"].items()}
    return _filled(dep, {"IsMultiregion": False, "TaskGroups": None})


# -- ACL tokens -------------------------------------------------------------------------------
def nomad_token(token: Obj) -> Obj:
    """An ACL token: RFC 3339 times (ExpirationTime null when it never expires), no secret hash.

    The secret itself is not kept (only its hash), so a read answers
    Nomad's zero SecretID; create, bootstrap and self fill it in.
    """
    token = dict(token)
    token.pop("SecretHash", None)
    created = token.get("CreateTime")
    if isinstance(created, int) and not isinstance(created, bool):
        token["CreateTime"] = go_time(created)
    exp = token.get("ExpirationTime")
    if not isinstance(exp, str):
        token["ExpirationTime"] = rfc3339(exp) if isinstance(exp, int) and exp else None
    return _filled(token, {"SecretID": "", "Roles": None, "Global": False, "Policies": None})


_TOKEN_STUB_KEYS = (
    "AccessorID", "Name", "Type", "Policies", "Roles", "Global", "CreateTime", "ExpirationTime",
    "CreateIndex", "ModifyIndex",
)  # fmt: skip


def token_stub(token: Obj) -> Obj:
    """Nomad's ACLTokenListStub (no secret)."""
    token = nomad_token(token)
    return {key: token.get(key) for key in _TOKEN_STUB_KEYS}


# -- stubs by name (the routes pick one) ----------------------------------------------------
class StubKind(tuple[str, ...]):
    """A list stub's field names, with the function that builds the stub from an object.

    A tuple, so code that reads the names still works; ``stub`` builds with
    ``build`` so computed fields (a job's Periodic flag, a node's Address)
    are right.
    """

    build: Callable[[Obj], Obj]

    def __new__(cls, keys: tuple[str, ...], build: Callable[[Obj], Obj]) -> StubKind:
        self = super().__new__(cls, keys)
        self.build = build
        return self


JOB_STUB = StubKind(_JOB_STUB_KEYS + ("Periodic", "ParameterizedJob", "JobSummary"), job_stub)
ALLOC_STUB = StubKind(_ALLOC_STUB_KEYS, alloc_stub)
NODE_STUB = StubKind(_NODE_STUB_KEYS + ("Address", "Version"), node_stub)
TOKEN_STUB = StubKind(_TOKEN_STUB_KEYS, token_stub)


def stub(obj: Obj, fields: tuple[str, ...]) -> Obj:
    """``obj`` as a list stub: built by the stub kind, or cut down to ``fields`` (those it has)."""
    if isinstance(fields, StubKind):
        return fields.build(obj)
    return {k: obj[k] for k in fields if k in obj}


# -- raft and status --------------------------------------------------------------------------
def raft_server(peer: Obj) -> Obj:
    """Nomad's RaftServer. Address is the server's RPC address, as ``/v1/status/peers`` lists it.

    Nomad serves raft and RPC on one address, so its leader, peers and raft
    configuration agree; ours are two ports, and clients compare the
    addresses, so Address is the RPC one and RaftAddress the raft port.
    """
    return {
        "ID": peer["ID"],
        "Node": peer.get("Name") or peer["ID"],
        "Address": peer["RPCAddress"],
        "Leader": bool(peer.get("Leader")),
        "Voter": bool(peer.get("Voter", True)),
        "RaftProtocol": "3",
        "RaftAddress": peer.get("RaftAddress", ""),
    }


# -- what the bridge applies to read answers ------------------------------------------------
def _each(shape: Callable[[Obj], Obj]) -> Callable[[Any], Any]:
    return lambda data: [shape(x) for x in data] if isinstance(data, list) else data


def _one(shape: Callable[[Obj], Obj]) -> Callable[[Any], Any]:
    return lambda data: shape(data) if isinstance(data, dict) else data


def _versions(data: Any) -> Any:
    if isinstance(data, dict) and isinstance(data.get("Versions"), list):
        return {**data, "Versions": [nomad_job(j) for j in data["Versions"]]}
    return data


READ_SHAPES: dict[str, Callable[[Any], Any]] = {
    "job.get": _one(nomad_job),
    "job.list": _each(nomad_job),
    "job.versions": _versions,
    "job.summary": _one(nomad_job_summary),
    "node.get": _one(nomad_node),
    "node.list": _each(nomad_node),
    "alloc.get": _one(nomad_alloc),
    "alloc.list": _each(nomad_alloc),
    "eval.get": _one(nomad_eval),
    "eval.list": _each(nomad_eval),
    "deployment.get": _one(nomad_deployment),
    "deployment.list": _each(nomad_deployment),
    "acl.token.get": _one(nomad_token),
    "acl.token.self": _one(nomad_token),
    "acl.token.list": _each(nomad_token),
}


def shape_read(method: str, out: Any) -> Any:
    """A read RPC's answer with its data in Nomad's shape (answers of other RPCs as they are)."""
    shape = READ_SHAPES.get(method)
    if shape is None or not isinstance(out, dict) or "data" not in out:
        return out
    return {**out, "data": shape(out["data"])}


# Writes whose missing object Nomad answers with an empty success, not a 404.
DEREGISTER_MISSING: Obj = {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": 0, "Index": 0}


# The event stream's payloads, by topic (``node.http.events`` shapes Job and ACLToken so far).
BY_TOPIC: dict[str, Callable[[Obj], Obj]] = {
    "Job": nomad_job,
    "Node": nomad_node,
    "Allocation": nomad_alloc,
    "Evaluation": nomad_eval,
    "Deployment": nomad_deployment,
    "ACLToken": nomad_token,
}
