"""Which change fires which ZooKeeper watch (one-shot, persistent, recursive), as ZooKeeper's
WatchManager and DataTree decide, on the change events of the range."""

from __future__ import annotations

import pytest

from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import jute
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.paths import node_key
from tablekeeper_server.zookeeper.watches import DATA, Watches
from tablekeeper_server.zookeeper.znode import OPEN_ACL, Znode

pytestmark = pytest.mark.unit


class FakeConnection:
    def __init__(self, auth: list[acls.AuthId] | None = None) -> None:
        self.watched: set[tuple[int, str]] = set()
        self.events: list[tuple[int, str, int]] = []
        self.auth: list[acls.AuthId] = auth or []

    def send_event(self, packet: bytes) -> None:
        _, xid, zxid, err, kind, state = jute.WATCHER_EVENT.unpack_from(packet)
        assert (xid, err, state) == (-1, 0, zk.SYNC_CONNECTED)
        self.events.append((kind, jute.read_string(packet, 28)[0] or "", zxid))


def record(mzxid: int = 1, acl: bytes = OPEN_ACL) -> StoredRecord:
    return Znode(1, mzxid, mzxid - 1, 0, 0, 0, 0, 0, 0, 1, acl, b"").record()


RECORD = record()
CHANGED = record(2)


def created(path: str, zxid: int = 5) -> ChangeEvent:
    return ChangeEvent(zxid, 0, node_key(path), RECORD, None)


def deleted(path: str, zxid: int = 5) -> ChangeEvent:
    return ChangeEvent(zxid, 0, node_key(path), None, RECORD)


def changed(path: str, zxid: int = 5) -> ChangeEvent:
    return ChangeEvent(zxid, 0, node_key(path), CHANGED, RECORD)


def test_one_shot_data_and_child_watches_fire_once() -> None:
    watches = Watches()
    client = FakeConnection()
    watches.watch_data("/a", client)
    watches.watch_children("/", client)
    watches.publish([created("/a", 7)])
    assert client.events == [(zk.NODE_CREATED, "/a", 7), (zk.NODE_CHILDREN_CHANGED, "/", 7)]
    watches.publish([changed("/a"), created("/b")])
    assert len(client.events) == 2
    assert watches.count() == 0 and client.watched == set()


def test_a_deleted_node_tells_each_watcher_once_then_its_parents_child_watchers() -> None:
    watches = Watches()
    both, children_only, parent = FakeConnection(), FakeConnection(), FakeConnection()
    watches.watch_data("/a/b", both)
    watches.watch_children("/a/b", both)
    watches.watch_children("/a/b", children_only)
    watches.watch_children("/a", parent)
    watches.publish([deleted("/a/b")])
    assert both.events == [(zk.NODE_DELETED, "/a/b", 5)]
    assert children_only.events == [(zk.NODE_DELETED, "/a/b", 5)]
    assert parent.events == [(zk.NODE_CHILDREN_CHANGED, "/a", 5)]


def test_a_persistent_watch_stays_and_sees_data_and_children() -> None:
    watches = Watches()
    client = FakeConnection()
    watches.add_persistent("/p", client, recursive=False)
    watches.publish([changed("/p"), created("/p/c"), changed("/p/c"), changed("/p")])
    assert client.events == [
        (zk.NODE_DATA_CHANGED, "/p", 5),
        (zk.NODE_CHILDREN_CHANGED, "/p", 5),
        (zk.NODE_DATA_CHANGED, "/p", 5),
    ]


def test_a_recursive_watch_sees_every_descendants_changes_but_no_child_events() -> None:
    watches = Watches()
    client, other = FakeConnection(), FakeConnection()
    watches.add_persistent("/", client, recursive=True)
    watches.watch_data("/x/y", other)
    watches.publish([created("/x"), created("/x/y"), changed("/x/y"), deleted("/x/y")])
    assert client.events == [
        (zk.NODE_CREATED, "/x", 5),
        (zk.NODE_CREATED, "/x/y", 5),
        (zk.NODE_DATA_CHANGED, "/x/y", 5),
        (zk.NODE_DELETED, "/x/y", 5),
    ]
    assert other.events == [(zk.NODE_CREATED, "/x/y", 5)]


def test_check_and_remove_watches_by_type() -> None:
    watches = Watches()
    client = FakeConnection()
    watches.watch_data("/w", client)
    watches.add_persistent("/w", client, recursive=True)
    assert watches.remove("/w", client, zk.WATCHER_CHILDREN, dry_run=True) is False
    assert watches.remove("/w", client, zk.WATCHER_DATA, dry_run=True) is True
    assert watches.remove("/w", client, zk.WATCHER_DATA, dry_run=False) is True
    assert watches.remove("/w", client, zk.WATCHER_DATA, dry_run=False) is False
    assert watches.remove("/w", client, zk.WATCHER_PERSISTENT_RECURSIVE, dry_run=False) is True
    assert watches.recursive == 0 and watches.count() == 0
    watches.watch_children("/w", client)
    assert watches.remove("/w", client, zk.WATCHER_ANY, dry_run=False) is True
    watches.publish([created("/w/c")])
    assert client.events == []


def test_a_closed_connection_drops_every_watch() -> None:
    watches = Watches()
    client = FakeConnection()
    watches.watch_data("/a", client)
    watches.watch_children("/a", client)
    watches.add_persistent("/", client, recursive=True)
    watches.drop(client)
    assert watches.count() == 0 and watches.recursive == 0
    watches.publish([created("/a/b"), deleted("/a")])
    assert client.events == []


def test_an_event_about_a_node_its_watcher_may_not_read_is_not_sent() -> None:
    """ZooKeeper 3.9 checks READ on the node's ACL (the parent's for NodeChildrenChanged)
    before it sends a watcher an event; a one-shot watch whose event is held back is gone."""
    alice = jute.write_acls([(zk.ALL, "digest", acls.digest_id("alice:pw"))])
    parent_acls = {"/": OPEN_ACL, "/secret": alice}
    watches = Watches(acl_of=parent_acls.get)
    nobody = FakeConnection()
    reader = FakeConnection([("digest", acls.digest_id("alice:pw"))])
    for client in (nobody, reader):
        watches.watch_data("/secret", client)
        watches.watch_children("/secret", client)
        watches.add_persistent("/", client, recursive=True)
    created_secret = ChangeEvent(3, 0, node_key("/secret"), record(3, alice), None)
    watches.publish([created_secret])
    assert nobody.events == []
    assert reader.events == [(zk.NODE_CREATED, "/secret", 3)]  # told once (two watches)
    watches.publish([ChangeEvent(4, 0, node_key("/secret/x"), record(4), None)])
    assert nobody.events == [(zk.NODE_CREATED, "/secret/x", 4)]  # recursive, /secret/x is open
    assert reader.events[1:] == [
        (zk.NODE_CREATED, "/secret/x", 4),
        (zk.NODE_CHILDREN_CHANGED, "/secret", 4),
    ]
    # nobody's one-shot watches on /secret went with the events it was not sent
    assert nobody.watched == {(DATA, "/")}
