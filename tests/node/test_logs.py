"""Log pipeline: JSON lines with node_id, console output, and secrets redacted everywhere."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from fsm.record import Record
from node.core.config import ServerConfig
from node.core.logs import (
    REDACTED,
    LogSettings,
    SecretRedactor,
    build_logger,
    configure_logging,
    is_secret_key,
)

RAFT_PASSWORD = "raft-pw-0123456789abcdef"
ACL_SECRET = "6f1e1c1a-2b1c-4d4e-9f00-5ec7e75ec7e7"


@dataclass
class Token:
    accessor_id: str
    secret_id: str
    policies: list[str]


class StoredToken(Record):
    accessor_id: str
    secret_id: str
    policies: list[str]


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Shouty:
    """An object whose repr leaks a secret, as careless ones do."""

    def __repr__(self) -> str:
        return f"Shouty(password={RAFT_PASSWORD})"


def log_every_kind_of_secret(log: Any) -> None:
    log.info("token issued", token=ACL_SECRET, accessor_id="acc-1")
    log.info(
        "nested",
        acl={"tokens": [{"SecretID": ACL_SECRET, "name": "ci"}]},
        request={"args": {"secret": "x" * 10}},
    )
    log.info("as a record", record=Token("acc-2", ACL_SECRET, ["write"]))
    log.info("as a stored record", record=StoredToken("acc-3", ACL_SECRET, ["read"]))
    log.info("tuple", pairs=(("a", 1), {"raft_password": RAFT_PASSWORD}))
    log.info(f"message quoting the raft password {RAFT_PASSWORD}")
    log.info("object", thing=Shouty())
    try:
        raise ValueError(f"could not auth with {RAFT_PASSWORD}")
    except ValueError:
        log.exception("raft auth failed")


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    path = tmp_path / "logs" / "s1.log"
    log, handle = build_logger(
        LogSettings(
            node_id="s1",
            level="debug",
            log_file=path,
            console=False,
            secret_values=(RAFT_PASSWORD,),
        )
    )
    yield log, path
    handle.close()


def test_secrets_never_reach_the_log_file(private: tuple[Any, Path]) -> None:
    log, path = private
    log_every_kind_of_secret(log)
    text = path.read_text()
    assert ACL_SECRET not in text
    assert RAFT_PASSWORD not in text
    assert "x" * 10 not in text
    lines = read_lines(path)
    assert len(lines) == 8
    by_event = {line["event"]: line for line in lines}
    assert by_event["token issued"]["token"] == REDACTED
    assert by_event["token issued"]["accessor_id"] == "acc-1"  # not every id is a secret
    assert by_event["nested"]["acl"]["tokens"][0] == {"SecretID": REDACTED, "name": "ci"}
    assert by_event["as a record"]["record"] == {
        "_type": "Token",
        "accessor_id": "acc-2",
        "secret_id": REDACTED,
        "policies": ["write"],
    }
    assert by_event["as a stored record"]["record"] == {  # a Record (msgspec Struct), not a dataclass
        "_type": "StoredToken",
        "accessor_id": "acc-3",
        "secret_id": REDACTED,
        "policies": ["read"],
    }
    assert f"message quoting the raft password {REDACTED}" in by_event
    failed = by_event["raft auth failed"]
    assert "ValueError: could not auth with <redacted>" in failed["exception"]


def test_every_line_is_json_with_node_id_level_and_time(private: tuple[Any, Path]) -> None:
    log, path = private
    log.bind(index=7).warning("apply skipped", reason="duplicate")
    log.debug("details")
    (line, debug) = read_lines(path)
    assert line["node_id"] == "s1"
    assert line["level"] == "warning"
    assert line["index"] == 7 and line["reason"] == "duplicate"
    assert line["timestamp"].endswith("Z")
    assert debug["level"] == "debug"


def test_level_filters(tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    log, handle = build_logger(
        LogSettings(node_id="s1", level="warning", log_file=path, console=False)
    )
    try:
        log.info("quiet")
        log.warning("loud")
    finally:
        handle.close()
    assert [line["event"] for line in read_lines(path)] == ["loud"]


def test_console_is_human_readable_on_a_tty() -> None:
    class FakeTTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = FakeTTY()
    log, handle = build_logger(LogSettings(node_id="s1", stream=stream))
    try:
        log.info("server started", rpc="127.0.0.1:4647", token=ACL_SECRET)
    finally:
        handle.close()
    out = stream.getvalue()
    assert "server started" in out and "127.0.0.1:4647" in out
    assert not out.lstrip().startswith("{")
    assert ACL_SECRET not in out


def test_console_off_a_tty_is_json_only_without_a_log_file() -> None:
    stream = io.StringIO()
    log, handle = build_logger(LogSettings(node_id="s1", stream=stream))
    try:
        log.info("hello")
    finally:
        handle.close()
    assert json.loads(stream.getvalue())["event"] == "hello"

    quiet = io.StringIO()
    _, handle = build_logger(LogSettings(node_id="s1", stream=quiet, log_file=None, console=False))
    handle.close()
    assert quiet.getvalue() == ""


def test_configure_logging_from_server_config_covers_stdlib_and_structlog(tmp_path: Path) -> None:
    config = ServerConfig.from_dict(
        {
            "node_id": "s7",
            "data_dir": str(tmp_path / "data"),
            "raft_password": RAFT_PASSWORD,
            "log_level": "info",
            "server": [{"id": "s7", "rpc_addr": "127.0.0.1:4647", "raft_addr": "127.0.0.1:4648"}],
        }
    )
    handle = configure_logging(config, console=False)
    try:
        structlog.get_logger("caravan.test").info("structlog line", password=RAFT_PASSWORD)
        # pysyncobj logs through the stdlib: its lines must be caught too.
        logging.getLogger("pysyncobj.syncobj").warning(
            "peer %s sent a bad password %s", "10.0.0.2", RAFT_PASSWORD
        )
        logging.getLogger("pysyncobj.syncobj").debug("below the level")
        log_every_kind_of_secret(structlog.get_logger("caravan.test"))
    finally:
        handle.close()
    text = config.log_file.read_text()
    assert RAFT_PASSWORD not in text and ACL_SECRET not in text
    lines = read_lines(config.log_file)
    assert all(line["node_id"] == "s7" for line in lines)
    foreign = next(line for line in lines if line["logger"] == "pysyncobj.syncobj")
    assert foreign["event"] == f"peer 10.0.0.2 sent a bad password {REDACTED}"
    assert foreign["level"] == "warning"
    assert not any(line["event"] == "below the level" for line in lines)


def test_close_restores_the_root_logger(tmp_path: Path) -> None:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    configure_logging(LogSettings(node_id="a", level="debug", log_file=tmp_path / "a.log")).close()
    assert root.level == level and root.handlers == handlers


def test_configure_twice_replaces_its_own_handlers(tmp_path: Path) -> None:
    first = configure_logging(LogSettings(node_id="a", log_file=tmp_path / "a.log", console=False))
    second = configure_logging(LogSettings(node_id="b", log_file=tmp_path / "b.log", console=False))
    try:
        structlog.get_logger().info("once")
    finally:
        second.close()
        first.close()
    assert (tmp_path / "a.log").read_text() == ""
    assert [line["node_id"] for line in read_lines(tmp_path / "b.log")] == ["b"]


@pytest.mark.parametrize(
    "key",
    [
        "secret",
        "secret_id",
        "SecretID",
        "token",
        "acl_token",
        "password",
        "raft_password",
        "Authorization",
        "x-caravan-token",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["accessor_id", "tokens", "token_accessor", "event", "index", "node_id", 5]
)
def test_not_secret_keys(key: Any) -> None:
    assert not is_secret_key(key)


def test_redactor_leaves_the_caller_objects_alone() -> None:
    args = {"secret_id": ACL_SECRET}
    out = SecretRedactor()(None, "info", {"event": "e", "args": args})
    assert out["args"] == {"secret_id": REDACTED}
    assert args == {"secret_id": ACL_SECRET}


def test_redactor_ignores_too_short_values() -> None:
    # A one-character "password" would blank every "a" in the log.
    out = SecretRedactor(["a", ""])(None, "info", {"event": "a cat"})
    assert out["event"] == "a cat"
