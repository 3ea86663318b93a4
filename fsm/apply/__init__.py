"""The apply functions, one module per kind of object the log changes.

Each function gets the entry's ``StateWriter`` and its decoded payload and
returns a small result map. A deterministic rejection raises
``ApplyRejected``; the FSM undoes the entry's writes, so a rejected entry
changes nothing. ``fsm.handlers`` maps every message type to its function.

The modules import one another only downwards: ``rejects`` and
``summaries`` at the bottom, then ``evals`` (most entries carry evals),
``jobs``, and the rest above them.
"""
