"""One short seeded run for the jepsen tests, and what they read back from its directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jepsen_like.runner import RESULTS_FILE, RUN_FILE, RunOptions, run


@dataclass
class ShortRun:
    """A finished run: its exit code and the files the tests look at."""

    out: Path
    code: int
    results: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    meta: dict[str, Any]

    def checker(self, name: str) -> dict[str, Any]:
        return next(r for r in self.results if r["checker"] == name)

    def explain(self) -> str:
        """Every checker's verdict and every fault window: the assertion message of a failed test."""
        checks = "; ".join(f"{r['checker']} {r['status']}: {r['summary']}" for r in self.results)
        return f"report in {self.out}: {checks}; faults: " + " | ".join(f.get("detail", "") for f in self.faults)


def short_run(out: Path, seed: int, nemeses: list[str], **overrides: Any) -> ShortRun:
    """A 15 s run of register, set and journal with faults every 1-2 s (``overrides`` change any option)."""
    settings: dict[str, Any] = {
        "quiet": (1.0, 2.0),
        "hold": (1.5, 3.0),
        "workloads": ["register", "set", "journal"],
        "time": 15.0,
        "checker_timeout": 60.0,
        "convergence_wait": 60.0,
    } | overrides
    code = run(RunOptions(out=str(out), seed=seed, nemeses=nemeses, keep_cluster_data=False, **settings),
               log=lambda *_: None)
    faults_file = out / "faults.jsonl"
    return ShortRun(
        out=out,
        code=code,
        results=json.loads((out / RESULTS_FILE).read_text()),
        faults=[json.loads(line) for line in faults_file.read_text().splitlines()] if faults_file.exists() else [],
        meta=json.loads((out / RUN_FILE).read_text()),
    )
