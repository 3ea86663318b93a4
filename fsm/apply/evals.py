"""Evaluations: stored as entries bring them.

Most entries carry the evals their change calls for (a job registered, a
node down, a plan's follow-ups), so every other apply module stores its
entry's evals through ``upsert_evals``.
"""

from __future__ import annotations

from typing import Any

from fsm import messages as m
from fsm.apply.summaries import set_queued
from fsm.structs import Evaluation
from fsm.validate import bad, check_eval
from fsm.writer import StateWriter


def upsert_evals(w: StateWriter, evals: list[Evaluation]) -> list[str]:
    """Store ``evals`` (all checked before any is written); returns their ids, in order."""
    for ev in evals:
        check_eval(ev)
    for ev in evals:
        old = w.eval(ev.id)
        if old is not None and old.job_id != ev.job_id:
            # Its allocs name the old job; moving it would orphan them when
            # either job is purged.
            raise bad(f"evaluation {ev.id} belongs to job {old.job_id}; it cannot move to job {ev.job_id}")
        w.put_eval(ev, old)
        set_queued(w, ev)
    return [ev.id for ev in evals]


def eval_upsert(w: StateWriter, msg: m.EvalUpsert) -> dict[str, Any]:
    """A scheduler's or the broker's evals: new ones, and status changes of known ones."""
    return {"eval_ids": upsert_evals(w, msg.evals)}
