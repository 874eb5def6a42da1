"""Brokers whose metadata lives in ZooKeeper, on TableKeeper's ZooKeeper port, unmodified:

* Pulsar 4.0.7 standalone (its broker and its BookKeeper bookie) with `zk:` metadata: Pulsar's
  ZooKeeper metadata driver (the ZooKeeper 3.9.3 client inside it) and BookKeeper's bookie
  registration; messages produced and consumed through a tenant, namespace, topic and
  subscription it keeps there.
* A Kafka 3.9 broker in ZooKeeper mode (`zookeeper.connect` with a chroot; jars from Maven
  Central, tests/compat/kafka): the Kafka Java client creates a topic, produces with an
  idempotent producer, consumes in a group that commits, changes a config, adds a partition and
  deletes the topic (tests/compat/kafka's KafkaCompat driver).

One TableKeeper for the module, shared by both; one Pulsar, one Kafka broker.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar as pulsar_client
import pytest
from kazoo.client import KazooClient

from tests.compat.zookeeper_compat import (
    RUNTIME_REASON,
    STANDALONE_REASON,
    maven_classpath,
    start_tablekeeper,
)
from tests.support.caches import pulsar_classpath
from tests.support.pulsar_oxia import PulsarOnOxia
from tests.support.server import ServerProcess, free_port

pytestmark = [
    pytest.mark.standalone_only(STANDALONE_REASON),
    pytest.mark.default_runtime_only(RUNTIME_REASON),
]

RECEIVE_TIMEOUT_MS = 120_000  # a hang guard, not a performance bound
KAFKA_MODULE = Path(__file__).parent / "kafka"
KAFKA_JAR = KAFKA_MODULE / "target" / "kafka-compat-0.1.0.jar"
KAFKA_START_S = 240.0  # a hang guard for the broker's start
KAFKA_RUN_S = 600.0
KAFKA_MESSAGES = 1000


class ZooKeeperPort:
    def __init__(self, server: ServerProcess, port: int) -> None:
        self.server = server
        self.port = port

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kazoo(self) -> KazooClient:
        client = KazooClient(hosts=self.hosts, timeout=30)
        client.start(timeout=120)
        return client


@pytest.fixture(scope="module")
def zk_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperPort]:
    server, port = start_tablekeeper(tmp_path_factory.mktemp("zookeeper-brokers") / "data")
    yield ZooKeeperPort(server, port)
    server.stop()


@pytest.fixture(scope="module")
def pulsar(
    tmp_path_factory: pytest.TempPathFactory, zk_port: ZooKeeperPort
) -> Iterator[PulsarOnOxia]:
    # (PulsarOnOxia runs a standalone on any metadata URL: `zk:` here.)
    started = PulsarOnOxia(
        tmp_path_factory.mktemp("pulsar-on-zk"), f"zk:{zk_port.hosts}", pulsar_classpath()
    )
    try:
        started.start()
        yield started
    except BaseException:
        print(started.log_tail(80))
        raise
    finally:
        started.stop()


def test_pulsar_on_zk_metadata_produces_and_consumes_through_tablekeeper(
    zk_port: ZooKeeperPort, pulsar: PulsarOnOxia
) -> None:
    tenant, namespace = f"zk{uuid.uuid4().hex[:6]}", "ns1"
    topic = f"persistent://{tenant}/{namespace}/t1"
    pulsar.admin("PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": ["standalone"]})
    pulsar.admin("PUT", f"/admin/v2/namespaces/{tenant}/{namespace}")
    pulsar.admin("PUT", f"/admin/v2/persistent/{tenant}/{namespace}/t1")
    pulsar.admin("PUT", f"/admin/v2/persistent/{tenant}/{namespace}/t1/subscription/sub1")
    assert pulsar.admin("GET", f"/admin/v2/namespaces/{tenant}") == [f"{tenant}/{namespace}"]
    assert pulsar.admin("GET", f"/admin/v2/persistent/{tenant}/{namespace}") == [topic]

    client = pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=60)
    try:
        producer = client.create_producer(topic)
        for i in range(100):
            producer.send(f"m{i}".encode())
        consumer = client.subscribe(topic, "sub1")
        got = []
        for _ in range(100):
            message = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            got.append(message.data().decode())
            consumer.acknowledge(message)
        assert got == [f"m{i}" for i in range(100)]
    finally:
        client.close()

    # What Pulsar and its bookie keep is in TableKeeper, where ZooKeeper clients read it.
    zk = zk_port.kazoo()
    try:
        assert zk.get_children("/ledgers/available"), "no bookie registered"
        assert namespace in zk.get_children(f"/admin/policies/{tenant}")
        # The topic's managed ledger (beside the namespace's system topics, e.g. its policies').
        ledgers = zk.get_children(f"/managed-ledgers/{tenant}/{namespace}/persistent")
        assert "t1" in ledgers
        assert zk.get_children(f"/managed-ledgers/{tenant}/{namespace}/persistent/t1") == ["sub1"]
    finally:
        zk.stop()
        zk.close()


class KafkaBroker:
    """One Kafka broker (`kafka.Kafka`) in ZooKeeper mode, under a chroot of its own."""

    def __init__(self, directory: Path, zookeeper_connect: str, classpath: str) -> None:
        self.directory = directory
        self.zookeeper_connect = zookeeper_connect
        self.classpath = classpath
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    def start(self) -> KafkaBroker:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "server.properties"
        config.write_text(
            f"""broker.id=0
listeners=PLAINTEXT://{self.bootstrap}
advertised.listeners=PLAINTEXT://{self.bootstrap}
log.dirs={self.directory}/logs
zookeeper.connect={self.zookeeper_connect}
zookeeper.session.timeout.ms=30000
zookeeper.connection.timeout.ms=120000
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
"""
        )
        log4j = self.directory / "log4j.properties"
        log4j.write_text(
            """log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaServer=INFO
"""
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
                 f"-Dlog4j.configuration=file:{log4j}", "-cp", self.classpath, "kafka.Kafka",
                 str(config)],
                cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + KAFKA_START_S
        while "started (kafka.server.KafkaServer)" not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka exited ({self.process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka not started in {KAFKA_START_S} s:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def kafka_classpath() -> str:
    assert shutil.which("java"), "the Kafka compatibility test needs java (17) on PATH"
    return maven_classpath(KAFKA_MODULE, KAFKA_JAR)


@pytest.fixture(scope="module")
def kafka(
    tmp_path_factory: pytest.TempPathFactory, zk_port: ZooKeeperPort, kafka_classpath: str
) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(
        tmp_path_factory.mktemp("kafka"), f"{zk_port.hosts}/kafka", kafka_classpath
    )
    try:
        yield broker.start()
    except BaseException:
        print(broker.log_tail())
        raise
    finally:
        broker.stop()


def test_a_kafka_broker_in_zookeeper_mode_creates_a_topic_and_moves_messages(
    zk_port: ZooKeeperPort, kafka: KafkaBroker, kafka_classpath: str
) -> None:
    zk = zk_port.kazoo()
    try:
        assert zk.get_children("/kafka/brokers/ids") == ["0"]  # its ephemeral registration
        assert zk.exists("/kafka/controller") is not None
    finally:
        zk.stop()
        zk.close()
    topic = f"compat-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Dlog4j.configuration=file:"
         f"{kafka.directory}/log4j.properties", "-cp", kafka_classpath,
         "io.tablekeeper.compat.kafka.KafkaCompat", kafka.bootstrap, topic, str(KAFKA_MESSAGES)],
        capture_output=True, text=True, timeout=KAFKA_RUN_S,
    )  # fmt: skip
    assert done.returncode == 0, f"KafkaCompat exited {done.returncode}:\n{done.stderr[-4000:]}"
    seen = {}
    for line in done.stdout.splitlines():
        observation = json.loads(line)
        seen[observation.pop("check")] = observation
    n = KAFKA_MESSAGES
    assert seen == {
        "cluster": {"value": "nodes=1 controller=0"},
        "topic.create": {"value": "partitions=3"},
        "topic.create.again": {"error": "TopicExistsException"},
        "produce": {"value": f"acked={n} partitions=3"},
        "consume": {"value": f"received={n} duplicates=0 committed={n}"},
        "topic.config": {"value": "retention.ms=3600000"},
        "topic.partitions": {"value": "partitions=4"},
        "topic.delete": {"value": "listed=false"},
    }, done.stderr[-4000:]
