"""The caravan CLI against a live cluster, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node.devcluster import alive, free_port
from node.wire.rpc_client import RPCClient
from tests.cluster.conftest import ClusterHandle
from tests.conditions import wait_until

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


def caravan(c: ClusterHandle, *args: str, token: str | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(c.addresses)}
    env.pop("CARAVAN_TOKEN", None)
    if token:
        env["CARAVAN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT, input=stdin, timeout=60
    )


def test_job_lifecycle_commands(cluster: ClusterHandle, tmp_path: Path) -> None:
    spec = ROOT / "examples" / "batch.json"
    out = caravan(cluster, "job", "run", "--detach", str(spec))
    assert out.returncode == 0, out.stderr
    assert "Evaluation ID" in out.stdout
    listing = caravan(cluster, "job", "status")
    assert "example" in listing.stdout
    detail = json.loads(caravan(cluster, "job", "status", "example", "--json").stdout)
    assert detail["ID"] == "example" and detail["Type"] == "batch" and "ModifyIndex" in detail
    # stdin, bare (unwrapped) spec
    bare = json.dumps(json.loads(spec.read_text())["Job"] | {"ID": "from-stdin"})
    assert caravan(cluster, "job", "run", "--detach", "-", stdin=bare).returncode == 0
    assert caravan(cluster, "job", "stop", "example").returncode == 0
    history = json.loads(caravan(cluster, "job", "history", "example", "--json").stdout)
    assert [v["Version"] for v in history["Versions"]] == [1, 0] and history["Versions"][0]["Stop"] is True
    evals = json.loads(caravan(cluster, "eval", "list", "--job", "example", "--json").stdout)
    assert {e["TriggeredBy"] for e in evals} >= {"job-register", "job-deregister"}
    digest = json.loads(caravan(cluster, "debug", "digest", "--json").stdout)
    assert set(digest) == {"digest", "index"}


def test_errors_are_one_line_and_non_zero(cluster: ClusterHandle, tmp_path: Path) -> None:
    missing = caravan(cluster, "job", "status", "nope")
    assert missing.returncode != 0 and missing.stderr.strip() == "Error: job nope not found"
    bad = tmp_path / "bad.json"
    bad.write_text('{"ID": "x", "TaskGroups": [{"Name": "g", "Count": -2, "Tasks": [{"Name": "t"}]}]}')
    out = caravan(cluster, "job", "run", "--detach", str(bad))
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "count -2" in out.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    out = caravan(cluster, "job", "run", "--detach", str(broken))
    assert out.returncode != 0 and "not valid JSON" in out.stderr and "Traceback" not in out.stderr
    unreachable = subprocess.run(
        [sys.executable, "-m", "node.cli", "job", "status", "--address", "127.0.0.1:1"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert unreachable.returncode != 0 and "Traceback" not in unreachable.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["job", "run", "examples/service.json"],
        # a quiet stream writes again at its next progress line (every 0.2 s here)
        ["event", "stream", "--index", "1", "--progress", "--heartbeat", "0.2"],
    ],
)
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(cluster: ClusterHandle, args: list[str]) -> None:
    """`caravan ... | head -1`: no error line, and the exit status a shell reports for SIGPIPE (as nomad's)."""
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(cluster.addresses)}
    env.pop("CARAVAN_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # the first line arrives; then the reader goes away, as head does
    proc.stdout.close()
    try:
        status = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.stderr.read() == b""
    assert status == 128 + signal.SIGPIPE


def test_acl_commands(cluster: ClusterHandle) -> None:
    boot = json.loads(caravan(cluster, "acl", "bootstrap", "--json").stdout)
    token = boot["SecretID"]
    denied = caravan(cluster, "job", "status")
    assert denied.returncode != 0 and denied.stderr == "Error: ACLs are enabled: pass a token (--token or CARAVAN_TOKEN)\n"
    wrong = caravan(cluster, "job", "run", "--detach", "examples/batch.json", token="not-a-token")
    assert wrong.returncode == 1 and wrong.stderr.endswith("no token has this secret (--token or CARAVAN_TOKEN)\n")
    created = json.loads(caravan(cluster, "acl", "token", "create", "--name", "ci", "--policy", "write", "--json", token=token).stdout)
    assert created["Name"] == "ci" and created["SecretID"]
    listing = caravan(cluster, "acl", "token", "list", token=token)
    assert "ci" in listing.stdout and created["SecretID"] not in listing.stdout
    assert caravan(cluster, "acl", "token", "delete", created["AccessorID"], token=token).returncode == 0
    # --ttl takes a Go duration, as `nomad acl token create -ttl`, or seconds
    for ttl, seconds in (("1h30m", 5400), ("90", 90)):
        out = caravan(cluster, "acl", "token", "create", "--name", "t", "--policy", "read", "--ttl", ttl, "--json", token=token)
        made = json.loads(out.stdout)
        assert abs(made["ExpirationTime"] - made["CreateTime"] - seconds * 10**9) < 10**9, (ttl, made)
    for bad in ("5x", "-5m"):
        out = caravan(cluster, "acl", "token", "create", "--name", "t", "--policy", "read", "--ttl", bad, token=token)
        assert out.returncode == 2 and "--ttl" in out.stderr and "Traceback" not in out.stderr
    # tables: times as dates, "<none>" for a token that never expires, and no
    # empty Secret ID line where the server cannot return it (stored hashed)
    made = caravan(cluster, "acl", "token", "create", "--name", "t", "--policy", "read", "--ttl", "1h", token=token).stdout
    assert re.search(r"^Secret ID +[0-9a-f-]{36}$", made, re.M) and re.search(r"^Expiry Time +\d{4}-\d\d-\d\dT", made, re.M)
    me = caravan(cluster, "acl", "token", "self", token=token).stdout
    assert re.search(r"^Expiry Time +<none>$", me, re.M) and re.search(r"^Create Time +\d{4}-", me, re.M)
    assert "Secret ID" not in me and boot["AccessorID"] in me
    peers = json.loads(caravan(cluster, "operator", "raft", "list-peers", "--json", token=token).stdout)
    assert len(peers) == 3 and sum(p["Leader"] for p in peers) == 1


def test_cluster_commands(tmp_path: Path) -> None:
    directory = str(tmp_path / "c")
    run = lambda *a: subprocess.run([sys.executable, "-m", "node.cli", *a], capture_output=True, text=True, cwd=ROOT, timeout=120)  # noqa: E731
    try:
        up = run("cluster", "up", "--dir", directory)
        assert up.returncode == 0, up.stderr
        assert "export CARAVAN_ADDRESS=" in up.stdout
        state = json.loads((Path(directory) / "cluster.json").read_text())
        assert {"id", "rpc_addr", "raft_addr", "pid", "data_dir", "log_file"} <= set(state["nodes"][0])
        status = json.loads(run("cluster", "status", "--dir", directory, "--json").stdout)
        assert sorted(s["Role"] for s in status) == ["follower", "follower", "leader"]
        assert all(s["RaftBusy"].endswith("%") and 0 <= int(s["RaftBusy"][:-1]) < 100 for s in status)
        assert run("cluster", "kill", "server2", "--dir", directory).returncode == 0
        status = json.loads(run("cluster", "status", "--dir", directory, "--json").stdout)
        assert [s["Healthy"] for s in status if s["Node"] == "server2"] == [False]
        assert run("cluster", "restart", "server2", "--dir", directory).returncode == 0
        again = run("cluster", "up", "--dir", directory)
        assert again.returncode != 0 and "already running" in again.stderr
    finally:
        run("cluster", "down", "--dir", directory)


def test_without_a_majority_commands_say_there_is_no_leader_and_what_to_do(cluster: ClusterHandle) -> None:
    """Kill the leader and one follower: the survivor names no leader (pysyncobj alone keeps
    naming the dead one), writes and reads fail with no_leader before the client's own timeout
    (not a bare timeout), and ``cluster status`` shows it; one restart brings writes back."""
    directory = cluster.cluster.dir
    spec = str(ROOT / "examples" / "batch.json")
    leader = cluster.leader()
    follower = next(n for n in cluster.cluster.nodes if n.id != leader.id)
    survivor = next(n for n in cluster.cluster.nodes if n.id not in (leader.id, follower.id))
    cluster.kill(leader)
    cluster.kill(follower)
    wait_until(lambda: (st := cluster.status(survivor.rpc_addr)) is not None and st["Leader"] == "",
               30, "the survivor to stop naming the dead leader")

    for command in (["job", "run", spec], ["job", "status"]):
        out = caravan(cluster, *command)
        assert out.returncode == 1, out
        assert out.stderr.startswith("Error: no cluster leader"), out.stderr
        assert "2 of the 3 servers" in out.stderr and "timeout" not in out.stderr

    status = caravan(cluster, "cluster", "status", "--dir", directory, "--json")
    assert [s["Healthy"] for s in json.loads(status.stdout)] == [False, False, False]
    assert "no leader" in status.stderr and "1 of 3 servers are up" in status.stderr

    cluster.restart(leader)
    cluster.reload()
    out = caravan(cluster, "job", "run", "--detach", spec)
    assert out.returncode == 0, out.stderr
    status = caravan(cluster, "cluster", "status", "--dir", directory, "--json")
    assert sorted(s["Healthy"] for s in json.loads(status.stdout)) == [False, True, True]
    assert "no leader" not in status.stderr


def test_the_http_address_given_as_the_rpc_address_is_named_as_such(cluster: ClusterHandle) -> None:
    """NOMAD_ADDR's host:port in CARAVAN_ADDRESS used to end in 'frame of 1213486160 bytes exceeds...'."""
    out = caravan(cluster, "job", "status", "--address", cluster.cluster.http_addresses[0])
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "Error: the server answered in HTTP: that is its HTTP API address (NOMAD_ADDR), not its RPC address; "
        "use the RPC address (CARAVAN_ADDRESS, printed by 'caravan cluster up')"
    )


def test_job_validate_checks_a_spec_with_the_servers_rules_and_no_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "CARAVAN_ADDRESS": "127.0.0.1:1"}  # nothing listens: validate must not need it
    run = lambda *a, stdin=None: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "node.cli", "job", "validate", *a], capture_output=True, text=True, env=env, cwd=ROOT,
        input=stdin, timeout=60,
    )
    good = run("examples/service.json")
    assert good.returncode == 0 and good.stdout == 'Job validation successful: service job "web" (frontend x2)\n', good
    bad = {"Job": {"ID": "x", "TaskGroups": [{"Name": "g", "Count": -1, "Tasks": [{"Name": "t", "Driver": "sim"}]}]}}
    out = run("-", stdin=json.dumps(bad))
    assert out.returncode == 1 and out.stderr == "Error: invalid jobspec: job x: group g: count -1 must be >= 0\n", out
    hcl = tmp_path / "j.nomad.hcl"
    hcl.write_text('job "h" {\n  group "g" {\n    count = "x"\n    task "t" { driver = "sim" }\n  }\n}\n')
    out = run(str(hcl))
    assert out.returncode == 1 and out.stderr.strip() == f"Error: {hcl}:3: count: must be a whole number, not 'x'", out
    for path, reason in ((tmp_path, "Is a directory"), (tmp_path / "none.json", "No such file or directory")):
        out = run(str(path))
        assert out.returncode == 1 and out.stderr == f"Error: {path}: cannot read the jobspec: {reason}\n", out


def test_a_command_with_no_server_listening_says_so_and_how_to_start_one(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens on it
    env = {k: v for k, v in os.environ.items() if k not in ("CARAVAN_ADDRESS", "CARAVAN_TOKEN")}
    out = subprocess.run([sys.executable, "-m", "node.cli", "job", "status", "--address", address],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"Error: no server is listening at {address} (connection refused): start the cluster "
        "('make run' or 'caravan cluster up') or check --address / CARAVAN_ADDRESS"
    )


def _bound(sock: socket.socket, host: str, port: int) -> bool:
    try:
        sock.bind((host, port))
    except OSError:
        return False
    return True


def test_restart_of_a_server_that_cannot_start_says_why(cluster: ClusterHandle) -> None:
    """Its raft port taken while it was down: 'restart' used to print 'Started' regardless."""
    node = cluster.cluster.nodes[0]
    cluster.kill(node)
    host, port = node.raft_addr.rsplit(":", 1)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # The killed server's connections hold the port for a few ms while they close.
        wait_until(lambda: _bound(squatter, host, int(port)), 10, "the killed server's raft port to be free")
        squatter.listen()
        out = caravan(cluster, "cluster", "restart", node.id, "--dir", cluster.cluster.dir)
    assert out.returncode == 1 and "Started" not in out.stdout
    assert out.stderr.startswith(
        f"Error: {node.id} exited as it started: caravan agent: cannot start: cannot listen on raft address "
        f"{node.raft_addr}: Address already in use"
    ), out.stderr
    out = caravan(cluster, "cluster", "restart", node.id, "--dir", cluster.cluster.dir)  # the port is free again
    assert out.returncode == 0 and out.stdout.startswith(f"Started {node.id}"), out.stderr


class _Dev:
    """``caravan dev`` as a user runs it: in the foreground, stopped with Ctrl-C."""

    def __init__(self, directory: str, out: Path) -> None:
        self.out = out
        with open(out, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "dev", "--dir", directory, "--nodes", "3", "--clients", "2"],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
            )

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def address(self) -> str:
        def ready() -> str | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"caravan dev exited with {self.proc.returncode}:\n{self.text()}")
            text = self.text()
            if "Press Ctrl-C to stop." not in text:
                return None
            return next(ln.split("=", 1)[1] for ln in text.splitlines() if "export CARAVAN_ADDRESS=" in ln)

        return wait_until(ready, 90, "caravan dev to print its addresses")

    def interrupt(self, signum: int = signal.SIGINT) -> int:
        self.proc.send_signal(signum)
        return self.proc.wait(60)


def test_dev_cluster_stops_on_ctrl_c_and_resumes_with_its_addresses_nodes_and_jobs(tmp_path: Path) -> None:
    """What ``make run`` runs: Ctrl-C stops every process; running it again keeps the state.

    The second run serves on the same addresses (an exported
    ``CARAVAN_ADDRESS`` still works), and the simulated client resumes the
    same nodes with their allocations instead of leaving down nodes behind.
    """
    directory = str(tmp_path / "dev")
    dev = _Dev(directory, tmp_path / "dev1.out")
    try:
        address = dev.address()
        env = {**os.environ, "CARAVAN_ADDRESS": address}
        env.pop("CARAVAN_TOKEN", None)
        run = subprocess.run([sys.executable, "-m", "node.cli", "job", "run", "--detach", str(ROOT / "examples" / "service.json")],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        with RPCClient(address.split(",")) as client:
            running = wait_until(lambda: sorted(a["ID"] for a in client.call("alloc.list", {"job_id": "web"})["data"]
                                                if a["ClientStatus"] == "running") or None, 60, "the service's allocs running")
            # After the wait: the simulated client may register its nodes after `job run` returns.
            nodes = {n["ID"] for n in client.call("node.list", {})["data"]}
        assert len(nodes) == 2 and len(running) == 2
        state = json.loads((Path(directory) / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]

        assert dev.interrupt() == 0, dev.text()
        assert "Stopped." in dev.text()
        assert not [pid for pid in pids if alive(pid)], "Ctrl-C leaves no server running"

        dev = _Dev(directory, tmp_path / "dev2.out")
        assert dev.address() == address
        with RPCClient(address.split(",")) as client:
            assert client.call("job.get", {"job_id": "web"})["data"]["Status"] == "running"

            def resumed() -> bool:
                listed = client.call("node.list", {})["data"]
                allocs = client.call("alloc.list", {"job_id": "web"})["data"]
                return ({n["ID"] for n in listed} == nodes and all(n["Status"] == "ready" for n in listed)
                        and sorted(a["ID"] for a in allocs if a["ClientStatus"] == "running") == running)

            wait_until(resumed, 30, "the same two nodes ready and the same allocs running")
        pids = [n["pid"] for n in json.loads((Path(directory) / "cluster.json").read_text())["nodes"]]
        assert dev.interrupt(signal.SIGHUP) == 0, dev.text()  # the terminal closed
        assert not [pid for pid in pids if alive(pid)], "a closed terminal leaves no server running"

        dev = _Dev(directory, tmp_path / "dev3.out")
        dev.address()
        state = json.loads((Path(directory) / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]] + [state["client_pid"]]
        assert alive(state["client_pid"])
        dev.interrupt(signal.SIGKILL)  # nothing of it can clean up: 'cluster down' must
        down = subprocess.run([sys.executable, "-m", "node.cli", "cluster", "down", "--dir", directory],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert down.returncode == 0, down.stderr
        assert not [pid for pid in pids if alive(pid)], "cluster down stops the servers and the simulated client"
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait(30)
        if (Path(directory) / "cluster.json").exists():
            subprocess.run([sys.executable, "-m", "node.cli", "cluster", "down", "--dir", directory],
                           capture_output=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("content", ["{nope", '{"nodes": 3}', '{"nodes": [{"id": "x"}]}'])
def test_a_bad_client_state_file_is_one_line_error_and_left_alone(tmp_path: Path, content: str) -> None:
    state = tmp_path / "client-sim.json"
    state.write_text(content)
    out = subprocess.run([sys.executable, "-m", "node.cli", "client", "sim", "--servers", "127.0.0.1:1", "--state-file", str(state)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("Error: ") and "delete it to start with new nodes" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and state.read_text() == content
