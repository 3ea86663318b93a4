"""The placement policy: which rules run, in what order, with how many buckets.

Protean's point is that policy is configuration, not code: the ordered
validation rules (hard filters), the ordered preference rules (combined in
strict priority) and each continuous rule's bucket count change without a
restart. Caravan keeps a ``Policy`` in the replicated scheduler
configuration (set through raft, like Nomad's ``operator scheduler
set-config``), so every server schedules with the same one, and a change
applies from the next evaluation on.

``Policy`` is plain data (names and numbers) so it can be stored, compared
and shown; ``validation_rules()`` and ``preference_rules()`` turn it into the
rule objects the selector runs. It is stored as ``fsm.scheduler_config``'s
record (``to_config``/``from_config``), whose check is the one ``check`` runs.
The default policy is exactly what Caravan scheduled with before the policy
became configurable.

Nomad's ``SchedulerAlgorithm`` is a view of the preference list, not a
setting of its own: ``binpack`` ranks best-fit (pack tightly), ``spread``
ranks worst-fit, its mirror image (leave nodes as empty as possible), in the
same place with the same buckets. ``spread``'s preset is therefore
avoid-previous-node, worst-fit:3, job-anti-affinity: a job's allocs go to
the emptiest nodes, and among nodes about as empty, to those running fewer
of the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from fsm.scheduler_config import (
    BUCKETED,
    DEFAULT_BUCKETS,
    DEFAULT_TOP_K_MAX,
    MAX_BUCKETS,
    PREFERENCE_NAMES,
    REQUIRED_VALIDATION,
    VALIDATION_NAMES,
    PreferenceSpec,
    SchedulerConfig,
    config_problem,
    default_preference,
)
from scheduler.errors import SchedulerError
from scheduler.feasibility import VALIDATION_RULES, ValidationRule
from scheduler.preferences import (
    AvoidPreviousNode,
    BestFit,
    JobAntiAffinity,
    PreferEmptierClusters,
    PreferenceRule,
    PreferNonEmptyMachines,
    WorstFit,
)

__all__ = [
    "ALGORITHMS",
    "BINPACK",
    "BUCKETED",
    "DEFAULT_POLICY",
    "MAX_BUCKETS",
    "PREFERENCE_NAMES",
    "REQUIRED_VALIDATION",
    "SPREAD",
    "VALIDATION_BY_NAME",
    "Policy",
    "PolicyError",
    "Preference",
    "WorstFit",
    "algorithm_of",
    "preset",
    "with_algorithm",
]


#: Nomad's two scheduler algorithms, as ``operator scheduler set-config -scheduler-algorithm`` names them.
BINPACK, SPREAD = "binpack", "spread"
ALGORITHMS = (BINPACK, SPREAD)

VALIDATION_BY_NAME: dict[str, ValidationRule] = {rule.name: rule for rule in VALIDATION_RULES}


class PolicyError(SchedulerError):
    """A policy that cannot be used; ``str()`` is one line that says what to change."""


@dataclass(frozen=True)
class Preference:
    """One preference rule in the ordered list; ``buckets`` only for bucketed rules."""

    name: str
    buckets: int = 0


_DEFAULT_CONFIG = SchedulerConfig()


@dataclass(frozen=True)
class Policy:
    """The placement policy. ``version`` is the raft index that set it (0: the default).

    The defaults are the FSM's (``fsm.scheduler_config``): what a store that
    never had a configuration set reads back.
    """

    validation: tuple[str, ...] = tuple(_DEFAULT_CONFIG.validation)
    preference: tuple[Preference, ...] = tuple(Preference(p.name, p.buckets) for p in _DEFAULT_CONFIG.preference)
    #: Two-level selection: clusters kept after ranking clusters (Protean keeps 8-16); 0 turns it off.
    cluster_top: int = 0
    #: Conflict-aware choice: the most candidates a worker picks among when plans conflict often.
    top_k_max: int = DEFAULT_TOP_K_MAX
    version: int = 0

    def check(self) -> None:
        """Raise ``PolicyError`` naming the first thing wrong (the very check apply repeats)."""
        problem = config_problem(self.to_config())
        if problem is not None:
            raise PolicyError(problem)

    def validation_rules(self) -> tuple[ValidationRule, ...]:
        return _validation_rules(self.validation)

    def preference_rules(self) -> tuple[PreferenceRule, ...]:
        return _preference_rules(self.preference)

    def to_config(self) -> SchedulerConfig:
        """The stored record this policy is (indexes left at 0: apply stamps them)."""
        return SchedulerConfig(
            validation=list(self.validation),
            preference=[PreferenceSpec(p.name, p.buckets) for p in self.preference],
            cluster_top=self.cluster_top,
            top_k_max=self.top_k_max,
        )

    @classmethod
    def from_config(cls, cfg: SchedulerConfig) -> Policy:
        """The policy a stored configuration holds; its version is the index that set it."""
        return cls(
            validation=tuple(cfg.validation),
            preference=tuple(Preference(p.name, p.buckets) for p in cfg.preference),
            cluster_top=cfg.cluster_top,
            top_k_max=cfg.top_k_max,
            version=cfg.modify_index,
        )


@lru_cache(maxsize=64)
def _validation_rules(names: tuple[str, ...]) -> tuple[ValidationRule, ...]:
    """The rules ``names`` name, built once per list: every evaluation asks for them."""
    return tuple(VALIDATION_BY_NAME[n] for n in names)


@lru_cache(maxsize=64)
def _preference_rules(prefs: tuple[Preference, ...]) -> tuple[PreferenceRule, ...]:
    """The rules of ``prefs``, built once per list and shared (a rule holds no state but its
    bucket count), so that every evaluation under one policy does not build them again."""
    return tuple(_preference(p) for p in prefs)


def _preference(pref: Preference) -> PreferenceRule:
    if pref.name == "avoid-previous-node":
        return AvoidPreviousNode()
    if pref.name == "best-fit":
        return BestFit(pref.buckets)
    if pref.name == "worst-fit":
        return WorstFit(pref.buckets)
    if pref.name == "job-anti-affinity":
        return JobAntiAffinity()
    if pref.name == "prefer-non-empty-machines":
        return PreferNonEmptyMachines()
    if pref.name == "prefer-emptier-clusters":
        return PreferEmptierClusters(pref.buckets)
    raise PolicyError(f"unknown preference rule {pref.name!r}")


# -- Nomad's scheduler algorithm ------------------------------------------------------
def algorithm_of(preference: list[PreferenceSpec]) -> str:
    """Nomad's name for a preference list: ``spread`` if worst-fit comes before any best-fit, else ``binpack``.

    Derived rather than stored, so the algorithm an operator reads can never
    disagree with the rules the scheduler runs.
    """
    for pref in preference:
        if pref.name == "worst-fit":
            return SPREAD
        if pref.name == "best-fit":
            return BINPACK
    return BINPACK


_MIRROR = {"best-fit": "worst-fit", "worst-fit": "best-fit"}


def with_algorithm(preference: list[PreferenceSpec], algorithm: str) -> list[PreferenceSpec]:
    """``preference`` changed as little as possible to be ``algorithm``: best-fit and worst-fit trade places.

    Buckets and every other rule keep their places. A list with neither
    that must spread gets worst-fit (3 buckets) after avoid-previous-node.
    So the default binpack policy becomes exactly ``spread``'s preset:
    avoid-previous-node, worst-fit:3, job-anti-affinity.
    """
    if algorithm not in ALGORITHMS:
        raise PolicyError(f"unknown scheduler algorithm {algorithm!r}; use binpack or spread")
    if algorithm_of(preference) == algorithm:
        return list(preference)
    if not any(p.name in _MIRROR for p in preference):
        at = 1 if preference and preference[0].name == "avoid-previous-node" else 0
        return [*preference[:at], PreferenceSpec("worst-fit", DEFAULT_BUCKETS), *preference[at:]]
    return [PreferenceSpec(_MIRROR.get(p.name, p.name), p.buckets) for p in preference]


def preset(algorithm: str) -> list[PreferenceSpec]:
    """The preference list of Nomad's ``algorithm`` when nothing else is said: binpack is the default."""
    return with_algorithm(default_preference(), algorithm)


def _check_catalogue() -> None:
    """Fail at import if the scheduler's rules and the FSM's catalogue of names differ.

    A stored policy may name only rules apply knows, and every name apply
    accepts must be a rule this scheduler can build; otherwise a
    configuration could be accepted on every replica and then crash every
    evaluation. A new rule needs its name in ``fsm/scheduler_config.py``.
    """
    if set(VALIDATION_BY_NAME) != set(VALIDATION_NAMES):
        raise ImportError(
            f"scheduler.policy: validation rules {sorted(VALIDATION_BY_NAME)} differ from "
            f"fsm.scheduler_config.VALIDATION_NAMES {sorted(VALIDATION_NAMES)}; add the new name there"
        )
    for name in PREFERENCE_NAMES:
        try:
            _preference(Preference(name, DEFAULT_BUCKETS if name in BUCKETED else 0))
        except PolicyError:
            raise ImportError(f"scheduler.policy: no preference rule named {name!r} to build") from None


_check_catalogue()
DEFAULT_POLICY = Policy()
