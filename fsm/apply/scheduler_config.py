"""The scheduler configuration: replace the placement policy, compare-and-set as Nomad's.

The leader checks the policy before the entry reaches the log; apply checks
it again (``config_problem``), so an entry from a buggy or older leader is
refused alike on every replica instead of leaving a policy the scheduler
cannot build. A failed compare-and-set is not a rejection, as in Nomad: it
changes nothing and answers ``updated: False`` with the stored modify index,
so the caller can read again and retry.
"""

from __future__ import annotations

from typing import Any

from fsm import codec
from fsm import messages as m
from fsm.scheduler_config import CONFIG_KEY, CONFIG_TABLE, config_problem
from fsm.topics import SCHEDULER_CONFIG_KEY, SCHEDULER_CONFIG_UPDATED, TOPIC_OPERATOR
from fsm.validate import bad
from fsm.writer import StateWriter


def scheduler_config_set(w: StateWriter, msg: m.SchedulerConfigSet) -> dict[str, Any]:
    """Store ``msg.config`` (stamped with this index) unless its CAS index is stale; journal it."""
    problem = config_problem(msg.config)
    if problem is not None:
        raise bad(problem)
    if msg.cas_index is not None and msg.cas_index < 0:
        raise bad("cas_index must be >= 0 (0: only if the configuration was never set)")
    current = w.scheduler_config()
    if msg.cas_index is not None and msg.cas_index != current.modify_index:
        return {"updated": False, "modify_index": current.modify_index}
    config = msg.config
    config.create_index = current.create_index or w.index
    config.modify_index = w.index
    raw = codec.encode(config)
    w.txn.put(CONFIG_KEY, raw, db=w.dbs[CONFIG_TABLE])
    w.touched.add(CONFIG_TABLE)
    w.record_packed(TOPIC_OPERATOR, SCHEDULER_CONFIG_UPDATED, SCHEDULER_CONFIG_KEY, raw)
    return {"updated": True, "modify_index": w.index}
