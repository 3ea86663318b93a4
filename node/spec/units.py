"""Go-style durations and sizes, as operators copy them from Nomad configs and jobspecs.

One reader of units for the whole server: the config file, job specs (JSON
and HCL), the HTTP API's query parameters and the CLI's flags all parse
"5m" and "4MiB" here, so they all accept and refuse the same spellings.
"""

from __future__ import annotations

import re

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign, as Go accepts
    "\u03bcs": 1e-6,  # Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)([a-zµμ]+)")


def parse_duration(text: str) -> float:
    """Parse a Go duration ("250ms", "5m", "1h30m", "1.5h", "-2s") into seconds.

    Go's grammar, because operators copy these values from Nomad configs:
    an optional sign, then one or more number+unit pairs; "0" alone needs no
    unit. Raises ValueError with the reason.
    """
    if not isinstance(text, str):
        raise ValueError(f'expected a duration string like "5m", got {text!r}')
    rest = text
    sign = 1.0
    if rest[:1] in ("+", "-"):
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f'invalid duration {text!r}: expected a number and a unit, like "5m"')
    total = 0.0
    pos = 0
    while pos < len(rest):
        match = _DURATION_PART.match(rest, pos)
        if match is None:
            raise ValueError(f'invalid duration {text!r}: expected number+unit pairs like "1h30m"')
        number, unit = match.groups()
        if unit not in _DURATION_UNITS:
            units = ", ".join(u for u in _DURATION_UNITS if u.isascii())
            raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r} (use {units})")
        total += float(number) * _DURATION_UNITS[unit]
        pos = match.end()
    return sign * total


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(value: int | str) -> int:
    """Bytes from an integer or a string like "48KiB", "4MiB", "1GB". Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f'expected a size like "4MiB" or a number of bytes, got {value!r}')
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]
    raise ValueError(f'expected a size like "4MiB" or a number of bytes, got {value!r}')


def go_duration(ns: int) -> str:
    """Nanoseconds as Go's ``time.Duration.String`` prints them ("1h0m0s", "1m30s", "1.5s", "500ms", "0s").

    Nomad's messages print durations this way; an operator comparing ours
    with Nomad's (or pasting one back into a spec) sees the same text.
    """
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = _fraction(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _fraction(value: int, size: int) -> str:
    """``value / size`` in decimal, trailing zeros of the fraction dropped (as Go's fmtFrac)."""
    whole, frac = divmod(value, size)
    if not frac:
        return str(whole)
    digits = len(str(size)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")
