"""ZooKeeper's watches: who watches which path, and which change fires which watch.

As ZooKeeper's `WatchManager` and `DataTree` keep them: two tables, data watches (getData's and
exists' one-shot watches) and child watches (getChildren's), each path -> watcher -> modes.
A persistent watch (addWatch) is in both tables, a persistent recursive one in the data table
only. A change fires the watches of its path in the table its event belongs to (a one-shot
watch goes, a persistent one stays) and, when any recursive watch exists, the recursive watches
of every ancestor:

- a node created: NodeCreated at the path (data table), NodeChildrenChanged at its parent
  (child table);
- a node deleted: NodeDeleted at the path (data table, then child table, a watcher told once),
  NodeChildrenChanged at its parent;
- data set: NodeDataChanged at the path (data table).

A watcher is one client connection (`Watcher`); an event goes to each watcher once, as one
packet encoded once for all of them, unless the watcher's ids may not read the node the event
is about (ZooKeeper 3.9's `ServerCnxn.process` with the znode's ACL): NodeCreated,
NodeDataChanged and NodeDeleted are checked against the node's ACL, NodeChildrenChanged
against the parent's; a one-shot watch whose event is held back is gone all the same.
Everything runs on the server's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import jute
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.paths import PREFIX, parent_of, path_of
from tablekeeper_server.zookeeper.znode import OPEN_ACL, record_acl

STANDARD = 1
PERSISTENT = 2
RECURSIVE = 4

DATA = 0
CHILD = 1


class Watcher(Protocol):
    watched: set[tuple[int, str]]
    """(table, path) of every watch this watcher holds (so it can drop them all)."""
    auth: list[acls.AuthId]
    """The connection's ids: an event about a node they may not read is not sent."""

    def send_event(self, packet: bytes) -> None: ...


class _Table:
    __slots__ = ("kind", "paths")

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.paths: dict[str, dict[Watcher, int]] = {}

    def add(self, path: str, watcher: Watcher, mode: int) -> None:
        entries = self.paths.get(path)
        if entries is None:
            entries = self.paths[path] = {}
        entries[watcher] = entries.get(watcher, 0) | mode
        watcher.watched.add((self.kind, path))

    def remove(self, path: str, watcher: Watcher, mode: int | None) -> bool:
        """Drop `watcher`'s watch of `mode` (None: every mode) on `path`; whether it had one."""
        entries = self.paths.get(path)
        if not entries or watcher not in entries:
            return False
        flags = entries[watcher]
        if mode is None:
            left, removed = 0, True
        else:
            left, removed = flags & ~mode, bool(flags & mode)
        if left:
            entries[watcher] = left
        else:
            del entries[watcher]
            watcher.watched.discard((self.kind, path))
            if not entries:
                del self.paths[path]
        return removed

    def has(self, path: str, watcher: Watcher, mode: int | None) -> bool:
        entries = self.paths.get(path)
        if not entries or watcher not in entries:
            return False
        return mode is None or bool(entries[watcher] & mode)

    def fire(self, path: str, recursive: bool) -> dict[Watcher, None]:
        """The watchers a change at `path` reaches (one-shot watches at `path` go)."""
        out: dict[Watcher, None] = {}
        paths = self.paths
        entries = paths.get(path)
        if entries:
            for watcher, flags in list(entries.items()):
                out[watcher] = None
                if flags & STANDARD:
                    if flags == STANDARD:
                        del entries[watcher]
                        watcher.watched.discard((self.kind, path))
                    else:
                        entries[watcher] = flags & ~STANDARD
            if not entries:
                del paths[path]
        if recursive:
            at = path
            while at != "/":
                at = parent_of(at)
                entries = paths.get(at)
                if entries:
                    for watcher, flags in entries.items():
                        if flags & RECURSIVE:
                            out[watcher] = None
        return out

    def count(self) -> int:
        return sum(len(entries) for entries in self.paths.values())


class Watches:
    """The watches of one keyspace's connections."""

    def __init__(self, acl_of: Callable[[str], bytes | None] = lambda path: None) -> None:
        """`acl_of(path)`: the ACL of the node at `path` now (None: no such node), for the
        parent's ACL a NodeChildrenChanged is checked against."""
        self._acl_of = acl_of
        self.data = _Table(DATA)
        self.child = _Table(CHILD)
        self.recursive = 0
        """Recursive watches held: while there are none, only a change's own path is looked at."""

    def watch_data(self, path: str, watcher: Watcher) -> None:
        self.data.add(path, watcher, STANDARD)

    def watch_children(self, path: str, watcher: Watcher) -> None:
        self.child.add(path, watcher, STANDARD)

    def add_persistent(self, path: str, watcher: Watcher, recursive: bool) -> None:
        if recursive:
            if not self.data.has(path, watcher, RECURSIVE):
                self.recursive += 1
            self.data.add(path, watcher, RECURSIVE)
        else:
            self.data.add(path, watcher, PERSISTENT)
            self.child.add(path, watcher, PERSISTENT)

    def _remove_recursive(self, path: str, watcher: Watcher) -> bool:
        removed = self.data.remove(path, watcher, RECURSIVE)
        if removed:
            self.recursive -= 1
        return removed

    def remove(self, path: str, watcher: Watcher, watcher_type: int, *, dry_run: bool) -> bool:
        """checkWatches (`dry_run`) / removeWatches of `watcher_type` (`WatcherType`) on
        `path`: whether the watcher has such a watch (had one, now removed)."""
        data, child = self.data, self.child
        if watcher_type == zk.WATCHER_CHILDREN:
            if dry_run:
                return child.has(path, watcher, STANDARD)
            return child.remove(path, watcher, STANDARD)
        if watcher_type == zk.WATCHER_DATA:
            if dry_run:
                return data.has(path, watcher, STANDARD)
            return data.remove(path, watcher, STANDARD)
        if watcher_type == zk.WATCHER_PERSISTENT:
            if dry_run:
                return data.has(path, watcher, PERSISTENT)
            removed_child = child.remove(path, watcher, PERSISTENT)
            return data.remove(path, watcher, PERSISTENT) or removed_child
        if watcher_type == zk.WATCHER_PERSISTENT_RECURSIVE:
            if dry_run:
                return data.has(path, watcher, RECURSIVE)
            return self._remove_recursive(path, watcher)
        if watcher_type == zk.WATCHER_ANY:
            if dry_run:
                return child.has(path, watcher, None) or data.has(path, watcher, None)
            removed = child.remove(path, watcher, None)
            if data.has(path, watcher, RECURSIVE):
                self.recursive -= 1
            return data.remove(path, watcher, None) or removed
        return False

    def drop(self, watcher: Watcher) -> None:
        """Forget every watch of `watcher` (its connection closed)."""
        for kind, path in list(watcher.watched):
            table = self.data if kind == DATA else self.child
            if kind == DATA and table.has(path, watcher, RECURSIVE):
                self.recursive -= 1
            table.remove(path, watcher, None)
        watcher.watched.clear()

    def count(self) -> int:
        return self.data.count() + self.child.count()

    # ------------------------------------------------------------------ events

    def publish(self, events: list[ChangeEvent]) -> None:
        """Fire the watches the range's changes reach, in order (see the module docstring)."""
        if not self.data.paths and not self.child.paths:
            return
        for event in events:
            key = event.key
            if not key.startswith(PREFIX):
                continue
            path = path_of(key)
            zxid = event.revision
            record = event.record if event.record is not None else event.prev
            acl = record_acl(record) if record is not None else OPEN_ACL
            if event.prev is None:
                fired = self.data.fire(path, self.recursive > 0)
                self._send(fired, zk.NODE_CREATED, path, zxid, acl)
                self._children_changed(parent_of(path), zxid)
            elif event.record is None:
                told = self.data.fire(path, self.recursive > 0)
                self._send(told, zk.NODE_DELETED, path, zxid, acl)
                children = self.child.fire(path, False)
                for watcher in told:
                    children.pop(watcher, None)
                self._send(children, zk.NODE_DELETED, path, zxid, acl)
                self._children_changed(parent_of(path), zxid)
            else:
                fired = self.data.fire(path, self.recursive > 0)
                self._send(fired, zk.NODE_DATA_CHANGED, path, zxid, acl)

    def _children_changed(self, parent: str, zxid: int) -> None:
        fired = self.child.fire(parent, False)
        if fired:
            acl = self._acl_of(parent)
            self._send(fired, zk.NODE_CHILDREN_CHANGED, parent, zxid, acl or OPEN_ACL)

    @staticmethod
    def _send(
        watchers: dict[Watcher, None], event_type: int, path: str, zxid: int, acl: bytes
    ) -> None:
        if not watchers:
            return
        packet = jute.notification(event_type, path, zxid)
        for watcher in watchers:
            if acl == OPEN_ACL or acls.allowed(acl, zk.READ, watcher.auth):
                watcher.send_event(packet)
