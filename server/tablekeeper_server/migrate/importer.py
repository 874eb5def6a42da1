"""Copying a ZooKeeper tree into an Oxia namespace or an etcd keyspace, and checking the copy.

Order: refuse a target that already has keys under `/` (unless forced: then keys are
overwritten, and keys the target has that ZooKeeper does not stay); write every persistent
znode as a key, parents before children, in requests of many keys; raise the counters of the
sequence parents (see `migrate.targets`); then, with `verify`, read the tree again from
ZooKeeper and compare every znode with the target (its data, and the names of its children).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.migrate.targets import Target
from tablekeeper_server.migrate.zookeeper import Tree, Znode

_CLOCK = SystemClock()  # progress and elapsed time of an offline command


WRITE_CHUNK = 2000
"""Znodes handed to the target per call (it splits them into requests per shard)."""
DIFFERENCES_SHOWN_MAX = 20

Say = Callable[[str], None]


class TargetNotEmptyError(Exception):
    pass


def sequence_parents(tree: Tree) -> list[Znode]:
    """Znodes whose children were created and deleted (`cversion` > 0) and which keep no
    persistent child: the parents of sequential znodes (ledger ids, counters). Their counters
    must carry on where ZooKeeper's are (`Target.bump`)."""
    return [n for n in tree.nodes if n.cversion > 0 and not n.children]


@dataclass
class ImportResult:
    keys: int = 0
    bytes: int = 0
    bumped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def write_tree(
    tree: Tree, target: Target, *, force: bool, say: Say, progress_interval_s: float = 2.0
) -> ImportResult:
    started = _CLOCK.monotonic_s()
    existing = target.top_level()
    if existing and not force:
        shown = ", ".join("/" + name for name in existing[:5])
        raise TargetNotEmptyError(
            f"{target.describe()} already has keys under / ({shown}"
            f"{', ...' if len(existing) > 5 else ''}): import into an empty namespace or "
            "keyspace, or pass --force to overwrite the keys ZooKeeper has"
        )
    result = ImportResult()
    said = _CLOCK.monotonic_s()
    total = len(tree.nodes)
    for start in range(0, total, WRITE_CHUNK):
        chunk = tree.nodes[start : start + WRITE_CHUNK]
        target.put_many([(n.path, n.data) for n in chunk], create_only=not force)
        result.keys += len(chunk)
        result.bytes += sum(len(n.data) for n in chunk)
        now = _CLOCK.monotonic_s()
        if now - said >= progress_interval_s:
            said = now
            say(f"written {result.keys:,} of {total:,} keys ({result.bytes / 2**20:.1f} MiB)")
    for node in sequence_parents(tree):
        target.bump(node.path, node.data, node.cversion)
        result.bumped[node.path] = node.cversion
    result.seconds = _CLOCK.monotonic_s() - started
    return result


@dataclass
class Verification:
    checked: int = 0
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.differences


def verify_tree(
    tree: Tree, target: Target, *, say: Say, progress_interval_s: float = 2.0
) -> Verification:
    """Every znode of `tree` against the target: the key exists with the same bytes, and the
    target lists exactly its persistent children under it (and under `/` its top level)."""
    started = _CLOCK.monotonic_s()
    result = Verification()
    tops = sorted(n.path[1:] for n in tree.nodes if n.path.count("/") == 1)
    _compare_children(result, "/", tops, target.children("/"))
    said = _CLOCK.monotonic_s()
    for node in tree.nodes:
        value = target.get(node.path)
        if value is None:
            result.differences.append(f"{node.path}: missing from {target.describe()}")
        elif value != node.data:
            result.differences.append(
                f"{node.path}: {len(value)} bytes in the target, {len(node.data)} in ZooKeeper "
                "(different data)"
            )
        _compare_children(result, node.path, sorted(node.children), target.children(node.path))
        result.checked += 1
        now = _CLOCK.monotonic_s()
        if now - said >= progress_interval_s:
            said = now
            say(f"verified {result.checked:,} of {len(tree.nodes):,} keys")
    result.seconds = _CLOCK.monotonic_s() - started
    return result


def _compare_children(result: Verification, path: str, zk: list[str], got: list[str]) -> None:
    if zk == got:
        return
    missing = sorted(set(zk) - set(got))
    extra = sorted(set(got) - set(zk))
    if missing:
        result.differences.append(f"{path}: children missing from the target: {missing[:5]}")
    if extra:
        result.differences.append(f"{path}: children only in the target: {extra[:5]}")
