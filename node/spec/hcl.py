"""Nomad HCL2 jobspecs, turned into the API job JSON that ``node.spec.jobspec`` parses.

``caravan job run FILE.nomad.hcl`` and ``POST /v1/jobs/parse`` accept the
HCL users already write for Nomad. The text is parsed with python-hcl2 (an
established HCL2 grammar); this module only maps Nomad's block and attribute
names onto the API JSON Nomad itself produces (``nomad job run -output``),
for the fields Caravan models: job, group, task, resources, constraint, meta,
reschedule, update, count, datacenters, type, priority (plus the
simple attributes around them: name, namespace, region, driver, config).

* Durations are Go duration strings ("30s", "1h") and become integer
  nanoseconds, as in Nomad's API.
* Task-level ``constraint`` blocks join their group's constraints (Nomad's
  scheduler checks a task's constraints for its whole group anyway).
* Job-level ``update``, ``migrate`` and ``reschedule`` blocks are defaults for every
  group, merged field by field under the group's own block (what Nomad's
  canonicalisation does), so the result carries them per group; a partial
  ``reschedule`` block gets the rest from Nomad's defaults for the job type
  (batch and service differ).
* Blocks and attributes Caravan does not model (network, service, template,
  or a misspelt block) are dropped with a warning naming the block and its
  line; nothing fails because of them.
* Invalid HCL is an ``HCLError`` whose message carries the line and column;
  a modelled attribute of the wrong type is an error naming it and its line.
* ``variable "x" { default = ... }`` blocks are honoured for ``var.x``
  references (defaults only); runtime interpolations such as
  ``${attr.kernel.name}`` or ``${node.datacenter}`` stay literal strings for
  the scheduler, as in Nomad.

The work is split by what each step knows: ``hcl_text`` reads the text
(python-hcl2, positions, syntax errors), ``hcl_values`` checks attribute
values and walks bodies, ``hcl_blocks`` knows Nomad's blocks; this module is
the entry and handles the file's top level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from node.spec.errors import HCLError
from node.spec.hcl_blocks import NomadBlocks
from node.spec.hcl_text import BLOCK_MARK, block_list, load_hcl

__all__ = ["HCLError", "Parsed", "looks_like_hcl", "parse_hcl"]


@dataclass
class Parsed:
    """The API job JSON (without the {"Job": ...} wrapper) and the warnings."""

    job: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def parse_hcl(text: str, source: str = "") -> Parsed:
    """A Nomad HCL2 jobspec -> the API job JSON and warnings; raises HCLError."""
    if not isinstance(text, str):
        raise HCLError("the jobspec must be HCL text")
    data, blocks, attrs = load_hcl(text, source)
    conv = NomadBlocks(blocks, attrs, _variables(data), source)
    jobs = block_list(data.get("job")) or []
    if len(jobs) != 1:
        found = "no job block" if not jobs else f"{len(jobs)} job blocks"
        raise HCLError(
            f'{source + ": " if source else ""}a jobspec holds exactly one job "ID" {{ ... }} block; found {found}'
        )
    for name, raw in data.items():
        if name in ("job", "variable", BLOCK_MARK):
            continue
        found_blocks = block_list(raw)
        if found_blocks is None:
            conv.ignore_attr((), name, "the file")
        for n, (labels, _) in enumerate(found_blocks or []):
            conv.ignore_block(((name, n),), name, labels, "the file")
    labels, body = jobs[0]
    job = conv.job(labels, body, (("job", 0),))
    return Parsed(job, conv.warnings)


def _variables(data: dict[str, Any]) -> dict[str, Any]:
    """``variable "x" { default = ... }`` blocks' defaults, for ``var.x`` references."""
    found: dict[str, Any] = {}
    for labels, body in block_list(data.get("variable")) or []:
        if len(labels) == 1 and "default" in body:
            found[labels[0]] = body["default"]
    return found


def looks_like_hcl(path: str, text: str) -> bool:
    """Whether a jobspec file is HCL (by name, or by not starting like JSON)."""
    if path.endswith((".hcl", ".nomad")):
        return True
    if path.endswith(".json"):
        return False
    return not text.lstrip().startswith(("{", "["))
