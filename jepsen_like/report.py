"""Reports of a run: summary.txt, timeline.html and plot.png beside the history.

* ``summary.txt`` -- the verdict, each checker's line, counts, fault windows.
* ``timeline.html`` -- self-contained (inline SVG, no scripts from
  anywhere): one row per client lane, one bar per operation from invoke to
  completion (green ok, grey fail, orange info -- drawn to the end of the
  run, since it may take effect any time later), fault windows shaded
  across all rows, and every operation a checker blamed outlined in red and
  listed at the top with its reason.
* ``plot.png`` -- throughput (completions per second by outcome) and
  latency (per operation, log scale) over time, fault windows shaded. Needs
  matplotlib (``pip install -e '.[jepsen]'``); without it the summary says
  the plot was skipped.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jepsen_like import availability
from jepsen_like.checkers import CheckerResult, split_failures
from jepsen_like.history import Event, Operation, operations_from_events
from jepsen_like.recorder import Fault

SUMMARY_FILE = "summary.txt"
TIMELINE_FILE = "timeline.html"
PLOT_FILE = "plot.png"

FAULT_COLORS = {
    "kill": "#e4572e",
    "kill-all": "#a4243b",
    "pause": "#4c72b0",
    "partition": "#8172b2",
    "snapshot-lag": "#55a868",
    "clock": "#c49c3a",
    "client-kill": "#64b5cd",
    "drain": "#ccb974",
    "clients": "#8c613c",
    "member": "#937860",
}
STATUS_COLORS = {"ok": "#4caf50", "fail": "#9e9e9e", "info": "#ff9800"}


def write(
    out: Path,
    meta: dict[str, Any],
    events: dict[str, list[Event]],
    faults: list[Fault],
    results: list[CheckerResult],
    code: int,
) -> None:
    ops = {name: operations_from_events(evs) for name, evs in events.items()}
    end = _end_time(meta, ops, faults)
    plot_note = write_plot(out / PLOT_FILE, ops, faults, end)
    (out / SUMMARY_FILE).write_text(
        summary_text(meta, ops, faults, results, code, plot_note), encoding="utf-8"
    )
    (out / TIMELINE_FILE).write_text(
        timeline_html(meta, ops, faults, results, code, end), encoding="utf-8"
    )


def _end_time(meta: dict[str, Any], ops: dict[str, list[Operation]], faults: list[Fault]) -> float:
    end = float((meta.get("phases") or {}).get("end") or 0.0)
    for group in ops.values():
        for op in group:
            end = max(end, op.return_time or op.call_time)
    for fault in faults:
        end = max(end, fault.end or fault.start)
    return max(end, 1.0)


def _verdict(code: int) -> str:
    return {0: "VALID", 1: "ANOMALY", 2: "UNKNOWN"}.get(code, "?")


# -- summary --------------------------------------------------------------------------
def summary_text(
    meta: dict[str, Any],
    ops: dict[str, list[Operation]],
    faults: list[Fault],
    results: list[CheckerResult],
    code: int,
    plot_note: str,
) -> str:
    options = meta.get("options", {})
    lines = [
        f"verdict: {_verdict(code)}",
        f"seed {meta.get('seed')}  nodes {options.get('nodes')}  time {options.get('time')}s  "
        f"nemesis {','.join(options.get('nemeses', []))}  workloads {','.join(options.get('workloads', []))}",
    ]
    lines.append(f"code under test: {meta.get('code', 'unknown')}")
    if options.get("server_env"):
        lines.append(f"server environment (test switches): {options['server_env']}")
    lines.append("")
    lines.append("checkers:")
    for r in results:
        scope = f"/{r.workload}" if r.workload else ""
        lines.append(f"  {r.status:8} {r.checker}{scope}: {r.summary}")
        explanation = r.details.get("explanation") if isinstance(r.details, dict) else None
        if explanation:
            lines += ["    " + line for line in str(explanation).splitlines()]
    lines += failure_lines(results, meta)
    lines.append("")
    lines.append("operations:")
    for name, group in ops.items():
        counts = Counter(op.status for op in group)
        kinds = Counter(
            op.input.get("f", "?") if isinstance(op.input, dict) else "?" for op in group
        )
        lines.append(
            f"  {name}: {len(group)} ({counts.get('ok', 0)} ok, {counts.get('fail', 0)} fail, "
            f"{counts.get('info', 0)} info); "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        )
    lines.append("")
    lines.append(f"faults: {len(faults)}")
    for f in faults:
        end = f"{f.end:.1f}" if f.end is not None else "open"
        lines.append(f"  {f.start:7.1f}-{end:>7}s {f.kind:12} {f.detail}")
    figures = next((r for r in results if r.checker == "availability"), None)
    if figures is not None and figures.details.get("windows"):
        lines.append("")
        lines += availability.summary_lines(figures.details)
    if meta.get("skipped"):
        lines.append("")
        lines.append("skipped:")
        lines += [f"  {k}: {v}" for k, v in meta["skipped"].items()]
    lines.append("")
    lines.append(f"plot: {plot_note}")
    return "\n".join(lines) + "\n"


def failure_lines(results: list[CheckerResult], meta: dict[str, Any]) -> list[str]:
    """Product anomalies and harness failures, apart: a bug found, or a run that could not be carried out as meant."""
    anomalies, harness = split_failures(results)
    lines = ["", f"product anomalies: {len(anomalies)}"]
    lines += [
        f"  {r.checker}{'/' + r.workload if r.workload else ''}: {r.summary}" for r in anomalies
    ]
    lines.append(
        f"harness failures: {len(harness)}"
        + (
            " (the harness could not do what it meant to: the run is inconclusive there, not a product finding)"
            if harness
            else ""
        )
    )
    lines += [f"  {r.summary}" for r in harness]
    if "heal_checks" in meta:
        lines.append(
            f"heal checks: {meta['heal_checks']} (every server that should run, up and answering after each heal)"
        )
    members = meta.get("members") or {}
    if members.get("retired"):
        lines.append(
            f"members at the end: {', '.join(members.get('final', []))}; retired: {', '.join(members['retired'])}"
        )
    return lines


# -- timeline ---------------------------------------------------------------------------------
def _lane_names(meta: dict[str, Any]) -> dict[int, str]:
    names: dict[int, str] = {}
    for workload, (first, count) in (meta.get("lanes") or {}).items():
        for i in range(count):
            names[first + i] = f"{workload} {i}" if workload != "final" else "final reads"
    return names


def _describe(op: Operation) -> str:
    value = op.input if not isinstance(op.input, dict) else {k: v for k, v in op.input.items()}
    out = op.output
    if isinstance(out, list) and len(out) > 10:
        out = f"[{len(out)} elements]"
    end = "?" if op.return_time is None else f"{op.return_time:.3f}"
    key = f" key={op.key}" if op.key is not None else ""
    return f"p{op.process}{key} {json.dumps(value, default=str)} -> {op.status} {out if op.status != 'info' else '?'} [{op.call_time:.3f}..{end}]"


def timeline_html(
    meta: dict[str, Any],
    ops: dict[str, list[Operation]],
    faults: list[Fault],
    results: list[CheckerResult],
    code: int,
    end: float,
) -> str:
    total_lanes = int(meta.get("total_lanes") or 1)
    lane_names = _lane_names(meta)
    lanes_used = sorted(
        {op.process % total_lanes for group in ops.values() for op in group} | set(lane_names)
    )
    row_of = {lane: i for i, lane in enumerate(lanes_used)}
    px_per_s = 40.0
    left, top, row_h, bar_h = 110, 40, 22, 14
    width = int(left + end * px_per_s + 40)
    height = top + row_h * max(1, len(lanes_used)) + 30

    def x(t: float) -> float:
        return left + t * px_per_s

    marked: dict[tuple[str, int, float], list[str]] = {}
    for r in results:
        for h in r.highlight:
            marked.setdefault(
                (h["workload"], h["process"], round(float(h["call_time"]), 6)), []
            ).append(f"{r.checker}: {h['why']}")

    svg: list[str] = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for s in range(0, int(end) + 1, 5):  # time grid
        svg.append(
            f'<line x1="{x(s):.1f}" y1="{top - 8}" x2="{x(s):.1f}" y2="{height - 25}" class="grid"/>'
        )
        svg.append(f'<text x="{x(s):.1f}" y="{height - 10}" class="tick">{s}s</text>')
    for f in faults:  # fault windows behind everything
        color = FAULT_COLORS.get(f.kind, "#999")
        f_end = f.end if f.end is not None else end
        svg.append(
            f'<rect x="{x(f.start):.1f}" y="{top - 8}" width="{max(1.0, (f_end - f.start) * px_per_s):.1f}" '
            f'height="{height - top - 17}" fill="{color}" fill-opacity="0.13">'
            f"<title>{html.escape(f'{f.kind} {f.start:.1f}-{f_end:.1f}s: {f.detail}')}</title></rect>"
        )
        svg.append(
            f'<text x="{x(f.start) + 2:.1f}" y="{top - 12}" class="fault" fill="{color}">{html.escape(f.kind)}</text>'
        )
    for lane, row in row_of.items():
        y = top + row * row_h
        svg.append(
            f'<text x="4" y="{y + bar_h - 2}" class="lane">{html.escape(lane_names.get(lane, f"lane {lane}"))}</text>'
        )
    anchors: list[tuple[str, str, str]] = []
    for workload, group in ops.items():
        for op in group:
            row = row_of.get(op.process % total_lanes, 0)
            y = top + row * row_h
            t_end = op.return_time if op.return_time is not None else end
            w = max(1.5, (t_end - op.call_time) * px_per_s)
            reasons = marked.get((workload, op.process, round(float(op.call_time), 6)))
            title = html.escape(
                f"{workload} {_describe(op)}" + ("\n" + "\n".join(reasons) if reasons else "")
            )
            attrs = f'fill="{STATUS_COLORS[op.status]}"'
            if op.status == "info":
                attrs += ' fill-opacity="0.35"'
            ident = ""
            if reasons:
                ident = f"op{len(anchors)}"
                anchors.append((ident, f"{workload} {_describe(op)}", "; ".join(reasons)))
                attrs += ' stroke="#d50000" stroke-width="3"'
            svg.append(
                f'<rect {f"id={chr(34)}{ident}{chr(34)} " if ident else ""}x="{x(op.call_time):.1f}" y="{y}" '
                f'width="{w:.1f}" height="{bar_h}" {attrs}><title>{title}</title></rect>'
            )
    svg.append("</svg>")

    rows = "".join(
        f"<tr class='{r.status}'><td>{r.status}</td><td>{html.escape(r.checker)}{('/' + html.escape(r.workload)) if r.workload else ''}</td>"
        f"<td>{html.escape(r.summary)}</td></tr>"
        for r in results
    )
    anomaly_list = "".join(
        f"<li><a href='#{ident}'>{html.escape(text)}</a> &mdash; {html.escape(why)}</li>"
        for ident, text, why in anchors
    )
    explanations = "".join(
        f"<pre>{html.escape(str(r.details.get('explanation')))}</pre>"
        for r in results
        if isinstance(r.details, dict) and r.details.get("explanation")
    )
    legend = (
        " ".join(
            f"<span class='key' style='background:{c}'></span>{k}" for k, c in STATUS_COLORS.items()
        )
        + " &nbsp; faults: "
        + " ".join(
            f"<span class='key' style='background:{c};opacity:.4'></span>{k}"
            for k, c in FAULT_COLORS.items()
        )
    )
    options = meta.get("options", {})
    title = f"jepsen_like run, seed {meta.get('seed')}: {_verdict(code)}"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; }}
h1 {{ font-size: 20px; }} .verdict-1 {{ color: #d50000; }} .verdict-0 {{ color: #2e7d32; }} .verdict-2 {{ color: #ef6c00; }}
table {{ border-collapse: collapse; }} td {{ padding: 2px 8px; border-bottom: 1px solid #eee; vertical-align: top; }}
tr.anomaly td {{ color: #d50000; font-weight: bold; }} tr.unknown td {{ color: #ef6c00; }} tr.skipped td {{ color: #888; }}
.scroll {{ overflow-x: auto; border: 1px solid #ddd; }}
.grid {{ stroke: #eee; }} .tick, .lane, .fault {{ font-size: 11px; }}
.key {{ display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 10px; vertical-align: middle; }}
pre {{ background: #fafafa; padding: 8px; overflow-x: auto; }}
</style></head><body>
<h1 class="verdict-{code}">{html.escape(title)}</h1>
<p>{options.get("nodes")} servers, {options.get("time")}s, nemesis {html.escape(",".join(options.get("nemeses", [])))},
workloads {html.escape(",".join(options.get("workloads", [])))}; {sum(len(g) for g in ops.values())} operations, {len(faults)} faults.
Hover a bar for the operation; anomalous operations are outlined in red.</p>
<table>{rows}</table>
{("<h2>Anomalous operations</h2><ul>" + anomaly_list + "</ul>") if anomaly_list else ""}
{explanations}
<p>{legend}</p>
<div class="scroll">{"".join(svg)}</div>
</body></html>
"""


# -- plot ----------------------------------------------------------------------------------------
def write_plot(
    path: Path, ops: dict[str, list[Operation]], faults: Sequence[Fault], end: float
) -> str:
    """Throughput and latency over time with fault windows; returns a note for the summary."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped (matplotlib is not installed: pip install -e '.[jepsen]')"
    fig, (ax_tp, ax_lat) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    bins = max(1, int(end) + 1)
    for status, color in STATUS_COLORS.items():
        counts = [0] * bins
        for group in ops.values():
            for op in group:
                if op.status == status:
                    t = op.return_time if op.return_time is not None else op.call_time
                    counts[min(bins - 1, int(t))] += 1
        ax_tp.step(range(bins), counts, where="post", color=color, label=status)
    ax_tp.set_ylabel("completions / s")
    ax_tp.legend(loc="upper right")
    markers = {"register": "o", "set": "s"}
    for name, group in ops.items():
        done = [op for op in group if op.status != "info" and op.return_time is not None]
        if not done:
            continue
        ax_lat.scatter(
            [op.call_time for op in done],
            [max(0.1, (op.return_time - op.call_time) * 1000.0) for op in done],  # type: ignore[operator]
            s=4,
            c=[STATUS_COLORS[op.status] for op in done],
            marker=markers.get(name, "o"),
            label=name,
            alpha=0.6,
        )
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency (ms, ok/fail)")
    ax_lat.set_xlabel("time since start (s)")
    seen: set[str] = set()
    for f in faults:
        color = FAULT_COLORS.get(f.kind, "#999")
        for ax in (ax_tp, ax_lat):
            ax.axvspan(
                f.start,
                f.end if f.end is not None else end,
                color=color,
                alpha=0.15,
                label=f.kind if ax is ax_lat and f.kind not in seen else None,
            )
        seen.add(f.kind)
    ax_lat.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path.name)
