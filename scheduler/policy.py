"""The placement policy: which rules run, in what order, with how many buckets.

Protean's point is that policy is configuration, not code: the ordered
validation rules (hard filters), the ordered preference rules (combined in
strict priority) and each continuous rule's bucket count change without a
restart. Caravan keeps a ``Policy`` in the replicated scheduler
configuration (set through raft, like Nomad's ``operator scheduler
set-config``), so every server schedules with the same one, and a change
applies from the next evaluation on.

``Policy`` is plain data (names and numbers) so it can be stored, compared
and shown; ``rules()`` turns it into the rule objects the selector runs.
The default policy is exactly what Caravan scheduled with before the policy
became configurable.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.errors import SchedulerError
from scheduler.feasibility import VALIDATION_RULES, ValidationRule
from scheduler.ranking import (
    DEFAULT_BUCKETS,
    AvoidPreviousNode,
    BestFit,
    JobAntiAffinity,
    PreferEmptierClusters,
    PreferenceRule,
    PreferNonEmptyMachines,
)

#: Node attributes that place a node in the topology (``${meta.cluster}`` and ``${meta.rack}``
#: in constraints): the client sets them at registration, as Nomad clients set ``meta``.
CLUSTER_ATTRIBUTE = "meta.cluster"
RACK_ATTRIBUTE = "meta.rack"

VALIDATION_BY_NAME: dict[str, ValidationRule] = {rule.name: rule for rule in VALIDATION_RULES}
#: Rules every policy must keep: without them a plan could place on a down node or overcommit one,
#: and the plan applier would reject it anyway.
REQUIRED_VALIDATION = ("node-status", "resources")
#: Preference rules that take a bucket count (continuous scores quantized, as Protean's BestFit).
BUCKETED = frozenset({"best-fit", "prefer-emptier-clusters"})
PREFERENCE_NAMES = (
    "avoid-previous-node",
    "best-fit",
    "job-anti-affinity",
    "prefer-non-empty-machines",
    "prefer-emptier-clusters",
)
MAX_BUCKETS = 1000  # "unlimited" in Protean's table: finer than any score difference that matters


class PolicyError(SchedulerError):
    """A policy that cannot be used; ``str()`` is one line that says what to change."""


@dataclass(frozen=True)
class Preference:
    """One preference rule in the ordered list; ``buckets`` only for bucketed rules."""

    name: str
    buckets: int = 0


@dataclass(frozen=True)
class Policy:
    """The placement policy. ``version`` is the raft index that set it (0: the default)."""

    validation: tuple[str, ...] = tuple(rule.name for rule in VALIDATION_RULES)
    preference: tuple[Preference, ...] = (
        Preference("avoid-previous-node"),
        Preference("best-fit", DEFAULT_BUCKETS),
        Preference("job-anti-affinity"),
    )
    #: Two-level selection: clusters kept after ranking clusters (Protean keeps 8-16); 0 turns it off.
    cluster_top: int = 0
    #: Conflict-aware choice: the most candidates a worker picks among when plans conflict often.
    top_k_max: int = 4
    version: int = 0

    def check(self) -> None:
        """Raise ``PolicyError`` naming the first thing wrong."""
        unknown = [n for n in self.validation if n not in VALIDATION_BY_NAME]
        if unknown:
            raise PolicyError(f"unknown validation rule {unknown[0]!r}; known: {', '.join(VALIDATION_BY_NAME)}")
        if len(set(self.validation)) != len(self.validation):
            raise PolicyError("a validation rule is listed twice; list each once")
        for name in REQUIRED_VALIDATION:
            if name not in self.validation:
                raise PolicyError(f"validation rule {name!r} is required; add it back to the list")
        names = [p.name for p in self.preference]
        if len(set(names)) != len(names):
            raise PolicyError("a preference rule is listed twice; list each once")
        for pref in self.preference:
            if pref.name not in PREFERENCE_NAMES:
                raise PolicyError(f"unknown preference rule {pref.name!r}; known: {', '.join(PREFERENCE_NAMES)}")
            if pref.name in BUCKETED and not 1 <= pref.buckets <= MAX_BUCKETS:
                raise PolicyError(f"preference {pref.name!r} needs buckets between 1 and {MAX_BUCKETS}")
            if pref.name not in BUCKETED and pref.buckets:
                raise PolicyError(f"preference {pref.name!r} takes no buckets; remove them")
        if self.cluster_top < 0:
            raise PolicyError("cluster_top must be 0 (off) or the number of clusters to keep, like 12")
        if not 1 <= self.top_k_max <= 64:
            raise PolicyError("top_k_max must be between 1 and 64")

    def validation_rules(self) -> tuple[ValidationRule, ...]:
        return tuple(VALIDATION_BY_NAME[n] for n in self.validation)

    def preference_rules(self) -> tuple[PreferenceRule, ...]:
        return tuple(_preference(p) for p in self.preference)


def _preference(pref: Preference) -> PreferenceRule:
    if pref.name == "avoid-previous-node":
        return AvoidPreviousNode()
    if pref.name == "best-fit":
        return BestFit(pref.buckets)
    if pref.name == "job-anti-affinity":
        return JobAntiAffinity()
    if pref.name == "prefer-non-empty-machines":
        return PreferNonEmptyMachines()
    if pref.name == "prefer-emptier-clusters":
        return PreferEmptierClusters(pref.buckets)
    raise PolicyError(f"unknown preference rule {pref.name!r}")


DEFAULT_POLICY = Policy()
