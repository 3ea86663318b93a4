"""Authentication of the raft link (defect 3 of pysyncobj.md).

pysyncobj's TCP connection unpickles every frame it receives, so whoever can
reach the raft port can run code on the node. pysyncobj's remedy
(``SyncObjConf.password``) needs the optional ``cryptography`` package and
Fernet. We install an object with Fernet's three-method interface instead,
built on the standard library: every frame carries a keyed-BLAKE2b tag (a
MAC; ~6x cheaper per frame than HMAC-SHA256 here) under a key derived from
the cluster password, and the connection verifies the tag
*before* it decompresses or unpickles anything. A frame with a bad tag makes
pysyncobj drop the connection, so an outsider gets nothing back and changes
nothing. pysyncobj's random-key exchange (each side's 32 random bytes echoed
inside every authenticated frame) still prevents replay across connections.

The link is authenticated, not encrypted: run raft on a private network (as
Nomad without TLS would) if entries must stay confidential in transit.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import Any

_VERSION = 1
_HEAD = struct.Struct(">BQ")  # version, sender's timestamp (pysyncobj's replay check)
_TAG_LEN = 32
_MIN_LEN = _HEAD.size + _TAG_LEN
_SALT = b"caravan-raft-link-v1"
_KDF_ITERATIONS = 200_000
_compare = hmac.compare_digest


class InvalidTag(Exception):
    """A frame failed authentication."""


class LinkAuthenticator:
    """Fernet-shaped authenticator: ``encrypt_at_time``, ``extract_timestamp``, ``decrypt``.

    The key is derived once (PBKDF2, ~0.1 s) so a guessed password cannot be
    tested cheaply against a captured frame; the password itself is not kept.
    """

    __slots__ = ("_mac",)

    def __init__(self, password: str) -> None:
        if not password:
            raise ValueError("password must not be empty")
        key = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), _SALT, _KDF_ITERATIONS)
        # Keyed once; every frame copies the keyed state (no per-frame key setup).
        self._mac = hashlib.blake2b(key=key, digest_size=_TAG_LEN, person=b"caravan-raft")

    def _tag(self, body: bytes | memoryview) -> bytes:
        h = self._mac.copy()
        h.update(body)
        return h.digest()

    def __repr__(self) -> str:
        return "LinkAuthenticator(<key hidden>)"

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        body = _HEAD.pack(_VERSION, max(0, int(current_time))) + data
        return body + self._tag(body)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < _MIN_LEN or token[0] != _VERSION:
            raise InvalidTag("malformed frame")
        return _HEAD.unpack_from(token)[1]

    def decrypt(self, token: bytes) -> bytes:
        if len(token) < _MIN_LEN or token[0] != _VERSION:
            raise InvalidTag("malformed frame")
        view = memoryview(token)
        if not _compare(view[-_TAG_LEN:], self._tag(view[:-_TAG_LEN])):
            raise InvalidTag("bad tag")
        return token[_HEAD.size : -_TAG_LEN]


class AuthFailureLog:
    """Reports frames that fail authentication, at most once per peer host per ``interval``.

    pysyncobj drops such a connection without a word ("Why no logging of
    security errors?" in its source), so a server given another password
    just never joins and the operator sees only "no leader". A peer retries
    its connection every few hundred milliseconds, hence the rate limit.
    """

    def __init__(self, log: Any, clock: Callable[[], float], interval: float = 30.0) -> None:
        self._log = log
        self._clock = clock
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, peer: str, reason: str) -> None:
        now = self._clock()
        last = self._last.get(peer)
        if last is not None and now - last < self._interval:
            self._suppressed[peer] = self._suppressed.get(peer, 0) + 1
            return
        self._last[peer] = now
        self._log.warning(
            "raft_peer_auth_failed",
            peer=peer,
            reason=reason,
            repeats_since_last_report=self._suppressed.pop(peer, 0),
            hint="the peer uses a different raft password, or is not a Caravan server: give every "
            "server the same raft_password or raft_password_file",
        )


class CheckedLink:
    """One raft connection's authenticator: ``LinkAuthenticator``, reporting failures with the peer."""

    __slots__ = ("_auth", "_peer", "_report")

    def __init__(self, auth: LinkAuthenticator, peer: str, report: Callable[[str, str], None]) -> None:
        self._auth = auth
        self._peer = peer
        self._report = report

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return self._auth.encrypt_at_time(data, current_time)

    def extract_timestamp(self, token: bytes) -> int:
        return self._checked(self._auth.extract_timestamp, token)

    def decrypt(self, token: bytes) -> bytes:
        return self._checked(self._auth.decrypt, token)

    def _checked(self, read: Callable[[bytes], Any], token: bytes) -> Any:
        try:
            return read(token)
        except InvalidTag as exc:
            self._report(self._peer, str(exc))
            raise
