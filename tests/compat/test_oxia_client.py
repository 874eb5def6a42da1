"""The real Oxia Java client (io.github.oxia-db:oxia-client 0.6.2, the one Pulsar 4.0.7 ships)
against TableKeeper's Oxia front-end (`--oxia-port`), through a small Java driver
(tests/compat/oxia/OxiaDriver.java, compiled against Pulsar's jars from `deploy/pulsar.sh
fetch`); Oxia's error codes for bad input, through the generated Python stubs; and a real
Pulsar 4.0.7 standalone whose metadata store is TableKeeper (`--metadata-url oxia://…`).

One standalone server for the module; each scenario uses keys of its own.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pulsar as pulsar_client
import pytest

from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tests.compat.oxia.pulsar_standalone import PulsarOnOxia
from tests.support.server import ServerProcess, free_port

pytestmark = pytest.mark.standalone_only("a server of its own, with --oxia-port")

REPO = Path(__file__).resolve().parents[2]
DRIVER_SOURCE = Path(__file__).parent / "oxia" / "OxiaDriver.java"
PULSAR_VERSION = "4.0.7"
RUN_TIMEOUT_S = 300.0
# Scenarios that need nothing from the test while they run: one JVM for all of them.
PLAIN = ("versions", "ranges", "comparisons", "ephemeral-close", "notifications", "sequences")


def _classpath() -> str:
    cache = os.environ.get("PULSAR_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "tablekeeper"
        / f"pulsar-{PULSAR_VERSION}"
    )
    path = Path(cache) / "classpath.txt"
    if not path.exists():
        subprocess.run([str(REPO / "deploy" / "pulsar.sh"), "fetch"], check=True, timeout=1800)
    return path.read_text().strip()


@dataclass
class Oxia:
    server: ServerProcess
    address: str
    java_classpath: str

    def driver(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["java", "-Xmx128m", "-cp", self.java_classpath, "OxiaDriver", self.address, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *args: str) -> str:
        process = self.driver(*args)
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        assert process.returncode == 0, f"driver {args}:\n{out}\n{err[-6000:]}"
        return out


@pytest.fixture(scope="module")
def oxia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oxia]:
    classes = tmp_path_factory.mktemp("oxia-driver")
    classpath = _classpath()
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", classpath, str(DRIVER_SOURCE)],
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    port = free_port()
    server = ServerProcess(
        tmp_path_factory.mktemp("oxia") / "data", extra_args=["--oxia-port", str(port)]
    )
    server.start()
    try:
        yield Oxia(server, f"127.0.0.1:{port}", f"{classpath}:{classes}")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain_results(oxia: Oxia) -> dict[str, str]:
    process = oxia.driver("+".join(PLAIN))
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    results = {}
    for line in out.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL"):
            scenario = rest.split(":")[0]
            results[scenario] = line if verdict == "FAIL" else "PASS"
            if verdict == "FAIL":
                results[scenario] += "\n" + err[-6000:]
    return results


@pytest.mark.on_grpc_aio("the Oxia Java client (grpc-java): write and read streams, notifications")
@pytest.mark.parametrize("scenario", PLAIN)
def test_java_client_scenario(plain_results: dict[str, str], scenario: str) -> None:
    """versions: put/get/delete with version ids, modification counts, timestamps, expected
    versions (-1 and N), refusals that change nothing; ranges: list/rangeScan/deleteRange in
    Oxia's key order over all shards; comparisons: FLOOR/CEILING/LOWER/HIGHER; ephemeral-close:
    an ephemeral record with its session id and owner goes when the session closes;
    notifications: created/modified/deleted in order; sequences: sequence keys (one and two
    parts), partition keys, sequence updates."""
    result = plain_results.get(scenario, "never ran (an earlier scenario failed)")
    assert result == "PASS", result


def test_ephemeral_record_goes_when_its_session_expires(oxia: Oxia) -> None:
    key = f"/ephemeral/crash-{uuid.uuid4().hex}"
    assert "PASS ephemeral-crash" in oxia.run("ephemeral-crash", key)
    oxia.run("wait-gone", key)  # the session (10 s) expires on the server: the key goes


def test_ephemeral_record_of_a_dead_client_goes_after_a_server_restart(oxia: Oxia) -> None:
    """The server restarts before the dead client's session expired: the session is timed again
    from the start (a fresh TTL) and its record goes. (The server opens every shard of `default`
    at start, so this happens even if nobody reads; this test reads, so it cannot tell.)"""
    key = f"/ephemeral/restart-{uuid.uuid4().hex}"
    assert "PASS ephemeral-crash" in oxia.run("ephemeral-crash", key)
    oxia.server.restart()
    oxia.run("wait-gone", key)


def _cli(oxia: Oxia, *args: str) -> None:
    command = "import sys; from tablekeeper.cli import main; sys.exit(main())"
    subprocess.run(
        [sys.executable, "-c", command, "--service", oxia.server.service, *args],
        check=True,
        timeout=60,
    )


@pytest.mark.on_grpc_aio("the namespace in the call's metadata")
def test_other_namespace_and_unknown_namespace(oxia: Oxia) -> None:
    name = f"ns{uuid.uuid4().hex[:8]}"
    _cli(oxia, "table", "create", f"oxia/{name}", "--ranges", "2")
    oxia.run("namespace", name)


@pytest.mark.on_grpc_aio("streams reconnect through the server's own shutdown")
def test_notifications_continue_across_a_server_restart(oxia: Oxia) -> None:
    process = oxia.driver("notifications-restart")
    assert process.stdout is not None and process.stdin is not None
    try:
        line = process.stdout.readline()
        while line and line.strip() != "RESTART":
            line = process.stdout.readline()
        assert line.strip() == "RESTART", "driver ended before the restart"
        oxia.server.restart()
        process.stdin.write("go\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, f"{out}\n{err[-6000:]}"


@pytest.fixture
def stub(oxia: Oxia) -> Iterator[client_pb2_grpc.OxiaClientStub]:
    with grpc.insecure_channel(oxia.address) as channel:
        yield client_pb2_grpc.OxiaClientStub(channel)


def _shards(stub: client_pb2_grpc.OxiaClientStub) -> list[int]:
    stream = stub.GetShardAssignments(client_pb2.ShardAssignmentsRequest(namespace="default"))
    first = next(iter(stream))
    stream.cancel()
    assignment = first.namespaces["default"]
    assert assignment.shard_key_router == client_pb2.XXHASH3
    ranges = [
        (a.int32_hash_range.min_hash_inclusive, a.int32_hash_range.max_hash_inclusive)
        for a in assignment.assignments
    ]
    # The shards' hash ranges cover the 32-bit space exactly, without overlap.
    ranges.sort()
    assert ranges[0][0] == 0 and ranges[-1][1] == 2**32 - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    return [a.shard for a in assignment.assignments]


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    code: grpc.StatusCode = failure.value.code()
    return code


@pytest.mark.on_grpc_aio("status codes and messages")
def test_bad_input_gets_oxia_codes_and_writes_nothing(
    stub: client_pb2_grpc.OxiaClientStub,
) -> None:
    shard = _shards(stub)[0]
    key = f"/bad/{uuid.uuid4().hex}"
    good = client_pb2.PutRequest(key=key + "-good", value=b"v")
    bad_requests = [
        # A sequence key without a partition key, or with an expected version, or a first
        # delta of 0: refused as a whole, the good put with it is not applied either.
        client_pb2.PutRequest(key=key, value=b"v", sequence_key_delta=[1]),
        client_pb2.PutRequest(
            key=key, value=b"v", partition_key="p", sequence_key_delta=[1], expected_version_id=-1
        ),
        client_pb2.PutRequest(key=key, value=b"v", partition_key="p", sequence_key_delta=[0]),
        client_pb2.PutRequest(key=key, value=b"v", expected_version_id=-2),
        client_pb2.PutRequest(key="k" * 70_000, value=b"v"),
    ]
    for bad in bad_requests:
        request = client_pb2.WriteRequest(shard=shard, puts=[good, bad])
        assert _code(functools.partial(stub.Write, request)) == grpc.StatusCode.INVALID_ARGUMENT
    # A value over the server's --max-value-bytes (4 MiB): RESOURCE_EXHAUSTED, as Oxia answers a
    # request over its gRPC frame; the good put with it is not applied either.
    big = client_pb2.PutRequest(key=key + "-big", value=b"v" * (4 * 1024 * 1024 + 1))
    request = client_pb2.WriteRequest(shard=shard, puts=[good, big])
    with pytest.raises(grpc.RpcError) as refused:
        stub.Write(request)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (refused.value.details() or "").startswith("oxia: value is 4194305 bytes")
    read = client_pb2.ReadRequest(shard=shard, gets=[client_pb2.GetRequest(key=key + "-good")])
    (response,) = list(stub.Read(read))
    assert response.gets[0].status == client_pb2.KEY_NOT_FOUND

    # An ephemeral put naming a session that does not exist: SESSION_DOES_NOT_EXIST, no record.
    write = client_pb2.WriteRequest(
        shard=shard, puts=[client_pb2.PutRequest(key=key, value=b"v", session_id=999_999_999)]
    )
    assert stub.Write(write).puts[0].status == client_pb2.SESSION_DOES_NOT_EXIST
    (response,) = list(
        stub.Read(client_pb2.ReadRequest(shard=shard, gets=[client_pb2.GetRequest(key=key)]))
    )
    assert response.gets[0].status == client_pb2.KEY_NOT_FOUND

    # Unknown shard, session, namespace.
    unknown = client_pb2.WriteRequest(shard=shard + 12345, puts=[good])
    assert _code(lambda: stub.Write(unknown)) == grpc.StatusCode.NOT_FOUND
    heartbeat = client_pb2.SessionHeartbeat(shard=shard, session_id=999_999_999)
    assert _code(lambda: stub.KeepAlive(heartbeat)) == grpc.StatusCode.NOT_FOUND
    close = client_pb2.CloseSessionRequest(shard=shard, session_id=999_999_999)
    assert _code(lambda: stub.CloseSession(close)) == grpc.StatusCode.NOT_FOUND
    missing = client_pb2.ShardAssignmentsRequest(namespace="no-such-namespace")
    with pytest.raises(grpc.RpcError) as failure:
        next(iter(stub.GetShardAssignments(missing)))
    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == "oxia: namespace not found"
    bad_timeout = client_pb2.CreateSessionRequest(shard=shard, session_timeout_ms=1)
    assert _code(lambda: stub.CreateSession(bad_timeout)) == grpc.StatusCode.INVALID_ARGUMENT


def _pulsar_round(pulsar: PulsarOnOxia, produce: bool) -> list[str]:
    """On the first round create a tenant, namespace, topic and subscription, and produce 10
    messages; every round consumes (and acknowledges) the next 5 of the subscription."""
    topic = "persistent://tk/ns1/t1"
    if produce:
        pulsar.admin("PUT", "/admin/v2/tenants/tk", {"allowedClusters": ["standalone"]})
        pulsar.admin("PUT", "/admin/v2/namespaces/tk/ns1")
        pulsar.admin("PUT", "/admin/v2/persistent/tk/ns1/t1")
        pulsar.admin("PUT", "/admin/v2/persistent/tk/ns1/t1/subscription/sub1")
    assert "tk" in pulsar.admin("GET", "/admin/v2/tenants")
    assert pulsar.admin("GET", "/admin/v2/namespaces/tk") == ["tk/ns1"]
    assert pulsar.admin("GET", "/admin/v2/persistent/tk/ns1") == [topic]
    assert pulsar.admin("GET", "/admin/v2/persistent/tk/ns1/t1/subscriptions") == ["sub1"]
    client = pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=30)
    try:
        if produce:
            producer = client.create_producer(topic)
            for i in range(10):
                producer.send(f"m{i}".encode())
        consumer = client.subscribe(topic, "sub1")
        got = []
        for _ in range(5):
            message = consumer.receive(timeout_millis=int(RUN_TIMEOUT_S * 1000))
            got.append(message.data().decode())
            consumer.acknowledge(message)
        consumer.close()
        return got
    finally:
        client.close()


def _try_admin(pulsar: PulsarOnOxia, method: str, path: str) -> bool:
    try:
        pulsar.admin(method, path)
    except urllib.error.HTTPError as error:
        if error.code == 409:  # an earlier attempt got through after all
            return True
        if error.code < 500:
            raise
        return False
    return True


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S  # a hang guard, not a performance bound
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.5)


def test_pulsar_standalone_keeps_its_metadata_in_tablekeeper(oxia: Oxia, tmp_path: Path) -> None:
    """Pulsar 4.0.7 standalone with `--metadata-url oxia://…`: tenant, namespace, topic,
    subscription, produce and consume; then Pulsar stops, TableKeeper restarts, Pulsar starts
    again on the same TableKeeper (and its bookie's own files): everything is there and the
    subscription goes on where it was acknowledged. Then TableKeeper restarts under the running
    Pulsar, which carries on."""
    pulsar = PulsarOnOxia(tmp_path / "pulsar", f"oxia://{oxia.address}", _classpath())
    try:
        pulsar.start()
        assert _pulsar_round(pulsar, produce=True) == [f"m{i}" for i in range(5)]
        pulsar.stop()
        oxia.server.restart()
        pulsar.start()
        assert _pulsar_round(pulsar, produce=False) == [f"m{i}" for i in range(5, 10)]
        # TableKeeper restarts under the running Pulsar: its Oxia client reconnects (write
        # streams, notifications, sessions) and metadata writes work again.
        oxia.server.restart()
        _wait_until(lambda: _try_admin(pulsar, "PUT", "/admin/v2/namespaces/tk/ns2"))
        assert pulsar.admin("GET", "/admin/v2/namespaces/tk") == ["tk/ns1", "tk/ns2"]
        client = pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer("persistent://tk/ns2/after-restart")
            consumer = client.subscribe("persistent://tk/ns2/after-restart", "s")
            producer.send(b"after")
            assert consumer.receive(timeout_millis=int(RUN_TIMEOUT_S * 1000)).data() == b"after"
        finally:
            client.close()
    except BaseException:
        print(pulsar.log_tail(80))
        raise
    finally:
        pulsar.stop()


def test_a_deleted_namespace_takes_nothing_and_comes_back_empty(
    stub: client_pb2_grpc.OxiaClientStub, oxia: Oxia
) -> None:
    """Deleting the table of a namespace: its shards answer "shard not found" and nothing is
    written; created again, the namespace has new shards and none of the old keys."""
    name = f"gone{uuid.uuid4().hex[:8]}"
    _cli(oxia, "table", "create", f"oxia/{name}", "--ranges", "2")

    def shards() -> list[int]:
        stream = stub.GetShardAssignments(client_pb2.ShardAssignmentsRequest(namespace=name))
        first = next(iter(stream))
        stream.cancel()
        return [a.shard for a in first.namespaces[name].assignments]

    old = shards()
    put = client_pb2.PutRequest(key="/k", value=b"v")
    for shard in old:
        assert stub.Write(client_pb2.WriteRequest(shard=shard, puts=[put])).puts[0].status == 0
    _cli(oxia, "table", "delete", f"oxia/{name}")
    for shard in old:
        write = client_pb2.WriteRequest(shard=shard, puts=[put])
        assert _code(functools.partial(stub.Write, write)) == grpc.StatusCode.NOT_FOUND
    _cli(oxia, "table", "create", f"oxia/{name}", "--ranges", "2")
    new = shards()
    assert not set(new) & set(old)
    for shard in new:
        read = client_pb2.ReadRequest(shard=shard, gets=[client_pb2.GetRequest(key="/k")])
        (response,) = list(stub.Read(read))
        assert response.gets[0].status == client_pb2.KEY_NOT_FOUND


MESSAGES = 10_000
KILL_AFTER = 3_000


def _admin_until(pulsar: PulsarOnOxia, method: str, path: str) -> None:
    _wait_until(lambda: _try_admin(pulsar, method, path))


@pytest.mark.default_runtime_only(
    "a kill -9 looks the same to the client on every runtime (refused connections); the "
    "client's reconnection through a runtime's own shutdown is test_notifications_continue_"
    "across_a_server_restart's, which runs on both"
)
def test_pulsar_produces_10000_messages_through_a_kill_9_of_tablekeeper(
    oxia: Oxia, tmp_path: Path
) -> None:
    """Pulsar on TableKeeper (`oxia://`): a partitioned and a non-partitioned topic with
    subscriptions; 10,000 messages produced while the TableKeeper server is killed with -9 and
    started again part-way. Pulsar carries on without a restart, every acknowledged message is
    consumed, and after a Pulsar restart the topics, subscriptions and a backlog are all there."""
    pulsar = PulsarOnOxia(tmp_path / "pulsar", f"oxia://{oxia.address}", _classpath())
    parted, plain = "persistent://load/ns/parted", "persistent://load/ns/plain"
    try:
        pulsar.start()
        pulsar.admin("PUT", "/admin/v2/tenants/load", {"allowedClusters": ["standalone"]})
        pulsar.admin("PUT", "/admin/v2/namespaces/load/ns")
        pulsar.admin("PUT", "/admin/v2/persistent/load/ns/parted/partitions", 3)
        pulsar.admin("PUT", "/admin/v2/persistent/load/ns/plain")
        client = pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=60)
        try:
            consumers = {t: client.subscribe(t, "sub") for t in (parted, plain)}
            producers = {
                t: client.create_producer(t, send_timeout_millis=120_000, block_if_queue_full=True)
                for t in (parted, plain)
            }
            acked: dict[str, set[str]] = {parted: set(), plain: set()}
            failed: list[str] = []
            done = threading.Semaphore(0)

            def sent(topic: str, body: str) -> Callable[[Any, Any], None]:
                def callback(result: Any, _: Any) -> None:
                    if result == pulsar_client.Result.Ok:
                        acked[topic].add(body)
                    else:
                        failed.append(f"{topic} {body}: {result}")
                    done.release()

                return callback

            for i in range(MESSAGES):
                topic = parted if i % 2 == 0 else plain
                body = f"m{i}"
                producers[topic].send_async(body.encode(), sent(topic, body), partition_key=body)
                if i == KILL_AFTER:
                    oxia.server.kill()  # metadata store gone while messages are in flight
                    oxia.server.start()
            for _ in range(MESSAGES):
                assert done.acquire(timeout=RUN_TIMEOUT_S), "a send never completed"
            # Nothing was refused outright: the broker carried on through the kill.
            assert not failed, failed[:5]
            for topic, consumer in consumers.items():
                received: set[str] = set()
                while len(received) < len(acked[topic]):
                    message = consumer.receive(timeout_millis=int(RUN_TIMEOUT_S * 1000))
                    received.add(message.data().decode())
                    consumer.acknowledge(message)
                assert acked[topic] <= received, sorted(acked[topic] - received)[:5]
            assert len(acked[parted]) + len(acked[plain]) == MESSAGES
            # A backlog to find again after a Pulsar restart.
            for i in range(100):
                producers[plain].send(f"b{i}".encode())
        finally:
            client.close()
        pulsar.restart()
        assert sorted(pulsar.admin("GET", "/admin/v2/persistent/load/ns/partitioned")) == [parted]
        assert "sub" in pulsar.admin("GET", "/admin/v2/persistent/load/ns/plain/subscriptions")
        stats = pulsar.admin("GET", "/admin/v2/persistent/load/ns/plain/stats")
        assert stats["subscriptions"]["sub"]["msgBacklog"] == 100, stats["subscriptions"]
        client = pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=60)
        try:
            consumer = client.subscribe(plain, "sub")
            backlog = [
                consumer.receive(timeout_millis=int(RUN_TIMEOUT_S * 1000)).data().decode()
                for _ in range(100)
            ]
            assert backlog == [f"b{i}" for i in range(100)]
        finally:
            client.close()
    except BaseException:
        print(pulsar.log_tail(80))
        raise
    finally:
        pulsar.stop()


@pytest.mark.default_runtime_only(
    "about deploy/pulsar.sh's set-up; the same client's calls on both runtimes are the "
    "scenarios (test_java_client_scenario)"
)
def test_deploy_pulsar_with_tablekeeper_as_its_metadata_store(oxia: Oxia, tmp_path: Path) -> None:
    """`deploy/pulsar.sh start --metadata oxia://…` (the documented one-command set-up): Pulsar
    starts and passes its produce/consume check with its broker and bookie metadata in
    TableKeeper, which then holds Pulsar's cluster and bookie registrations; the --dir keeps its
    metadata store (another one is refused)."""
    script = Path(__file__).resolve().parents[2] / "deploy" / "pulsar.sh"
    directory = tmp_path / "pulsar-deploy"
    ports = ["--port", str(free_port()), "--http-port", str(free_port())]
    ports += ["--bookie-port", str(free_port())]
    common = [*ports, "--dir", str(directory), "--timeout", str(int(RUN_TIMEOUT_S * 2))]
    url = f"oxia://{oxia.address}"
    started = subprocess.run(
        [str(script), "start", "--metadata", url, *common],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S * 3,
    )
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert f"metadata store: {url}" in started.stderr
        assert not (directory / "data" / "metadata").exists() or not any(
            (directory / "data" / "metadata").iterdir()
        ), "Pulsar used its own RocksDB metadata store"
        # Pulsar's cluster and its bookie, registered in TableKeeper (Oxia lists the children
        # of `p` as the keys in [p/, p//)).
        assert _children(oxia, "/admin/clusters") == ["/admin/clusters/standalone"]
        assert len(_children(oxia, "/ledgers/available")) >= 1
        other = subprocess.run(
            [str(script), "restart", *common], capture_output=True, text=True, timeout=300
        )
        assert other.returncode != 0 and "metadata store" in other.stderr, other.stderr[-2000:]
    finally:
        subprocess.run([str(script), "stop", "--dir", str(directory)], timeout=120, check=False)


def _children(oxia: Oxia, parent: str) -> list[str]:
    with grpc.insecure_channel(oxia.address) as channel:
        stub = client_pb2_grpc.OxiaClientStub(channel)
        keys: list[str] = []
        for shard in _shards(stub):
            request = client_pb2.ListRequest(
                shard=shard, start_inclusive=f"{parent}/", end_exclusive=f"{parent}//"
            )
            for response in stub.List(request, timeout=RUN_TIMEOUT_S):
                keys += list(response.keys)
    return sorted(keys)
