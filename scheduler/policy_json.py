"""The scheduler configuration in Nomad's JSON shape, and the policy's text form for the command line.

Nomad's ``/v1/operator/scheduler/configuration`` answers and takes a
``SchedulerConfiguration``; Caravan's placement policy rides along under
``PlacementPolicy``, so Nomad's clients, scripts and Terraform keep working
and see Caravan's policy beside Nomad's fields::

    {"SchedulerAlgorithm": "binpack",
     "PreemptionConfig": {"SystemSchedulerEnabled": false, ...},
     "MemoryOversubscriptionEnabled": false, "RejectJobRegistration": false, "PauseEvalBroker": false,
     "PlacementPolicy": {"Validation": ["node-status", ...],
                         "Preference": [{"Name": "best-fit", "Buckets": 3}, ...],
                         "ClusterTop": 0, "TopKMax": 4},
     "CreateIndex": 0, "ModifyIndex": 0}

What a PUT body means (a whole configuration, as Nomad's PUT is):

- ``SchedulerAlgorithm`` is a view of the preference list (``policy.algorithm_of``).
  Without ``PlacementPolicy.Preference`` it picks the preset (binpack: the
  default list; spread: the same with worst-fit for best-fit); with one, it
  must agree with it or be left out.
- A ``PlacementPolicy`` key left out takes its default; a bucketed
  preference without ``Buckets`` gets 3.
- Nomad features Caravan does not implement (preemption by scheduler type,
  memory oversubscription, rejecting registrations, pausing the broker) read
  as false and may only be set to false: a true is refused, never silently
  ignored. ``CreateIndex`` and ``ModifyIndex`` are ignored (``?cas=`` is the
  compare-and-set).

Every refusal is a ``PolicyError`` whose text is one line saying what to change.
"""

from __future__ import annotations

from typing import Any

from fsm.scheduler_config import (
    BUCKETED,
    DEFAULT_BUCKETS,
    DEFAULT_TOP_K_MAX,
    VALIDATION_NAMES,
    PreferenceSpec,
    SchedulerConfig,
)
from scheduler.policy import (
    ALGORITHMS,
    BINPACK,
    Policy,
    PolicyError,
    algorithm_of,
    preset,
    with_algorithm,
)

PREEMPTION_FIELDS = ("SystemSchedulerEnabled", "SysBatchSchedulerEnabled", "BatchSchedulerEnabled", "ServiceSchedulerEnabled")
UNIMPLEMENTED_FLAGS = ("MemoryOversubscriptionEnabled", "RejectJobRegistration", "PauseEvalBroker")
PLACEMENT_FIELDS = ("Validation", "Preference", "ClusterTop", "TopKMax")
CONFIG_FIELDS = frozenset(
    ("SchedulerAlgorithm", "PreemptionConfig", "PlacementPolicy", "CreateIndex", "ModifyIndex", *UNIMPLEMENTED_FLAGS)
)


# -- record -> JSON --------------------------------------------------------------------
def preference_json(prefs: list[PreferenceSpec]) -> list[dict[str, Any]]:
    return [{"Name": p.name, "Buckets": p.buckets} for p in prefs]


def config_json(cfg: SchedulerConfig) -> dict[str, Any]:
    """``cfg`` as Nomad's ``SchedulerConfig`` object, with Caravan's ``PlacementPolicy``."""
    return {
        "SchedulerAlgorithm": algorithm_of(cfg.preference),
        "PreemptionConfig": dict.fromkeys(PREEMPTION_FIELDS, False),
        **dict.fromkeys(UNIMPLEMENTED_FLAGS, False),
        "PlacementPolicy": {
            "Validation": list(cfg.validation),
            "Preference": preference_json(cfg.preference),
            "ClusterTop": cfg.cluster_top,
            "TopKMax": cfg.top_k_max,
        },
        "CreateIndex": cfg.create_index,
        "ModifyIndex": cfg.modify_index,
    }


# -- JSON -> record ----------------------------------------------------------------------
def config_from_json(body: Any) -> SchedulerConfig:
    """The configuration a PUT body asks for, checked as apply will check it; raises ``PolicyError``."""
    if not isinstance(body, dict):
        raise PolicyError('the scheduler configuration must be a JSON object, like {"SchedulerAlgorithm": "spread"}')
    unknown = sorted(set(body) - CONFIG_FIELDS)
    if unknown:
        raise PolicyError(f"unknown field {unknown[0]!r} in the scheduler configuration; known: {', '.join(sorted(CONFIG_FIELDS))}")
    _refuse_unimplemented(body)
    algorithm = body.get("SchedulerAlgorithm")
    if algorithm is None:
        algorithm = ""  # Nomad's empty algorithm is binpack
    if not isinstance(algorithm, str) or (algorithm and algorithm not in ALGORITHMS):
        raise PolicyError(f"SchedulerAlgorithm must be binpack or spread, not {algorithm!r}")
    placement = body.get("PlacementPolicy")
    if placement is None:
        placement = {}
    if not isinstance(placement, dict):
        raise PolicyError('PlacementPolicy must be a JSON object, like {"Preference": [{"Name": "best-fit", "Buckets": 3}]}')
    unknown = sorted(set(placement) - set(PLACEMENT_FIELDS))
    if unknown:
        raise PolicyError(f"unknown field {unknown[0]!r} in PlacementPolicy; known: {', '.join(PLACEMENT_FIELDS)}")
    cfg = SchedulerConfig(
        validation=_validation(placement.get("Validation", list(VALIDATION_NAMES))),
        preference=_preference_for(placement, algorithm),
        cluster_top=_whole(placement, "ClusterTop", 0),
        top_k_max=_whole(placement, "TopKMax", DEFAULT_TOP_K_MAX),
    )
    Policy.from_config(cfg).check()
    return cfg


def _refuse_unimplemented(body: dict[str, Any]) -> None:
    for name in UNIMPLEMENTED_FLAGS:
        if _flag(body.get(name, False), name):
            raise PolicyError(f"Caravan does not implement {name}; set it to false or leave it out")
    preemption = body.get("PreemptionConfig")
    if preemption is None:
        return
    if not isinstance(preemption, dict):
        raise PolicyError("PreemptionConfig must be a JSON object of booleans")
    for name, value in preemption.items():
        if name not in PREEMPTION_FIELDS:
            raise PolicyError(f"unknown field {name!r} in PreemptionConfig; known: {', '.join(PREEMPTION_FIELDS)}")
        if _flag(value, f"PreemptionConfig.{name}"):
            raise PolicyError(f"Caravan's schedulers do not preempt by job type; set PreemptionConfig.{name} to false")


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{name} must be true or false")
    return value


def _validation(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError('PlacementPolicy.Validation must be a list of rule names, like ["node-status", "resources"]')
    return list(value)


def _preference_for(placement: dict[str, Any], algorithm: str) -> list[PreferenceSpec]:
    """The preference list a body asks for: its own (agreeing with ``algorithm``), or ``algorithm``'s preset."""
    if "Preference" not in placement:
        return preset(algorithm or BINPACK)
    value = placement["Preference"]
    if not isinstance(value, list):
        raise PolicyError('PlacementPolicy.Preference must be a list like [{"Name": "best-fit", "Buckets": 3}]')
    prefs = [_preference_item(item) for item in value]
    if algorithm and algorithm_of(prefs) != algorithm:
        rule = "worst-fit" if algorithm != BINPACK else "best-fit"
        raise PolicyError(
            f"SchedulerAlgorithm {algorithm!r} disagrees with the preference list, which is {algorithm_of(prefs)}: "
            f"rank {rule} first among best-fit and worst-fit, or leave SchedulerAlgorithm out"
        )
    return prefs


def _preference_item(item: Any) -> PreferenceSpec:
    if not isinstance(item, dict) or not isinstance(item.get("Name"), str) or set(item) - {"Name", "Buckets"}:
        raise PolicyError('each PlacementPolicy.Preference item must be {"Name": rule, "Buckets": n}')
    name = item["Name"]
    return PreferenceSpec(name, _whole(item, "Buckets", DEFAULT_BUCKETS if name in BUCKETED else 0, name))


def _whole(data: dict[str, Any], key: str, default: int, where: str = "PlacementPolicy") -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PolicyError(f"{key} of {where} must be a whole number")
    return value


# -- the command line's text forms -------------------------------------------------------
def parse_preference(text: str) -> list[dict[str, Any]]:
    """``best-fit:3,job-anti-affinity`` as PlacementPolicy.Preference JSON (a bucketed rule alone gets 3)."""
    out = []
    for part in _parts(text, "--preference"):
        name, sep, count = part.partition(":")
        if not sep:
            out.append({"Name": name, "Buckets": DEFAULT_BUCKETS if name in BUCKETED else 0})
            continue
        try:
            buckets = int(count)
        except ValueError:
            raise PolicyError(f"--preference: {part!r} needs a whole number of buckets, like {name}:3") from None
        out.append({"Name": name, "Buckets": buckets})
    return out


def parse_validation(text: str) -> list[str]:
    """``node-status,resources`` as PlacementPolicy.Validation JSON."""
    return _parts(text, "--validation")


def _parts(text: str, flag: str) -> list[str]:
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise PolicyError(f"{flag}: an empty rule name in {text!r}; give comma-separated names")
    return parts


def preference_text(prefs: list[dict[str, Any]]) -> str:
    """PlacementPolicy.Preference JSON as the command line writes it (``best-fit:3, job-anti-affinity``)."""
    return ", ".join(f"{p['Name']}:{p['Buckets']}" if p.get("Buckets") else p["Name"] for p in prefs)


def switch_algorithm(prefs: list[dict[str, Any]], algorithm: str) -> list[dict[str, Any]]:
    """PlacementPolicy.Preference JSON changed as little as possible to be ``algorithm`` (``policy.with_algorithm``)."""
    if not isinstance(prefs, list):
        raise PolicyError("PlacementPolicy.Preference must be a list")
    return preference_json(with_algorithm([_preference_item(p) for p in prefs], algorithm))
