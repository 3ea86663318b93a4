"""Before the replica runs: check the raft port, and build pysyncobj's hooks.

pysyncobj calls its hooks (role changes, snapshot serializer and
deserializer, serialize checker) on the tick thread, where an exception or a
missing commit would do harm: the wrappers here make them safe. The port
check exists because pysyncobj retries a failed bind forever without saying
why.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic

from raft.config import RaftConfig, split_host_port
from raft.errors import RaftError
from raft.replica_base import ROLE_NAMES
from raft.ticks import TickGaps


class Committer(Protocol):
    """What the hooks reach of the replica: its pending FSM transaction (committed first by the
    snapshot hooks) and its tick gaps (named by a role change)."""

    tick_gaps: TickGaps

    def commit_pending(self) -> bool: ...


_BIND_HINTS = {
    errno.EADDRINUSE: "another process holds the port (a server still running from an earlier start?): "
    "stop it or choose another raft_addr",
    errno.EADDRNOTAVAIL: "the host is not an address of this machine: use one of its own addresses",
}


def check_bindable(address: str, grace: float = 2.0) -> None:
    """Fail early, saying why, when the raft address cannot be listened on.

    pysyncobj retries a failed bind every second and never says why, so a port
    held by another process cost the whole bind timeout and a vague error.
    Binding the way pysyncobj will (SO_REUSEADDR) and closing at once tells
    the cause. "In use" is retried for ``grace`` seconds: right after a
    server is killed its accepted connections still hold the port for a few
    milliseconds (measured: up to 10 ms) while they close.
    """
    # Validated with the config: cannot fail here.
    host, port = split_host_port(address, "raft bind address")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    deadline = monotonic() + grace
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or monotonic() > deadline:
                    hint = _BIND_HINTS.get(exc.errno or 0, "check the address")
                    raise RaftError(
                        f"cannot listen on raft address {address}: {exc.strerror or exc}; {hint}"
                    ) from None
        time.sleep(0.02)


def syncobj_hooks(
    config: RaftConfig, log: Any, replica: Callable[[], Committer | None]
) -> dict[str, Any]:
    """The ``SyncObjConf`` overrides that hook the node into pysyncobj.

    ``replica`` returns the replica once its constructor has returned (None
    before): pysyncobj may call the hooks inside that constructor.
    """

    def on_state_changed(old: int, new: int) -> None:
        # May run before the replica exists (pysyncobj ticks during its
        # constructor); it must never raise inside pysyncobj's state change.
        # The longest recent stall of this server's own raft thread tells an
        # election it caused by starving apart from a leader that went quiet.
        rep = replica()
        stalled = round(rep.tick_gaps.longest(), 3) if rep is not None else 0.0
        log.info(
            "raft_role_changed", old=ROLE_NAMES.get(old), new=ROLE_NAMES.get(new), longest_tick_gap_s=stalled
        )

    hooks: dict[str, Any] = {"onStateChanged": on_state_changed}
    if config.serializer is not None and config.deserializer is not None:
        hooks["serializer"] = commit_first(config.serializer, replica)
        hooks["deserializer"] = commit_first(config.deserializer, replica)
        if config.serialize_checker is not None:
            hooks["serializeChecker"] = guarded_checker(config.serialize_checker, log)
    return hooks


def commit_first(
    fn: Callable[..., Any], replica: Callable[[], Committer | None]
) -> Callable[..., Any]:
    """pysyncobj calls the snapshot serializer/deserializer on the tick
    thread, after this tick's entries were applied but before our
    end-of-tick commit: commit first, so the serializer reads (and the
    deserializer replaces) a store that holds every applied entry."""

    def hook(*args: Any) -> Any:
        obj = replica()
        if obj is not None:
            obj.commit_pending()
        return fn(*args)

    return hook


def guarded_checker(fn: Callable[[], int], log: Any) -> Callable[[], int]:
    """pysyncobj polls the checker every tick (no commit needed: it only
    reports on a dump already started). An exception there would abort
    the rest of the tick (apply, sends, our commit) on every tick, so it
    is logged and reported as a failed dump instead; pysyncobj then keeps
    the journal and tries again later."""

    def checker() -> int:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - must never break the tick
            log.error("raft_serialize_checker_failed", error=f"{type(exc).__name__}: {exc}")
            return SERIALIZER_STATE.FAILED

    return checker
