"""The Nomad lifecycle end to end on real processes: servers, the simulated client, the CLI."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from node import devcluster as cl
from node.wire.errors import BAD_REQUEST, NOT_FOUND, RPCError
from node.wire.rpc_client import RPCClient
from tests.lifecycle.conftest import LIFECYCLE_CONFIG, Env, wait_until

pytestmark = pytest.mark.cluster


def spec(job_id: str, *, type: str = "service", count: int = 1, config: dict[str, Any] | None = None,
         cpu: int = 100, mem: int = 64, update: dict[str, Any] | None = None, **job: Any) -> dict[str, Any]:
    group: dict[str, Any] = {
        "Name": "g",
        "Count": count,
        "Tasks": [{"Name": "t", "Driver": "sim", "Config": config or {}, "Resources": {"CPU": cpu, "MemoryMB": mem}}],
    }
    if update is not None:
        group["Update"] = update
    return {"Job": {"ID": job_id, "Type": type, "Datacenters": ["dc1"], "TaskGroups": [group], **job}}


def allocs(env: Env, job_id: str) -> list[dict[str, Any]]:
    return env.read("alloc.list", {"job_id": job_id})


def live(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in rows if a["DesiredStatus"] == "run" and a["ClientStatus"] in ("pending", "running")]


def deployment_of(env: Env, job_id: str, version: int) -> dict[str, Any] | None:
    """The deployment of one version of a job, if it has one yet."""
    return next((d for d in env.read("deployment.list", {"job_id": job_id}) if d["JobVersion"] == version), None)


def job_status(env: Env, job_id: str) -> str:
    return env.read("job.get", {"job_id": job_id})["Status"]


def write_spec(env: Env, name: str, body: dict[str, Any]) -> str:
    path = env.tmp / f"{name}-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(body))
    return str(path)


# -- the happy paths ---------------------------------------------------------------------
def test_batch_job_completes_and_the_job_becomes_dead(lifecycle_env: Env) -> None:
    env = lifecycle_env
    out = env.cli("job", "run", write_spec(env, "batch", spec("batch5", type="batch", count=5, config={"run_for": "1s"})))
    assert out.returncode == 0, out.stdout + out.stderr
    assert '==> Monitoring evaluation' in out.stdout and 'finished with status "complete"' in out.stdout
    assert out.stdout.count("Allocation ") == 5
    wait_until(lambda: job_status(env, "batch5") == "dead", 60, "batch job dead")
    rows = allocs(env, "batch5")
    assert len(rows) == 5 and all(a["ClientStatus"] == "complete" for a in rows)
    summary = env.read("job.summary", {"job_id": "batch5"})["Summary"]["g"]
    assert summary["Complete"] == 5 and summary["Running"] == 0 and summary["Queued"] == 0


def test_service_job_runs_and_job_stop_stops_its_allocs(lifecycle_env: Env) -> None:
    env = lifecycle_env
    env.call("job.register", {"job": spec("svc3", count=3, update={"MinHealthyTime": 200_000_000})})
    wait_until(lambda: len([a for a in allocs(env, "svc3") if a["ClientStatus"] == "running"]) == 3, 60, "3 running")
    assert job_status(env, "svc3") == "running"
    out = env.cli("job", "stop", "svc3")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: all(a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete" for a in allocs(env, "svc3")),
               60, "allocs stopped by the client")
    wait_until(lambda: job_status(env, "svc3") == "dead", 30, "stopped job dead")


def test_a_new_version_rolls_out_through_a_successful_deployment(lifecycle_env: Env) -> None:
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 300_000_000}
    env.call("job.register", {"job": spec("roll", count=3, config={"v": 1}, update=update)})

    def deployment(version: int) -> dict[str, Any] | None:
        return deployment_of(env, "roll", version)

    wait_until(lambda: (deployment(0) or {}).get("Status") == "successful", 60, "first deployment successful")
    env.call("job.register", {"job": spec("roll", count=3, config={"v": 2}, update=update)})
    wait_until(lambda: deployment(1) is not None, 30, "a deployment for version 1")
    dep = wait_until(lambda: (d := deployment(1)) and d["Status"] != "running" and d, 90, "second deployment finished")
    assert dep["Status"] == "successful", dep
    rows = live(allocs(env, "roll"))
    assert len(rows) == 3 and all(a["JobVersion"] == 1 and a["DeploymentID"] == dep["ID"] for a in rows)
    assert dep["TaskGroups"]["g"]["HealthyAllocs"] >= 3 and dep["TaskGroups"]["g"]["PlacedAllocs"] == 3
    # Old allocs were replaced at most one at a time: never more than count + max_parallel live.
    env.call("job.stop", {"job_id": "roll"})


def test_a_failing_version_with_auto_revert_rolls_back_to_the_last_stable_one(lifecycle_env: Env) -> None:
    """Nomad's auto_revert: the failed rollout re-registers the newest stable version's spec.

    The group has a progress deadline, so a crashed alloc is first rescheduled within the rollout
    (one attempt); the rollout fails when the replacement crashes too, without waiting for the deadline.
    """
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 300_000_000, "AutoRevert": True}
    once = {"Attempts": 1, "Interval": 3_600_000_000_000, "Delay": 5_000_000_000, "DelayFunction": "constant", "Unlimited": False}

    def spec_with(config: dict[str, Any]) -> dict[str, Any]:
        body = spec("back", count=2, config=config, update=update)
        body["Job"]["TaskGroups"][0]["ReschedulePolicy"] = once
        return body

    env.call("job.register", {"job": spec_with({"v": 0})})

    def deployment(version: int) -> dict[str, Any] | None:
        return deployment_of(env, "back", version)

    wait_until(lambda: (deployment(0) or {}).get("Status") == "successful", 60, "first deployment successful")
    assert env.read("job.get", {"job_id": "back"})["Stable"] is True
    env.call("job.register", {"job": spec_with({"v": 1, "run_for": "100ms", "exit_code": 1})})
    failed = wait_until(lambda: (d := deployment(1)) and d["Status"] == "failed" and d, 60, "the failing version's rollout failed")
    assert failed["StatusDescription"] == "Failed due to unhealthy allocations - rolling back to job version 0", failed
    # Its first alloc crashed and was replaced within the rollout; the replacement crashed too.
    v1 = [a for a in allocs(env, "back") if a["JobVersion"] == 1]
    assert any(a["PreviousAllocation"] and a["DeploymentID"] == failed["ID"] for a in v1), v1
    assert failed["TaskGroups"]["g"]["PlacedAllocs"] >= 2 and failed["TaskGroups"]["g"]["UnhealthyAllocs"] >= 2, failed
    back = wait_until(lambda: (d := deployment(2)) and d["Status"] == "successful" and d, 60, "the rollback's rollout succeeded")
    job = env.read("job.get", {"job_id": "back"})
    assert job["Version"] == 2 and job["TaskGroups"][0]["Tasks"][0]["Config"] == {"v": 0} and job["Stable"] is True
    rows = live(allocs(env, "back"))
    assert len(rows) == 2 and all(a["JobVersion"] == 2 and a["DeploymentID"] == back["ID"] for a in rows), rows
    history = env.cli("job", "history", "back")
    assert history.returncode == 0 and re.search(r"^\s*1\s+false\s", history.stdout, re.M), history.stdout
    shown = env.cli("deployment", "status", failed["ID"])
    assert "Auto Revert" in shown.stdout and "rolling back to job version 0" in shown.stdout, shown.stdout
    env.call("job.stop", {"job_id": "back"})


def test_a_version_whose_checks_never_pass_holds_its_rollout_then_rolls_back(lifecycle_env: Env) -> None:
    """The client's own health verdict end to end, as in Nomad: a task whose checks never pass
    keeps running, and the client reports it unhealthy at healthy_deadline. It is not rescheduled
    (it did not fail), nothing more of the rollout is replaced while it is unhealthy, and the
    progress deadline fails the rollout, which auto-reverts to the last stable version."""
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 200_000_000, "HealthyDeadline": 1_000_000_000,
              "ProgressDeadline": 4_000_000_000, "AutoRevert": True}
    env.call("job.register", {"job": spec("checks", count=2, config={"v": 0}, update=update)})
    wait_until(lambda: (deployment_of(env, "checks", 0) or {}).get("Status") == "successful", 60, "first deployment successful")
    v0 = {a["ID"] for a in live(allocs(env, "checks"))}
    env.call("job.register", {"job": spec("checks", count=2, config={"v": 1, "healthy": False}, update=update)})
    failed = wait_until(lambda: (d := deployment_of(env, "checks", 1)) and d["Status"] == "failed" and d, 60,
                        "the unhealthy version's rollout failed")
    assert failed["StatusDescription"] == "Failed due to progress deadline - rolling back to job version 0", failed
    state = failed["TaskGroups"]["g"]
    assert (state["PlacedAllocs"], state["HealthyAllocs"], state["UnhealthyAllocs"]) == (1, 0, 1), failed
    rows = allocs(env, "checks")
    (sick,) = [a for a in rows if a["JobVersion"] == 1]
    assert sick["DeploymentStatus"]["Healthy"] is False and sick["ClientStatus"] != "failed", sick
    assert not [a for a in rows if a["PreviousAllocation"] == sick["ID"] and a["JobVersion"] == 1], "not rescheduled"
    stopped = [a for a in rows if a["ID"] in v0 and a["DesiredStatus"] == "stop"]
    assert len(stopped) == 1, "max_parallel 1: one old alloc replaced, the other kept while the new one was unhealthy"
    back = wait_until(lambda: (d := deployment_of(env, "checks", 2)) and d["Status"] == "successful" and d, 60,
                      "the rollback's rollout succeeded")
    rows = live(allocs(env, "checks"))
    assert len(rows) == 2 and all(a["JobVersion"] == 2 and a["DeploymentID"] == back["ID"] for a in rows), rows
    env.call("job.stop", {"job_id": "checks"})


def test_deployment_fail_rolls_back_by_cli_and_http_and_refuses_a_finished_one(lifecycle_env: Env) -> None:
    """`nomad deployment fail`: an operator fails a rollout that is still running; with
    auto_revert the last stable version comes back. A finished rollout cannot be failed."""
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 200_000_000, "AutoRevert": True}
    env.call("job.register", {"job": spec("undo", count=1, config={"v": 0}, update=update)})

    def deployment(version: int) -> dict[str, Any] | None:
        return deployment_of(env, "undo", version)

    wait_until(lambda: (deployment(0) or {}).get("Status") == "successful", 60, "first deployment successful")
    # never healthy within the test (Nomad's order: MinHealthyTime < HealthyDeadline < ProgressDeadline)
    slow = {**update, "MinHealthyTime": 600_000_000_000, "HealthyDeadline": 700_000_000_000, "ProgressDeadline": 800_000_000_000}
    env.call("job.register", {"job": spec("undo", count=1, config={"v": 1}, update=slow)})
    d1 = wait_until(lambda: deployment(1), 30, "the second version's deployment")
    out = env.cli("deployment", "fail", d1["ID"][:8])
    assert out.returncode == 0 and "Auto-reverted to job version 0." in out.stdout, out.stdout + out.stderr
    d1 = env.read("deployment.get", {"deployment_id": d1["ID"]})
    assert (d1["Status"], d1["StatusDescription"]) == ("failed", "Deployment marked as failed - rolling back to job version 0")
    job = env.read("job.get", {"job_id": "undo"})
    assert job["Version"] == 2 and job["TaskGroups"][0]["Tasks"][0]["Config"] == {"v": 0}
    again = env.cli("deployment", "fail", d1["ID"])
    assert again.returncode != 0 and again.stderr.strip().count("\n") == 0, again.stderr
    assert "is failed: only a running deployment can be failed" in again.stderr, again.stderr
    assert env.read("deployment.get", {"deployment_id": d1["ID"]})["ModifyIndex"] == d1["ModifyIndex"]  # unchanged
    missing = env.cli("deployment", "fail", "f" * 8)
    assert missing.returncode != 0 and "not found" in missing.stderr, missing.stderr
    # Nomad's HTTP route answers the same, for scripts and nomad tooling.
    http = env.cluster.http_addresses[0]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"http://{http}/v1/deployment/fail/{d1['ID']}", method="POST"), timeout=10)
    assert refused.value.code == 400
    wait_until(lambda: (deployment(2) or {}).get("Status") == "successful", 60, "the rollback's rollout succeeded")
    env.call("job.stop", {"job_id": "undo"})


def test_deployment_pause_holds_a_rollout_and_resume_goes_on_by_cli_and_http(lifecycle_env: Env) -> None:
    """`nomad deployment pause|resume`: a paused rollout replaces nothing more, even once its
    first new alloc is healthy; resumed, it finishes."""
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 200_000_000}
    env.call("job.register", {"job": spec("hold", count=3, config={"v": 0}, update=update)})

    def deployment(version: int) -> dict[str, Any] | None:
        return deployment_of(env, "hold", version)

    wait_until(lambda: (deployment(0) or {}).get("Status") == "successful", 60, "first deployment successful")
    slow = {**update, "MinHealthyTime": 3_000_000_000}  # time enough to pause before the first is healthy
    env.call("job.register", {"job": spec("hold", count=3, config={"v": 1}, update=slow)})
    d1 = wait_until(lambda: deployment(1), 30, "the second version's deployment")
    out = env.cli("deployment", "pause", d1["ID"][:8])
    assert out.returncode == 0 and f'Deployment "{d1["ID"]}" paused' in out.stdout, out.stdout + out.stderr

    def group() -> dict[str, Any]:
        return env.read("deployment.get", {"deployment_id": d1["ID"]})["TaskGroups"]["g"]

    wait_until(lambda: group()["HealthyAllocs"] == 1, 30, "the first new alloc healthy while paused")
    # Running, the watcher would place the next batch within a second of that; paused, nothing moves.
    held_until = time.monotonic() + 3.0
    while time.monotonic() < held_until:
        d = env.read("deployment.get", {"deployment_id": d1["ID"]})
        assert (d["Status"], d["TaskGroups"]["g"]["PlacedAllocs"]) == ("paused", 1), d
        time.sleep(0.2)
    again = env.cli("deployment", "pause", d1["ID"])
    assert again.returncode != 0 and "is already paused" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    http = env.cluster.http_addresses[0]

    def post(body: Any) -> tuple[int, Any]:
        url = f"http://{http}/v1/deployment/pause/{d1['ID']}"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert post({"Pause": "no"})[0] == 400
    resumed = env.cli("deployment", "resume", d1["ID"][:8])  # monitors the eval that places the next batch
    assert resumed.returncode == 0 and f'Deployment "{d1["ID"]}" resumed' in resumed.stdout, resumed.stdout + resumed.stderr
    assert '" created: node' in resumed.stdout, resumed.stdout
    assert post({"DeploymentID": d1["ID"], "Pause": True})[0] == 200  # and Nomad's HTTP route, both ways
    status, answer = post({"DeploymentID": d1["ID"], "Pause": False})
    assert status == 200 and answer["EvalID"] and answer["DeploymentModifyIndex"] > d1["ModifyIndex"], answer
    resumed = env.cli("deployment", "resume", d1["ID"])
    assert resumed.returncode != 0 and "is not paused: nothing to resume" in resumed.stderr, resumed.stderr
    done = wait_until(lambda: (deployment(1) or {}).get("Status") == "successful" and deployment(1), 60, "rollout finished")
    assert (done["TaskGroups"]["g"]["PlacedAllocs"], done["TaskGroups"]["g"]["HealthyAllocs"]) == (3, 3)
    env.call("job.stop", {"job_id": "hold"})


def test_canaries_wait_for_promotion_by_cli_then_replace_the_old_allocs(lifecycle_env: Env) -> None:
    """`update { canary = 1 }`: a new version first runs one canary beside the old allocs and waits
    for `deployment promote`; promoted, it replaces them."""
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 200_000_000, "Canary": 1}
    env.call("job.register", {"job": spec("bird", count=2, config={"v": 0}, update=update)})

    def deployment(version: int) -> dict[str, Any] | None:
        return deployment_of(env, "bird", version)

    wait_until(lambda: (deployment(0) or {}).get("Status") == "successful", 60, "first deployment successful")
    env.call("job.register", {"job": spec("bird", count=2, config={"v": 1}, update=update)})
    waiting = "Deployment is running but requires manual promotion"
    d1 = wait_until(lambda: (d := deployment(1)) and d["StatusDescription"] == waiting and d["TaskGroups"]["g"]["HealthyAllocs"]
                    and d, 60, "the canary healthy")
    rows = live(allocs(env, "bird"))
    assert sorted(a["JobVersion"] for a in rows) == [0, 0, 1], rows  # the canary runs beside count old allocs
    shown = env.cli("deployment", "status", d1["ID"])
    assert "Promoted" in shown.stdout and "Canaries" in shown.stdout, shown.stdout
    http = env.cluster.http_addresses[0]
    url = f"http://{http}/v1/deployment/promote/{d1['ID']}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="PUT"), timeout=10)
    assert refused.value.code == 400 and "say what to promote" in refused.value.read().decode()
    for groups, words in (("g", "must be a list of task group names"), (["nope"], "'nope' has no canaries to promote")):
        with pytest.raises(RPCError) as bad:
            env.call("deployment.promote", {"deployment_id": d1["ID"], "groups": groups})
        assert bad.value.code == BAD_REQUEST and words in bad.value.message, bad.value
    out = env.cli("deployment", "promote", d1["ID"][:8])
    assert out.returncode == 0 and f'Deployment "{d1["ID"]}" promoted' in out.stdout, out.stdout + out.stderr
    done = wait_until(lambda: (d := deployment(1)) and d["Status"] == "successful" and d, 60, "the promoted rollout finished")
    assert done["TaskGroups"]["g"]["Promoted"] and done["TaskGroups"]["g"]["HealthyAllocs"] == 2
    rows = live(allocs(env, "bird"))
    assert sorted((a["Name"], a["JobVersion"]) for a in rows) == [("bird.g[0]", 1), ("bird.g[1]", 1)], rows
    again = env.cli("deployment", "promote", d1["ID"])
    assert again.returncode != 0 and "only a running deployment can be promoted" in again.stderr, again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    env.call("job.stop", {"job_id": "bird"})


def test_an_old_alloc_lost_during_a_canary_soak_comes_back_as_the_old_version(lifecycle_env: Env) -> None:
    """Nomad's downgradeNonCanary on real processes: while a canary waits for promotion, a client
    dies; its old alloc is replaced with the old version, outside the rollout, so the version
    under test runs only as the canary. The promotion then replaces every old alloc."""
    env = lifecycle_env
    victim = env.start_sim(1, "soak")
    update = {"MaxParallel": 2, "MinHealthyTime": 200_000_000, "Canary": 1}
    env.call("job.register", {"job": spec("soak", count=4, config={"v": 0}, update=update)})
    wait_until(lambda: (deployment_of(env, "soak", 0) or {}).get("Status") == "successful", 60, "first deployment successful")
    on_victim = [a["ID"] for a in live(allocs(env, "soak")) if a["NodeID"] in victim.nodes]
    assert on_victim, "anti-affinity spreads the 4 allocs over the 4 nodes, the victim's too"
    env.call("job.register", {"job": spec("soak", count=4, config={"v": 1}, update=update)})
    d1 = wait_until(lambda: (d := deployment_of(env, "soak", 1)) and d["TaskGroups"]["g"]["HealthyAllocs"] and d, 60,
                    "the canary healthy")
    victim.kill()

    def replaced() -> list[dict[str, Any]]:
        rows = allocs(env, "soak")
        return [a for a in rows if a["PreviousAllocation"] in on_victim and a["ClientStatus"] == "running"]

    (again,) = wait_until(replaced, 60, "the lost old alloc replaced")
    assert (again["JobVersion"], again["DeploymentID"]) == (0, ""), again
    v1 = [a for a in live(allocs(env, "soak")) if a["JobVersion"] == 1]
    assert len(v1) <= 1 and all((a["DeploymentStatus"] or {}).get("Canary") for a in v1), "only a canary runs the version under test"
    # The canary may have shared the victim's node: then a new canary must turn healthy first.
    wait_until(lambda: env.cli("deployment", "promote", d1["ID"]).returncode == 0, 60, "the canary promoted")
    wait_until(lambda: (deployment_of(env, "soak", 1) or {}).get("Status") == "successful", 90, "the promoted rollout finished")
    rows = live(allocs(env, "soak"))
    assert len(rows) == 4 and all(a["JobVersion"] == 1 for a in rows), rows
    env.call("job.stop", {"job_id": "soak"})


def test_job_revert_runs_a_kept_version_again_by_cli_and_http(lifecycle_env: Env) -> None:
    """`nomad job revert`: the kept version's spec becomes the newest version and is placed."""
    env = lifecycle_env
    env.call("job.register", {"job": spec("rev", type="batch", count=1, config={"v": 0, "run_for": "1h"})})
    env.call("job.register", {"job": spec("rev", type="batch", count=1, config={"v": 1, "run_for": "1h"})})
    out = env.cli("job", "revert", "rev", "0")
    assert out.returncode == 0 and "reverted to the spec of version 0" in out.stdout, out.stdout + out.stderr
    assert '" created: node' in out.stdout, out.stdout  # monitored as `job run` is
    job = env.read("job.get", {"job_id": "rev"})
    assert job["Version"] == 2 and job["TaskGroups"][0]["Tasks"][0]["Config"] == {"v": 0, "run_for": "1h"}
    for argv, words in ((("rev", "2"), "can't revert to the current version"), (("rev", "7"), "has no version 7"),
                        (("nope", "0"), "job nope not found")):
        bad = env.cli("job", "revert", *argv)
        assert bad.returncode != 0 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert env.read("job.get", {"job_id": "rev"})["ModifyIndex"] == job["ModifyIndex"]  # refusals change nothing
    http = env.cluster.http_addresses[0]

    def post(body: Any) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://{http}/v1/job/rev/revert", data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert post({"JobID": "rev", "JobVersion": 1, "EnforcePriorVersion": 1})[0] == 409  # it is at version 2
    assert post([1])[0] == 400
    status, answer = post({"JobID": "rev", "JobVersion": 1, "EnforcePriorVersion": 2})
    assert status == 200 and answer["EvalID"] and answer["JobModifyIndex"] > job["JobModifyIndex"], answer
    assert env.read("job.get", {"job_id": "rev"})["Version"] == 3
    env.call("job.stop", {"job_id": "rev"})


def test_job_run_names_updated_allocs_modified_and_the_new_deployment(lifecycle_env: Env) -> None:
    """A count-only change updates the running allocs in place: `job run` says "modified" for
    them and "created" for the new one, and names the new version's deployment (as nomad)."""
    env = lifecycle_env
    update = {"MaxParallel": 1, "MinHealthyTime": 100_000_000}
    first = env.cli("job", "run", write_spec(env, "grow", spec("grow", count=2, update=update)))
    assert first.returncode == 0 and first.stdout.count('" created: node') == 2, first.stdout + first.stderr
    wait_until(lambda: len(env.read("deployment.list", {"job_id": "grow"})) == 1, 30, "the first deployment")
    out = env.cli("job", "run", write_spec(env, "grow", spec("grow", count=3, update=update)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count('" modified: node') == 2 and out.stdout.count('" created: node') == 1, out.stdout
    v1 = next(d for d in env.read("deployment.list", {"job_id": "grow"}) if d["JobVersion"] == 1)
    assert f'Evaluation within deployment: "{v1["ID"][:8]}"' in out.stdout, (v1["ID"], out.stdout)
    # The two allocs updated in place joined the new rollout, and the client judged their health
    # anew: it succeeds with all three counted (Nomad's Desired/Placed/Healthy).
    v1 = wait_until(lambda: (d := env.read("deployment.get", {"deployment_id": v1["ID"]}))["Status"] != "running" and d,
                    60, "the second deployment finished")
    state = v1["TaskGroups"]["g"]
    assert v1["Status"] == "successful" and (state["DesiredTotal"], state["PlacedAllocs"], state["HealthyAllocs"]) == (3, 3, 3), v1
    assert all(a["DeploymentID"] == v1["ID"] for a in live(allocs(env, "grow")))
    shown = env.cli("deployment", "status", v1["ID"])
    assert shown.returncode == 0 and re.search(r"^g\s+3\s+3\s+3\s+0\s+\S+$", shown.stdout, re.M), shown.stdout
    status = env.cli("job", "status", "grow")
    assert "Latest Deployment" in status.stdout and v1["ID"][:8] in status.stdout, status.stdout
    env.call("job.stop", {"job_id": "grow"})


def test_a_killed_client_loses_its_allocs_and_they_are_replaced(lifecycle_env: Env) -> None:
    env = lifecycle_env
    victim = env.start_sim(2, "victim")
    env.call("job.register", {"job": spec("spread", count=5, cpu=100)})
    wait_until(lambda: len([a for a in allocs(env, "spread") if a["ClientStatus"] == "running"]) == 5, 60, "5 running")
    on_victim = [a["ID"] for a in allocs(env, "spread") if a["NodeID"] in victim.nodes]
    assert on_victim, "anti-affinity spreads the job over every node, the victim's too"
    victim.kill()
    wait_until(lambda: all(n["Status"] == "down" for n in env.read("node.list") if n["ID"] in victim.nodes),
               30, "victim nodes marked down after their heartbeat TTL")

    def replaced() -> bool:
        rows = allocs(env, "spread")
        by_id = {a["ID"]: a for a in rows}
        lost = all(by_id[i]["ClientStatus"] == "lost" and by_id[i]["NextAllocation"] for i in on_victim)
        running = [a for a in rows if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"]
        return lost and len(running) == 5 and not any(a["NodeID"] in victim.nodes for a in running)

    try:
        wait_until(replaced, 60, "lost allocs replaced on live nodes")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_state(env, 'spread')}") from None
    env.call("job.stop", {"job_id": "spread"})


def test_a_node_running_more_jobs_than_one_entry_holds_evals_for_is_marked_down(tmp_path: Path) -> None:
    """Marking a node down carries one eval per job on it; with more jobs than one raft entry
    can hold evals for, the node was never marked down (the entry was refused, retried forever)."""
    config = 'max_entry_size = "4KiB"\n' + LIFECYCLE_CONFIG  # ~15 evals: 40 jobs overflow it
    cluster = cl.up(str(tmp_path / "cluster"), 3, extra_config=config, timeout=60)
    env = Env(cluster, tmp_path)
    try:
        victim = env.start_sim(1, "crowded")
        jobs = [f"crowd-{i}" for i in range(40)]
        for job_id in jobs:
            env.call("job.register", {"job": spec(job_id, count=1, cpu=10, mem=10)})
        wait_until(lambda: sum(a["ClientStatus"] == "running" for j in jobs for a in allocs(env, j)) == 40, 90, "40 running")
        victim.kill()
        wait_until(lambda: all(n["Status"] == "down" for n in env.read("node.list")), 30, "the node marked down")
        # Every job got its eval (in the entry or from the leader's tail): all 40 allocs are lost.
        wait_until(lambda: all(a["ClientStatus"] == "lost" for j in jobs for a in allocs(env, j)), 60, "every alloc lost")
    finally:
        env.stop_sims()
        cl.down(cl.Cluster.load(cluster.dir))


def _state(env: Env, job_id: str) -> str:
    """What a timed-out wait saw: the job's allocs and evals and the nodes, one line each."""
    lines = [f"alloc {a['ID'][:8]} node {a['NodeID'][:8]} desired {a['DesiredStatus']} client {a['ClientStatus']}"
             f" next {(a.get('NextAllocation') or '')[:8]}" for a in allocs(env, job_id)]
    lines += [f"eval {e['ID'][:8]} {e['TriggeredBy']} {e['Status']} {e.get('StatusDescription', '')}"
              for e in env.read("eval.list", {"job_id": job_id})]
    lines += [f"node {n['ID'][:8]} {n['Name']} {n['Status']}" for n in env.read("node.list")]
    return "\n".join(lines)


# -- bad input ----------------------------------------------------------------------------
def test_bad_jobspecs_are_rejected_before_the_log(lifecycle_env: Env) -> None:
    env = lifecycle_env
    for job_id, body, want in [
        ("neg", spec("neg", count=-1), "count -1 must be >= 0"),
        ("weird", spec("weird", type="frobnicate"), "type 'frobnicate'"),
    ]:
        with pytest.raises(RPCError) as err:
            env.call("job.register", {"job": body})
        assert err.value.code == BAD_REQUEST and want in err.value.message
        with pytest.raises(RPCError) as err:
            env.read("job.get", {"job_id": job_id})
        assert err.value.code == NOT_FOUND
        out = env.cli("job", "run", write_spec(env, job_id, body))
        assert out.returncode == 1 and out.stderr.startswith("Error: ") and len(out.stderr.strip().splitlines()) == 1
        assert "Traceback" not in out.stderr


def test_a_job_larger_than_any_node_leaves_a_blocked_eval_with_the_reason(lifecycle_env: Env) -> None:
    env = lifecycle_env
    out = env.cli("job", "run", write_spec(env, "huge", spec("huge", count=2, mem=10_000_000)))
    assert out.returncode == 2, out.stdout + out.stderr  # nomad job run: 2 on placement failures
    assert "failed to place 2 allocations" in out.stdout and "than any node has" in out.stdout
    blocked = wait_until(lambda: [e for e in env.read("eval.list", {"job_id": "huge"}) if e["Status"] == "blocked"],
                         30, "a blocked eval")
    assert len(blocked) == 1
    shown = env.cli("eval", "status", blocked[0]["ID"])
    assert shown.returncode == 0, shown.stderr
    assert "blocked" in shown.stdout and "asks more memory (10000000 MB) than any node has" in shown.stdout
    assert job_status(env, "huge") == "pending"
    env.call("job.stop", {"job_id": "huge"})
    wait_until(lambda: not [e for e in env.read("eval.list", {"job_id": "huge"}) if e["Status"] in ("blocked", "pending")],
               30, "the blocked eval to go once the job is stopped")


# -- failover -------------------------------------------------------------------------------
def _history(env: Env, until: int) -> list[tuple[int, list[Any]]]:
    """Every journal batch up to ``until`` (the whole history: retention is far larger)."""
    out: list[tuple[int, list[Any]]] = []
    with RPCClient(env.addresses, timeout=30) as c:
        for item in c.stream("event.stream", {"index": 0, "topics": ["Allocation", "Evaluation"], "heartbeat": 1}):
            if "index" in item:
                out.append((item["index"], item["events"]))
            if item.get("index", item.get("progress", 0)) >= until:
                break
    return out


def test_leader_killed_while_evals_are_processed(fresh_env: Env) -> None:
    env = fresh_env
    env.start_sim(4, "fo", "--cpu", "8000", "--memory", "16384")
    counts = {f"fo{i}": 2 + i % 3 for i in range(24)}
    leader = cl.wait_for_leader(env.addresses)["NodeID"]

    def register(job_id: str) -> None:
        with env.client() as c:
            c.call("job.register", {"job": spec(job_id, count=counts[job_id], update={"MinHealthyTime": 200_000_000})})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(register, counts))
    pending = [e["ID"] for e in env.read("eval.list") if e["Status"] == "pending"]
    cl.kill(env.cluster, leader)  # kill -9 while those evals are being processed
    assert pending, "the burst should leave evals queued on the leader we kill"
    cl.wait_for_leader([n.rpc_addr for n in env.cluster.nodes if n.id != leader])

    def settled() -> bool:
        evals = [e for job_id in counts for e in env.read("eval.list", {"job_id": job_id})]
        if any(e["Status"] in ("pending", "blocked") for e in evals):
            return False
        return all(len([a for a in allocs(env, j) if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"]) == n
                   for j, n in counts.items())

    wait_until(settled, 120, "every eval processed and every job at its count")
    evals = [e for job_id in counts for e in env.read("eval.list", {"job_id": job_id})]
    assert not [e for e in evals if e["Status"] == "failed"]
    by_id = {e["ID"]: e for e in evals}
    assert all(by_id[i]["Status"] in ("complete", "canceled") for i in pending), "an eval queued at the kill was lost"
    # No eval lost: every job's registration eval was processed by one leader or the other.
    assert all(any(e["TriggeredBy"] == "job-register" and e["Status"] == "complete" for e in evals if e["JobID"] == j)
               for j in counts)
    # Replay the journal: at no index did a group have more live allocs than its count.
    status = cl.wait_for_leader([n.rpc_addr for n in env.cluster.nodes if n.id != leader])
    state: dict[str, dict[str, Any]] = {}
    worst: dict[str, int] = defaultdict(int)
    for _index, records in _history(env, status["AppliedIndex"]):
        for topic, _type, key, obj in records:
            if topic != "Allocation" or obj is None or obj["job_id"] not in counts:
                continue
            state[key] = obj
        per_job: dict[str, int] = defaultdict(int)
        for a in state.values():
            if a["desired_status"] == "run" and a["client_status"] in ("pending", "running"):
                per_job[a["job_id"]] += 1
        for job_id, n in per_job.items():
            worst[job_id] = max(worst[job_id], n)
    assert all(worst[j] <= counts[j] for j in counts), {j: (worst[j], counts[j]) for j in counts if worst[j] > counts[j]}


def test_heartbeats_through_a_follower_keep_a_node_up_and_silence_takes_it_down(lifecycle_env: Env) -> None:
    env = lifecycle_env
    leader = cl.wait_for_leader(env.addresses)["Leader"]
    follower = next(a for a in env.addresses if a != leader)
    node = {"ID": f"hb-{uuid.uuid4().hex[:8]}", "Name": "hb", "Status": "ready", "Datacenter": "dc-hb"}
    env.call("node.register", {"node": node})
    with RPCClient([follower]) as c:
        until = time.monotonic() + 6.0  # longer than ttl + grace (4 s)
        while time.monotonic() < until:
            c.call("node.status", {"node_id": node["ID"]})
            time.sleep(0.5)
    assert env.read("node.get", {"node_id": node["ID"]})["Status"] == "ready"
    wait_until(lambda: env.read("node.get", {"node_id": node["ID"]})["Status"] == "down", 30, "silent node marked down")


def test_failed_batch_alloc_is_rescheduled_after_its_delay_then_given_up(lifecycle_env: Env) -> None:
    env = lifecycle_env
    policy = {"Attempts": 1, "Interval": 3600_000_000_000, "Delay": 5_000_000_000, "DelayFunction": "constant",
              "Unlimited": False}
    body = spec("flaky", type="batch", count=1, config={"run_for": "200ms", "exit_code": 3})
    body["Job"]["TaskGroups"][0]["ReschedulePolicy"] = policy
    env.call("job.register", {"job": body})

    def follow_up() -> dict[str, Any] | None:
        return next((e for e in env.read("eval.list", {"job_id": "flaky"}) if e["WaitUntil"]), None)

    ev = wait_until(follow_up, 60, "a follow-up eval that waits for the reschedule delay")
    assert ev["TriggeredBy"] == "alloc-failure"
    first = wait_until(lambda: [a for a in allocs(env, "flaky") if a["ClientStatus"] == "failed"], 30, "first failure")[0]
    assert first["FollowupEvalID"] == ev["ID"]
    rows = wait_until(lambda: (r := allocs(env, "flaky")) and len(r) == 2 and all(a["ClientStatus"] == "failed" for a in r) and r,
                      60, "the replacement to run and fail too")
    replacement = next(a for a in rows if a["ID"] != first["ID"])
    assert replacement["PreviousAllocation"] == first["ID"]
    assert replacement["RescheduleTracker"]["Events"][0]["PrevAllocID"] == first["ID"]
    assert replacement["CreateTime"] >= ev["WaitUntil"] - 1_000_000_000  # not before the delay (1 s window)
    wait_until(lambda: job_status(env, "flaky") == "dead", 30, "job dead once attempts are used up")
    assert len(allocs(env, "flaky")) == 2


def test_a_node_closed_by_the_operator_stays_closed_when_its_client_restarts(lifecycle_env: Env) -> None:
    """`nomad node eligibility -disable`: the node takes no new allocs, and its client registering
    again after a crash (it says "eligible") does not reopen it, as Nomad keeps the operator's word."""
    env = lifecycle_env
    state = str(env.tmp / "fence-nodes.json")
    fence = env.start_sim(1, "fence", "--state-file", state)
    (node_id,) = fence.nodes
    out = env.cli("node", "eligibility", "--disable", node_id[:8])
    assert out.returncode == 0 and f'Node "{node_id}" scheduling eligibility set: ineligible' in out.stdout, out.stdout + out.stderr
    fence.kill()
    again = env.start_sim(1, "fence", "--state-file", state)
    assert set(again.nodes) == {node_id}
    shown = env.cli("node", "status", node_id, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["SchedulingEligibility"] == "ineligible", shown.stdout
    env.call("job.register", {"job": spec("fenced", count=4, cpu=10, mem=10)})
    wait_until(lambda: len([a for a in allocs(env, "fenced") if a["ClientStatus"] == "running"]) == 4, 60, "4 running")
    assert not [a for a in allocs(env, "fenced") if a["NodeID"] == node_id]
    usage = env.cli("node", "eligibility", node_id)
    assert usage.returncode != 0 and "--enable or --disable" in usage.stderr, usage.stderr
    assert env.cli("node", "eligibility", "--enable", node_id).returncode == 0
    assert env.read("node.get", {"node_id": node_id})["SchedulingEligibility"] == "eligible"
    env.call("job.stop", {"job_id": "fenced"})  # the client stays up: later tests count ready nodes


def test_system_job_runs_one_alloc_per_node(lifecycle_env: Env) -> None:
    env = lifecycle_env
    ready = {n["ID"] for n in env.read("node.list") if n["Status"] == "ready" and n["Datacenter"] == "dc1"}
    env.call("job.register", {"job": spec("sys", type="system", cpu=50, mem=32)})
    rows = wait_until(lambda: (r := [a for a in allocs(env, "sys") if a["ClientStatus"] == "running"]) and len(r) >= len(ready) and r,
                      60, "one running alloc per ready node")
    assert sorted(a["NodeID"] for a in rows) == sorted(ready)
    env.call("job.stop", {"job_id": "sys"})
    wait_until(lambda: not live(allocs(env, "sys")), 30, "system allocs stopped")


def test_a_node_marked_down_by_an_operator_loses_its_allocs_and_heartbeats_revive_it(lifecycle_env: Env) -> None:
    env = lifecycle_env
    op = env.start_sim(2, "op")
    env.call("job.register", {"job": spec("mark", count=5, cpu=100)})
    rows = wait_until(lambda: (r := [a for a in allocs(env, "mark") if a["ClientStatus"] == "running"]) and len(r) == 5 and r,
                      60, "5 running")
    victim = next(a["NodeID"] for a in rows if a["NodeID"] in op.nodes)
    lost_ids = {a["ID"] for a in rows if a["NodeID"] == victim}
    # Pause the client so its heartbeats cannot mark the node ready before the scheduler acts.
    op.proc.send_signal(signal.SIGSTOP)
    try:
        env.call("node.status", {"node_id": victim, "status": "down"})

        def replaced() -> bool:
            now = allocs(env, "mark")
            by_id = {a["ID"]: a for a in now}
            running = [a for a in now if a["ClientStatus"] in ("pending", "running") and a["DesiredStatus"] == "run"]
            return all(by_id[i]["ClientStatus"] == "lost" for i in lost_ids) and len(running) == 5

        wait_until(replaced, 60, "the down node's allocs lost and replaced")
        evals = env.read("eval.list", {"job_id": "mark"})
        assert any(e["TriggeredBy"] == "node-update" and e["NodeID"] == victim for e in evals)
    finally:
        op.proc.send_signal(signal.SIGCONT)
    # The client is alive again and heartbeats: the leader marks its nodes ready.
    wait_until(lambda: env.read("node.get", {"node_id": victim})["Status"] == "ready", 30, "node revived by heartbeats")
    env.call("job.stop", {"job_id": "mark"})


def _http(env: Env, path: str, body: Any) -> dict[str, Any]:
    req = urllib.request.Request(f"http://{env.cluster.http_addresses[0]}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_a_node_drain_moves_service_allocs_one_healthy_step_at_a_time_and_system_allocs_last(lifecycle_env: Env) -> None:
    """`nomad node drain -enable`: the CLI monitors the drain to its end. With migrate.max_parallel 1,
    each alloc moves only once the previous replacement was reported healthy (after the migrate block's
    min_healthy_time); the system alloc stops after every service alloc; the node stays closed."""
    env = lifecycle_env
    sim = env.start_sim(2, "drn", "--datacenter", "dcd")
    a, b = sorted(sim.nodes)
    assert env.cli("node", "eligibility", "--disable", b).returncode == 0
    body = spec("moving", count=3, cpu=10, mem=10, Datacenters=["dcd"])
    body["Job"]["TaskGroups"][0]["Migrate"] = {"MaxParallel": 1, "MinHealthyTime": 1_000_000_000, "HealthyDeadline": 20_000_000_000}
    env.call("job.register", {"job": body["Job"]})

    def healthy_on(node_id: str) -> list[dict[str, Any]]:
        return [x for x in live(allocs(env, "moving")) if x["NodeID"] == node_id and x["ClientStatus"] == "running"
                and (x.get("DeploymentStatus") or {}).get("Healthy")]

    wait_until(lambda: len(healthy_on(a)) == 3, 60, "3 healthy allocs on the first node")
    assert env.cli("node", "eligibility", "--enable", b).returncode == 0
    env.call("job.register", {"job": spec("daemon", type="system", cpu=10, mem=10, Datacenters=["dcd"])["Job"]})
    wait_until(lambda: sorted(x["NodeID"] for x in live(allocs(env, "daemon")) if x["ClientStatus"] == "running") == [a, b],
               60, "the system job on both nodes")

    out = env.cli("node", "drain", "--enable", "--deadline", "2m", a[:8], timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for line in (f'Node "{a}" drain strategy set', "marked for migration",
                 f"Drain complete for node {a}", f'All allocations on node "{a}" have stopped'):
        assert line in out.stdout, out.stdout
    rows = allocs(env, "moving")
    assert sorted(x["NodeID"] for x in live(rows)) == [b, b, b]
    replacements = sorted((x for x in rows if x["NodeID"] == b), key=lambda x: x["CreateIndex"])
    assert len(replacements) == 3 and all(x["PreviousAllocation"] for x in replacements)
    for earlier, later in zip(replacements, replacements[1:], strict=False):
        healthy_at = earlier["DeploymentStatus"]["Timestamp"]
        assert later["CreateTime"] >= healthy_at, "the next alloc moved only after the replacement was healthy"
    node = env.read("node.get", {"node_id": a})
    assert node["Drain"] is False and node["SchedulingEligibility"] == "ineligible" and node["DrainStrategy"] is None
    daemons = allocs(env, "daemon")
    (stopped,) = [x for x in daemons if x["NodeID"] == a]
    assert stopped["DesiredStatus"] == "stop" and stopped["DesiredDescription"] == "alloc not needed as node is tainted"
    moved_last = max(x["AllocModifyIndex"] for x in rows if x["NodeID"] == a)
    assert stopped["AllocModifyIndex"] > moved_last, "system allocs go after every service alloc"
    assert [x["NodeID"] for x in live(daemons)] == [b]
    # Nomad's HTTP API opens the node again; a drain of an unknown node is a one-line error.
    assert _http(env, f"/v1/node/{a}/eligibility", {"Eligibility": "eligible"})["Index"] > 0
    assert env.read("node.get", {"node_id": a})["SchedulingEligibility"] == "eligible"
    missing = env.cli("node", "drain", "--enable", "ffffffff-0000")
    assert missing.returncode != 0 and "not found" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    both = env.cli("node", "drain", "--enable", "--disable", a)
    assert both.returncode != 0 and "exactly one of" in both.stderr
    idle = env.cli("node", "drain", "--monitor", a)
    assert idle.returncode == 0 and f"No drain strategy set for node {a}" in idle.stdout, idle.stdout + idle.stderr
    env.call("job.stop", {"job_id": "moving"})
    env.call("job.stop", {"job_id": "daemon"})


def test_a_drain_deadline_moves_a_batch_alloc_that_would_run_forever_and_http_ends_a_drain(lifecycle_env: Env) -> None:
    """Batch allocs are left to finish until the deadline; at it the drainer moves them (Nomad's
    drain deadline). Over Nomad's HTTP API a drain starts with a DrainSpec and ends with null."""
    env = lifecycle_env
    sim = env.start_sim(2, "dl", "--datacenter", "dcl")
    a, b = sorted(sim.nodes)
    assert env.cli("node", "eligibility", "--disable", b).returncode == 0
    env.call("job.register", {"job": spec("forever", type="batch", cpu=10, mem=10, Datacenters=["dcl"])["Job"]})
    (first,) = wait_until(lambda: [x for x in live(allocs(env, "forever")) if x["ClientStatus"] == "running"], 60, "batch alloc running")
    assert first["NodeID"] == a
    assert env.cli("node", "eligibility", "--enable", b).returncode == 0
    started = time.monotonic()
    out = _http(env, f"/v1/node/{a}/drain", {"DrainSpec": {"Deadline": 3_000_000_000, "IgnoreSystemJobs": False}})
    assert out["NodeID"] == a and out["Index"] > 0
    shown = env.cli("node", "status", a)
    assert re.search(r"Drain\s+true; \S+ deadline", shown.stdout), shown.stdout
    moved = wait_until(lambda: [x for x in live(allocs(env, "forever")) if x["NodeID"] == b], 60, "the batch alloc moved at the deadline")
    assert time.monotonic() - started >= 3.0, "moved before the deadline"
    assert moved[0]["PreviousAllocation"] == first["ID"]
    wait_until(lambda: not env.read("node.get", {"node_id": a})["Drain"], 30, "drain complete")
    # A drain ended over HTTP before it is done: nothing more moves, and MarkEligible opens the node.
    env.call("job.register", {"job": spec("stays", type="batch", cpu=10, mem=10, Datacenters=["dcl"])["Job"]})
    wait_until(lambda: [x for x in live(allocs(env, "stays")) if x["ClientStatus"] == "running"], 60, "second batch running")
    on_b = [x["ID"] for x in live(allocs(env, "stays")) if x["NodeID"] == b]
    _http(env, f"/v1/node/{b}/drain", {"DrainSpec": {"Deadline": 0}})
    assert env.read("node.get", {"node_id": b})["Drain"] is True
    _http(env, f"/v1/node/{b}/drain", {"DrainSpec": None, "MarkEligible": True})
    node = env.read("node.get", {"node_id": b})
    assert node["Drain"] is False and node["SchedulingEligibility"] == "eligible"
    assert [x["ID"] for x in live(allocs(env, "stays")) if x["NodeID"] == b] == on_b
    env.call("job.stop", {"job_id": "forever"})
    env.call("job.stop", {"job_id": "stays"})
