"""The one-pass jobspec reader against the general path it stands in for.

``parse_job`` reads a spec in one pass and falls back to the general path
(snake-case, prune, strict decode) for anything it cannot vouch for. These
tests mutate real specs at random and require the same job, the same
warnings, or the same error text from both, so the fast path can never
change what a spec means.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.spec import defaults, jobspec, onepass, reader
from node.spec.hcl import parse_hcl
from node.spec.jobspec import JobSpecError, parse_job

ROOT = Path(__file__).resolve().parents[2]


def _corpus() -> list[dict[str, Any]]:
    specs = [json.loads(p.read_text())["Job"] for p in sorted((ROOT / "examples").glob("*.json"))]
    for name in ("web.nomad.hcl", "batch.nomad.hcl", "docs.nomad.hcl"):
        specs.append(parse_hcl((ROOT / "tests/http/fixtures" / name).read_text()).job)
    return specs


CORPUS = _corpus()


def _general(spec: Any) -> Any:
    """What the general path alone makes of ``spec``: (job, warnings) or the error it raises."""
    try:
        job, warnings = reader.read_general(defaults.spread_job_blocks(spec) if isinstance(spec, dict) else spec)
        return jobspec.finish(job), warnings
    except Exception as exc:  # the general path's error, whatever its type, is the reference
        return type(exc), str(exc)


def _fast(spec: Any) -> Any:
    try:
        return parse_job(spec)
    except Exception as exc:
        return type(exc), str(exc)


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    """Every container (dict or list) in the spec, by path."""
    out = [path]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, (dict, list)):
            out.extend(_paths(value, (*path, key)))
    return out


def _at(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["Name", "Count", "x", "CPU"]), inner, max_size=3),
    max_leaves=6,
)
_keys = st.sampled_from(
    ["Name", "name", "Count", "count", "Tasks", "Meta", "meta", "Config", "Resources", "CPU", "cpu", "MemoryMB",
     "Update", "ReschedulePolicy", "Periodic", "ParameterizedJob", "Frobnicate", "Datacenters", "ID", "id",
     "Constraints", "LTarget", "Attempts", "Unlimited", "Delay", "Type", "Priority", 7]
)


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    spec = copy.deepcopy(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 4))):
        target = _at(spec, draw(st.sampled_from(_paths(spec))))
        if isinstance(target, dict):
            op = draw(st.sampled_from(["set", "delete", "add"]))
            if op == "delete" and target:
                del target[draw(st.sampled_from(sorted(target, key=str)))]
            elif op == "set" and target:
                target[draw(st.sampled_from(sorted(target, key=str)))] = draw(_values)
            else:
                target[draw(_keys)] = draw(_values)
        elif target:
            target[draw(st.integers(0, len(target) - 1))] = draw(_values)
    return spec


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_fast_path_matches_the_general_path(spec: dict[str, Any]) -> None:
    expected = _general(copy.deepcopy(spec))
    assert _fast(spec) == expected


def test_the_corpus_takes_the_fast_path() -> None:
    """Ordinary specs must not fall back (else the one-pass reader buys nothing)."""
    for spec in CORPUS:
        job, warnings = onepass.read_fast(copy.deepcopy(spec))  # raises Fallback if it fell back
        try:
            got: Any = jobspec.finish(job), warnings
        except JobSpecError as exc:  # docs.nomad.hcl is invalid on purpose
            got = JobSpecError, str(exc)
        assert got == _general(copy.deepcopy(spec))


def test_two_spellings_of_one_field_keep_the_last() -> None:
    spec = copy.deepcopy(CORPUS[0])
    spec["Priority"], spec["priority"] = 10, 90
    job, _ = parse_job(spec)
    assert job.priority == 90


def test_a_wrong_type_names_the_field_in_nomad_spelling() -> None:
    spec = copy.deepcopy(CORPUS[0])
    spec["TaskGroups"][0]["Count"] = "two"
    try:
        parse_job(spec)
    except JobSpecError as exc:
        assert str(exc).startswith("Job.TaskGroups[0].Count:")
    else:
        raise AssertionError("a string Count was accepted")


def test_a_job_level_update_is_every_groups_default() -> None:
    """Nomad's Job.Update: each group's own Update keys win, the rest come from the job's."""
    spec = {"ID": "u", "Update": {"MaxParallel": 2, "Canary": 1, "AutoRevert": True}, "TaskGroups": [
        {"Name": "a", "Update": {"MaxParallel": 3}, "Tasks": [{"Name": "t"}]},
        {"Name": "b", "Tasks": [{"Name": "t"}]},
    ]}
    job, warnings = parse_job(spec)
    assert warnings == []
    a, b = (g.update for g in job.task_groups)
    assert (a.max_parallel, a.canary, a.auto_revert) == (3, 1, True)
    assert (b.max_parallel, b.canary, b.auto_revert) == (2, 1, True)
    assert spec["TaskGroups"][1].get("Update") is None  # the caller's spec is left as it was
    bad = {"ID": "u", "Update": {"MaxParallel": 2}, "TaskGroups": [{"Name": "a", "Update": [1], "Tasks": [{"Name": "t"}]}]}
    with pytest.raises(JobSpecError, match=r"TaskGroups\[0\]\.Update: expected map"):
        parse_job(bad)


def test_migrate_blocks_nomads_defaults_job_level_keys_and_validation() -> None:
    """Nomad's Migrate: service groups get the defaults, a job's block is each group's default,
    other job types have none, and a bad block is a one-line error naming the field."""
    spec = {"ID": "m", "Migrate": {"MaxParallel": 2}, "TaskGroups": [
        {"Name": "a", "Migrate": {"MinHealthyTime": 1_000_000_000}, "Tasks": [{"Name": "t"}]},
        {"Name": "b", "Tasks": [{"Name": "t"}]},
    ]}
    job, warnings = parse_job(spec)
    assert warnings == []
    a, b = (g.migrate for g in job.task_groups)
    assert (a.max_parallel, a.min_healthy_time, a.healthy_deadline, a.health_check) == (2, 10**9, 300 * 10**9, "checks")
    assert (b.max_parallel, b.min_healthy_time) == (2, 10 * 10**9)
    plain, _ = parse_job({"ID": "p", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]})
    assert plain.task_groups[0].migrate is not None and plain.task_groups[0].migrate.max_parallel == 1
    batch, _ = parse_job({"ID": "b", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]})
    assert batch.task_groups[0].migrate is None
    with pytest.raises(JobSpecError, match=r"Migrate: job type 'batch' does not allow a migrate block"):
        parse_job({"ID": "b", "Type": "batch", "Migrate": {"MaxParallel": 2}, "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]})
    for block, message in [
        ({"MaxParallel": -1}, r"TaskGroups\[g\]\.Migrate\.MaxParallel: must not be negative"),
        ({"HealthCheck": "vibes"}, r"Migrate\.HealthCheck: must be checks or task_states"),
        ({"MinHealthyTime": 10**12, "HealthyDeadline": 10**9}, r"Migrate\.MinHealthyTime: must be less than HealthyDeadline"),
    ]:
        with pytest.raises(JobSpecError, match=message):
            parse_job({"ID": "x", "TaskGroups": [{"Name": "g", "Migrate": block, "Tasks": [{"Name": "t"}]}]})
