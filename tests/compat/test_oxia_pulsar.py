"""A real Pulsar 4.0.7 standalone whose metadata store is TableKeeper (`--metadata-url
oxia://…`, Pulsar's own Oxia driver and oxia-client 0.6.2) against a standalone server's Oxia
port: metadata kept across restarts of either side, messages produced through a kill -9 of
TableKeeper, and the deploy script's Pulsar.

One server for the module (these tests restart and kill it); the Oxia Java client's own
scenarios are test_oxia_client.py's.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pulsar as pulsar_client
import pytest

from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tests.compat.oxia.harness import RUN_TIMEOUT_S, Oxia, oxia_server
from tests.support.caches import pulsar_classpath as _classpath
from tests.support.pulsar_oxia import PulsarOnOxia
from tests.support.server import free_port

pytestmark = pytest.mark.standalone_only("a server of its own, with --oxia-port")


@pytest.fixture(scope="module")
def oxia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oxia]:
    with oxia_server(tmp_path_factory, driver=False) as started:
        yield started


def _shards(stub: client_pb2_grpc.OxiaClientStub) -> list[int]:
    stream = stub.GetShardAssignments(client_pb2.ShardAssignmentsRequest(namespace="default"))
    first = next(iter(stream))
    stream.cancel()
    return [a.shard for a in first.namespaces["default"].assignments]


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


MESSAGES = 10_000
KILL_AFTER = 3_000


@pytest.mark.default_runtime_only(
    "a kill -9 looks the same to the client on every runtime (refused connections); the "
    "client's reconnection through a runtime's own shutdown is test_notifications_continue_"
    "across_a_server_restart's, which runs on both"
)
def test_pulsar_keeps_its_metadata_and_messages_through_restarts_and_a_kill_9_of_tablekeeper(
    oxia: Oxia, tmp_path: Path
) -> None:
    """Pulsar 4.0.7 standalone with `--metadata-url oxia://…`, in one Pulsar's life and the next
    (each start of Pulsar costs about 20 s of CPU, so one test walks through all of it):

    1. a tenant, namespace, topic and subscription; messages produced and half consumed;
    2. a partitioned and a non-partitioned topic with subscriptions; 10,000 messages produced
       while the TableKeeper server is killed with -9 and started again part-way: Pulsar
       carries on without a restart, and every acknowledged message is consumed;
    3. Pulsar stops, TableKeeper restarts, Pulsar starts again on the same TableKeeper (and its
       bookie's own files): every topic and subscription is there, a backlog of 100 is found
       again, and the first subscription goes on where it was acknowledged;
    4. TableKeeper restarts under the running Pulsar, whose Oxia client reconnects (write
       streams, notifications, sessions): metadata writes work again."""
    pulsar = PulsarOnOxia(tmp_path / "pulsar", f"oxia://{oxia.address}", _classpath())
    parted, plain = "persistent://load/ns/parted", "persistent://load/ns/plain"
    try:
        pulsar.start()
        assert _pulsar_round(pulsar, produce=True) == [f"m{i}" for i in range(5)]
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
        pulsar.stop()
        oxia.server.restart()
        pulsar.start()
        assert _pulsar_round(pulsar, produce=False) == [f"m{i}" for i in range(5, 10)]
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
