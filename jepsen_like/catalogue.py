"""Every nemesis and workload a run can name, in one place for the runner and the command line.

The base sets live beside their code (``nemesis.FAULTS``,
``workloads.WORKLOADS``); faults and workloads in modules of their own
(which import those, so cannot be listed there) join them here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jepsen_like.checkers import CheckerResult
from jepsen_like.clients_fault import SilenceClients
from jepsen_like.failover import FailoverWorkload
from jepsen_like.history import Event
from jepsen_like.member_fault import MemberChange
from jepsen_like.nemesis import FAULTS as BASE_FAULTS
from jepsen_like.nemesis import Fault
from jepsen_like.quota import QuotaWorkload
from jepsen_like.quota_check import check_quota
from jepsen_like.workloads import WORKLOADS as BASE_WORKLOADS
from jepsen_like.workloads import Workload

FAULTS: dict[str, Callable[[], Fault]] = {
    **BASE_FAULTS,
    SilenceClients.name: SilenceClients,
    MemberChange.name: MemberChange,
}
WORKLOADS: dict[str, Callable[[], Workload]] = {
    **BASE_WORKLOADS,
    FailoverWorkload.name: FailoverWorkload,
    QuotaWorkload.name: QuotaWorkload,
}

#: Workloads a nemesis needs: its checker judges what they record (added to a run that lacks them).
NEEDS_WORKLOAD: dict[str, str] = {SilenceClients.name: FailoverWorkload.name}

#: Checkers of workloads in modules of their own: workload -> check(that workload's events).
WORKLOAD_CHECKS: dict[str, Callable[[Sequence[Event]], CheckerResult]] = {
    QuotaWorkload.name: check_quota
}
