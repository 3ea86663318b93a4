"""Records in Nomad's JSON shape: field names renamed, user data maps kept as they are."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from fsm import codec
from fsm.structs import Deployment, DeploymentState, Evaluation, Job
from node.spec.jobspec import parse_job
from node.spec.nomadjson import DATA_MAPS, pascal, to_nomad
from tests.fsm.test_fsm_properties import eval_specs, job_specs


def reference(obj: Any, data_map: bool = False) -> Any:
    """The definition, written plainly: convert to wire maps, then rename every field key below."""
    obj = codec.to_wire(obj)
    if isinstance(obj, list):
        return [reference(v) for v in obj]
    if isinstance(obj, dict):
        if data_map:
            return {k: reference(v) for k, v in obj.items()}
        return {pascal(k): reference(v, k in DATA_MAPS or k == "task_groups" and isinstance(v, dict)) for k, v in obj.items()}
    return obj


def outcome(fn: Any, obj: Any) -> Any:
    try:
        return fn(obj)
    except Exception as exc:  # noqa: BLE001 - the same failure counts as agreement
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(job=job_specs(), ev=eval_specs())
def test_to_nomad_is_the_plain_recursive_renaming(job: Job, ev: Evaluation) -> None:
    for obj in (job, ev, [job, ev], {"Job": job}, codec.to_wire(job)):
        assert outcome(to_nomad, obj) == outcome(reference, obj)


def test_field_names_take_nomads_spelling_and_user_keys_stay() -> None:
    job, _ = parse_job(
        {
            "ID": "web",
            "Meta": {"owner_team": "a"},
            "TaskGroups": [
                {
                    "Name": "g",
                    "Count": 2,
                    "Tasks": [{"Name": "t", "Driver": "sim", "Config": {"run_for": "1s", "args": [{"a_b": 1}]}}],
                }
            ],
        }
    )
    out = to_nomad(job)
    assert out["ID"] == "web" and out["Meta"] == {"owner_team": "a"}
    task = out["TaskGroups"][0]["Tasks"][0]
    assert task["Resources"]["MemoryMB"] == job.task_groups[0].tasks[0].resources.memory_mb
    # A task config's own keys are the driver's; maps inside it are renamed, as from_nomad snake-cased them.
    assert task["Config"] == {"run_for": "1s", "args": [{"AB": 1}]}
    assert "task_groups" not in out and "JobModifyIndex" in out


def test_a_deployments_group_names_stay_and_their_states_are_renamed() -> None:
    dep = Deployment(id="d1", job_id="web", task_groups={"web_tier": DeploymentState(desired_total=3, placed_canaries=["a1"])})
    out = to_nomad(dep)
    assert list(out["TaskGroups"]) == ["web_tier"]
    assert out["TaskGroups"]["web_tier"]["DesiredTotal"] == 3
    assert out["TaskGroups"]["web_tier"]["PlacedCanaries"] == ["a1"]
    assert out == reference(dep)
