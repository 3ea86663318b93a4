"""ServerConfig loading, validation messages, and the duration/size helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import node.core.config as config_module
from fsm.journal import Retention
from node.core.config import (
    ConfigError,
    GCConfig,
    ServerConfig,
    ServerEntry,
    load_config,
)
from node.spec.units import parse_duration, parse_size

PASSWORD = "0123456789abcdef0123"

CLUSTER = f"""
node_id = "s2"
data_dir = "data/s2"
raft_password = "{PASSWORD}"

[[server]]
id = "s1"
rpc_addr = "127.0.0.1:4601"
raft_addr = "127.0.0.1:4701"

[[server]]
id = "s2"
rpc_addr = "127.0.0.1:4602"
raft_addr = "127.0.0.1:4702"

[[server]]
id = "s3"
rpc_addr = "[::1]:4603"
raft_addr = "[::1]:4703"
"""


def base() -> dict[str, Any]:
    return {
        "node_id": "s1",
        "data_dir": "/var/lib/caravan",
        "raft_password": PASSWORD,
        "server": [{"id": "s1", "rpc_addr": "10.0.0.1:4647", "raft_addr": "10.0.0.1:4648"}],
    }


def error_of(data: dict[str, Any], base_dir: Path | str = "/etc/caravan") -> str:
    with pytest.raises(ConfigError) as info:
        ServerConfig.from_dict(data, base_dir=base_dir)
    message = str(info.value)
    assert message.startswith("config error: ")
    assert "\n" not in message
    return message


# ---- loading --------------------------------------------------------------------


def test_load_cluster_file_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s2.toml"
    path.write_text(CLUSTER)
    cfg = ServerConfig.load(path)
    assert cfg.node_id == "s2"
    assert cfg.data_dir == tmp_path / "data/s2"  # relative to the config file
    assert cfg.rpc_addr == "127.0.0.1:4602" and cfg.raft_addr == "127.0.0.1:4702"
    assert cfg.rpc_bind == cfg.rpc_addr and cfg.raft_bind == cfg.raft_addr
    assert [p.id for p in cfg.peers] == ["s1", "s3"]
    assert cfg.peers[1] == ServerEntry("s3", "[::1]:4603", "[::1]:4703")
    assert cfg.rpc_addr_of_raft("[::1]:4703") == "[::1]:4603"
    assert cfg.rpc_addr_of_raft("10.9.9.9:1") is None
    assert cfg.log_file == tmp_path / "data/s2/server.log"
    assert cfg.log_level == "info"
    assert cfg.fsync is True
    assert cfg.raft_profile is None and cfg.max_entry_size is None
    assert cfg.rpc_max_frame == 4 * 1024 * 1024
    assert cfg.gc == GCConfig()
    assert cfg.journal == Retention()


def test_docstring_example_is_valid(tmp_path: Path) -> None:
    doc = config_module.__doc__ or ""
    lines = doc[doc.index("    node_id") :].splitlines()
    end = next(n for n, line in enumerate(lines) if line and not line.startswith("    "))
    example = "\n".join(line[4:] for line in lines[:end])
    key = tmp_path / "raft.key"
    key.write_text(PASSWORD + "\n")
    example = example.replace("/etc/caravan/raft.key", str(key))
    cfg = ServerConfig.loads(example, base_dir=tmp_path)
    assert cfg.raft_password == PASSWORD  # trailing newline of the file stripped
    assert cfg.rpc_bind == "0.0.0.0:4647" and cfg.rpc_addr == "10.0.0.1:4647"
    assert len(cfg.servers) == 3
    assert cfg.max_entry_size == 48 * 1024
    assert cfg.raft_profile == "low-latency"
    assert cfg.gc == GCConfig()  # the example spells out the defaults
    assert cfg.journal == Retention(max_batches=100_000, max_bytes=256 * 2**20)


def test_all_settings(tmp_path: Path) -> None:
    data = base() | {
        "log_level": "DEBUG",
        "log_file": "logs/s1.log",
        "raft_profile": "throughput",
        "max_entry_size": 40000,
        "rpc_max_frame": "1MiB",
        "fsync": False,
        "rpc_bind": "0.0.0.0:4647",
        "raft_bind": "0.0.0.0:4648",
        "gc": {"job_threshold": "1h30m", "token_threshold": "0", "job_batch": 10},
        "journal": {"max_batches": 10, "max_bytes": 1 << 20},
    }
    cfg = ServerConfig.from_dict(data, base_dir=tmp_path)
    assert cfg.log_level == "debug"
    assert cfg.log_file == tmp_path / "logs/s1.log"
    assert cfg.max_entry_size == 40000 and cfg.rpc_max_frame == 2**20
    assert cfg.fsync is False
    assert cfg.raft_bind == "0.0.0.0:4648"
    assert cfg.gc.job_threshold == 5400.0
    assert cfg.gc.token_threshold == 0.0
    assert cfg.gc.job_batch == 10
    assert cfg.gc.eval_interval == 300.0  # untouched defaults stay
    assert cfg.journal == Retention(max_batches=10, max_bytes=1 << 20)


def test_top_level_addresses_must_repeat_the_own_entry(tmp_path: Path) -> None:
    same = base() | {"rpc_addr": "10.0.0.1:4647", "raft_addr": "10.0.0.1:4648"}
    assert ServerConfig.from_dict(same).rpc_addr == "10.0.0.1:4647"
    message = error_of(base() | {"rpc_addr": "10.0.0.9:4647"})
    assert (
        "rpc_addr '10.0.0.9:4647' differs from the [[server]] entry of 's1' ('10.0.0.1:4647')"
        in message
    )


def test_load_config_function(tmp_path: Path) -> None:
    path = tmp_path / "s2.toml"
    path.write_text(CLUSTER)
    assert load_config(path) == ServerConfig.load(path)


def test_raft_config_bridge(tmp_path: Path) -> None:
    pytest.importorskip("raft.config")
    cfg = ServerConfig.from_dict(
        base() | {"raft_bind": "0.0.0.0:4648", "max_entry_size": 40000, "fsync": False},
        base_dir=tmp_path,
    )
    raft = cfg.raft_config()
    assert raft.self_address == "10.0.0.1:4648"
    assert raft.peers == ["10.0.0.1:4648"]
    assert raft.password == PASSWORD
    assert raft.bind_address == "0.0.0.0:4648"
    assert raft.max_entry_bytes == 40000 and raft.fsync is False
    assert str(raft.data_dir) == "/var/lib/caravan"
    assert cfg.raft_config(fsync=True).fsync is True


def test_password_never_in_repr() -> None:
    cfg = ServerConfig.from_dict(base())
    assert PASSWORD not in repr(cfg)


# ---- errors -------------------------------------------------------------------------


def test_missing_password_message() -> None:
    data = base()
    del data["raft_password"]
    assert (
        error_of(data)
        == "config error: raft_password is required (set raft_password or raft_password_file)"
    )


def test_password_both_ways() -> None:
    assert "only one of" in error_of(base() | {"raft_password_file": "x"})


def test_short_password_is_rejected_without_echoing_it() -> None:
    message = error_of(base() | {"raft_password": "hunter2"})
    assert "hunter2" not in message
    assert "16 characters" in message


def test_password_file_unreadable(tmp_path: Path) -> None:
    data = base()
    del data["raft_password"]
    data["raft_password_file"] = "missing.key"
    message = error_of(data, tmp_path)
    assert str(tmp_path / "missing.key") in message and "No such file" in message


def test_password_file_contents_never_in_errors(tmp_path: Path) -> None:
    (tmp_path / "short.key").write_text("tiny-secret")
    data = base()
    del data["raft_password"]
    data["raft_password_file"] = "short.key"
    assert "tiny-secret" not in error_of(data, tmp_path)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"node_id": None}, "node_id is required"),
        ({"node_id": "a b"}, "node_id 'a b' must be"),
        ({"node_id": "s9"}, "node_id 's9' is not among the [[server]] ids (s1)"),
        ({"data_dir": None}, "data_dir is required"),
        ({"server": None}, "no [[server]] entries"),
        ({"server": [{"id": "s1", "rpc_addr": "10.0.0.1:1"}]}, "[[server]] #1 has no raft_addr"),
        (
            {"server": [{"id": "s1", "rpc_addr": "10.0.0.1", "raft_addr": "10.0.0.1:2"}]},
            "[[server]] #1 rpc_addr: invalid address",
        ),
        ({"server": [{"id": "s1", "rpc_addr": "10.0.0.1:0", "raft_addr": "10.0.0.1:2"}]}, "port 0"),
        (
            {"server": [{"id": "s1", "rpc_adr": "x:1", "raft_addr": "x:2"}]},
            "unknown key 'rpc_adr' in [[server]] #1; did you mean 'rpc_addr'?",
        ),
        (
            {
                "server": [
                    {"id": "s1", "rpc_addr": "a:1", "raft_addr": "a:2"},
                    {"id": "s2", "rpc_addr": "a:1", "raft_addr": "b:2"},
                ]
            },
            "two [[server]] entries share rpc_addr 'a:1'",
        ),
        ({"log_level": "verbose"}, "log_level 'verbose' is not one of debug, info, warning, error"),
        ({"fsync": "yes"}, "fsync must be true or false"),
        ({"raft_bind": "everywhere"}, "raft_bind: invalid address"),
        ({"max_entry_size": "5MiB"}, "max_entry_size (5242880 bytes) must be below rpc_max_frame"),
        ({"rpc_max_frame": "lots"}, "rpc_max_frame: expected a size"),
        ({"raft_pasword": "x"}, "unknown key 'raft_pasword'; did you mean 'raft_password'?"),
        # another tool's peer list: say how this config names its servers
        ({"peers": ["10.0.0.2:4648"]}, "unknown key 'peers'; list every server (this one too) as a [[server]] table"),
        ({"retry_join": ["10.0.0.2"]}, "unknown key 'retry_join'; list every server (this one too) as a [[server]]"),
        (
            {"gc": {"job_threshold": 14400}},
            'gc.job_threshold must be a duration string like "5m", not 14400',
        ),
        ({"gc": {"job_interval": "0"}}, "gc.job_interval must be positive"),
        ({"gc": {"job_threshold": "-1h"}}, "gc.job_threshold must be zero or positive"),
        ({"gc": {"job_threshold": "4 hours"}}, "gc.job_threshold: invalid duration '4 hours'"),
        ({"gc": {"job_batch": 0}}, "gc.job_batch must be a positive integer"),
        (
            {"gc": {"jobs_threshold": "1h"}},
            "unknown key 'jobs_threshold' in [gc]; did you mean 'job_threshold'?",
        ),
        ({"journal": {"retention": "1h"}}, "unknown key 'retention' in [journal]"),
        ({"journal": {"max_batches": -1}}, "journal.max_batches must be a positive integer"),
    ],
)
def test_validation_messages(change: dict[str, Any], expected: str) -> None:
    data = base()
    for key, value in change.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    assert expected in error_of(data)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = \n")
    with pytest.raises(ConfigError) as info:
        ServerConfig.load(bad)
    assert str(info.value).startswith(f"config error: {bad}: invalid TOML")
    with pytest.raises(ConfigError) as info:
        ServerConfig.load(tmp_path / "absent.toml")
    assert "cannot read" in str(info.value) and "absent.toml" in str(info.value)


# ---- durations and sizes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("5m", 300.0),
        ("4h", 14400.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("-2s", -2.0),
        ("+3m", 180.0),
        ("2h45m30s500ms", 9930.5),
        ("10us", 1e-5),
        ("10\u00b5s", 1e-5),
        ("100ns", 1e-7),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "5", "m", "1d", "1h 30m", "1.2.3s", "-", "five minutes", "5M", ".s"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from(["h", "m", "s", "ms"])),
        min_size=1,
        max_size=4,
    )
)
def test_parse_duration_sums_its_parts(parts: list[tuple[int, str]]) -> None:
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    text = "".join(f"{n}{unit}" for n, unit in parts)
    assert parse_duration(text) == pytest.approx(sum(n * scale[unit] for n, unit in parts))


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (1234, 1234),
        ("1234", 1234),
        ("48KiB", 48 * 1024),
        ("4MiB", 4 * 2**20),
        ("1GB", 10**9),
        ("1 kb", 1000),
        ("7B", 7),
    ],
)
def test_parse_size(value: int | str, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["", "4 MiBs", "1.5MiB", "-1", True, 1.5, None])
def test_parse_size_rejects(value: Any) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(value)
