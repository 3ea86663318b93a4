"""Bad input against a live cluster: a clear error, the server stays up, nothing changes."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from node.wire.errors import RPCError
from tests.cluster.conftest import ClusterHandle, job_spec, wait_until

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


def _raw(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _read_frame(sock: socket.socket) -> dict:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            raise ConnectionError("closed")
        header += chunk
    (length,) = struct.unpack(">I", header)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return msgpack.unpackb(body, raw=False)


@pytest.fixture
def settled(cluster: ClusterHandle) -> tuple[ClusterHandle, str]:
    # A periodic parent gets no evaluation, so no scheduler writes follow and
    # the digest stays put unless bad input changes something.
    cluster.client().call("job.register", {"job": job_spec("keep") | {"Periodic": {"Spec": "@daily"}}})
    digests = cluster.digests()
    return cluster, next(iter(digests.values()))[0]


def _unchanged(cluster: ClusterHandle, digest: str) -> None:
    assert {d for d, _ in cluster.digests().values()} == {digest}
    assert cluster.client().call("job.get", {"job_id": "keep"})["data"]["ID"] == "keep"


def test_malformed_msgpack_frame(settled: tuple[ClusterHandle, str]) -> None:
    cluster, digest = settled
    with _raw(cluster.addresses[0]) as sock:
        sock.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
        reply = _read_frame(sock)
    assert reply["ok"] is False and reply["error"]["code"] == "malformed"
    _unchanged(cluster, digest)


def test_an_http_request_on_the_rpc_port_is_told_where_http_goes(settled: tuple[ClusterHandle, str]) -> None:
    cluster, digest = settled
    with _raw(cluster.addresses[0]) as sock:
        sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = _read_frame(sock)
    assert reply["error"]["code"] == "malformed" and "http_addr" in reply["error"]["message"]
    _unchanged(cluster, digest)


def test_oversized_frame(settled: tuple[ClusterHandle, str]) -> None:
    cluster, digest = settled
    with _raw(cluster.addresses[0]) as sock:
        sock.sendall(struct.pack(">I", 1 << 30))
        reply = _read_frame(sock)
    assert reply["error"]["code"] == "frame_too_large"
    _unchanged(cluster, digest)


def test_unknown_method(settled: tuple[ClusterHandle, str]) -> None:
    cluster, digest = settled
    with pytest.raises(RPCError) as err:
        cluster.client().call("job.explode", {})
    assert err.value.code == "unknown_method"
    _unchanged(cluster, digest)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Count": -1, "Tasks": [{"Name": "t"}]}]}, "count -1"),
        ({"ID": "bad", "Type": "cron", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}, "type 'cron'"),
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Count": "3", "Tasks": [{"Name": "t"}]}]}, "TaskGroups[0].Count"),
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Update": {"Canary": -1}, "Tasks": [{"Name": "t"}]}]}, "canary -1"),
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Update": {"MinHealthyTime": 400_000_000_000}, "Tasks": [{"Name": "t"}]}]},
         "Update.MinHealthyTime: must be less than HealthyDeadline"),
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Update": {"HealthyDeadline": 700_000_000_000}, "Tasks": [{"Name": "t"}]}]},
         "Update.HealthyDeadline: must be less than ProgressDeadline"),
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Update": {"AutoPromote": True}, "Tasks": [{"Name": "t"}]}]},
         "Update.AutoPromote: needs a Canary count greater than zero"),
        ({"ID": "bad", "TaskGroups": [{"Name": "g", "Update": {"ProgressDeadline": -1}, "Tasks": [{"Name": "t"}]}]},
         "Update.ProgressDeadline: must not be negative"),
        ({"ID": "bad", "Type": "system", "TaskGroups": [{"Name": "g", "Count": 3, "Tasks": [{"Name": "t"}]}]},
         "Count: cannot exceed 1 with the system scheduler"),
        ({"TaskGroups": []}, "Job.ID"),
        ("not a job", "JSON"),
    ],
)
def test_invalid_jobspec(settled: tuple[ClusterHandle, str], spec: object, fragment: str) -> None:
    cluster, digest = settled
    with pytest.raises(RPCError) as err:
        cluster.client().call("job.register", {"job": spec})
    assert err.value.code == "bad_request"
    assert fragment in err.value.message and "\n" not in err.value.message
    _unchanged(cluster, digest)


def test_raft_port_without_password_gets_nothing(settled: tuple[ClusterHandle, str]) -> None:
    cluster, digest = settled
    node = cluster.cluster.nodes[0]
    host, port = node.raft_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        # pysyncobj would unpickle this without a password; ours must drop it.
        sock.sendall(b"\x00\x00\x00\x10" + b"cos\nsystem\n(S'x'" * 4)
        sock.settimeout(2)
        try:
            data = sock.recv(1024)
        except (TimeoutError, ConnectionError):
            data = b""
    assert data == b""
    _unchanged(cluster, digest)


def test_raft_port_not_on_all_interfaces(cluster: ClusterHandle) -> None:
    node = cluster.cluster.nodes[0]
    port = int(node.raft_addr.rsplit(":", 1)[1])
    with open("/proc/net/tcp") as f:
        listeners = [line.split() for line in f.readlines()[1:]]
    bound = [row[1] for row in listeners if row[3] == "0A" and int(row[1].split(":")[1], 16) == port]
    assert bound and all(not b.startswith("00000000:") for b in bound)


def test_a_second_server_on_a_taken_raft_port_fails_at_once_saying_why(
    settled: tuple[ClusterHandle, str], tmp_path: Path
) -> None:
    """A copy of a running server's config (say, the agent started twice): pysyncobj
    would retry the bind silently until the 10 s bind timeout and end in a traceback."""
    cluster, digest = settled
    node = cluster.cluster.nodes[0]
    config = Path(node.config_file).read_text()
    config = config.replace(str(Path(node.data_dir)), str(tmp_path / "data")).replace(node.log_file, str(tmp_path / "log"))
    (tmp_path / "server.toml").write_text(config)
    out = subprocess.run(
        [sys.executable, "-m", "node.cli", "agent", "--config", str(tmp_path / "server.toml")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"caravan agent: cannot start: cannot listen on raft address {node.raft_addr}: Address already in use; "
        "another process holds the port (a server still running from an earlier start?): stop it or choose "
        "another raft_addr"
    ]
    _unchanged(cluster, digest)


class TestACL:
    def test_tokens(self, settled: tuple[ClusterHandle, str]) -> None:
        cluster, _ = settled
        boot = cluster.client().call("acl.bootstrap", {})
        management = boot["SecretID"]
        assert "SecretHash" not in boot
        # A second bootstrap is refused.
        with pytest.raises(RPCError) as err:
            cluster.client().call("acl.bootstrap", {})
        assert err.value.code == "conflict"
        # Missing and wrong tokens; writes that look an object up first say nothing of it either.
        for token in (None, "not-a-real-secret"):
            for method, args in (("job.register", {"job": job_spec("x")}), ("job.stop", {"job_id": "no-such-job"}),
                                 ("deployment.fail", {"deployment_id": "no-such-deployment"}),
                                 ("deployment.pause", {"deployment_id": "no-such-deployment"}),
                                 ("deployment.promote", {"deployment_id": "no-such-deployment"})):
                with pytest.raises(RPCError) as err:
                    cluster.client(token=token).call(method, args)
                assert err.value.code == "permission_denied", (method, err.value)
        mgmt = cluster.client(token=management)
        reader = mgmt.call("acl.token.create", {"name": "r", "policies": ["read"]})["SecretID"]
        writer = mgmt.call("acl.token.create", {"name": "w", "policies": ["write"]}, request_id="create-w")["SecretID"]
        # A resend of that create (its answer lost) must not hand out a secret that was never stored.
        with pytest.raises(RPCError) as err:
            mgmt.call("acl.token.create", {"name": "w", "policies": ["write"]}, request_id="create-w")
        assert err.value.code == "conflict" and "shown only once" in err.value.message
        assert [t["Name"] for t in mgmt.call("acl.token.list", {})["data"]].count("w") == 1
        # A read token reads but cannot write; a write token writes but cannot manage tokens.
        assert cluster.client(token=reader).call("job.get", {"job_id": "keep"})["data"]["ID"] == "keep"
        with pytest.raises(RPCError) as err:
            cluster.client(token=reader).call("job.register", {"job": job_spec("x")})
        assert err.value.code == "permission_denied"
        cluster.client(token=writer).call("job.register", {"job": job_spec("by-writer")})
        with pytest.raises(RPCError) as err:
            cluster.client(token=writer).call("acl.token.list", {})
        assert err.value.code == "permission_denied"
        # Through a follower too (forwarded with the token).
        follower = cluster.followers()[0]
        cluster.client(follower.rpc_addr, token=writer).call("job.register", {"job": job_spec("via-follower")})
        # Expiring tokens stop working once expired.
        short = mgmt.call("acl.token.create", {"name": "s", "policies": ["write"], "ttl_seconds": 1})["SecretID"]
        cluster.client(token=short).call("job.register", {"job": job_spec("short-lived")})

        def expired() -> bool:
            try:
                cluster.client(token=short).call("job.register", {"job": job_spec("late")})
            except RPCError as exc:
                return exc.code == "permission_denied" and "expired" in exc.message
            return False

        wait_until(expired, 15, "the token to expire")
        tokens = mgmt.call("acl.token.list", {})["data"]
        assert len(tokens) == 4 and all("SecretID" not in t and "SecretHash" not in t for t in tokens)
        # Secrets never reach the logs.
        for node in cluster.cluster.nodes:
            with open(node.log_file) as f:
                text = f.read()
            for secret in (management, reader, writer, short):
                assert secret not in text



def test_an_empty_id_is_refused_not_taken_as_a_prefix_of_every_id(cluster: ClusterHandle) -> None:
    """With one node, ``node.get ""`` used to answer that node: "" is a prefix of every id."""
    client = cluster.client()
    node = {
        "ID": "00000000-0000-4000-8000-00000000e0e0",
        "Name": "only",
        "Datacenter": "dc1",
        "NodeClass": "",
        "Attributes": {"driver.sim": "1"},
        "Resources": {"CPU": 1000, "MemoryMB": 1024, "DiskMB": 0},
        "Status": "ready",
        "SchedulingEligibility": "eligible",
    }
    client.call("node.register", {"node": node})
    for method, arg in [("node.get", "node_id"), ("job.get", "job_id"), ("deployment.pause", "deployment_id")]:
        for empty in ("", "  "):
            with pytest.raises(RPCError) as err:
                client.call(method, {arg: empty})
            assert err.value.code == "bad_request", (method, err.value)
            assert f"argument '{arg}' must not be empty" in err.value.message
    assert client.call("node.get", {"node_id": "00000000"})["data"]["Name"] == "only"  # a real prefix still works
