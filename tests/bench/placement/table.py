"""Plain-text tables: every part prints its figures beside the published anchor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned first column, right-aligned others, two spaces apart."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def ms(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.1f} ms"


def ratio(x: float | None, base: float | None) -> str:
    if x is None or not base or x != x or base != base:
        return "n/a"
    return f"{x / base:.2f}x"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("meets" if ok else "BELOW")
