"""Reschedule policies validated with Nomad's rules and words (``structs.ReschedulePolicy.Validate``).

The table is Nomad's ``TestReschedulePolicy_Validate`` (nomad/structs/
structs_test.go), each expected error verbatim, plus one accepted and one
refused case per rule. ``viable_attempts`` is checked against Nomad's
attempt-by-attempt walk, transcribed literally below as the reference model.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.structs import HOUR, MINUTE, SECOND, ReschedulePolicy
from node.spec.jobspec import JobSpecError, parse_job
from node.spec.reschedule import problems, viable_attempts
from node.spec.units import go_duration


def policy(attempts: int = 0, interval: int = 0, delay: int = 0, fn: str = "", max_delay: int = 0,
           unlimited: bool = False) -> ReschedulePolicy:
    """A policy with Go's zero values where Nomad's test leaves a field out."""
    return ReschedulePolicy(attempts=attempts, interval=interval, delay=delay, delay_function=fn, max_delay=max_delay,
                            unlimited=unlimited)


# (case, policy, errors Nomad's test expects; [] = valid)
NOMAD_TABLE: list[tuple[str, ReschedulePolicy, list[str]]] = [
    ("Disabled", policy(attempts=0, interval=0), []),
    ("Disabled, negative attempts", policy(attempts=-1, interval=5 * MINUTE), []),
    ("Valid Linear Delay", policy(1, 5 * MINUTE, 10 * SECOND, "constant"), []),
    ("Valid Exponential Delay", policy(5, HOUR, 30 * SECOND, "exponential", 5 * MINUTE), []),
    ("Valid Fibonacci Delay", policy(5, 15 * MINUTE, 10 * SECOND, "fibonacci", 5 * MINUTE), []),
    ("Invalid delay function", policy(1, SECOND, fn="blah"), [
        "Interval cannot be less than 15s (got 1s)",
        "Delay cannot be less than 5s (got 0s)",
        'Invalid delay function "blah", must be one of ["constant" "exponential" "fibonacci"]',
    ]),
    ("Invalid delay ceiling", policy(1, 8 * SECOND, 15 * SECOND, "exponential", 5 * SECOND), [
        "Max Delay cannot be less than Delay 15s (got 5s)",
    ]),
    ("Invalid delay and interval", policy(1, SECOND, fn="constant"), [
        "Interval cannot be less than 15s (got 1s)",
        "Delay cannot be less than 5s (got 0s)",
    ]),
    ("Invalid Attempts - linear delay", policy(10, HOUR, 20 * MINUTE, "constant"), [
        'Nomad can only make 3 attempts in 1h0m0s with initial delay 20m0s and delay function "constant"',
        "Set the interval to at least 3h20m0s to accommodate 10 attempts",
    ]),
    ("Invalid Attempts - exponential delay", policy(10, 30 * MINUTE, 5 * MINUTE, "exponential", 40 * MINUTE), [
        'Nomad can only make 3 attempts in 30m0s with initial delay 5m0s, delay function "exponential", '
        "and delay ceiling 40m0s",
        "Set the interval to at least 4h40m0s to accommodate 10 attempts",
    ]),
    ("Invalid Attempts - fibonacci delay", policy(10, HOUR, 20 * MINUTE, "fibonacci", 80 * MINUTE), [
        'Nomad can only make 4 attempts in 1h0m0s with initial delay 20m0s, delay function "fibonacci", '
        "and delay ceiling 1h20m0s",
        "Set the interval to at least 8h0m0s to accommodate 10 attempts",
    ]),
    ("Ambiguous Unlimited config", policy(1, 0, 5 * MINUTE, "exponential", HOUR, unlimited=True), [
        "Interval must be a non zero value if Attempts > 0",
        "Reschedule Policy with Attempts = 1, Interval = 0s, and Unlimited = true is ambiguous",
    ]),
    ("Invalid Unlimited config", policy(1, SECOND, fn="exponential", unlimited=True), [
        "Delay cannot be less than 5s (got 0s)",
        "Max Delay cannot be less than 5s (got 0s)",
    ]),
    ("Valid Unlimited config", policy(0, 0, 5 * SECOND, "exponential", HOUR, unlimited=True), []),
]  # fmt: skip


@pytest.mark.parametrize(("case", "rp", "errors"), NOMAD_TABLE, ids=[c[0] for c in NOMAD_TABLE])
def test_nomads_validate_table(case: str, rp: ReschedulePolicy, errors: list[str]) -> None:
    found = problems(rp)
    if not errors:
        assert found == []
    for message in errors:  # Nomad's test: each expected error is among those reported
        assert message in found


# One accepted and one refused case per rule, through the whole spec path (one line naming the field).
BASE = {"Attempts": 3, "Interval": HOUR, "Delay": 30 * SECOND, "DelayFunction": "constant", "MaxDelay": HOUR,
        "Unlimited": False}
RULES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("max delay >= delay", {"DelayFunction": "exponential", "MaxDelay": 30 * SECOND},
     {"DelayFunction": "exponential", "MaxDelay": 29 * SECOND}, "Max Delay cannot be less than Delay 30s (got 29s)"),
    ("a constant delay has no ceiling", {"MaxDelay": 0}, {"DelayFunction": "exponential", "MaxDelay": 0},
     "Max Delay cannot be less than 5s (got 0s); Max Delay cannot be less than Delay 30s (got 0s)"),
    ("minimum delay", {"Delay": 5 * SECOND}, {"Delay": 4 * SECOND}, "Delay cannot be less than 5s (got 4s)"),
    ("minimum interval", {"Attempts": 1, "Interval": 15 * SECOND, "Delay": 5 * SECOND},
     {"Attempts": 1, "Interval": 14 * SECOND, "Delay": 5 * SECOND}, "Interval cannot be less than 15s (got 14s)"),
    ("delay function", {"DelayFunction": "fibonacci"}, {"DelayFunction": "linear"},
     'Invalid delay function "linear", must be one of ["constant" "exponential" "fibonacci"]'),
    ("attempts or unlimited", {"Attempts": 0, "Unlimited": True}, {"Unlimited": True},
     "Reschedule Policy with Attempts = 3, Interval = 1h0m0s, and Unlimited = true is ambiguous; "
     "If Attempts >0, Unlimited cannot also be set to true"),
    ("a non zero interval", {"Attempts": 0, "Interval": 0, "Unlimited": True},
     {"Interval": 0, "Unlimited": True}, "Interval must be a non zero value if Attempts > 0; "
     "Reschedule Policy with Attempts = 3, Interval = 0s, and Unlimited = true is ambiguous; "
     "If Attempts >0, Unlimited cannot also be set to true"),
    ("constant attempts fit", {"Attempts": 120, "Delay": 30 * SECOND},
     {"Attempts": 121, "Delay": 30 * SECOND},
     'Nomad can only make 120 attempts in 1h0m0s with initial delay 30s and delay function "constant"; '
     "Set the interval to at least 1h0m30s to accommodate 121 attempts"),
    # 30s, 1m, 2m, 4m, 8m, then 10m each: the 11th attempt ends at 1h8m.
    ("exponential attempts fit", {"Attempts": 10, "DelayFunction": "exponential", "MaxDelay": 10 * MINUTE},
     {"Attempts": 11, "DelayFunction": "exponential", "MaxDelay": 10 * MINUTE},
     'Nomad can only make 10 attempts in 1h0m0s with initial delay 30s, delay function "exponential", '
     "and delay ceiling 10m0s; Set the interval to at least 1h8m0s to accommodate 11 attempts"),
    ("fibonacci attempts fit", {"Attempts": 6, "DelayFunction": "fibonacci", "MaxDelay": 10 * MINUTE},
     {"Attempts": 15, "DelayFunction": "fibonacci", "MaxDelay": 10 * MINUTE},
     'Nomad can only make 13 attempts in 1h0m0s with initial delay 30s, delay function "fibonacci", '
     "and delay ceiling 10m0s; Set the interval to at least 1h20m0s to accommodate 15 attempts"),
]  # fmt: skip


def register(group_policy: dict[str, Any], job_type: str = "service") -> Any:
    return parse_job({"ID": "j", "Type": job_type, "TaskGroups": [
        {"Name": "web", "ReschedulePolicy": group_policy, "Tasks": [{"Name": "t", "Driver": "sim"}]}]})


@pytest.mark.parametrize(("rule", "accepted", "refused", "message"), RULES, ids=[r[0] for r in RULES])
def test_each_rule_accepts_and_refuses(rule: str, accepted: dict[str, Any], refused: dict[str, Any], message: str) -> None:
    register({**BASE, **accepted})
    with pytest.raises(JobSpecError) as info:
        register({**BASE, **refused})
    assert str(info.value) == f"Job.TaskGroups[web].ReschedulePolicy: {message}"


def test_the_issues_examples() -> None:
    """A partial batch policy is accepted; MaxDelay below Delay and attempts that cannot fit are refused."""
    job, _ = register({"Attempts": 3}, "batch")
    assert job.task_groups[0].reschedule_policy.attempts == 3
    with pytest.raises(JobSpecError, match="Max Delay cannot be less than Delay 1m0s"):
        register({"Delay": MINUTE, "MaxDelay": 30 * SECOND})
    with pytest.raises(JobSpecError, match="Nomad can only make 2 attempts in 24h0m0s"):
        register({"Attempts": 3, "Delay": 12 * HOUR}, "batch")


# -- viable_attempts against Nomad's walk --------------------------------------------------------
def nomad_walk(p: ReschedulePolicy) -> tuple[bool, int, int]:
    """Nomad's ``viableAttempts``, attempt by attempt, as written in structs.go."""
    possible, recommended, valid = 0, 0, True
    if p.delay_function == "constant":
        recommended = p.attempts * p.delay
        if p.interval < recommended:
            possible, valid = p.interval // p.delay, False
    elif p.delay_function == "exponential":
        for i in range(p.attempts):
            nxt = 2**i * p.delay
            if nxt > p.max_delay:
                recommended += p.max_delay
            else:
                recommended = nxt
            if recommended < p.interval:
                possible += 1
        valid = possible >= p.attempts
    else:
        slots, ceiling = [p.delay, p.delay], False
        for i in range(2, p.attempts):
            if ceiling:
                nxt = slots[i - 1] + p.max_delay
            else:
                nxt = slots[i - 1] + slots[i - 2]
                if nxt > p.max_delay:
                    nxt, ceiling = p.max_delay, True
            slots.append(nxt)
        recommended = slots[-1]
        if p.interval < recommended:
            valid = False
            possible = next(i for i, s in enumerate(slots) if s > p.interval)
    return valid, max(possible, 0), recommended


@settings(max_examples=400, deadline=None)
@given(
    attempts=st.integers(1, 60),
    interval=st.integers(15, 6 * 3600),
    delay=st.integers(5, 3600),
    ceiling=st.integers(0, 7200),
    fn=st.sampled_from(["constant", "exponential", "fibonacci"]),
)
def test_viable_attempts_is_nomads_walk(attempts: int, interval: int, delay: int, ceiling: int, fn: str) -> None:
    p = policy(attempts, interval * SECOND, delay * SECOND, fn, (delay + ceiling) * SECOND)
    assert viable_attempts(p) == nomad_walk(p)


def test_huge_attempts_cost_nothing() -> None:
    p = policy(10**12, HOUR, 30 * SECOND, "exponential", 10 * MINUTE)
    ok, possible, needed = viable_attempts(p)
    # 30s, 1m, 2m, 4m, 8m under the ceiling, then 10m each: ten end within the hour.
    assert not ok and possible == 10 and needed == 8 * MINUTE + (10**12 - 5) * 10 * MINUTE
    assert not viable_attempts(policy(10**12, HOUR, 30 * SECOND, "fibonacci", 10 * MINUTE))[0]


@pytest.mark.parametrize(("ns", "text"), [
    (0, "0s"), (1, "1ns"), (1500, "1.5µs"), (2_500_000, "2.5ms"), (SECOND, "1s"), (1_500_000_000, "1.5s"),
    (90 * SECOND, "1m30s"), (HOUR, "1h0m0s"), (24 * HOUR, "24h0m0s"), (-5 * SECOND, "-5s"),
])  # fmt: skip
def test_durations_print_as_go_prints_them(ns: int, text: str) -> None:
    assert go_duration(ns) == text
