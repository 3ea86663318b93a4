"""The sim task driver: its config checks and the outcome it plans for an alloc."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.driver import DriverError, TaskSpec, parse_duration, plan_run, task_spec


def test_durations_are_read_as_go_writes_them() -> None:
    assert parse_duration("1m30s", "f") == 90.0
    assert parse_duration("250ms", "f") == 0.25
    assert parse_duration(2_000_000_000, "f") == 2.0
    for bad in ("", "5", "1d", True, -1):
        with pytest.raises(DriverError, match="^f: "):
            parse_duration(bad, "f")


@pytest.mark.parametrize(("config", "message"), [
    ({"exit_code": "1"}, "exit_code must be an integer"),
    ({"fail_rate": 2}, "fail_rate must be a number between 0 and 1"),
    ({"healthy": "no"}, "healthy must be true or false"),
    ({"unhealthy_rate": -0.1}, "unhealthy_rate must be a number between 0 and 1"),
    ({"run_for": "soon"}, "run_for: invalid duration"),
])
def test_a_bad_task_config_is_one_error_naming_the_task_and_field(config: dict, message: str) -> None:
    with pytest.raises(DriverError, match=f"^task web: {message}"):
        task_spec({"Name": "web", "Driver": "sim", "Config": config})


def test_a_task_whose_checks_never_pass_makes_its_alloc_unhealthy_but_keeps_it_running() -> None:
    tasks = [task_spec({"Name": "a", "Config": {}}), task_spec({"Name": "b", "Config": {"healthy": False}})]
    outcome = plan_run(tasks, random.Random(1))
    assert (outcome.after, outcome.failed, outcome.healthy) == (None, False, False)
    assert plan_run(tasks[:1], random.Random(1)).healthy


@given(st.floats(0, 1), st.integers(0, 2**32))
def test_unhealthy_rate_draws_unhealthy_allocs_and_its_ends_are_certain(rate: float, seed: int) -> None:
    spec = TaskSpec("t", None, unhealthy_rate=rate)
    outcome = plan_run([spec], random.Random(seed))
    assert outcome.after is None and not outcome.failed
    if rate == 0:
        assert outcome.healthy
    if rate == 1:
        assert not outcome.healthy


def test_unhealthy_rate_is_roughly_the_share_of_unhealthy_allocs() -> None:
    rng = random.Random(7)
    spec = TaskSpec("t", None, unhealthy_rate=0.3)
    share = sum(not plan_run([spec], rng).healthy for _ in range(2000)) / 2000
    assert 0.25 < share < 0.35
