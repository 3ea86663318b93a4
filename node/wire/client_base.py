"""What the blocking and the asyncio RPC client share: addresses, token, how a call starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm.ids import new_request_id
from node.wire.framing import pack_frame, parse_address
from node.wire.messages import request_message
from node.wire.retry import Attempt


class _DefaultToken:
    """Marks "use the client's token" apart from an explicit None."""


DEFAULT_TOKEN: Any = _DefaultToken()


def checked_addresses(addresses: Sequence[str] | str) -> list[str]:
    """``addresses`` as a list, each checked to be host:port (a ``ValueError`` if not)."""
    found = [addresses] if isinstance(addresses, str) else list(addresses)
    for address in found:
        parse_address(address)
    return found


class ClientBase:
    """The servers to try (sticking to the last that answered), the token, limits."""

    def __init__(
        self,
        addresses: Sequence[str] | str,
        token: str | None,
        timeout: float,
        max_frame: int,
        refused_grace: float | None = None,
    ) -> None:
        self.addresses = checked_addresses(addresses)
        self.token = token
        self.timeout = timeout
        self.max_frame = max_frame
        self.refused_grace = refused_grace
        self._preferred = 0

    def __repr__(self) -> str:  # keep the token out of reprs and tracebacks
        return f"{type(self).__name__}(addresses={self.addresses!r}, timeout={self.timeout!r})"

    def start_call(
        self,
        method: str,
        args: dict[str, Any] | None,
        *,
        idempotent: bool,
        timeout: float | None,
        request_id: str | None,
        token: str | None,
        address: str | None,
    ) -> tuple[Attempt, bytes]:
        """The call's retry state and its encoded request (oversize fails here, before any I/O)."""
        if address is not None:
            parse_address(address)
            order = [address]
        else:
            order = self.addresses[self._preferred :] + self.addresses[: self._preferred]
        attempt = Attempt(
            method,
            request_id or new_request_id(),
            idempotent,
            self.timeout if timeout is None else timeout,
            order,
            refused_grace=self.refused_grace,
        )
        token = self.token if token is DEFAULT_TOKEN else token
        frame = pack_frame(
            request_message(attempt.request_id, method, args, token), self.max_frame, "request"
        )
        return attempt, frame

    def start_stream(
        self,
        method: str,
        args: dict[str, Any] | None,
        *,
        request_id: str | None,
        token: str | None,
        address: str | None,
    ) -> tuple[Attempt, bytes]:
        """As ``start_call`` for a stream: only its connecting is retried, within the client timeout."""
        return self.start_call(
            method,
            args,
            idempotent=True,
            timeout=None,
            request_id=request_id,
            token=token,
            address=address,
        )

    def remember(self, address: str, pinned: bool) -> None:
        """Stick to the server that answered (unless the caller pinned one)."""
        if pinned:
            return
        if address not in self.addresses:
            self.addresses.append(address)  # a leader named by a not_leader answer
        self._preferred = self.addresses.index(address)
