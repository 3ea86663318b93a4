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
* Job-level ``update`` and ``reschedule`` blocks are defaults for every
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
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node.spec.units import parse_duration

NS_PER_SECOND = 1_000_000_000
BLOCK_MARK = "__is_block__"


class HCLError(ValueError):
    """An unusable HCL jobspec; the message is one line with the position."""


@dataclass
class Parsed:
    """The API job JSON (without the {"Job": ...} wrapper) and the warnings."""

    job: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


# -- positions from the raw parse tree ----------------------------------------------
Path = tuple[tuple[str, int], ...]


def _positions(tree: Any) -> tuple[dict[Path, int], dict[tuple[Path, str], int]]:
    """Line of every block (by path of (type, nth of that type)) and attribute.

    Also refuses an attribute set twice in one body, which python-hcl2
    silently resolves to the last value (HCL says it is an error).
    """
    blocks: dict[Path, int] = {}
    attrs: dict[tuple[Path, str], int] = {}

    def walk(body: Any, path: Path) -> None:
        seen: dict[str, int] = {}
        for child in getattr(body, "children", ()):
            kind = getattr(child, "data", None)
            if kind == "block":
                name, line = _ident(child.children[0])
                n = seen.get(name, 0)
                seen[name] = n + 1
                blocks[path + ((name, n),)] = line
                inner = next(
                    (c for c in child.children if getattr(c, "data", None) == "body"), None
                )
                if inner is not None:
                    walk(inner, path + ((name, n),))
            elif kind == "attribute":
                name, line = _ident(child.children[0])
                if (path, name) in attrs:
                    raise HCLError(
                        f"line {line}: attribute {name!r} is set twice in the same block (first at line {attrs[(path, name)]})"
                    )
                attrs[(path, name)] = line

    root = tree.children[0] if getattr(tree, "data", None) == "start" and tree.children else tree
    walk(root, ())
    return blocks, attrs


def _ident(node: Any) -> tuple[str, int]:
    token = node.children[0] if getattr(node, "children", None) else node
    return str(token), int(getattr(token, "line", 0) or 0)


# -- parsing --------------------------------------------------------------------------
def _syntax_error(exc: Exception, source: str) -> HCLError:
    line = getattr(exc, "line", None)
    column = getattr(exc, "column", None)
    token = getattr(exc, "token", None)
    char = getattr(exc, "char", None)
    if token is not None and getattr(token, "type", "") == "$END":
        what = "unexpected end of file (an unclosed block, string or list?)"
    elif token is not None and not str(token).strip():
        what = "unexpected end of line (a value or a closing bracket is missing)"
    elif token is not None:
        what = f"unexpected {str(token)!r}"
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "accepts", None) or [])
        if expected and len(expected) <= 6:
            what += f" (expected {', '.join(e.lower() for e in expected)})"
    elif char is not None:
        what = f"unexpected character {char!r}"
    else:
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = f"{source}:" if source else ""
    if isinstance(line, int) and line > 0:
        return HCLError(
            f"{where}{line}:{column}: invalid HCL at line {line}, column {column}: {what}"
        )
    return HCLError(f"{where} invalid HCL: {what}".strip())


def load_hcl(
    text: str, source: str = ""
) -> tuple[dict[str, Any], dict[Path, int], dict[tuple[Path, str], int]]:
    """(python-hcl2's dict, block lines, attribute lines); raises HCLError with line and column."""
    import hcl2  # imported here: the CLI imports this module for JSON specs too
    from lark.exceptions import LarkError, UnexpectedInput

    try:
        tree = hcl2.parses_to_tree(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source) from None
    except LarkError as exc:
        raise HCLError(
            f"{source + ': ' if source else ''}invalid HCL: {str(exc).splitlines()[0]}"
        ) from None
    blocks, attrs = _positions(tree)
    options = hcl2.SerializationOptions(
        with_comments=False,
        with_meta=False,
        explicit_blocks=True,
        strip_string_quotes=True,
        preserve_heredocs=False,
    )
    try:
        data = hcl2.serialize(
            hcl2.transform(tree, discard_comments=True), serialization_options=options
        )
    except Exception as exc:  # noqa: BLE001 - the library's own errors have no common base
        raise HCLError(f"{source + ': ' if source else ''}invalid HCL: {exc}") from None
    return data, blocks, attrs


# -- the mapping ------------------------------------------------------------------------
def _is_block_body(value: Any) -> bool:
    return isinstance(value, dict) and value.get(BLOCK_MARK) is True


def _block_list(value: Any) -> list[tuple[list[str], dict[str, Any]]] | None:
    """[(labels, body)] if ``value`` is python-hcl2's list of blocks, else None."""
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None
    out = []
    for item in value:
        labels: list[str] = []
        body = item
        while not _is_block_body(body):
            if not isinstance(body, dict) or len(body) != 1:
                return None
            ((label, inner),) = body.items()
            labels.append(label)
            body = inner
        out.append((labels, body))
    return out


_INTERP = re.compile(r"\$\{\s*var\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}")


class _Converter:
    def __init__(
        self,
        blocks: dict[Path, int],
        attrs: dict[tuple[Path, str], int],
        variables: dict[str, Any],
        source: str = "",
    ) -> None:
        self.source = source
        self.blocks = blocks
        self.attrs = attrs
        self.variables = variables
        self.warnings: list[str] = []

    # -- positions and messages ----------------------------------------------------
    def line_of(self, path: Path, attr: str | None = None) -> int:
        if attr is not None:
            return self.attrs.get((path, attr), 0)
        return self.blocks.get(path, 0)

    def where(self, path: Path, attr: str | None = None) -> str:
        line = self.line_of(path, attr)
        if self.source:
            return f"{self.source}:{line}: " if line else f"{self.source}: "
        return f"line {line}: " if line else ""

    def fail(self, path: Path, attr: str, message: str) -> HCLError:
        return HCLError(f"{self.where(path, attr)}{attr}: {message}")

    def ignore_block(self, path: Path, name: str, labels: list[str], context: str) -> None:
        label = "".join(f' "{lab}"' for lab in labels)
        line = self.line_of(path)
        at = f" at line {line}" if line else ""
        self.warnings.append(
            f'block "{name}"{label}{at} in {context} is not supported by Caravan and was ignored'
        )

    def ignore_attr(self, path: Path, name: str, context: str) -> None:
        line = self.line_of(path, name)
        at = f" at line {line}" if line else ""
        self.warnings.append(
            f'attribute "{name}"{at} in {context} is not supported by Caravan and was ignored'
        )

    # -- values ----------------------------------------------------------------------
    def value(self, raw: Any) -> Any:
        """Resolve var.x references (defaults) and HCL's $${ escapes, recursively."""
        if isinstance(raw, str):
            whole = _INTERP.fullmatch(raw)
            if whole and whole.group(1) in self.variables:
                return self.value(self.variables[whole.group(1)])
            if "var." in raw:
                raw = _INTERP.sub(
                    lambda m: (
                        _text(self.variables[m.group(1)])
                        if m.group(1) in self.variables
                        else m.group(0)
                    ),
                    raw,
                )
            return raw.replace("$${", "${").replace("%%{", "%{")
        if isinstance(raw, list):
            return [self.value(v) for v in raw]
        if isinstance(raw, dict):
            return {k: self.value(v) for k, v in raw.items() if k != BLOCK_MARK}
        return raw

    def string(self, path: Path, name: str, raw: Any) -> str:
        value = self.value(raw)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(path, name, f"must be a string, not {value!r}")
        return str(value)

    def integer(self, path: Path, name: str, raw: Any) -> int:
        value = self.value(raw)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise self.fail(path, name, f"must be a whole number, not {value!r}")
        return value

    def boolean(self, path: Path, name: str, raw: Any) -> bool:
        value = self.value(raw)
        if not isinstance(value, bool):
            raise self.fail(path, name, f"must be true or false, not {value!r}")
        return value

    def duration(self, path: Path, name: str, raw: Any) -> int:
        value = self.value(raw)
        if not isinstance(value, str):
            raise self.fail(
                path, name, f'must be a duration string like "30s" or "1h", not {value!r}'
            )
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.fail(path, name, str(exc)) from None
        return int(round(seconds * NS_PER_SECOND))

    def strings(self, path: Path, name: str, raw: Any) -> list[str]:
        value = self.value(raw)
        if not isinstance(value, list):
            raise self.fail(path, name, f'must be a list of strings like ["dc1"], not {value!r}')
        return [self.string(path, name, v) for v in value]

    def string_map(self, path: Path, name: str, raw: Any) -> dict[str, str]:
        value = self.value(raw)
        if not isinstance(value, dict):
            raise self.fail(path, name, f"must be a map of strings, not {value!r}")
        out = {}
        for k, v in value.items():
            if isinstance(v, dict | list) or v is None:
                raise self.fail(path, f"{name}.{k}", f"must be a string, not {v!r}")
            out[str(k)] = _text(v)
        return out

    # -- bodies --------------------------------------------------------------------------
    def body(
        self,
        body: dict[str, Any],
        path: Path,
        context: str,
        attrs: dict[str, tuple[str, Callable[[Path, str, Any], Any]]],
        blocks: dict[str, Callable[[list[str], dict[str, Any], Path], None]],
        out: dict[str, Any],
    ) -> None:
        """Map one block body: known attributes into ``out``, known blocks to their handlers."""
        counts: dict[str, int] = {}
        for name, raw in body.items():
            if name == BLOCK_MARK:
                continue
            found = _block_list(raw)
            if found is not None:
                for labels, inner in found:
                    n = counts.get(name, 0)
                    counts[name] = n + 1
                    sub = path + ((name, n),)
                    handler = blocks.get(name)
                    if handler is None:
                        self.ignore_block(sub, name, labels, context)
                    else:
                        handler(labels, inner, sub)
                continue
            if name in blocks and name == "meta":  # meta = { ... } as an attribute
                out.setdefault("Meta", {}).update(self.string_map(path, name, raw))
                continue
            spec = attrs.get(name)
            if spec is None:
                self.ignore_attr(path, name, context)
                continue
            key, convert = spec
            out[key] = convert(path, name, raw)

    def labels(self, path: Path, name: str, labels: list[str], count: int) -> list[str]:
        if len(labels) != count:
            at = self.where(path)
            want = f"{count} label" + ("s" if count != 1 else "") if count else "no labels"
            raise HCLError(f"{at}block {name!r} takes {want}, got {len(labels)}")
        return labels

    # -- job ------------------------------------------------------------------------------
    def job(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        (job_id,) = self.labels(path, "job", labels, 1)
        job: dict[str, Any] = {"ID": job_id, "Name": job_id}
        defaults: dict[str, dict[str, Any]] = {}
        groups: list[dict[str, Any]] = []
        context = f'job "{job_id}"'

        def group(lab: list[str], inner: dict[str, Any], sub: Path) -> None:
            groups.append(self.group(lab, inner, sub))

        def task(lab: list[str], inner: dict[str, Any], sub: Path) -> None:
            # A task directly under the job: Nomad wraps it in a group of the same name.
            t = self.task(lab, inner, sub)
            g: dict[str, Any] = {"Name": t["Name"], "Count": 1, "Tasks": [t]}
            if t.get("Constraints"):
                g["Constraints"] = t.pop("Constraints")
            groups.append(g)

        self.body(
            body,
            path,
            context,
            {
                "name": ("Name", self.string),
                "namespace": ("Namespace", self.string),
                "region": ("Region", self.string),
                "type": ("Type", self.string),
                "priority": ("Priority", self.integer),
                "datacenters": ("Datacenters", self.strings),
            },
            {
                "group": group,
                "task": task,
                "constraint": lambda lab, inner, sub: job.setdefault("Constraints", []).append(
                    self.constraint(lab, inner, sub)
                ),
                "meta": lambda lab, inner, sub: job.setdefault("Meta", {}).update(
                    self.meta(lab, inner, sub)
                ),
                "update": lambda lab, inner, sub: defaults.__setitem__(
                    "Update", self.update(lab, inner, sub)
                ),
                "migrate": lambda lab, inner, sub: defaults.__setitem__(
                    "Migrate", self.migrate(lab, inner, sub)
                ),
                "reschedule": lambda lab, inner, sub: defaults.__setitem__(
                    "ReschedulePolicy", self.reschedule(lab, inner, sub)
                ),
            },
            job,
        )
        job.pop("Region", None)  # one region: accepted, not modelled
        for g in groups:
            for key, value in defaults.items():
                g[key] = {**value, **g.get(key, {})}
            if (
                "ReschedulePolicy" in g
            ):  # a partial block: the rest from Nomad's defaults for the type
                g["ReschedulePolicy"] = {
                    **_reschedule_defaults(job.get("Type", "service")),
                    **g["ReschedulePolicy"],
                }
        job["TaskGroups"] = groups
        return job

    def group(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        (name,) = self.labels(path, "group", labels, 1)
        group: dict[str, Any] = {"Name": name}
        tasks: list[dict[str, Any]] = []
        self.body(
            body,
            path,
            f'group "{name}"',
            {"count": ("Count", self.integer)},
            {
                "task": lambda lab, inner, sub: tasks.append(self.task(lab, inner, sub)),
                "constraint": lambda lab, inner, sub: group.setdefault("Constraints", []).append(
                    self.constraint(lab, inner, sub)
                ),
                "meta": lambda lab, inner, sub: group.setdefault("Meta", {}).update(
                    self.meta(lab, inner, sub)
                ),
                "update": lambda lab, inner, sub: group.__setitem__(
                    "Update", self.update(lab, inner, sub)
                ),
                "migrate": lambda lab, inner, sub: group.__setitem__(
                    "Migrate", self.migrate(lab, inner, sub)
                ),
                "reschedule": lambda lab, inner, sub: group.__setitem__(
                    "ReschedulePolicy", self.reschedule(lab, inner, sub)
                ),
            },
            group,
        )
        group.setdefault("Count", 1)
        for t in tasks:
            moved = t.pop("Constraints", [])
            if moved:
                group.setdefault("Constraints", []).extend(moved)
        group["Tasks"] = tasks
        return group

    def task(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        (name,) = self.labels(path, "task", labels, 1)
        task: dict[str, Any] = {"Name": name}
        self.body(
            body,
            path,
            f'task "{name}"',
            {"driver": ("Driver", self.string)},
            {
                "config": lambda lab, inner, sub: task.__setitem__("Config", self.config(inner)),
                "resources": lambda lab, inner, sub: task.__setitem__(
                    "Resources", self.resources(lab, inner, sub)
                ),
                "meta": lambda lab, inner, sub: task.setdefault("Meta", {}).update(
                    self.meta(lab, inner, sub)
                ),
                "constraint": lambda lab, inner, sub: task.setdefault("Constraints", []).append(
                    self.constraint(lab, inner, sub)
                ),
            },
            task,
        )
        return task

    def config(self, body: dict[str, Any]) -> dict[str, Any]:
        """A driver's free-form config: attributes as values, nested blocks as lists of maps."""
        out: dict[str, Any] = {}
        for name, raw in body.items():
            if name == BLOCK_MARK:
                continue
            found = _block_list(raw)
            if found is None:
                out[name] = self.value(raw)
                continue
            items = out.setdefault(name, [])
            for labels, inner in found:
                value = self.config(inner)
                for label in reversed(labels):
                    value = {label: value}
                items.append(value)
        return out

    def resources(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        self.labels(path, "resources", labels, 0)
        out: dict[str, Any] = {}
        self.body(
            body,
            path,
            "resources",
            {
                "cpu": ("CPU", self.integer),
                "memory": ("MemoryMB", self.integer),
                "disk": ("DiskMB", self.integer),
            },
            {},
            out,
        )
        return out

    def meta(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, str]:
        self.labels(path, "meta", labels, 0)
        return self.string_map(path, "meta", {k: v for k, v in body.items() if k != BLOCK_MARK})

    def constraint(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """Nomad's constraint block, shorthands (version, regexp, distinct_hosts, ...) included."""
        self.labels(path, "constraint", labels, 0)
        out: dict[str, Any] = {"LTarget": "", "RTarget": "", "Operand": "="}
        shorthand_rtarget = (
            "version",
            "semver",
            "regexp",
            "set_contains",
            "set_contains_any",
            "set_contains_all",
        )
        for name, raw in body.items():
            if name == BLOCK_MARK:
                continue
            if name == "attribute":
                out["LTarget"] = self.string(path, name, raw)
            elif name == "value":
                out["RTarget"] = self.string(path, name, raw)
            elif name in ("operator", "operand"):
                out["Operand"] = self.string(path, name, raw)
            elif name in shorthand_rtarget:
                out["Operand"], out["RTarget"] = name, self.string(path, name, raw)
            elif name == "distinct_hosts":
                if self.boolean(path, name, raw):
                    out["Operand"] = "distinct_hosts"
            elif name == "distinct_property":
                out["Operand"], out["LTarget"] = "distinct_property", self.string(path, name, raw)
            else:
                self.ignore_attr(path, name, "constraint")
        return out

    def update(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        self.labels(path, "update", labels, 0)
        out: dict[str, Any] = {}
        self.body(
            body,
            path,
            "update",
            {
                "max_parallel": ("MaxParallel", self.integer),
                "min_healthy_time": ("MinHealthyTime", self.duration),
                "healthy_deadline": ("HealthyDeadline", self.duration),
                "progress_deadline": ("ProgressDeadline", self.duration),
                "auto_revert": ("AutoRevert", self.boolean),
                "canary": ("Canary", self.integer),
                "auto_promote": ("AutoPromote", self.boolean),
            },
            {},
            out,
        )
        return out

    def migrate(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        self.labels(path, "migrate", labels, 0)
        out: dict[str, Any] = {}
        self.body(
            body,
            path,
            "migrate",
            {
                "max_parallel": ("MaxParallel", self.integer),
                "health_check": ("HealthCheck", self.string),
                "min_healthy_time": ("MinHealthyTime", self.duration),
                "healthy_deadline": ("HealthyDeadline", self.duration),
            },
            {},
            out,
        )
        return out

    def reschedule(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        self.labels(path, "reschedule", labels, 0)
        out: dict[str, Any] = {}
        self.body(
            body,
            path,
            "reschedule",
            {
                "attempts": ("Attempts", self.integer),
                "interval": ("Interval", self.duration),
                "delay": ("Delay", self.duration),
                "delay_function": ("DelayFunction", self.string),
                "max_delay": ("MaxDelay", self.duration),
                "unlimited": ("Unlimited", self.boolean),
            },
            {},
            out,
        )
        return out


def _reschedule_defaults(job_type: str) -> dict[str, Any]:
    from node.spec.jobspec import default_reschedule
    from node.spec.nomadjson import to_nomad

    return to_nomad(default_reschedule(job_type))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _variables(data: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for labels, body in _block_list(data.get("variable")) or []:
        if len(labels) == 1 and "default" in body:
            found[labels[0]] = body["default"]
    return found


def parse_hcl(text: str, source: str = "") -> Parsed:
    """A Nomad HCL2 jobspec -> the API job JSON and warnings; raises HCLError."""
    if not isinstance(text, str):
        raise HCLError("the jobspec must be HCL text")
    data, blocks, attrs = load_hcl(text, source)
    conv = _Converter(blocks, attrs, _variables(data), source)
    jobs = _block_list(data.get("job")) or []
    if len(jobs) != 1:
        found = "no job block" if not jobs else f"{len(jobs)} job blocks"
        raise HCLError(
            f'{source + ": " if source else ""}a jobspec holds exactly one job "ID" {{ ... }} block; found {found}'
        )
    for name, raw in data.items():
        if name in ("job", "variable", BLOCK_MARK):
            continue
        found_blocks = _block_list(raw)
        if found_blocks is None:
            conv.ignore_attr((), name, "the file")
        for n, (labels, _) in enumerate(found_blocks or []):
            conv.ignore_block(((name, n),), name, labels, "the file")
    labels, body = jobs[0]
    job = conv.job(labels, body, (("job", 0),))
    return Parsed(job, conv.warnings)


def looks_like_hcl(path: str, text: str) -> bool:
    """Whether a jobspec file is HCL (by name, or by not starting like JSON)."""
    if path.endswith((".hcl", ".nomad")):
        return True
    if path.endswith(".json"):
        return False
    return not text.lstrip().startswith(("{", "["))
