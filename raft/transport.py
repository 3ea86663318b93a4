"""pysyncobj TCP transport with Caravan's hooks in front of the library.

pysyncobj builds its transport inside ``SyncObj.__init__`` and starts the tick
thread before the constructor returns, so patching callbacks afterwards would
race with the first messages. A transport subclass is in place from the very
first byte: every received message passes through the node's
``_filter_incoming`` (truncation fix, leader-side size/type guards) and every
sent message through ``_filter_outgoing`` (ack rewriting, fsync ordering,
instrumentation). Its constructor is also where the node swaps in the
crash-safe journal (``_caravan_before_start``).
"""

from __future__ import annotations

from typing import Any

from pysyncobj.transport import TCPTransport


class CaravanTransport(TCPTransport):
    """TCPTransport whose receive and send paths call back into the node.

    The hooks are looked up per message (they exist from SyncObj's first
    line, before this transport is built) and pysyncobj's own handlers are
    passed in, so the hot path costs two extra Python calls per message.
    """

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        # SyncObj builds its transport after opening the journal and before
        # starting its tick thread: the one moment the node can adapt the
        # journal (raft/journal.py) with nothing running concurrently.
        prepare = getattr(syncObj, "_caravan_before_start", None)
        if prepare is not None:
            prepare()
        super().__init__(syncObj, selfNode, otherNodes)

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj name)
        deliver = self._onMessageReceivedCallback
        if deliver is None:
            return
        hook = getattr(self._syncObj, "_caravan_on_message", None)
        if hook is None or message.__class__ is not dict:
            deliver(node, message)
        else:
            hook(node, message, deliver)

    def send(self, node: Any, message: Any) -> bool:
        hook = getattr(self._syncObj, "_caravan_on_send", None)
        if hook is None or message.__class__ is not dict:
            return TCPTransport.send(self, node, message)
        return hook(node, message, self.raw_send)

    def raw_send(self, node: Any, message: Any) -> bool:
        """Send without the hooks (used to release held messages)."""
        return TCPTransport.send(self, node, message)
