"""ACL policy rules as Nomad writes them: parsing HCL/JSON, and what a set of policies grants.

A policy is ``namespace "name" { policy = ..., capabilities = [...] }``
blocks (``name`` may be a ``*`` glob) plus ``node``, ``agent`` and
``operator`` blocks with ``policy = "deny" | "read" | "write"``. The leader
parses the text once, before the log (``parse_rules``); servers authorize
from the parsed ``ACLPolicy`` fields (``Grants.of``), so a request never
parses HCL. The capability vocabulary and the expansion of the policy words
follow Nomad's ``acl/policy.go``.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fsm.structs import ACL_LEVELS, ACLNamespaceRule, ACLPolicy
from node.spec.errors import HCLError
from node.spec.hcl_text import block_list, load_hcl

DENY = "deny"
LIST_JOBS, PARSE_JOB, READ_JOB = "list-jobs", "parse-job", "read-job"
SUBMIT_JOB, DISPATCH_JOB, READ_LOGS, READ_FS = "submit-job", "dispatch-job", "read-logs", "read-fs"
ALLOC_EXEC, ALLOC_NODE_EXEC, ALLOC_LIFECYCLE = "alloc-exec", "alloc-node-exec", "alloc-lifecycle"
SCALE_JOB, READ_JOB_SCALING = "scale-job", "read-job-scaling"
LIST_SCALING, READ_SCALING = "list-scaling-policies", "read-scaling-policy"
CSI_LIST, CSI_READ, CSI_MOUNT, CSI_WRITE = "csi-list-volume", "csi-read-volume", "csi-mount-volume", "csi-write-volume"
CSI_REGISTER_PLUGIN, SUBMIT_RECOMMENDATION = "csi-register-plugin", "submit-recommendation"

_READ = (LIST_JOBS, PARSE_JOB, READ_JOB, CSI_LIST, CSI_READ, READ_JOB_SCALING, LIST_SCALING, READ_SCALING)
_WRITE = (*_READ, SCALE_JOB, SUBMIT_JOB, DISPATCH_JOB, READ_LOGS, READ_FS, ALLOC_EXEC, ALLOC_LIFECYCLE,
          CSI_MOUNT, CSI_WRITE, SUBMIT_RECOMMENDATION)
#: What each namespace ``policy`` word stands for (Nomad's expandNamespacePolicy).
POLICY_CAPABILITIES: dict[str, frozenset[str]] = {
    DENY: frozenset((DENY,)),
    "read": frozenset(_READ),
    "write": frozenset(_WRITE),
    "scale": frozenset((LIST_SCALING, READ_SCALING, READ_JOB_SCALING, SCALE_JOB)),
}
CAPABILITIES = frozenset().union(*POLICY_CAPABILITIES.values(), (ALLOC_NODE_EXEC, CSI_REGISTER_PLUGIN))
SCOPES = ("node", "agent", "operator")
_IGNORED_BLOCKS = ("quota", "plugin", "host_volume")  # Nomad's, for objects Caravan does not have
_LEVEL_RANK = {"": 0, "read": 1, "write": 2}


class PolicyRulesError(ValueError):
    """Rules that are not a Nomad ACL policy; the message names what to fix."""


# -- parsing ---------------------------------------------------------------------------
def parse_rules(name: str, description: str, text: str) -> ACLPolicy:
    """The policy ``name`` from its rules (HCL, or the same structure as JSON); raises PolicyRulesError."""
    data = _load(text)
    unknown = sorted(set(data) - {"namespace", *SCOPES, *_IGNORED_BLOCKS})
    if unknown:
        raise PolicyRulesError(f"unknown rule block(s) {', '.join(unknown)}; use namespace, node, agent or operator")
    policy = ACLPolicy(name=name, description=description, rules=text)
    policy.namespaces = [_namespace(labels, body) for labels, body in _blocks(data.get("namespace"), "namespace")]
    for scope in SCOPES:
        bodies = _blocks(data.get(scope), scope)
        if len(bodies) > 1:
            raise PolicyRulesError(f"more than one {scope} block; write one")
        if bodies:
            level = bodies[0][1].get("policy", "")
            if level not in ACL_LEVELS:
                raise PolicyRulesError(f"{scope} policy must be one of {', '.join(ACL_LEVELS)}, not {level!r}")
            setattr(policy, scope, level)
    return policy


def _load(text: str) -> dict[str, Any]:
    """The rules as python-hcl2 gives HCL, whether they came as HCL or JSON."""
    stripped = text.strip()
    if not stripped:
        raise PolicyRulesError("the policy has no rules; write at least one namespace, node, agent or operator block")
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise PolicyRulesError(f"rules look like JSON but do not parse: {exc}") from None
        if not isinstance(data, dict):
            raise PolicyRulesError("JSON rules must be an object of blocks")
        return {k: _json_blocks(k, v) for k, v in data.items()}
    try:
        data, _, _ = load_hcl(text, "rules")
    except HCLError as exc:
        raise PolicyRulesError(str(exc)) from None
    return data


def _json_blocks(kind: str, value: Any) -> list[tuple[list[str], dict[str, Any]]]:
    """JSON's ``{"namespace": {"default": {...}}}`` / ``{"node": {...}}`` as (labels, body) pairs."""
    if not isinstance(value, dict):
        raise PolicyRulesError(f"{kind} must be an object")
    if kind != "namespace":
        return [([], value)]
    if not all(isinstance(v, dict) for v in value.values()):
        raise PolicyRulesError('namespace must map names to rules: {"namespace": {"default": {"policy": "read"}}}')
    return [([label], body) for label, body in value.items()]


def _blocks(value: Any, kind: str) -> list[tuple[list[str], dict[str, Any]]]:
    if value is None:
        return []
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return value  # from JSON, already paired
    found = block_list(value)
    if found is None:
        raise PolicyRulesError(f"{kind} must be a block, as {kind} {{ policy = \"read\" }}")
    return found


def _namespace(labels: list[str], body: dict[str, Any]) -> ACLNamespaceRule:
    if len(labels) != 1 or not labels[0]:
        raise PolicyRulesError('a namespace block needs one name: namespace "default" { ... }')
    word = body.get("policy", "")
    if word and word not in POLICY_CAPABILITIES:
        raise PolicyRulesError(f"namespace {labels[0]!r}: policy must be one of {', '.join(POLICY_CAPABILITIES)}")
    caps = body.get("capabilities", [])
    if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
        raise PolicyRulesError(f"namespace {labels[0]!r}: capabilities must be a list of strings")
    bad = sorted(set(caps) - CAPABILITIES)
    if bad:
        raise PolicyRulesError(f"namespace {labels[0]!r}: unknown capabilities {', '.join(bad)}")
    if not word and not caps:
        raise PolicyRulesError(f"namespace {labels[0]!r}: set policy or capabilities")
    return ACLNamespaceRule(name=labels[0], policy=word, capabilities=sorted(set(caps)))


# -- what policies grant ----------------------------------------------------------------
@dataclass
class Grants:
    """The union of a token's policies (Nomad's compiled ACL): deny wins, else the most allowed."""

    namespaces: dict[str, set[str]] = field(default_factory=dict)
    levels: dict[str, str] = field(default_factory=dict)  # scope -> deny/read/write
    denied: set[str] = field(default_factory=set)  # scopes some policy denies

    @classmethod
    def of(cls, policies: Iterable[ACLPolicy]) -> Grants:
        grants = cls()
        for policy in policies:
            for rule in policy.namespaces:
                caps = grants.namespaces.setdefault(rule.name, set())
                caps |= POLICY_CAPABILITIES.get(rule.policy, frozenset()) | set(rule.capabilities)
            for scope in SCOPES:
                level = getattr(policy, scope)
                if level == DENY:
                    grants.denied.add(scope)
                elif _LEVEL_RANK.get(level, 0) > _LEVEL_RANK[grants.levels.get(scope, "")]:
                    grants.levels[scope] = level
        return grants

    def allows_namespace(self, namespace: str, capability: str) -> bool:
        caps = self._namespace_caps(namespace)
        return DENY not in caps and capability in caps

    def allows_level(self, scope: str, level: str) -> bool:
        """``level`` read is met by read or write; write only by write; a deny anywhere denies."""
        if scope in self.denied:
            return False
        return _LEVEL_RANK[self.levels.get(scope, "")] >= _LEVEL_RANK[level]

    def _namespace_caps(self, namespace: str) -> set[str]:
        """The exact rule, else the closest glob (Nomad: the match leaving the fewest characters to ``*``)."""
        if namespace in self.namespaces:
            return self.namespaces[namespace]
        globs = [p for p in self.namespaces if "*" in p and fnmatch.fnmatchcase(namespace, p)]
        if not globs:
            return set()
        best = min(globs, key=lambda p: len(namespace) - len(p.replace("*", "")))
        return self.namespaces[best]


#: Tokens from before named policies carry the fixed words read or write; they
#: keep working as these built-in policies, with what they could do then: every
#: namespace and node at their word, agent and operator reads (operator
#: changes needed a management token, and still do for them).
BUILTIN_POLICIES: dict[str, ACLPolicy] = {
    word: ACLPolicy(
        name=word,
        description=f"built-in: what a {word} token of older versions may do",
        namespaces=[ACLNamespaceRule(name="*", policy=word)],
        node=word,
        agent="read",
        operator="read",
    )
    for word in ("read", "write")
}
