"""RaftConfig validation (defect 3's mandatory password and bind address) and the link authenticator."""

from __future__ import annotations

import pytest
import structlog
from structlog.testing import capture_logs

from raft import PROFILES, ConfigError, RaftConfig
from raft.auth import AuthFailureLog, CheckedLink, InvalidTag, LinkAuthenticator


def cfg(**kw: object) -> RaftConfig:
    base: dict = {
        "self_address": "127.0.0.1:7001",
        "peers": ["127.0.0.1:7001", "127.0.0.1:7002"],
        "data_dir": "/tmp/x",
    }
    base.update(kw)
    return RaftConfig(**base)  # type: ignore[arg-type]


def test_password_is_mandatory_with_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as ei:
        cfg().validate()
    assert "password is required" in str(ei.value)
    assert "\n" not in str(ei.value)


def test_password_never_appears_in_repr() -> None:
    c = cfg(password="s3cret-value")
    assert "s3cret-value" not in repr(c)
    assert "s3cret-value" not in repr(LinkAuthenticator("s3cret-value"))


def test_bind_defaults_to_the_self_host_never_0000() -> None:
    c = cfg(password="pw")
    assert c.effective_bind_address == "127.0.0.1:7001"
    assert c.to_syncobj_conf().bindAddress == "127.0.0.1:7001"
    assert cfg(password="pw", bind_address="0.0.0.0:7001").effective_bind_address == "0.0.0.0:7001"


def test_syncobj_conf_never_carries_the_password() -> None:
    conf = cfg(password="pw").to_syncobj_conf()
    assert conf.password is None  # the adapter authenticates frames itself (raft/auth.py)


def test_profiles_are_valid_and_tuned_away_from_pysyncobj_defaults() -> None:
    for name in PROFILES:
        c = cfg(password="pw", profile=name)
        c.validate()
        conf = c.to_syncobj_conf()
        conf.validate()
        assert conf.commandsWaitLeader is False  # fail fast, the RPC layer retries
    low = cfg(password="pw").to_syncobj_conf()
    assert low.appendEntriesUseBatch is False  # pysyncobj's default gives ~10 serial writes/s


def test_unknown_profile_and_bad_limits_are_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown raft profile"):
        cfg(password="pw", profile="fast").validate()
    with pytest.raises(ConfigError, match="max entry size"):
        cfg(password="pw", max_entry_bytes=64 * 1024).validate()
    with pytest.raises(ConfigError, match="given together"):
        cfg(password="pw", serializer=lambda f, d: None).validate()


def test_serialize_checker_is_passed_only_when_set() -> None:
    assert cfg(password="pw").to_syncobj_conf().serializeChecker is None

    def checker() -> int:
        return 0

    c = cfg(
        password="pw",
        serializer=lambda f, d: None,
        deserializer=lambda f: None,
        serialize_checker=checker,
    )
    c.validate()
    assert c.to_syncobj_conf().serializeChecker is checker
    with pytest.raises(ConfigError, match="needs a snapshot serializer"):
        cfg(password="pw", serialize_checker=checker).validate()


def test_compaction_is_off_without_a_snapshot_serializer() -> None:
    conf = cfg(password="pw").to_syncobj_conf()
    assert conf.logCompactionMinEntries > 10**12


def test_authenticator_round_trip_and_rejections() -> None:
    a = LinkAuthenticator("pw")
    tok = a.encrypt_at_time(b"payload", 42)
    assert a.extract_timestamp(tok) == 42
    assert a.decrypt(tok) == b"payload"
    with pytest.raises(InvalidTag):
        a.decrypt(tok[:-1] + bytes([tok[-1] ^ 1]))
    with pytest.raises(InvalidTag):
        LinkAuthenticator("other").decrypt(tok)
    with pytest.raises(InvalidTag):
        a.decrypt(b"\x80\x02junk")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_auth_failures_are_reported_once_per_peer_per_interval() -> None:
    clock = _Clock()
    with capture_logs() as events:
        report = AuthFailureLog(structlog.get_logger("raft"), clock, interval=30.0)
        report("10.0.0.2", "bad tag")
        report("10.0.0.2", "bad tag")  # the peer reconnecting: counted, not logged
        report("10.0.0.3", "malformed frame")  # another peer: its own report
        clock.now += 30.0
        report("10.0.0.2", "bad tag")
    assert [(e["event"], e["peer"], e["repeats_since_last_report"]) for e in events] == [
        ("raft_peer_auth_failed", "10.0.0.2", 0),
        ("raft_peer_auth_failed", "10.0.0.3", 0),
        ("raft_peer_auth_failed", "10.0.0.2", 1),
    ]
    assert all(e["log_level"] == "warning" and "same raft_password" in e["hint"] for e in events)


def test_a_checked_link_passes_good_frames_and_reports_bad_ones_with_the_peer() -> None:
    reports: list[tuple[str, str]] = []
    link = CheckedLink(LinkAuthenticator("pw"), "10.0.0.2:4648", lambda peer, why: reports.append((peer, why)))
    tok = link.encrypt_at_time(b"payload", 7)
    assert link.extract_timestamp(tok) == 7 and link.decrypt(tok) == b"payload"
    assert reports == []
    foreign = LinkAuthenticator("another password").encrypt_at_time(b"payload", 7)
    with pytest.raises(InvalidTag):
        link.decrypt(foreign)
    with pytest.raises(InvalidTag):
        link.extract_timestamp(b"\x80\x02junk")
    assert reports == [("10.0.0.2:4648", "bad tag"), ("10.0.0.2:4648", "malformed frame")]
