"""Moving a live Pulsar off ZooKeeper: `tablekeeper import zookeeper` end to end.

A real Pulsar 4.0.7 standalone (broker and bookie, tests/support/pulsar_oxia.py) runs with its
metadata on a real ZooKeeper (deploy/zookeeper.sh): a tenant, a namespace, a partitioned topic
and a plain one, subscriptions with messages acknowledged and others not. Pulsar is stopped,
the tree is imported into TableKeeper's Oxia port (with --verify), and the same Pulsar (same
directory, same ports: the bookie keeps its journal and ledger files and its identity) starts
again with `--metadata-url oxia://...`. It must serve every topic, every subscription's backlog
and every unacknowledged message from the old ledgers (their metadata came across), and new
ledgers must get ids above the old ones (the id generator's counter came across).

One Pulsar start on ZooKeeper and one on TableKeeper: the test's cost.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pulsar as pulsar_client
import pytest
from kazoo.client import KazooClient

from tests.support.caches import pulsar_classpath
from tests.support.pulsar_oxia import PulsarOnOxia
from tests.support.server import TABLEKEEPER, ServerProcess, free_port
from tests.support.zookeeper import ZooKeeperProcess

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

TENANT, NAMESPACE = "acme", "orders"
EVENTS = f"persistent://{TENANT}/{NAMESPACE}/events"
AUDIT = f"persistent://{TENANT}/{NAMESPACE}/audit"
PARTITIONS = 3
EVENT_COUNT, EVENTS_ACKED = 60, 30
AUDIT_COUNT, AUDIT_ACKED = 20, 5
START_S = 300.0
RECEIVE_MS = 30_000


def _client(pulsar: PulsarOnOxia) -> Any:
    return pulsar_client.Client(pulsar.service_url, operation_timeout_seconds=60)


def _subscribe(client: Any, topic: str, name: str) -> Any:
    return client.subscribe(
        topic,
        name,
        consumer_type=pulsar_client.ConsumerType.Shared,
        initial_position=pulsar_client.InitialPosition.Earliest,
    )


def _receive(consumer: Any, count: int, *, ack: bool) -> list[bytes]:
    got = []
    for _ in range(count):
        message = consumer.receive(timeout_millis=RECEIVE_MS)
        got.append(message.data())
        if ack:
            consumer.acknowledge(message)
    return got


def _backlogs(pulsar: PulsarOnOxia) -> dict[str, int]:
    base = f"/admin/v2/persistent/{TENANT}/{NAMESPACE}"
    events = pulsar.admin("GET", f"{base}/events/partitioned-stats")
    audit = pulsar.admin("GET", f"{base}/audit/stats")
    found = {f"events/{s}": v["msgBacklog"] for s, v in events["subscriptions"].items()}
    found.update({f"audit/{s}": v["msgBacklog"] for s, v in audit["subscriptions"].items()})
    return found


def _ledger_ids(pulsar: PulsarOnOxia) -> list[int]:
    stats = pulsar.admin("GET", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/audit/internalStats")
    return [int(ledger["ledgerId"]) for ledger in stats["ledgers"]]


def _zookeeper_ledger_ids(session: KazooClient) -> list[int]:
    """Every ledger whose metadata ZooKeeper holds (the hierarchical layout:
    /ledgers/00/0000/L0005 is ledger 5)."""
    found = []
    for top in session.get_children("/ledgers"):
        if not (len(top) == 2 and top.isdigit()):
            continue
        for middle in session.get_children(f"/ledgers/{top}"):
            for leaf in session.get_children(f"/ledgers/{top}/{middle}"):
                if leaf.startswith("L") and leaf[1:].isdigit():
                    found.append(int(top + middle + leaf[1:]))
    assert found, "no ledger metadata in ZooKeeper"
    return found


def _use_pulsar(pulsar: PulsarOnOxia) -> tuple[set[bytes], set[bytes], list[int]]:
    """Tenant, namespace, topics, subscriptions and messages; returns the unacknowledged
    payloads of `events`/billing and `audit`/reader, and the audit topic's ledgers."""
    pulsar.admin(
        "PUT", f"/admin/v2/tenants/{TENANT}", {"allowedClusters": ["standalone"], "adminRoles": []}
    )
    pulsar.admin("PUT", f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}")
    pulsar.admin("PUT", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/events/partitions", PARTITIONS)
    client = _client(pulsar)
    try:
        billing = _subscribe(client, EVENTS, "billing")
        archive = _subscribe(client, EVENTS, "archive")
        reader = _subscribe(client, AUDIT, "reader")
        events = client.create_producer(EVENTS)
        for i in range(EVENT_COUNT):
            events.send(f"event-{i}".encode(), partition_key=f"k{i % 7}")
        audit = client.create_producer(AUDIT)
        for i in range(AUDIT_COUNT):
            audit.send(f"audit-{i}".encode())
        acked_events = set(_receive(billing, EVENTS_ACKED, ack=True))
        acked_audit = set(_receive(reader, AUDIT_ACKED, ack=True))
        for consumer in (billing, archive, reader):
            consumer.close()
        events.close()
        audit.close()
    finally:
        client.close()
    all_events = {f"event-{i}".encode() for i in range(EVENT_COUNT)}
    all_audit = {f"audit-{i}".encode() for i in range(AUDIT_COUNT)}
    return all_events - acked_events, all_audit - acked_audit, _ledger_ids(pulsar)


def _wait_backlogs(pulsar: PulsarOnOxia, expected: dict[str, int]) -> dict[str, int]:
    """The backlogs once the stats report `expected` (a broker computes them as topics load)."""
    deadline = time.monotonic() + START_S
    while True:
        try:
            found = _backlogs(pulsar)
        except OSError:
            found = {}
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(1)


def test_pulsar_moves_from_zookeeper_to_tablekeeper_with_topics_backlogs_and_messages(
    tmp_path: Path,
) -> None:
    zookeeper = ZooKeeperProcess(tmp_path / "zookeeper").start()
    oxia_port = free_port()
    tablekeeper = ServerProcess(
        tmp_path / "tablekeeper", extra_args=["--oxia-port", str(oxia_port)]
    )
    pulsar = PulsarOnOxia(tmp_path / "pulsar", f"zk:{zookeeper.hosts}", pulsar_classpath())
    session = KazooClient(hosts=zookeeper.hosts)
    try:
        pulsar.start(START_S)
        unacked_events, unacked_audit, old_ledgers = _use_pulsar(pulsar)
        expected = {
            "events/billing": EVENT_COUNT - EVENTS_ACKED,
            "events/archive": EVENT_COUNT,
            "audit/reader": AUDIT_COUNT - AUDIT_ACKED,
        }
        assert _wait_backlogs(pulsar, expected) == expected
        topics_before = sorted(pulsar.admin("GET", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}"))
        pulsar.stop()

        # A session that lives through the import: its ephemeral znode is skipped and listed.
        session.start()
        session.create("/import-test/lock", b"held", ephemeral=True, makepath=True)
        zookeeper_ledgers = _zookeeper_ledger_ids(session)
        assert set(old_ledgers) <= set(zookeeper_ledgers)
        tablekeeper.start(START_S)
        done = subprocess.run(
            [
                str(TABLEKEEPER),
                "import",
                "zookeeper",
                "--from",
                zookeeper.hosts,
                "--to",
                f"oxia://127.0.0.1:{oxia_port}",
                "--verify",
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=START_S,
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert "/import-test/lock" in summary["ephemeral_skipped"]
        assert summary["differences"] == [] and summary["verified"] == summary["znodes"]
        assert any(path.endswith("/idgen") for path in summary["sequence_parents"]), summary
        session.stop()

        pulsar.oxia_url = f"oxia://127.0.0.1:{oxia_port}"
        pulsar.start(START_S)
        assert TENANT in pulsar.admin("GET", "/admin/v2/tenants")
        assert f"{TENANT}/{NAMESPACE}" in pulsar.admin("GET", f"/admin/v2/namespaces/{TENANT}")
        partitions = pulsar.admin(
            "GET", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/events/partitions"
        )
        assert partitions["partitions"] == PARTITIONS
        assert sorted(pulsar.admin("GET", f"/admin/v2/persistent/{TENANT}/{NAMESPACE}")) == (
            topics_before
        )
        assert _wait_backlogs(pulsar, expected) == expected

        client = _client(pulsar)
        try:
            billing = _subscribe(client, EVENTS, "billing")
            assert set(_receive(billing, len(unacked_events), ack=True)) == unacked_events
            archive = _subscribe(client, EVENTS, "archive")
            everything = _receive(archive, EVENT_COUNT, ack=True)
            assert sorted(everything) == sorted(f"event-{i}".encode() for i in range(EVENT_COUNT))
            reader = _subscribe(client, AUDIT, "reader")
            assert set(_receive(reader, len(unacked_audit), ack=True)) == unacked_audit
            # New messages go to a ledger made on TableKeeper (the topic's ledger when it
            # loaded again), whose id is above every ledger id ZooKeeper issued.
            producer = client.create_producer(AUDIT)
            producer.send(b"after-the-move")
            assert _receive(reader, 1, ack=True) == [b"after-the-move"]
        finally:
            client.close()
        new_ledgers = [i for i in _ledger_ids(pulsar) if i not in old_ledgers]
        assert new_ledgers and min(new_ledgers) > max(zookeeper_ledgers), (
            zookeeper_ledgers,
            new_ledgers,
        )
    finally:
        if session.connected:
            session.stop()
        pulsar.stop()
        if tablekeeper.running:
            tablekeeper.stop()
        zookeeper.stop()


def test_both_targets_get_the_drivers_layout_and_counters_that_carry_on(tmp_path: Path) -> None:
    """A tree written with kazoo (nested data, an ephemeral znode, a sequence parent whose
    children were created and deleted) imported into the Oxia port and into the etcd port: each
    key where the driver reads it, parents included, children listed as each driver lists them,
    and the next sequential number (as each driver makes it) above ZooKeeper's. A second import
    is refused; a dry run writes nothing."""
    zookeeper = ZooKeeperProcess(tmp_path / "zookeeper").start()
    oxia_port, etcd_port = free_port(), free_port()
    tablekeeper = ServerProcess(
        tmp_path / "tablekeeper",
        extra_args=["--oxia-port", str(oxia_port), "--etcd-port", str(etcd_port)],
    )
    session = KazooClient(hosts=zookeeper.hosts)
    try:
        tablekeeper.launch()
        session.start()
        session.create("/admin/policies/acme/orders", b'{"bundles":4}', makepath=True)
        session.create("/ledgers/idgen", b"", makepath=True)
        issued = []
        for _ in range(9):
            path = session.create("/ledgers/idgen/ID-", b"", ephemeral=True, sequence=True)
            issued.append(int(path.rsplit("-", 1)[1]))
            session.delete(path)
        session.create("/loadbalance/brokers/b1", b"alive", ephemeral=True, makepath=True)
        tablekeeper.wait_serving(START_S)

        oxia_url, etcd_url = f"oxia://127.0.0.1:{oxia_port}", f"etcd:http://127.0.0.1:{etcd_port}"
        dry = _import(zookeeper.hosts, oxia_url, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["dry_run"] is True
        for url in (oxia_url, etcd_url):
            done = _import(zookeeper.hosts, url, "--verify")
            assert done.returncode == 0, done.stderr
            summary = json.loads(done.stdout)
            assert summary["ephemeral_skipped"] == ["/loadbalance/brokers/b1"]
            assert summary["differences"] == []
            again = _import(zookeeper.hosts, url)
            assert again.returncode == 3 and "already has keys under /" in again.stderr

        next_oxia = _oxia_layout(oxia_port)
        next_etcd = _etcd_layout(etcd_port)
        assert next_oxia > max(issued) and next_etcd > max(issued), (issued, next_oxia, next_etcd)
    finally:
        if session.connected:
            session.stop()
        if tablekeeper.running:
            tablekeeper.stop()
        zookeeper.stop()


def _import(source: str, target: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TABLEKEEPER), "import", "zookeeper", "--from", source, "--to", target, "-o", "json"]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=START_S,
    )


def _oxia_layout(port: int) -> int:
    """Check the keys as Pulsar's Oxia driver reads them; return the number its next
    sequential put under /ledgers/idgen would get (the parent's modifications count after a
    put of the parent)."""
    import xxhash

    from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
    from tests.support.oxia import children, shard_leaders

    leaders = shard_leaders(f"127.0.0.1:{port}", "default")

    def listed(parent: str) -> list[str]:
        return sorted(key for keys in children(leaders, parent).values() for key in keys)

    assert listed("") == ["/admin", "/ledgers", "/loadbalance"]
    assert listed("/admin/policies/acme") == ["/admin/policies/acme/orders"]
    assert listed("/loadbalance/brokers") == []  # the ephemeral one stayed behind

    with grpc.insecure_channel(next(iter(leaders.values()))) as channel:
        assignment = next(
            client_pb2_grpc.OxiaClientStub(channel).GetShardAssignments(
                client_pb2.ShardAssignmentsRequest(namespace="default"), timeout=60
            )
        ).namespaces["default"]

    def shard_of(key: str) -> client_pb2.ShardAssignment:
        hashed = xxhash.xxh3_64_intdigest(key.encode()) & 0xFFFFFFFF
        found: client_pb2.ShardAssignment = next(
            a
            for a in assignment.assignments
            if a.int32_hash_range.min_hash_inclusive
            <= hashed
            <= a.int32_hash_range.max_hash_inclusive
        )
        return found

    def get(key: str) -> bytes | None:
        shard = shard_of(key)
        with grpc.insecure_channel(shard.leader) as channel:
            request = client_pb2.ReadRequest(
                shard=shard.shard, gets=[client_pb2.GetRequest(key=key, include_value=True)]
            )
            for response in client_pb2_grpc.OxiaClientStub(channel).Read(request, timeout=60):
                got = response.gets[0]
                return bytes(got.value) if got.status == client_pb2.OK else None
        return None

    assert get("/admin/policies/acme/orders") == b'{"bundles":4}'
    assert get("/admin/policies") == b""  # a parent is a key of its own
    shard = shard_of("/ledgers/idgen")
    with grpc.insecure_channel(shard.leader) as channel:
        put = client_pb2.PutRequest(key="/ledgers/idgen", value=b"")
        response = client_pb2_grpc.OxiaClientStub(channel).Write(
            client_pb2.WriteRequest(shard=shard.shard, puts=[put]), timeout=60
        )
    return int(response.puts[0].version.modifications_count)


def _etcd_layout(port: int) -> int:
    """Check the keys as Pulsar's etcd driver reads them; return the number its next
    sequential put under /ledgers/idgen would get (the parent's version before a put of it)."""
    from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        everything = kv.Range(rpc_pb2.RangeRequest(key=b"/", range_end=b"0"), timeout=60)
        keys = {bytes(k.key): bytes(k.value) for k in everything.kvs}
        assert keys[b"/admin/policies/acme/orders"] == b'{"bundles":4}'
        assert keys[b"/admin/policies"] == b""
        assert b"/loadbalance/brokers/b1" not in keys
        put = kv.Put(rpc_pb2.PutRequest(key=b"/ledgers/idgen", value=b"", prev_kv=True), timeout=60)
    return int(put.prev_kv.version)
