"""Placement: turn an evaluation and a consistent state snapshot into a plan.

Nomad's shape, in pure functions over ``fsm`` records (no I/O, no clock: the
caller passes ``now``), so every rule can be tested on hand-built states:

- ``reconcile``: desired allocations per task group versus existing ones
  (place, stop, replace lost, reschedule failed, update on a new version).
- ``queueing``: queue admission cycles and preemption (Kueue's), before any
  placement: the leader commits their decisions; a job waiting in its queue
  is never placed.
- ``feasibility``: validation rules (hard filters), one small class each.
- ``ranking``: preference rules combined in strict priority, continuous
  scores quantized into buckets (Protean), ties broken at random.
- ``generic`` (service and batch jobs) and ``system`` (one alloc per eligible
  node) build a ``plan.Plan``; ``plan`` turns it into PlanApply entries.
- ``evals``: ``new_eval``, the one factory for a new evaluation (the servers
  use it too), and ``finish_eval``, how both schedulers end the one they ran.

``scheduler`` imports ``fsm`` only; the leader side (broker, workers, plan
applier) lives in ``node/``.
"""
