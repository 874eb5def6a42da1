"""The ZooKeeper port in cluster mode: every server runs one; a server that does not own the
keyspace range's container relays the connection to the owner's port. Sessions are the range's:
a client resumes its session through any server, and after the owner dies with SIGKILL (the
container moves, the new owner opens the range and times its sessions afresh), with its
ephemeral nodes and every acknowledged write.

Three real servers, ZooKeeper (the cluster's) and Pulsar; kazoo and the bare wire client."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from tests.support.cluster import TestCluster
from tests.support.routes import table_router
from tests.support.server import free_port
from tests.support.zookeeper_wire import WireClient

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

CONTAINERS = 4
WAIT_S = 90.0
SESSION_MS = 30_000


def connect_wire(port: int, session: int = 0, password: bytes | None = None) -> WireClient:
    """A wire session through `port`, retried while the server has no owner to relay to (it
    closes the connection then, as a ZooKeeper server that cannot serve does)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        wire = WireClient(port, SESSION_MS)
        try:
            timeout, _, _ = wire.connect(session, password)
            assert timeout > 0, "the session was refused as expired"
            return wire
        except (ConnectionError, OSError):
            wire.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def retry(call: Callable[[], object]) -> object:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return call()
        except ConnectionLoss:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_zookeeper_through_a_non_owner_and_after_the_owner_dies(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=CONTAINERS).init()
    ports = []
    for _ in range(3):
        port = free_port()
        cluster.add_server(["--zookeeper-port", str(port)])
        ports.append(port)
    cluster.wait_ready(WAIT_S)
    for port in ports:  # every server has found the keyspace (or its owner)
        connect_wire(port).close()
    with grpc.insecure_channel(cluster.endpoint(0)) as channel:
        container = table_router(channel, "zookeeper", "keyspace").route(b"").container_id
    owner = cluster.index(cluster.assigned_to(container) or "")
    others = [i for i in range(3) if i != owner]

    via = KazooClient(hosts=f"127.0.0.1:{ports[others[0]]}", timeout=SESSION_MS / 1000)
    via.start(timeout=WAIT_S)
    third = KazooClient(hosts=f"127.0.0.1:{ports[others[1]]}", timeout=SESSION_MS / 1000)
    third.start(timeout=WAIT_S)
    try:
        # Writes and reads through servers that do not own the keyspace, one order for all.
        via.create("/c/a", b"1", makepath=True)
        assert third.get("/c/a")[0] == b"1"
        seen = []
        third.get_children("/c", watch=lambda event: seen.append(event.path))
        via.create("/c/b", b"2")
        deadline = time.monotonic() + WAIT_S
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == ["/c"]

        # A session made through one server, resumed through another, with its ephemeral node.
        wire = connect_wire(ports[others[0]])
        assert wire.create("/c/eph", mode=1).err == 0
        session, password = wire.session_id, wire.password
        wire.close()
        wire = connect_wire(ports[others[1]], session, password)
        assert wire.exists("/c/eph").err == 0
        wire.close()

        acknowledged = {f"/c/ack-{i:02d}": str(i).encode() for i in range(20)}
        for path, value in acknowledged.items():
            via.create(path, value)

        cluster.kill(owner)
        cluster.wait_ready(WAIT_S)
        new_owner = cluster.index(cluster.assigned_to(container) or "")
        assert new_owner != owner
        survivor = next(i for i in others if i != new_owner)

        # The session resumes on the new owner, through a server that is not it.
        wire = connect_wire(ports[survivor], session, password)
        assert wire.exists("/c/eph").err == 0
        wire.close()
        # kazoo reconnects by itself (its session too) and finds every acknowledged write.
        for path, value in acknowledged.items():
            assert retry(lambda path=path: via.get(path)[0]) == value  # type: ignore[misc]
        assert retry(lambda: via.create("/c/after", b"3")) == "/c/after"
        assert retry(lambda: third.get("/c/after")[0]) == b"3"
    except SessionExpiredError:
        pytest.fail("a session expired across the failover")
    finally:
        for client in (via, third):
            client.stop()
            client.close()
