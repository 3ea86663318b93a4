"""The leader's own eval writes: new evals in size-bounded EvalUpsert entries, and evals it ends.

Shared by the lifecycle, the deployment watcher and the drainer, so every
eval the leader writes itself goes through one batching rule.
"""

from __future__ import annotations

from typing import Any

from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import EVAL_FAILED, EVAL_TERMINAL, SECOND, Evaluation
from node.leader.nodeevals import eval_chunks
from node.leader.shims import RaftApplier, StateReads
from scheduler.evals import new_eval

TRIGGER_FAILED_FOLLOWUP = "failed-eval-follow-up"
WRITE_BATCH = 200  # evals per EvalUpsert entry


class EvalWriter:
    """Batches the leader's own eval writes into EvalUpsert entries."""

    def __init__(self, state: StateReads, raft: RaftApplier, *, max_entry_bytes: int, followup_delay: float, log: Any) -> None:
        self.state = state
        self.raft = raft
        self.max_entry_bytes = max_entry_bytes
        self.followup_delay = followup_delay
        self.log = log.bind(component="eval_writer")

    async def create(self, evals: list[Evaluation]) -> None:
        for chunk in eval_chunks(evals, self.max_entry_bytes // 2, WRITE_BATCH):
            await self.raft.propose(m.EvalUpsert(evals=chunk))

    async def finish(self, evals: list[Evaluation], status: str, description: str) -> None:
        """Give ``evals`` a terminal status, skipping those already finished in state."""

        def current(reader: StateReader) -> list[Evaluation]:
            out = []
            for ev in evals:
                now = reader.eval(ev.id)
                if now is not None and now.status not in EVAL_TERMINAL:
                    now.status = status
                    now.status_description = description
                    out.append(now)
            return out

        todo = await self.state.local(current)
        extra: list[Evaluation] = []
        if status == EVAL_FAILED:
            # Nomad: a failed eval gets a delayed follow-up so the job is tried again later.
            wait_until = self.state.state_now() + int(self.followup_delay * SECOND)
            for ev in todo:
                follow = new_eval(ev, TRIGGER_FAILED_FOLLOWUP, wait_until=wait_until, previous_eval=ev.id)
                ev.next_eval = follow.id
                extra.append(follow)
        if todo:
            await self.create(todo + extra)
            self.log.info("evaluations finished by the leader", status=status, count=len(todo))
