"""Errors of the scheduler package."""

from __future__ import annotations


class SchedulerError(Exception):
    """The scheduler cannot build a plan for an evaluation (a bug or corrupt input)."""


class PlanTooLargeError(SchedulerError):
    """One item of a plan does not fit in a raft entry on its own."""
