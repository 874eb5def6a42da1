"""`tablekeeper server --runtime envoy` (issue 12): the main port's HTTP/2 served by Envoy, the
calls handed to the server's Python as ASGI requests (`rpc.envoy`, `rpc.asgi`).

Real clients against a real Envoy: our SDK (unary calls, routing, a watch stream, a session's
keep-alive stream) and raw gRPC for the bad inputs; SIGTERM drains and exits 0 (a call in flight
is answered, on either runtime), kill -9 loses nothing acknowledged. TLS, tokens, permissions
and client-certificate roles are tests/integration/test_security.py's, on both runtimes.
The unmodified BookKeeper clients (Python and Java) run their whole compat suite on this
runtime too (`make test-compat`, TABLEKEEPER_TEST_RUNTIME=envoy)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tablekeeper import (
    Client,
    RetryPolicy,
)
from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc, storage_pb2
from tablekeeper_server.core.failpoints import ENV_VAR as FAILPOINTS
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = pytest.mark.integration

TIMEOUT_S = 30
FAST_FAIL = RetryPolicy(deadline_s=0.5)


@pytest.fixture
def envoy_server(tmp_path: Path, server_factory: list[ServerProcess]) -> ServerProcess:
    server = ServerProcess(tmp_path / "data", extra_args=["--runtime", "envoy"])
    server_factory.append(server)
    return server.start(timeout_s=120)


def _table_id(server: ServerProcess) -> int:
    with Client(server.service) as client:
        client.create_namespace("e")
        return client.create_table("e", "t", ranges=4).table_id


def test_the_process_is_envoy_and_the_sdk_works_through_it(envoy_server: ServerProcess) -> None:
    assert envoy_server.process is not None
    exe = Path(f"/proc/{envoy_server.process.pid}/exe").resolve()
    assert exe.name == "envoy", exe  # exec'd: the same pid, so signals and kill -9 reach it
    _table_id(envoy_server)
    with Client(envoy_server.service) as client:
        table = client.table("e", "t")
        for i in range(50):
            table.put(f"p{i}", "k", f"v{i}")
        assert table.get("p7", "k").value == b"v7"  # type: ignore[union-attr]
        assert table.increment("counter", "c", 5, get_total=True) == 5
        assert table.increment("counter", "c", 2, get_total=True) == 7
        assert table.get("nope", "k") is None
        assert table.delete("p7", "k") == 1
        assert table.get("p7", "k") is None
        assert table.delete("p7", "k") == 0
        assert client.status().runtime == "envoy"


def test_a_watch_stream_and_a_session_stream_through_envoy(envoy_server: ServerProcess) -> None:
    _table_id(envoy_server)
    with Client(envoy_server.service) as client:
        table = client.table("e", "t")
        table.put("w", "k", "v0")
        events: list[bytes] = []
        got_two = threading.Event()

        def watch() -> None:
            with table.watch("w", "k") as changes:
                for event in changes:
                    assert event.kv is not None
                    events.append(event.kv.value)
                    if len(events) == 2:
                        got_two.set()
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with table.session("w", ttl_s=5) as session:
            table.put("w", "eph", "x", session=session)
            assert table.get("w", "eph") is not None
            table.put("w", "k", "v1")
            table.put("w", "k", "v2")
            assert got_two.wait(TIMEOUT_S), events
        assert events == [b"v1", b"v2"]
        # The session's close deleted its ephemeral key.
        assert table.get("w", "eph") is None


def test_bad_requests_get_the_same_answers_as_on_grpc_aio(
    tmp_path: Path, envoy_server: ServerProcess, server_factory: list[ServerProcess]
) -> None:
    plain = ServerProcess(tmp_path / "plain")
    server_factory.append(plain)
    plain.start()
    answers = []
    for server in (envoy_server, plain):
        table_id = _table_id(server)
        with grpc.insecure_channel(server.target) as channel:
            stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
            garbage = channel.unary_unary(
                "/bookkeeper.proto.kv.rpc.TableService/Put",
                request_serializer=lambda raw: raw,
                response_deserializer=lambda raw: raw,
            )
            with pytest.raises(grpc.RpcError) as malformed:
                garbage(b"\xff\xff\xff", timeout=TIMEOUT_S)
            no_table = stub.Put(
                kv.PutRequest(header=kv.RoutingHeader(stream_id=999_999, r_key=b"k"), key=b"k"),
                timeout=TIMEOUT_S,
            )
            too_long = stub.Put(
                kv.PutRequest(
                    header=kv.RoutingHeader(stream_id=table_id, r_key=b"k"),
                    key=b"k" * 100_000,
                    value=b"v",
                ),
                timeout=TIMEOUT_S,
            )
            unknown = channel.unary_unary("/bookkeeper.proto.kv.rpc.TableService/Nope")
            with pytest.raises(grpc.RpcError) as unimplemented:
                unknown(b"", timeout=TIMEOUT_S)
        answers.append(
            (
                malformed.value.code(),
                no_table.header.code,
                too_long.header.code,
                unimplemented.value.code(),
            )
        )
    envoy_answers, plain_answers = answers
    assert envoy_answers[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert envoy_answers[3] == grpc.StatusCode.UNIMPLEMENTED
    assert envoy_answers[1] != storage_pb2.SUCCESS and envoy_answers[2] != storage_pb2.SUCCESS
    assert envoy_answers == plain_answers


def test_sigterm_stops_cleanly_and_kill_9_loses_nothing_acknowledged(
    envoy_server: ServerProcess,
) -> None:
    _table_id(envoy_server)
    with Client(envoy_server.service) as client:
        table = client.table("e", "t")
        for i in range(200):
            table.put(f"p{i}", "k", f"v{i}")
    assert envoy_server.process is not None
    envoy_server.process.send_signal(signal.SIGKILL)
    envoy_server.process.wait(TIMEOUT_S)
    envoy_server.start(timeout_s=120)
    with Client(envoy_server.service) as client:
        table = client.table("e", "t")
        assert all(table.get(f"p{i}", "k").value == f"v{i}".encode() for i in range(200))  # type: ignore[union-attr]
    envoy_server.process.send_signal(signal.SIGTERM)
    assert envoy_server.process.wait(TIMEOUT_S) == 0
    log = envoy_server.log_path.read_text()
    assert "stopped cleanly" in log
    envoy_server.start(timeout_s=120)
    with Client(envoy_server.service) as client:
        assert client.table("e", "t").get("p199", "k").value == b"v199"  # type: ignore[union-attr]


def test_workers_on_envoy_share_the_containers_and_stop_on_sigterm(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(tmp_path / "data", extra_args=["--runtime", "envoy", "--workers", "2"])
    server_factory.append(server)
    server.start(timeout_s=120)
    assert server.process is not None
    workers = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text()
    assert [Path(f"/proc/{pid}/exe").resolve().name for pid in workers.split()] == ["envoy"] * 2
    with Client(server.service) as client:
        client.create_namespace("w")
        client.create_table("w", "t", ranges=8)
        table = client.table("w", "t")
        for i in range(100):
            table.put(f"p{i}", "k", f"v{i}")
        assert all(table.get(f"p{i}", "k").value == f"v{i}".encode() for i in range(100))  # type: ignore[union-attr]
        assert list(client.server_info().containers) == [0, 2, 4, 6]  # worker 0's share
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(TIMEOUT_S) == 0
    assert server.log_path.read_text().count("stopped cleanly") == 2


def _logged(server: ServerProcess, text: str) -> Callable[[], bool]:
    return lambda: text in server.log_path.read_text(errors="replace")


@pytest.mark.parametrize("runtime", ["grpc-aio", "envoy"])
def test_sigterm_answers_the_call_in_flight_then_stops_cleanly(
    runtime: str, tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """A call in flight when SIGTERM comes is answered, not cut (Envoy alone would close its
    connections at once: `rpc.envoy` takes the signal first); a call that comes after the
    drain began is refused UNAVAILABLE; then the server exits 0. The call held in flight is
    an admin Checkpoint, stopped by a failpoint inside its upload until the test lets it go."""
    release = tmp_path / "release"
    server = ServerProcess(
        tmp_path / "data",
        extra_args=["--runtime", runtime, "--shutdown-grace", "120"],
        env={FAILPOINTS: f"checkpoint.during_upload=wait:{release}"},
    )
    server_factory.append(server)
    server.start(timeout_s=120)
    table_id = _table_id(server)
    with Client(server.service) as client:
        table = client.table("e", "t")
        for i in range(20):
            table.put(f"p{i}", "k", f"v{i}")
    outcome: dict[str, Any] = {}

    def checkpoint() -> None:
        with Client(server.service) as client:
            try:
                outcome["result"] = client.checkpoint("e", "t")
            except Exception as exc:  # reported by the assertion below
                outcome["error"] = exc

    in_flight = threading.Thread(target=checkpoint, daemon=True)
    in_flight.start()
    server.wait_for(_logged(server, "failpoint checkpoint.during_upload: waiting"), "the failpoint")
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    server.wait_for(_logged(server, "shutting down: draining in-flight requests"), "the drain")
    with grpc.insecure_channel(server.target) as channel:
        stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
        get = kv.RangeRequest(header=kv.RoutingHeader(stream_id=table_id, r_key=b"p1"), key=b"k")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Range(get, timeout=TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.running and in_flight.is_alive()  # the drain waits for the checkpoint
    release.touch()
    in_flight.join(TIMEOUT_S)
    assert "error" not in outcome, outcome
    assert outcome["result"] is not None
    assert server.process.wait(TIMEOUT_S) == 0
    log = server.log_path.read_text()
    assert "stopped cleanly" in log
    assert "Traceback" not in log


def test_a_server_started_by_a_script_outlives_it(tmp_path: Path) -> None:
    """Envoy's main thread starts with a parent-death signal (SIGTERM): a server started by a
    script that then exits (deploy/cluster.sh) would stop with it. It goes on, as on grpc.aio,
    and the command it was started with stays on its command line."""
    server = ServerProcess(tmp_path / "data", extra_args=["--runtime", "envoy"])
    command = [
        str(SERVER_COMMAND),
        *("server", "--runtime", "envoy", "--data-dir", str(server.data_dir)),
        *("--port", str(server.port), "--metrics-port", str(server.metrics_port)),
    ]
    release = tmp_path / "script-may-exit"
    # The script starts the server, then exits once it serves (Envoy has started by then).
    script = (
        'release="$1"; shift; setsid "$@" </dev/null >>"$0" 2>&1 & echo $!; '
        'until [ -e "$release" ]; do sleep 0.05; done'
    )
    launcher = subprocess.Popen(
        ["bash", "-c", script, str(server.log_path), str(release), *command],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    try:
        with grpc.insecure_channel(server.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def serving() -> bool:
                assert _state(pid) != b"Z", server.log_tail()  # (gone reads as a zombie)
                try:
                    answer = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    return False
                return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

            _until(serving, "the server serving")
        release.touch()
        assert launcher.wait(TIMEOUT_S) == 0  # the parent is gone: its death was signalled
        _table_id(server)
        with Client(server.service) as client:
            client.table("e", "t").put("p", "k", "v")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        assert b" server --runtime envoy --data-dir " + str(server.data_dir).encode() in cmdline
    finally:
        os.kill(pid, signal.SIGTERM)
        _until(lambda: _state(pid) == b"Z", "the server stopped")
    log = server.log_path.read_text()
    # One stop, and it was ours (this test's kill), not the launcher's exit.
    assert log.count("stopping gracefully") == 1, log
    assert f"SIGTERM (from pid {os.getpid()}: " in log, log
    assert "already stopping" not in log and "stopped cleanly" in log


def _until(condition: Callable[[], bool], what: str) -> None:
    """For a server that is not this test's child (`ServerProcess.wait_for` needs that)."""
    deadline = time.monotonic() + 2 * TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.05)


def _state(pid: int) -> bytes:
    """The process's state letter; Z for a zombie and for a process that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return b"Z"
