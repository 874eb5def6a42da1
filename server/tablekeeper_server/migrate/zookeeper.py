"""Reading a ZooKeeper tree for an import: every persistent znode's data, children and counters.

The tree is walked level by level from the connect string's chroot (`HOST:PORT/pulsar` reads
`/pulsar` and names its znodes as the chrooted client sees them, e.g. `/admin/clusters`), with
many requests in flight at once (kazoo's async calls), so a tree of 100,000 znodes is read in
seconds rather than a round trip per znode. Ephemeral znodes belong to live sessions (a broker's
lock, a bookie's registration): they are not copied, only listed; their owners write them again
when they start on the new store. ZooKeeper's own `/zookeeper` subtree is skipped.

The walk is not a snapshot: run it with the tree's writers stopped (brokers and bookies), as
the import procedure says. A znode deleted during the walk is left out; one created after its
parent was listed is not seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tablekeeper_server.core.clock import SystemClock

_CLOCK = SystemClock()  # progress and elapsed time of an offline command


WINDOW = 256
"""Requests in flight at once."""
SKIPPED_BY_DEFAULT = ("/zookeeper",)
"""ZooKeeper's own znodes (quotas, the dynamic configuration)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Znode:
    path: str
    data: bytes
    cversion: int
    """How many times a child was created or deleted: the next sequential child's number."""
    children: tuple[str, ...]
    """Names of its persistent children (ephemeral ones are not copied)."""


@dataclass
class Tree:
    nodes: list[Znode] = field(default_factory=list)
    """Persistent znodes, each after its parent (the chroot's root itself is not one)."""
    ephemeral: list[tuple[str, int]] = field(default_factory=list)
    """(path, owning session id) of the ephemeral znodes left out."""
    skipped: list[str] = field(default_factory=list)
    """Subtrees left out (`/zookeeper`, `--skip`)."""
    vanished: int = 0
    """Znodes listed by their parent but deleted before they were read."""

    @property
    def bytes(self) -> int:
        return sum(len(n.data) for n in self.nodes)


def _join(parent: str, child: str) -> str:
    return f"{parent.rstrip('/')}/{child}"


def read_tree(
    client: Any,
    *,
    skip: Iterable[str] = SKIPPED_BY_DEFAULT,
    progress: Callable[[int, int], None] = lambda nodes, ephemeral: None,
) -> Tree:
    """Walk the tree `client` (a started `KazooClient`, chrooted as the connect string says)
    sees. `progress(persistent, ephemeral)` is told the counts as the walk goes."""
    from kazoo.exceptions import NoNodeError

    skipped = {p.rstrip("/") or "/" for p in skip}
    tree = Tree()
    level = [_join("/", name) for name in sorted(client.get_children("/"))]
    found: dict[str, tuple[bytes, Any, list[str]]] = {}
    said = _CLOCK.monotonic_s()
    while level:
        next_level: list[str] = []
        for start in range(0, len(level), WINDOW):
            batch = [p for p in level[start : start + WINDOW]]
            pending = []
            for path in batch:
                if path in skipped:
                    tree.skipped.append(path)
                    continue
                pending.append((path, client.get_async(path), client.get_children_async(path)))
            for path, data_call, children_call in pending:
                try:
                    data, stat = data_call.get()
                    children = sorted(children_call.get())
                except NoNodeError:
                    tree.vanished += 1
                    continue
                if stat.ephemeralOwner:
                    tree.ephemeral.append((path, int(stat.ephemeralOwner)))
                    continue
                found[path] = (data or b"", stat, children)
                next_level.extend(_join(path, child) for child in children)
            now = _CLOCK.monotonic_s()
            if now - said >= 2.0:
                said = now
                progress(len(found), len(tree.ephemeral))
        level = next_level
    for path, (data, stat, children) in found.items():
        persistent = tuple(c for c in children if _join(path, c) in found)
        tree.nodes.append(Znode(path, data, int(stat.cversion), persistent))
    progress(len(found), len(tree.ephemeral))
    return tree


def connect(hosts: str, timeout_s: float = 30.0) -> Any:
    """A started kazoo client for `HOST:PORT[,HOST:PORT][/chroot]` (read-only use). Raises
    `ConnectionError` naming the address when no session comes up within `timeout_s`."""
    from kazoo.client import KazooClient

    logging.getLogger("kazoo").setLevel(logging.WARNING)
    client = KazooClient(hosts=hosts, timeout=timeout_s, read_only=True)
    try:
        client.start(timeout=timeout_s)
    except Exception as exc:
        client.close()
        raise ConnectionError(f"cannot reach ZooKeeper at {hosts}: {exc}") from None
    return client
