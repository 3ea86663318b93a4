"""Our objects in the exact shapes Nomad's HTTP API gives them.

The RPCs answer with Caravan's own JSON; Nomad's clients expect a few
things differently: list stubs with only the fields Nomad lists, ``null``
for a non-periodic job's ``Periodic``, RFC 3339 times on ACL tokens. The
routes and the event stream shape objects here, so both agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# Nomad's list stubs: the fields its list endpoints return (ours where we model them).
JOB_STUB = (
    "ID", "ParentID", "Name", "Namespace", "Datacenters", "Type", "Priority", "Periodic", "ParameterizedJob",
    "Stop", "Status", "StatusDescription", "JobSummary", "CreateIndex", "ModifyIndex", "JobModifyIndex", "SubmitTime",
)  # fmt: skip
ALLOC_STUB = (
    "ID", "EvalID", "Name", "Namespace", "NodeID", "NodeName", "JobID", "JobType", "JobVersion", "TaskGroup",
    "DesiredStatus", "DesiredDescription", "ClientStatus", "ClientDescription", "DesiredTransition", "TaskStates",
    "DeploymentStatus", "FollowupEvalID", "RescheduleTracker", "PreviousAllocation", "NextAllocation",
    "CreateIndex", "ModifyIndex", "AllocModifyIndex", "CreateTime", "ModifyTime",
)  # fmt: skip
NODE_STUB = (
    "ID", "Name", "Datacenter", "NodeClass", "Drain", "SchedulingEligibility", "Status", "StatusDescription",
    "CreateIndex", "ModifyIndex",
)  # fmt: skip
TOKEN_STUB = (
    "AccessorID",
    "Name",
    "Type",
    "Policies",
    "Global",
    "CreateTime",
    "ExpirationTime",
    "CreateIndex",
    "ModifyIndex",
)


def stub(obj: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``obj`` cut down to a list stub's ``fields`` (those it has)."""
    return {k: obj[k] for k in fields if k in obj}


def alloc_stubs(allocs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Allocations as Nomad lists them."""
    return [stub(a, ALLOC_STUB) for a in allocs]


def nomad_job(job: dict[str, Any]) -> dict[str, Any]:
    """Our job JSON in Nomad's exact shape: Periodic / ParameterizedJob are objects or null."""
    job = dict(job)
    if "Periodic" in job:
        job["Periodic"] = {"Enabled": True} if job["Periodic"] else None
    if "ParameterizedJob" in job:
        job["ParameterizedJob"] = {} if job["ParameterizedJob"] else None
    return job


def rfc3339(ns: int) -> str:
    """A time in ns since the epoch as Go prints a UTC ``time.Time`` in JSON."""
    return (
        datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{ns % 1_000_000_000:09d}Z"
    )


def nomad_token(token: dict[str, Any]) -> dict[str, Any]:
    """An ACL token with Nomad's RFC 3339 times (ExpirationTime null when it never expires)."""
    token = dict(token)
    token.pop("SecretHash", None)
    if isinstance(token.get("CreateTime"), int):
        token["CreateTime"] = rfc3339(token["CreateTime"]) if token["CreateTime"] else None
    if "ExpirationTime" in token:
        exp = token["ExpirationTime"]
        token["ExpirationTime"] = rfc3339(exp) if isinstance(exp, int) and exp else None
    return token
