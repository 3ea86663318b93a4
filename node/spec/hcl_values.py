"""Typed attribute values of an HCL jobspec, each error and warning naming its line.

``HCLValues`` is the half of HCL-to-JSON conversion that knows nothing of
Nomad: resolving ``var.x`` defaults and ``$${`` escapes, checking that an
attribute is a string, whole number, bool, duration, list or map (an
``HCLError`` naming the attribute and its line otherwise), and walking a block
body into known attributes, known sub-blocks and ignored-with-a-warning rest.
``node.spec.hcl_blocks`` builds Nomad's blocks on top of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fsm.structs import SECOND
from node.spec.errors import HCLError
from node.spec.hcl_text import BLOCK_MARK, AttrLines, BlockLines, Path, block_list
from node.spec.units import parse_duration

_INTERP = re.compile(r"\$\{\s*var\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}")

# How one attribute is read: its Nomad JSON key, and the converter that checks its value.
AttrSpec = tuple[str, Callable[[Path, str, Any], Any]]
# What one kind of sub-block does with (labels, body, path).
BlockHandler = Callable[[list[str], dict[str, Any], Path], None]


class HCLValues:
    """Attribute values and block bodies of one HCL file, with the lines to name in errors and warnings."""

    def __init__(
        self,
        blocks: BlockLines,
        attrs: AttrLines,
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
        """The line of a block (or of one of its attributes); 0 when unknown."""
        if attr is not None:
            return self.attrs.get((path, attr), 0)
        return self.blocks.get(path, 0)

    def where(self, path: Path, attr: str | None = None) -> str:
        """The prefix of an error message: "FILE:LINE: " or "line LINE: "."""
        line = self.line_of(path, attr)
        if self.source:
            return f"{self.source}:{line}: " if line else f"{self.source}: "
        return f"line {line}: " if line else ""

    def fail(self, path: Path, attr: str, message: str) -> HCLError:
        """An error naming the attribute and its line (raised by the caller)."""
        return HCLError(f"{self.where(path, attr)}{attr}: {message}")

    def ignore_block(self, path: Path, name: str, labels: list[str], context: str) -> None:
        """Warn that a block Caravan does not model was dropped, so real Nomad specs still load."""
        label = "".join(f' "{lab}"' for lab in labels)
        line = self.line_of(path)
        at = f" at line {line}" if line else ""
        self.warnings.append(
            f'block "{name}"{label}{at} in {context} is not supported by Caravan and was ignored'
        )

    def ignore_attr(self, path: Path, name: str, context: str) -> None:
        """Warn that an attribute Caravan does not model was dropped."""
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
        """A string attribute (numbers are taken as their text, as HCL converts them)."""
        value = self.value(raw)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(path, name, f"must be a string, not {value!r}")
        return str(value)

    def integer(self, path: Path, name: str, raw: Any) -> int:
        """A whole-number attribute (2.0 is 2)."""
        value = self.value(raw)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise self.fail(path, name, f"must be a whole number, not {value!r}")
        return value

    def boolean(self, path: Path, name: str, raw: Any) -> bool:
        """A true/false attribute."""
        value = self.value(raw)
        if not isinstance(value, bool):
            raise self.fail(path, name, f"must be true or false, not {value!r}")
        return value

    def duration(self, path: Path, name: str, raw: Any) -> int:
        """A Go duration string ("30s") as integer nanoseconds, as in Nomad's API."""
        value = self.value(raw)
        if not isinstance(value, str):
            raise self.fail(
                path, name, f'must be a duration string like "30s" or "1h", not {value!r}'
            )
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.fail(path, name, str(exc)) from None
        return int(round(seconds * SECOND))

    def strings(self, path: Path, name: str, raw: Any) -> list[str]:
        """A list-of-strings attribute (datacenters)."""
        value = self.value(raw)
        if not isinstance(value, list):
            raise self.fail(path, name, f'must be a list of strings like ["dc1"], not {value!r}')
        return [self.string(path, name, v) for v in value]

    def string_map(self, path: Path, name: str, raw: Any) -> dict[str, str]:
        """A map of strings (meta): scalar values are taken as their text."""
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
        attrs: dict[str, AttrSpec],
        blocks: dict[str, BlockHandler],
        out: dict[str, Any],
    ) -> None:
        """Map one block body: known attributes into ``out``, known blocks to their handlers."""
        counts: dict[str, int] = {}
        for name, raw in body.items():
            if name == BLOCK_MARK:
                continue
            found = block_list(raw)
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
        """``labels``, if the block has the ``count`` labels Nomad gives it (job "x", group "y"); else an HCLError."""
        if len(labels) != count:
            at = self.where(path)
            want = f"{count} label" + ("s" if count != 1 else "") if count else "no labels"
            raise HCLError(f"{at}block {name!r} takes {want}, got {len(labels)}")
        return labels

    def flat(self, name: str, labels: list[str], body: dict[str, Any], path: Path, attrs: dict[str, AttrSpec]) -> dict[str, Any]:
        """A label-less block of attributes only (resources, update, migrate, reschedule) as its JSON map."""
        self.labels(path, name, labels, 0)
        out: dict[str, Any] = {}
        self.body(body, path, name, attrs, {}, out)
        return out


def _text(value: Any) -> str:
    """A scalar as HCL would interpolate it into a string (true, 3 rather than True, 3.0)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

