"""etcd's Go client (go.etcd.io/etcd/client/v3 and its concurrency recipes) against
TableKeeper's etcd API, through the small Go program in tests/compat/etcd_go (built once per
session from the Go module proxy; offline once the modules are in the cache).

Mutex and Election among five contenders with one killed while it holds the lock or leads; STM
bank transfers keep the total; a kill -9 of the server under load loses no acknowledged put,
and the client's watch and lease carry on across the restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.server import REPO, SERVER_COMMAND, ServerProcess, free_port

GO = shutil.which("go")
SOURCE = REPO / "tests" / "compat" / "etcd_go"
TIMEOUT_S = 300.0  # a hang guard: a kill -9 and a restart under load take a while on a busy machine
pytestmark = [
    pytest.mark.standalone_only("a server of its own, with --etcd-port"),
    pytest.mark.skipif(GO is None, reason="go is not installed"),
]


@pytest.fixture(scope="module")
def etcdgo_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert GO is not None
    binary = tmp_path_factory.mktemp("etcdgo") / "etcdgo"
    subprocess.run(
        [GO, "build", "-o", str(binary), "."],
        cwd=SOURCE,
        check=True,
        timeout=600,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    return binary


@pytest.fixture
def etcdgo(etcdgo_binary: Path) -> Iterator[Callable[..., Program]]:
    """Starts etcdgo runs; any still running when the test ends (it failed) is killed."""
    started: list[Program] = []

    def start(*args: str) -> Program:
        program = Program(etcdgo_binary, *args)
        started.append(program)
        return program

    yield start
    for program in started:
        if program.process.poll() is None:
            program.kill()


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    server = ServerProcess(tmp_path / "data", extra_args=["--etcd-port", str(port)])
    server.start()
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        server.stop()


class Program:
    """One run of etcdgo; its output lines are collected on a thread."""

    def __init__(self, binary: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [str(binary), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_line(self, start: str) -> str:
        with self._changed:
            self._changed.wait_for(
                lambda: any(line.startswith(start) for line in self.lines), timeout=TIMEOUT_S
            )
            found = [line for line in self.lines if line.startswith(start)]
        assert found, f"no {start!r} line; output: {self.lines[-20:]}"
        return found[0]

    def exit_code(self) -> int:
        """Wait for the program to end and for its last output line to be read (the process
        can end before the reader has seen what it wrote)."""
        code = self.process.wait(TIMEOUT_S)
        self._reader.join(TIMEOUT_S)
        return code

    def finish(self) -> list[str]:
        code = self.exit_code()
        assert code == 0, f"etcdgo exited {code}: {self.lines[-20:]}"
        return self.lines

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


def test_mutex_among_five_contenders_one_killed_while_holding(
    etcdgo: Callable[..., Program], etcd_server: tuple[ServerProcess, str]
) -> None:
    _, endpoint = etcd_server
    # Only the contender that is killed has a short session (its expiry frees the lock); the
    # others keep the program's long default, so a pause of a busy machine ends none of theirs.
    holder = etcdgo("mutex", "-endpoint", endpoint, "-name", "killed", "-hold", "-ttl", "2")
    holder.wait_line("LOCKED killed")
    others = [
        etcdgo("mutex", "-endpoint", endpoint, "-name", f"c{i}", "-rounds", "5") for i in range(4)
    ]
    holder.kill()  # its session's lease expires; the lock and its holder key go with it
    for i, other in enumerate(others):
        lines = other.finish()
        assert f"DONE c{i}" in lines and not any(line.startswith("FAIL") for line in lines)
    # Every round's unguarded read-increment-write counted: no two contenders overlapped.
    assert _get(endpoint, "/mutex/count") == b"20"


@pytest.mark.on_grpc_aio("keep-alive streams of clients that die")
def test_election_five_contenders_leader_killed(
    etcdgo: Callable[..., Program], etcd_server: tuple[ServerProcess, str]
) -> None:
    _, endpoint = etcd_server
    first = etcdgo("elect", "-endpoint", endpoint, "-name", "killed", "-hold", "-ttl", "2")
    first.wait_line("LEADER killed")
    others = [etcdgo("elect", "-endpoint", endpoint, "-name", f"e{i}") for i in range(4)]
    first.kill()
    revisions = []
    for i, other in enumerate(others):
        lines = other.finish()
        leader = [line for line in lines if line.startswith("LEADER")]
        assert leader and leader[0].split()[1] == f"e{i}" and f"RESIGNED e{i}" in lines
        revisions.append(int(leader[0].split()[2]))
    assert len(set(revisions)) == 4  # each led under its own campaign key


@pytest.mark.on_grpc_aio("concurrent txns from one client")
def test_stm_bank_transfers_keep_the_total(
    etcdgo: Callable[..., Program], etcd_server: tuple[ServerProcess, str]
) -> None:
    _, endpoint = etcd_server
    args = ["-accounts", "10", "-workers", "8", "-transfers", "40"]
    lines = etcdgo("bank", "-endpoint", endpoint, *args).finish()
    assert "TOTAL 1000 ACCOUNTS 10" in lines


def test_kill9_under_load_loses_no_acknowledged_put(
    etcdgo: Callable[..., Program], etcd_server: tuple[ServerProcess, str]
) -> None:
    server, endpoint = etcd_server
    workers, count = 4, 250
    load = etcdgo(
        "load",
        *["-endpoint", endpoint, "-prefix", "load/", "-workers", str(workers)],
        *["-count", str(count)],
    )
    load.wait_line("ACK load/0/000050")
    server.kill()
    server.start()
    lines = load.finish()
    acknowledged = {line.split()[1] for line in lines if line.startswith("ACK")}
    assert len(acknowledged) == workers * count
    assert f"WATCHED {workers * count}" in lines and "LEASE ok" in lines
    stored = set(_keys(endpoint, "load/"))
    assert acknowledged <= stored


def _etcdctl(endpoint: str, *args: str) -> str:
    etcdctl = shutil.which("etcdctl")
    if etcdctl is None:
        pytest.skip("etcdctl missing: apt-get install etcd-client")
    done = subprocess.run(
        [etcdctl, f"--endpoints={endpoint}", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "ETCDCTL_API": "3"},
        check=True,
    )
    return done.stdout


def _get(endpoint: str, key: str) -> bytes:
    return _etcdctl(endpoint, "get", key, "--print-value-only").strip().encode()


def _keys(endpoint: str, prefix: str) -> list[str]:
    return _etcdctl(endpoint, "get", "--prefix", prefix, "--keys-only").split()


@pytest.mark.on_grpc_aio("TLS and the token in every call's metadata")
def test_username_and_password_over_tls(etcdgo: Callable[..., Program], tmp_path: Path) -> None:
    """clientv3 with Username/Password: it calls Authenticate and sends the token (`token`
    metadata) with every call, streams included; what it may do is the user's permissions on
    namespace etcd. A wrong password fails the connect with etcd's error."""
    import grpc

    from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
    from tablekeeper_server.security.certs import write_authority
    from tablekeeper_server.security.tokens import create_token

    certs = tmp_path / "certs"
    write_authority(certs, hosts=["127.0.0.1", "localhost"], clients=[])
    secret = (certs / "secret.key").read_bytes().strip()
    port = free_port()
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            *("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")),
            *("--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"),
            *("--etcd-port", str(port)),
        ],
        tls_files=(certs / "ca.pem", None, None),
    ).start()
    try:
        endpoint = f"127.0.0.1:{port}"
        admin = (("authorization", f"Bearer {create_token(secret, 'admin')}"),)
        credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        with grpc.secure_channel(endpoint, credentials) as channel:
            rpc_pb2_grpc.AuthStub(channel).UserAdd(
                rpc_pb2.AuthUserAddRequest(name="gopher", password="s3cret"), metadata=admin
            )
        login = ("-endpoint", endpoint, "-cacert", str(certs / "ca.pem"), "-prefix", "/go/")

        wrong = etcdgo("auth", *login, "-user", "gopher", "-password", "nope")
        assert wrong.exit_code() != 0
        assert "invalid user ID or password" in "\n".join(wrong.lines), wrong.lines

        denied = etcdgo("auth", *login, "-user", "gopher", "-password", "s3cret")
        assert denied.exit_code() != 0
        assert "lacks write on namespace 'etcd'" in denied.wait_line("DENIED put")

        # The grant through the CLI, in its own process: this one has the BookKeeper Python
        # client's protos loaded, whose names collide with the SDK's.
        granted = subprocess.run(
            [
                str(SERVER_COMMAND),
                *("--service", server.service, "--tls-ca", str(certs / "ca.pem")),
                *("--token", create_token(secret, "admin")),
                *("auth", "grant", "etcd", "gopher", "read", "write"),
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert granted.returncode == 0, granted.stderr
        lines = etcdgo("auth", *login, "-user", "gopher", "-password", "s3cret").finish()
        assert "PUT-GET ok" in lines and "LEASE ok" in lines, lines
        assert any(line.startswith("WATCH /go/") for line in lines), lines
    finally:
        server.stop()
