"""ZooKeeper's client protocol on `tablekeeper server --zookeeper-port`, driven by kazoo (the real
client, through its public API) and, for what kazoo never sends, by a bare wire client.

One server for the module; each test works under a path of its own."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.security import make_digest_acl

from tests.support.server import ServerProcess, free_port
from tests.support.zookeeper_wire import OPEN_ACL, STAT, WireClient, string

pytestmark = pytest.mark.integration

NODE_CREATED, NODE_DELETED, NODE_DATA_CHANGED, NODE_CHILDREN_CHANGED = 1, 2, 3, 4


class ZkServer:
    def __init__(self, server: ServerProcess, port: int) -> None:
        self.server = server
        self.port = port

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, timeout_s: float = 30.0) -> KazooClient:
        client = KazooClient(hosts=self.hosts, timeout=timeout_s)
        client.start(timeout=60)
        return client

    def wire(self, timeout_ms: int = 30_000) -> WireClient:
        wire = WireClient(self.port, timeout_ms)
        wire.connect()
        return wire


def start_server(data_dir: Path, port: int, *more: str) -> ServerProcess:
    return ServerProcess(
        data_dir,
        extra_args=[
            "--zookeeper-port",
            str(port),
            "--zookeeper-tick-time",
            "200ms",  # sessions from 0.4 s (the tests of expiry ask for short ones)
            "--zookeeper-max-session-timeout",
            "60s",  # and long ones for the others, however slow this machine is meanwhile
            "--zookeeper-container-check-interval",
            "200ms",
            *more,
        ],
    ).start(timeout_s=120)


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    port = free_port()
    server = start_server(tmp_path_factory.mktemp("zookeeper-protocol") / "data", port)
    yield ZkServer(server, port)
    server.stop()


@pytest.fixture
def zk(zk_server: ZkServer) -> Iterator[KazooClient]:
    client = zk_server.client()
    yield client
    client.stop()
    client.close()


@pytest.fixture
def base(zk: KazooClient) -> str:
    """A path of this test's own, created."""
    path = f"/t-{uuid.uuid4().hex[:12]}"
    zk.create(path)
    return path


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


# ---------------------------------------------------------------------------- kazoo


def test_create_get_set_delete_with_zookeepers_stats(zk: KazooClient, base: str) -> None:
    created = zk.create(f"{base}/a", b"hello")
    assert created == f"{base}/a"
    data, stat = zk.get(f"{base}/a")
    assert data == b"hello" and stat.version == 0 and stat.czxid == stat.mzxid == stat.pzxid
    assert stat.dataLength == 5 and stat.numChildren == 0 and stat.ephemeralOwner == 0
    after = zk.set(f"{base}/a", b"bye", version=0)
    assert after.version == 1 and after.mzxid > stat.mzxid and after.czxid == stat.czxid
    with pytest.raises(BadVersionError):
        zk.set(f"{base}/a", b"x", version=0)
    zk.create(f"{base}/a/child")
    with pytest.raises(NotEmptyError):
        zk.delete(f"{base}/a")
    parent = zk.exists(base)
    assert parent is not None and parent.numChildren == 1
    zk.delete(f"{base}/a", recursive=True)
    assert zk.exists(f"{base}/a") is None
    with pytest.raises(NoNodeError):
        zk.get(f"{base}/a")
    with pytest.raises(NodeExistsError):
        zk.create(base)
    assert "zookeeper" in zk.get_children("/")


def test_children_are_the_immediate_ones_with_their_parents_stat(
    zk: KazooClient, base: str
) -> None:
    for name in ("b", "a", "c"):
        zk.create(f"{base}/{name}")
    zk.create(f"{base}/a/deep")
    children, stat = zk.get_children(base, include_data=True)
    assert sorted(children) == ["a", "b", "c"]
    assert stat.numChildren == 3 and stat.cversion == 3


def test_sequential_and_ephemeral_nodes(zk_server: ZkServer, zk: KazooClient, base: str) -> None:
    first = zk.create(f"{base}/s-", sequence=True)
    second = zk.create(f"{base}/s-", sequence=True)
    assert (first, second) == (f"{base}/s-0000000000", f"{base}/s-0000000001")
    other = zk_server.client()
    other.create(f"{base}/e", b"", ephemeral=True)
    owner = zk.exists(f"{base}/e")
    assert owner is not None and owner.ephemeralOwner == other.client_id[0]
    deleted = threading.Event()
    zk.exists(f"{base}/e", watch=lambda event: deleted.set())
    other.stop()  # closes the session: its ephemeral node goes
    other.close()
    assert deleted.wait(30)
    assert zk.exists(f"{base}/e") is None


def test_a_transaction_is_all_or_nothing_with_per_op_errors(zk: KazooClient, base: str) -> None:
    zk.create(f"{base}/x", b"1")
    transaction = zk.transaction()
    transaction.create(f"{base}/new", b"n")
    transaction.check(f"{base}/x", 5)
    transaction.set_data(f"{base}/x", b"2")
    results = transaction.commit()
    assert [type(r) for r in results] == [RolledBackError, BadVersionError, RuntimeInconsistency]
    assert zk.exists(f"{base}/new") is None and zk.get(f"{base}/x")[0] == b"1"
    transaction = zk.transaction()
    transaction.create(f"{base}/new", b"n")
    transaction.check(f"{base}/x", 0)
    transaction.set_data(f"{base}/x", b"2")
    transaction.delete(f"{base}/new")
    results = transaction.commit()
    assert results[0] == f"{base}/new" and results[1] is True and results[3] is True
    assert results[2].version == 1
    assert zk.exists(f"{base}/new") is None and zk.get(f"{base}/x")[0] == b"2"


def test_one_shot_watches_fire_once(zk_server: ZkServer, zk: KazooClient, base: str) -> None:
    events: list[WatchedEvent] = []
    done = threading.Event()

    def record(event: WatchedEvent) -> None:
        events.append(event)
        if len(events) == 3:
            done.set()

    zk.create(f"{base}/w", b"")
    zk.get(f"{base}/w", watch=record)
    zk.get_children(base, watch=record)
    zk.exists(f"{base}/later", watch=record)
    writer = zk_server.client()
    writer.set(f"{base}/w", b"1")
    writer.set(f"{base}/w", b"2")  # the data watch is gone
    writer.create(f"{base}/later")
    assert done.wait(30)
    writer.stop()
    writer.close()
    got = sorted((e.type, e.path) for e in events)
    assert got == sorted(
        [
            (EventType.CHANGED, f"{base}/w"),
            (EventType.CHILD, base),
            (EventType.CREATED, f"{base}/later"),
        ]
    )


def test_acls_with_digest_authentication(zk_server: ZkServer, zk: KazooClient, base: str) -> None:
    zk.add_auth("digest", "alice:secret")
    acl = make_digest_acl("alice", "secret", all=True)
    zk.create(f"{base}/private", b"mine", acl=[acl])
    assert zk.get(f"{base}/private")[0] == b"mine"
    stranger = zk_server.client()
    try:
        with pytest.raises(NoAuthError):
            stranger.get(f"{base}/private")
        with pytest.raises(NoAuthError):
            stranger.set(f"{base}/private", b"theirs")
        with pytest.raises(NoAuthError):  # READ or ADMIN is needed
            stranger.get_acls(f"{base}/private")
    finally:
        stranger.stop()
        stranger.close()
    got, stat = zk.get_acls(f"{base}/private")
    assert [a.id.id for a in got] == [acl.id.id] and stat.aversion == 0


def test_large_values_up_to_the_packet_limit(zk: KazooClient, base: str) -> None:
    value = bytes(range(256)) * 3000  # 768,000 bytes
    zk.create(f"{base}/big", value)
    assert zk.get(f"{base}/big")[0] == value


# ---------------------------------------------------------------------------- the wire


def test_every_event_precedes_the_reply_to_a_later_request(zk_server: ZkServer, base: str) -> None:
    watcher = zk_server.wire()
    writer = zk_server.wire()
    try:
        assert watcher.create(f"{base}/o").err == 0
        assert watcher.get_data(f"{base}/o", watch=True).err == 0
        assert writer.set_data(f"{base}/o", b"x").err == 0
        # The change happened before this read was sent: its event comes first.
        reply = watcher.get_data(f"{base}/o")
        assert reply.err == 0
        event_at = watcher.order.index(("event", (NODE_DATA_CHANGED, f"{base}/o")))
        assert watcher.order[event_at + 1] == ("reply", reply.xid)
    finally:
        watcher.close()
        writer.close()


def test_pipelined_requests_are_answered_in_order(zk_server: ZkServer, base: str) -> None:
    wire = zk_server.wire()
    try:
        xids = []
        for i in range(50):
            xids.append(
                wire.send(
                    1,
                    string(f"{base}/p{i}") + struct.pack(">i", 0) + OPEN_ACL + struct.pack(">i", 0),
                )
            )
            xids.append(wire.send(3, string(f"{base}/p{i}") + b"\x00"))
        for xid in xids:
            assert wire.receive(xid).err == 0  # receive() fails on any reply out of order
    finally:
        wire.close()


def test_persistent_and_recursive_watches(zk_server: ZkServer, base: str) -> None:
    watcher = zk_server.wire()
    writer = zk_server.wire()
    try:
        assert watcher.add_watch(base, recursive=True).err == 0
        assert watcher.add_watch(f"{base}/p", recursive=False).err == 0
        writer.create(f"{base}/p")
        writer.create(f"{base}/p/q")
        writer.set_data(f"{base}/p/q", b"1")
        writer.delete(f"{base}/p/q")
        got = [watcher.wait_event()[:2] for _ in range(6)]
        assert got == [
            (NODE_CREATED, f"{base}/p"),  # recursive at base, persistent at p: once
            (NODE_CREATED, f"{base}/p/q"),
            (NODE_CHILDREN_CHANGED, f"{base}/p"),
            (NODE_DATA_CHANGED, f"{base}/p/q"),
            (NODE_DELETED, f"{base}/p/q"),
            (NODE_CHILDREN_CHANGED, f"{base}/p"),
        ]
        assert watcher.call(17, string(base) + struct.pack(">i", 5)).err == 0  # checkWatches
        assert watcher.call(18, string(base) + struct.pack(">i", 5)).err == 0  # removeWatches
        assert watcher.call(18, string(base) + struct.pack(">i", 5)).err == -121  # NOWATCHER
    finally:
        watcher.close()
        writer.close()


def test_a_session_resumes_with_its_password_and_watches_are_set_again(
    zk_server: ZkServer, base: str
) -> None:
    wire = zk_server.wire()
    wire.create(f"{base}/eph", mode=1)
    wire.create(f"{base}/watched")
    last = wire.exists(f"{base}/watched").zxid
    session, password = wire.session_id, wire.password
    wire.close()
    writer = zk_server.wire()
    writer.set_data(f"{base}/watched", b"changed while away")
    writer.create(f"{base}/appeared")

    wrong = WireClient(zk_server.port)
    timeout, sid, _ = wrong.connect(session, b"x" * 16)
    assert (timeout, sid) == (0, 0)  # "expired", and the connection closes
    with pytest.raises(ConnectionError):
        wrong.read_packet()
    wrong.close()

    back = WireClient(zk_server.port)
    timeout, sid, _ = back.connect(session, password, last_zxid=last)
    try:
        assert sid == session and timeout > 0
        assert back.exists(f"{base}/eph").err == 0
        reply = back.set_watches(
            last, data=[f"{base}/watched"], exist=[f"{base}/appeared", f"{base}/none"]
        )
        assert reply.err == 0
        assert sorted(back.events) == sorted(
            [(NODE_DATA_CHANGED, f"{base}/watched", -1), (NODE_CREATED, f"{base}/appeared", -1)]
        )
        writer.create(f"{base}/none")  # the exist watch set again fires now
        back.wait_for(NODE_CREATED, f"{base}/none")
    finally:
        back.close()
        writer.close()


def test_a_wrong_password_is_answered_expired_and_closes_the_sessions_connection(
    zk_server: ZkServer, base: str
) -> None:
    """ZooKeeper closes the connection a session has for any connect request naming it, right
    password or wrong (its client reconnects); a wrong one is answered expired and the session
    lives on."""
    wire = zk_server.wire()
    assert wire.create(f"{base}/kept", mode=1).err == 0
    intruder = WireClient(zk_server.port)
    try:
        assert intruder.connect(wire.session_id, b"\x01" * 16)[:2] == (0, 0)
    finally:
        intruder.close()
    with pytest.raises(ConnectionError):  # closed by the server (not a timeout)
        wire.read_packet()
    wire.close()
    back = WireClient(zk_server.port)
    try:
        timeout, session, _ = back.connect(wire.session_id, wire.password)
        assert (timeout > 0, session) == (True, wire.session_id)
        assert back.exists(f"{base}/kept").err == 0
    finally:
        back.close()


def test_an_abandoned_session_expires_and_its_ephemerals_go(
    zk_server: ZkServer, zk: KazooClient, base: str
) -> None:
    wire = zk_server.wire(timeout_ms=500)
    assert wire.negotiated_ms == 500
    wire.create(f"{base}/gone", mode=1)
    deleted = threading.Event()
    zk.exists(f"{base}/gone", watch=lambda event: deleted.set())
    session, password = wire.session_id, wire.password
    wire.sock.close()  # no closeSession: the client just disappears
    assert deleted.wait(30)
    assert zk.exists(f"{base}/gone") is None
    late = WireClient(zk_server.port)
    assert late.connect(session, password)[:2] == (0, 0)
    late.close()


def test_containers_and_ttl_nodes_are_swept(
    zk_server: ZkServer, zk: KazooClient, base: str
) -> None:
    wire = zk_server.wire()
    try:
        assert wire.create(f"{base}/c", mode=4, op=19).err == 0
        assert wire.create(f"{base}/c/x").err == 0
        assert wire.create(f"{base}/ttl", mode=5, op=21, ttl=300).err == 0
        reply = wire.exists(f"{base}/ttl")
        assert STAT.unpack(reply.body)[7] == 0  # a TTL node shows no ephemeral owner
        assert wire.delete(f"{base}/c/x").err == 0
    finally:
        wire.close()
    wait_until(lambda: zk.exists(f"{base}/c") is None, "the empty container deleted")
    wait_until(lambda: zk.exists(f"{base}/ttl") is None, "the expired TTL node deleted")


def test_four_letter_words(zk_server: ZkServer) -> None:
    def ask(word: bytes) -> str:
        with socket.create_connection(("127.0.0.1", zk_server.port), timeout=30) as sock:
            sock.sendall(word)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    assert ask(b"ruok") == "imok"
    srvr = ask(b"srvr")
    assert "Zookeeper version: 3.9" in srvr and "Mode: standalone" in srvr and "Zxid: 0x" in srvr
    assert "zk_znode_count\t" in ask(b"mntr")
    assert "tickTime=200" in ask(b"conf")


def test_bad_packets_close_their_connection_and_harm_nothing(
    zk_server: ZkServer, zk: KazooClient, base: str
) -> None:
    def closed(wire: WireClient) -> bool:
        try:
            wire.read_packet()
        except (ConnectionError, OSError):
            return True
        return False

    too_long = zk_server.wire()
    too_long.send_raw(struct.pack(">i", 0x100000) + b"x" * 16)
    assert closed(too_long)
    negative = zk_server.wire()
    negative.send_raw(struct.pack(">i", -5))
    assert closed(negative)
    unknown = zk_server.wire()
    reply = unknown.call(77, b"")
    assert reply.err == -6  # UNIMPLEMENTED, then the connection closes
    assert closed(unknown)
    garbled = zk_server.wire()
    assert garbled.call(1, b"\x00\x00\x00\x40/short").err == -5  # MARSHALLINGERROR
    assert garbled.exists("/").err == 0  # and the connection goes on
    garbled.close()
    truncated = socket.create_connection(("127.0.0.1", zk_server.port), timeout=30)
    truncated.sendall(struct.pack(">i", 1000) + b"half a packet")
    truncated.close()
    not_a_word = socket.create_connection(("127.0.0.1", zk_server.port), timeout=30)
    not_a_word.sendall(b"abcd")
    assert not_a_word.recv(10) == b""
    not_a_word.close()
    zk.create(f"{base}/still-fine", b"ok")
    assert zk.get(f"{base}/still-fine")[0] == b"ok"


# ---------------------------------------------------------------------------- crash and restart


def test_acknowledged_writes_survive_kill_9_and_only_returning_sessions_keep_ephemerals(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = start_server(tmp_path / "data", port)
    try:
        keeper, leaver, writer = (WireClient(port, 10_000) for _ in range(3))
        for wire in (keeper, leaver, writer):
            wire.connect()
        keeper.create("/kept", mode=1)
        leaver.create("/left", mode=1)
        writer.create("/acked")
        xids = [
            writer.send(
                1,
                string(f"/acked/n{i}")
                + struct.pack(">i", 1)
                + bytes([i])
                + OPEN_ACL
                + struct.pack(">i", 0),
            )
            for i in range(100)
        ]
        assert all(writer.receive(xid).err == 0 for xid in xids)
        server.kill()
        for wire in (keeper, leaver, writer):
            wire.close()
        server.start(timeout_s=120)

        back = WireClient(port, 10_000)
        timeout, session, _ = back.connect(keeper.session_id, keeper.password)
        assert session == keeper.session_id and timeout > 0
        reader = WireClient(port, 10_000)
        reader.connect()
        names = reader.children("/acked")
        assert sorted(names) == sorted(f"n{i}" for i in range(100))
        assert reader.get_data("/acked/n42").body[4:5] == bytes([42])

        def left_gone() -> bool:
            back.exists("/kept")  # keeps the returning session alive while we wait
            return reader.exists("/left").err == -101

        wait_until(left_gone, "the ephemeral node of the session that did not come back deleted")
        assert reader.exists("/kept").err == 0
        back.close()
        reader.close()
    finally:
        server.kill()


def test_replies_are_counted_in_the_servers_metrics(
    zk_server: ZkServer, zk: KazooClient, base: str
) -> None:
    zk.create(f"{base}/counted")
    with pytest.raises(NodeExistsError):
        zk.create(f"{base}/counted")
    text = zk_server.server.metrics()
    assert 'tablekeeper_requests_total{code="0",method="ZooKeeper/create"}' in text
    assert 'tablekeeper_requests_total{code="-110",method="ZooKeeper/create"}' in text
    assert 'tablekeeper_request_seconds_count{method="ZooKeeper/create"}' in text
