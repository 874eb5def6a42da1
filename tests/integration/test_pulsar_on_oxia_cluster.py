"""Pulsar 4.0.7 standalone whose metadata store is a 3-server TableKeeper cluster, through the
Oxia port (`--metadata-url oxia://<server 0's Oxia address>`), while a server leading shards of
Pulsar's namespace (`default`) is killed with SIGKILL and later started again.

Two Pulsars run: the session's (`pulsar_service`), which holds the cluster's WAL, and the one
under test (`PulsarOnOxia`, tests/support/pulsar_oxia.py), whose tenants, namespaces, topics,
cursors, ledgers and bookie registration all live in the cluster. Its Oxia client is given server
0 only (the bootstrap address is a single point), so the server killed is another one; it then
follows the assignment stream to each shard's new leader.
"""

from __future__ import annotations

import threading
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar as pulsar_client
import pytest

from tests.support.caches import pulsar_classpath
from tests.support.cluster import TestCluster
from tests.support.oxia import children, wait_leaders
from tests.support.pulsar_oxia import PulsarOnOxia
from tests.support.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

CONTAINERS = 4
"""As many as namespace `default` has shards: shard i's range is on container (table id + i) % 4,
so every container holds one shard, and every server of the balanced cluster leads one or two."""
NAMESPACE = "default"
MESSAGES = 10_000
KILL_AFTER = 3_000
"""Sends submitted before the kill; the next ones up to `RESUME_AFTER` are submitted while the
dead server's containers have not moved yet, the rest once the cluster is ready again."""
RESUME_AFTER = 6_000
WAIT_S = 90.0
GUARD_S = 300.0
"""A hang guard (a send never completing, a message never arriving), not a performance bound."""


def test_pulsar_carries_on_when_a_shard_leader_of_its_metadata_is_killed(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(containers=CONTAINERS).init()
    addresses = []
    for _ in range(3):
        port = free_port()
        cluster.add_server(["--oxia-port", str(port)])
        addresses.append(f"127.0.0.1:{port}")
    cluster.wait_ready(WAIT_S, balanced=True)  # the containers are spread; nothing moves now
    # Each server's view of the assignment follows ZooKeeper's: wait until all name the
    # balanced one (every server leads a shard).
    leaders = wait_leaders(
        addresses[0], NAMESPACE, lambda now: set(now.values()) == set(addresses), WAIT_S
    )
    assert len(leaders) == CONTAINERS, leaders
    for address in addresses[1:]:
        wait_leaders(address, NAMESPACE, lambda now: now == leaders, WAIT_S)

    pulsar = PulsarOnOxia(tmp_path / "pulsar", f"oxia://{addresses[0]}", pulsar_classpath())
    parted, plain = "persistent://load/ns/parted", "persistent://load/ns/plain"
    victim = -1
    try:
        pulsar.start()
        # Pulsar's broker and bookie register with ephemeral records: each of their Oxia
        # clients' sessions lives on the shard of its record. Not server 0 (Pulsar's bootstrap);
        # of the other two, one leading such a shard if there is one (the session has to live
        # through the failover), else the one leading more shards.
        registered = _registrations(leaders)
        session_leaders = {leaders[shard] for shard in registered}
        victim = max(
            (1, 2),
            key=lambda i: (
                addresses[i] in session_leaders,
                list(leaders.values()).count(addresses[i]),
                i,
            ),
        )
        victim_address = addresses[victim]
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

            def send(first: int, end: int) -> None:
                for i in range(first, end):
                    topic = parted if i % 2 == 0 else plain
                    body = f"m{i}"
                    producers[topic].send_async(
                        body.encode(), sent(topic, body), partition_key=body
                    )

            send(0, KILL_AFTER)
            cluster.kill(victim)  # while the first sends are in flight
            # Submitted before the controller can move anything: the dead server's ZooKeeper
            # session has yet to time out (TestCluster's is 2 s).
            send(KILL_AFTER, RESUME_AFTER)
            cluster.wait_ready(WAIT_S)
            moved = wait_leaders(
                addresses[0], NAMESPACE, lambda now: victim_address not in now.values(), WAIT_S
            )
            # The sessions lived through it: the registrations are still there, and Pulsar
            # writes new metadata (a namespace, a topic: its managed ledger).
            failed_over = pulsar.log_offset()
            assert _registrations(moved) == registered
            _admin_write(pulsar, "/admin/v2/namespaces/load/during")
            _admin_write(pulsar, "/admin/v2/persistent/load/during/t")
            send(RESUME_AFTER, MESSAGES)
            for _ in range(MESSAGES):
                assert done.acquire(timeout=GUARD_S), "a send never completed"
            # Nothing was refused: the broker carried on through the failover.
            assert not failed, failed[:5]
            assert len(acked[parted]) + len(acked[plain]) == MESSAGES
            for topic, consumer in consumers.items():
                received: set[str] = set()
                while len(received) < len(acked[topic]):
                    message = consumer.receive(timeout_millis=int(GUARD_S * 1000))
                    received.add(message.data().decode())
                    consumer.acknowledge(message)
                assert received == acked[topic], sorted(received ^ acked[topic])[:5]
        finally:
            client.close()
        _no_metadata_errors(pulsar.log_since(failed_over))

        # The killed server comes back; the controller gives it containers again (the leaders
        # change once more: the servers that lose them end their write streams, so Pulsar's
        # client opens its next one to the new leader instead of failing a write with "not
        # leader"). Pulsar's admin answers from its metadata, and writes new metadata.
        cluster.restart(victim)
        cluster.wait_ready(WAIT_S, balanced=True)
        rebalanced = pulsar.log_offset()
        back = wait_leaders(
            addresses[0], NAMESPACE, lambda now: victim_address in now.values(), WAIT_S
        )
        assert pulsar.admin("GET", "/admin/v2/persistent/load/ns/partitioned") == [parted]
        assert pulsar.admin("GET", "/admin/v2/namespaces/load") == ["load/during", "load/ns"]
        for topic in (f"{parted}-partition-0", plain):
            path = topic.removeprefix("persistent://")
            assert pulsar.admin("GET", f"/admin/v2/persistent/{path}/subscriptions") == ["sub"]
        assert _registrations(back) == registered
        _admin_write(pulsar, "/admin/v2/persistent/load/ns/plain/subscription/after")
        subscriptions = pulsar.admin("GET", "/admin/v2/persistent/load/ns/plain/subscriptions")
        assert sorted(subscriptions) == ["after", "sub"]
        _admin_write(pulsar, "/admin/v2/namespaces/load/after")
        _admin_write(pulsar, "/admin/v2/persistent/load/after/t")
        assert pulsar.admin("GET", "/admin/v2/namespaces/load") == [
            "load/after",
            "load/during",
            "load/ns",
        ]
        _no_metadata_errors(pulsar.log_since(rebalanced))
    except BaseException:
        print(f"servers {addresses}, victim: server {victim}; leaders before: {leaders}")
        print(f"--- Pulsar under test ({pulsar.log_path}):\n{pulsar.log_tail(80)}")
        print(cluster.log_tails(40))
        raise
    finally:
        pulsar.stop()


def _registrations(leaders: dict[int, str]) -> dict[int, list[str]]:
    """Pulsar's bookie and broker registrations (ephemeral records, named HOST:PORT) by shard."""
    found: dict[int, list[str]] = {}
    for parent in ("/ledgers/available", "/loadbalance/brokers"):
        for shard, keys in children(leaders, parent).items():
            ephemeral = [key for key in keys if ":" in key.rsplit("/", 1)[-1]]
            if ephemeral:
                found[shard] = sorted(found.get(shard, []) + ephemeral)
    return found


def _admin_write(pulsar: PulsarOnOxia, path: str) -> None:
    """A PUT of Pulsar's admin API, sent again while the broker answers 5xx: right after a
    move, Pulsar's Oxia client may still hold the old leaders for a moment (the new ones reach
    it on the assignment stream), and a metadata write sent there fails "not leader"."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            pulsar.admin("PUT", path)
            return
        except urllib.error.HTTPError as error:
            if error.code < 500 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _no_metadata_errors(log: str) -> None:
    """No metadata store call of Pulsar's failed (its Oxia client's gRPC errors, as Pulsar logs
    them) in this part of its log, one taken while the cluster was ready, except "not leader"
    answers: Pulsar's client may learn a move from the assignment stream a moment after a write
    reached the old leader (it then follows; the fix that old leaders end their write streams is
    checked by tests/unit/test_oxia_leaders.py)."""
    failures = [
        line
        for line in log.splitlines()
        if "StatusRuntimeException" in line and "not leader" not in line
    ]
    assert not failures, "\n".join(failures[:5])
