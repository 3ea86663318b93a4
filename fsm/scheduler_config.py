"""The scheduler configuration: the placement policy as replicated state (Nomad's SchedulerConfiguration).

Protean's policy (which validation rules run and in what order, which
preference rules rank in what strict priority, each continuous rule's bucket
count, two-level selection's cluster count, the conflict-aware top-k) is
configuration, set through raft like Nomad's ``operator scheduler
set-config``, so every server schedules with the same one and a change needs
no restart. This module is the stored record and the one check of it.

The rule *names* are part of the replicated schema, like message type codes:
apply refuses a name this build does not know (on every replica alike), and
``scheduler.policy`` refuses to import if its rules and this catalogue
differ, so a stored policy is always one the scheduler can build. A new rule
is therefore a new name here as well as a class in the scheduler. The check
lives here, not in the scheduler, because apply must repeat it and the FSM
imports nothing of ours; the leader runs the same function before an entry
reaches the log, so an operator reads the very message apply would give.
"""

from __future__ import annotations

from fsm.record import Record, field

#: Where the configuration is stored (one row) and how journal and index name it.
CONFIG_TABLE = "scheduler_config"
CONFIG_KEY = b"config"

#: Validation rules (hard filters), in the default order: static and cheap first.
VALIDATION_NAMES = (
    "node-status",
    "node-eligibility",
    "datacenter",
    "drivers",
    "constraints",
    "distinct-hosts",
    "resources",
)
#: Rules every policy must keep: without them a plan could place on a down node or overcommit one,
#: and the plan applier would reject it anyway.
REQUIRED_VALIDATION = ("node-status", "resources")
PREFERENCE_NAMES = (
    "avoid-previous-node",
    "best-fit",
    "worst-fit",
    "job-anti-affinity",
    "prefer-non-empty-machines",
    "prefer-emptier-clusters",
)
#: Preference rules that take a bucket count (continuous scores quantized, as Protean's BestFit).
BUCKETED = frozenset({"best-fit", "worst-fit", "prefer-emptier-clusters"})
MAX_BUCKETS = 1000  # "unlimited" in Protean's table: finer than any score difference that matters
DEFAULT_BUCKETS = 3  # Protean's production choice
MAX_TOP_K = 64
MAX_CLUSTER_TOP = 4096  # far more clusters than Protean keeps (8-16); bounds what an entry may carry
DEFAULT_TOP_K_MAX = 4


class PreferenceSpec(Record):
    """One preference rule in the ordered list; ``buckets`` only for bucketed rules (else 0)."""

    name: str
    buckets: int = 0


def default_preference() -> list[PreferenceSpec]:
    """Nomad's binpack as Caravan ranks it: avoid the failed node, pack tightly, then spread one job."""
    return [
        PreferenceSpec("avoid-previous-node"),
        PreferenceSpec("best-fit", DEFAULT_BUCKETS),
        PreferenceSpec("job-anti-affinity"),
    ]


class SchedulerConfig(Record):
    """The stored configuration. ``modify_index`` 0 means "never set": the defaults are in force."""

    validation: list[str] = field(default_factory=lambda: list(VALIDATION_NAMES))
    preference: list[PreferenceSpec] = field(default_factory=default_preference)
    #: Two-level selection: clusters kept after ranking clusters (Protean keeps 8-16); 0 turns it off.
    cluster_top: int = 0
    #: Conflict-aware choice: the most candidates a worker picks among when plans conflict often.
    top_k_max: int = DEFAULT_TOP_K_MAX
    create_index: int = 0
    modify_index: int = 0


def config_problem(cfg: SchedulerConfig) -> str | None:
    """The first thing wrong with ``cfg``, as one line that says what to change; None if it is usable."""
    return _validation_problem(cfg.validation) or _preference_problem(cfg.preference) or _limits_problem(cfg)


def _validation_problem(names: list[str]) -> str | None:
    unknown = [n for n in names if n not in VALIDATION_NAMES]
    if unknown:
        return f"unknown validation rule {unknown[0]!r}; known: {', '.join(VALIDATION_NAMES)}"
    if len(set(names)) != len(names):
        return "a validation rule is listed twice; list each once"
    for name in REQUIRED_VALIDATION:
        if name not in names:
            return f"validation rule {name!r} is required; add it back to the list"
    return None


def _preference_problem(prefs: list[PreferenceSpec]) -> str | None:
    names = [p.name for p in prefs]
    if len(set(names)) != len(names):
        return "a preference rule is listed twice; list each once"
    for pref in prefs:
        if pref.name not in PREFERENCE_NAMES:
            return f"unknown preference rule {pref.name!r}; known: {', '.join(PREFERENCE_NAMES)}"
        if pref.name in BUCKETED and not 1 <= pref.buckets <= MAX_BUCKETS:
            return f"preference {pref.name!r} needs buckets between 1 and {MAX_BUCKETS}, like {pref.name}:3"
        if pref.name not in BUCKETED and pref.buckets:
            return f"preference {pref.name!r} takes no buckets; remove them"
    return None


def _limits_problem(cfg: SchedulerConfig) -> str | None:
    if not 0 <= cfg.cluster_top <= MAX_CLUSTER_TOP:
        return f"cluster_top must be 0 (off) or the number of clusters to keep (at most {MAX_CLUSTER_TOP}), like 12"
    if not 1 <= cfg.top_k_max <= MAX_TOP_K:
        return f"top_k_max must be between 1 and {MAX_TOP_K}"
    return None
