"""Admission: a separate step in front of placement that may hold placements back.

Kueue-style quota cohorts will live here: before any node is chosen, a
task group's wanted placements are checked against its queue's quota
(nominal, borrowing and lending limits), and what is not admitted stays
queued with a reason, exactly like a placement that found no node. Keeping
this apart from feasibility means quota never leaks into node rules, and
preemption can later decide victims by queue without touching placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsm.structs import Job, TaskGroup


@dataclass(frozen=True)
class Admitted:
    count: int  # placements that may go ahead
    reason: str = ""  # why the rest wait (shown in the eval's failed allocations)


class Admission:
    """Decides how many of ``wanted`` placements of a group may be placed now."""

    def admit(self, job: Job, group: TaskGroup, wanted: int) -> Admitted:
        raise NotImplementedError


class AdmitAll(Admission):
    """No quotas: everything is admitted."""

    def admit(self, job: Job, group: TaskGroup, wanted: int) -> Admitted:
        return Admitted(wanted)


ADMIT_ALL = AdmitAll()
