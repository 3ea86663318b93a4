"""Reschedule policies as Nomad merges and validates them: the one place the spec readers ask.

Nomad decides a group's policy in its API canonicalisation (``api/tasks.go``:
``TaskGroup.Canonicalize``, ``ReschedulePolicy.Merge`` and ``Canonicalize``)
and checks it in ``structs.ReschedulePolicy.Validate``. Caravan follows both
to the letter, because operators bring specs and expectations from Nomad:

* **merge**: the group's own fields win over the job-level ``Reschedule``
  block, which wins over the job type's defaults, field by field. A field
  that is absent or ``null`` is unset (Go's nil pointer); ``0`` and ``false``
  are set. System jobs have no defaults: a policy there comes only from the
  spec, and validation refuses it.
* **validate**: the rules and the messages of Nomad's ``Validate``, including
  whether ``Attempts`` fit in ``Interval`` given the delay function
  (``validateDelayParams``); every rule broken is reported, as Nomad's
  multierror does.

JSON (``node.spec.defaults``) and HCL (``node.spec.hcl_blocks``) both merge
through ``merge_policy``, so ``/v1/jobs``, ``job.register`` and an HCL file
mean the same policy; ``node.spec.validate`` reports ``problems``.
"""

from __future__ import annotations

import json
from typing import Any

from fsm.structs import HOUR, SECOND, ReschedulePolicy
from node.spec.units import go_duration

# Nomad's ReschedulePolicyMinInterval and ReschedulePolicyMinDelay.
MIN_INTERVAL = 15 * SECOND
MIN_DELAY = 5 * SECOND
DELAY_FUNCTIONS = ("constant", "exponential", "fibonacci")

# The policy's fields in Nomad's JSON spelling, in Nomad's order.
FIELDS = ("Attempts", "Interval", "Delay", "DelayFunction", "MaxDelay", "Unlimited")

# Nomad's NewDefaultReschedulePolicy (api/tasks.go) per job type; any other type gets zeros.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "service": {"Attempts": 0, "Interval": 0, "Delay": 30 * SECOND, "DelayFunction": "exponential",
                "MaxDelay": HOUR, "Unlimited": True},
    "batch": {"Attempts": 1, "Interval": 24 * HOUR, "Delay": 5 * SECOND, "DelayFunction": "constant",
              "MaxDelay": 0, "Unlimited": False},
}  # fmt: skip
_ZERO: dict[str, Any] = {"Attempts": 0, "Interval": 0, "Delay": 0, "DelayFunction": "", "MaxDelay": 0, "Unlimited": False}


def nomad_default(job_type: str) -> dict[str, Any]:
    """Nomad's default policy for ``job_type`` in its JSON shape (a fresh map the caller may change)."""
    return dict(_DEFAULTS.get(job_type, _ZERO))


def has_default(job_type: str) -> bool:
    """Whether a group of this job type gets a policy when its spec names none (service and batch)."""
    return job_type in _DEFAULTS


def default_policy(job_type: str) -> ReschedulePolicy:
    """Nomad's default policy for ``job_type`` as our record."""
    d = nomad_default(job_type)
    return ReschedulePolicy(attempts=d["Attempts"], interval=d["Interval"], delay=d["Delay"],
                            delay_function=d["DelayFunction"], max_delay=d["MaxDelay"], unlimited=d["Unlimited"])


def merge_policy(job_type: str, job_level: Any, group_level: Any) -> Any:
    """A group's policy in Nomad's JSON shape: its own fields over the job-level block over the type's defaults.

    Nomad's ``TaskGroup.Canonicalize``: with neither block, a service or
    batch group gets the type's defaults and a system group none (``None``).
    A block that is not a map is returned as is, for the reader to name.
    """
    if not isinstance(group_level, dict) and group_level is not None:
        return group_level
    if not isinstance(job_level, dict):
        job_level = None
    if job_level is None and group_level is None:
        return nomad_default(job_type) if has_default(job_type) else None
    merged = nomad_default(job_type)
    for block in (job_level, group_level):
        for key, value in (block or {}).items():
            if value is not None:
                merged[key] = value
    return merged


def problems(policy: ReschedulePolicy) -> list[str]:
    """Every rule of Nomad's ``ReschedulePolicy.Validate`` that ``policy`` breaks, in Nomad's words and order.

    A disabled policy (no attempts, not unlimited) is never wrong: Nomad
    does not reschedule with it, so its other fields do not matter.
    """
    if not (policy.attempts > 0 or policy.unlimited):
        return []
    out: list[str] = []
    if policy.attempts > 0:
        if policy.interval <= 0:
            out.append("Interval must be a non zero value if Attempts > 0")
        if policy.unlimited:
            out.append(f"Reschedule Policy with Attempts = {policy.attempts}, Interval = {go_duration(policy.interval)}, "
                       "and Unlimited = true is ambiguous")
            out.append("If Attempts >0, Unlimited cannot also be set to true")
    delays = _delay_problems(policy)
    out.extend(delays)
    if not policy.unlimited:
        if policy.interval < MIN_INTERVAL:
            out.append(f"Interval cannot be less than {go_duration(MIN_INTERVAL)} (got {go_duration(policy.interval)})")
        if not delays:  # Nomad cross-checks the attempts only when the delays themselves are sound
            out.extend(_attempts_problems(policy))
    return out


def _delay_problems(policy: ReschedulePolicy) -> list[str]:
    """Nomad's checks of Delay, DelayFunction and (for a growing delay) MaxDelay."""
    out = []
    if policy.delay < MIN_DELAY:
        out.append(f"Delay cannot be less than {go_duration(MIN_DELAY)} (got {go_duration(policy.delay)})")
    if policy.delay_function not in DELAY_FUNCTIONS:
        choices = "[" + " ".join(json.dumps(f) for f in DELAY_FUNCTIONS) + "]"
        out.append(f"Invalid delay function {json.dumps(policy.delay_function)}, must be one of {choices}")
    if policy.delay_function != "constant":
        # Nomad prints Delay after "got" here (a slip in its message); we print the MaxDelay it checked.
        if policy.max_delay < MIN_DELAY:
            out.append(f"Max Delay cannot be less than {go_duration(MIN_DELAY)} (got {go_duration(policy.max_delay)})")
        if policy.max_delay < policy.delay:
            out.append(f"Max Delay cannot be less than Delay {go_duration(policy.delay)} "
                       f"(got {go_duration(policy.max_delay)})")
    return out


def _attempts_problems(policy: ReschedulePolicy) -> list[str]:
    """Nomad's ``validateDelayParams``: the attempts must fit in the interval with the delays they wait."""
    ok, possible, recommended = viable_attempts(policy)
    if ok:
        return []
    interval, delay = go_duration(policy.interval), go_duration(policy.delay)
    if policy.delay_function == "constant":
        first = (f"Nomad can only make {possible} attempts in {interval} with initial delay {delay} and "
                 f'delay function "constant"')
    else:
        first = (f"Nomad can only make {possible} attempts in {interval} with initial delay {delay}, "
                 f"delay function {json.dumps(policy.delay_function)}, and delay ceiling {go_duration(policy.max_delay)}")
    rounded = (recommended + SECOND // 2) // SECOND * SECOND  # Go's Duration.Round(time.Second)
    return [first, f"Set the interval to at least {go_duration(rounded)} to accommodate {policy.attempts} attempts"]


def viable_attempts(policy: ReschedulePolicy) -> tuple[bool, int, int]:
    """(fit?, attempts that fit, the interval all of them need), as Nomad's ``viableAttempts`` works them out.

    Nomad walks every attempt; here the walk stops at the delay ceiling and
    the rest, which grows by ``max_delay`` per attempt, is arithmetic, so a
    huge ``Attempts`` costs nothing (it is checked before the delays are).
    """
    if policy.delay_function == "constant":
        needed = policy.attempts * policy.delay
        if policy.interval < needed:
            return False, policy.interval // policy.delay, needed
        return True, 0, needed
    if policy.delay_function == "exponential":
        possible, needed = _exponential(policy)
        return possible >= policy.attempts, possible, needed
    if policy.delay_function == "fibonacci":
        return _fibonacci(policy)
    return False, 0, 0


def _exponential(policy: ReschedulePolicy) -> tuple[int, int]:
    """Nomad's exponential walk: (attempts whose running total stays under Interval, that total).

    Below the ceiling the total is the attempt's own delay (Nomad's quirk:
    it is set, not added); from the ceiling on, each attempt adds MaxDelay.
    """
    possible, needed, i = 0, 0, 0
    while i < policy.attempts:
        delay = (2**i) * policy.delay
        if delay > policy.max_delay:
            break
        needed = delay
        possible += needed < policy.interval
        i += 1
    rest = policy.attempts - i
    if rest <= 0:
        return possible, needed
    # needed + k * max_delay < interval for k = 1..rest
    fitting = (policy.interval - needed - 1) // policy.max_delay if policy.interval > needed else 0
    return possible + max(0, min(rest, fitting)), needed + rest * policy.max_delay


def _fibonacci(policy: ReschedulePolicy) -> tuple[bool, int, int]:
    """Nomad's fibonacci walk: the delays of the attempts (at least two), growing linearly past the ceiling."""
    slots = [policy.delay, policy.delay]
    while len(slots) < policy.attempts:
        delay = slots[-1] + slots[-2]
        if delay > policy.max_delay:
            slots.append(policy.max_delay)  # the ceiling: from here each slot adds max_delay
            break
        slots.append(delay)
    extra = max(0, policy.attempts - len(slots))

    def slot(i: int) -> int:
        return slots[i] if i < len(slots) else slots[-1] + (i - len(slots) + 1) * policy.max_delay

    needed = slot(len(slots) - 1 + extra)
    if policy.interval >= needed:
        return True, 0, needed
    for i, value in enumerate(slots):
        if value > policy.interval:
            return False, i, needed
    # Past the listed slots: the first linear slot beyond the interval.
    k = (policy.interval - slots[-1]) // policy.max_delay + 1
    return False, len(slots) - 1 + k, needed
