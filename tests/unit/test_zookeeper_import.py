"""The import's plan and checks on their own (`migrate.importer`), against an in-memory target:
which parents carry sequence counters on, refusal of a non-empty target, and what the
verification reports. The real ZooKeeper, TableKeeper and Pulsar run in
tests/integration/test_import_zookeeper.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tablekeeper_server.migrate.importer import (
    TargetNotEmptyError,
    sequence_parents,
    verify_tree,
    write_tree,
)
from tablekeeper_server.migrate.targets import TargetError, parse_target
from tablekeeper_server.migrate.zookeeper import Tree, Znode

pytestmark = pytest.mark.unit


class MemoryTarget:
    """Keys with a put count each (Oxia's modifications count)."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.puts: dict[str, int] = {}

    def describe(self) -> str:
        return "memory"

    def top_level(self) -> list[str]:
        return self.children("/")

    def put_many(self, items: Sequence[tuple[str, bytes]], *, create_only: bool) -> None:
        for key, value in items:
            if create_only and key in self.keys:
                raise TargetError(f"{key} exists already")
            self.keys[key] = value
            self.puts[key] = self.puts.get(key, 0) + 1

    def bump(self, key: str, value: bytes, times: int) -> None:
        self.put_many([(key, value)] * times, create_only=False)

    def get(self, key: str) -> bytes | None:
        return self.keys.get(key)

    def children(self, path: str) -> list[str]:
        prefix = path if path.endswith("/") else path + "/"
        return sorted({k[len(prefix) :].split("/")[0] for k in self.keys if k.startswith(prefix)})

    def close(self) -> None:
        pass


def _tree() -> Tree:
    return Tree(
        nodes=[
            Znode("/admin", b"", 3, ("clusters",)),
            Znode("/ledgers", b"", 9, ("idgen", "00")),
            Znode("/admin/clusters", b"", 1, ("standalone",)),
            Znode("/ledgers/idgen", b"", 14, ()),
            Znode("/ledgers/00", b"", 1, ()),
            Znode("/admin/clusters/standalone", b'{"url":1}', 0, ()),
        ],
        ephemeral=[("/loadbalance/brokers/b1", 0x42)],
    )


def test_parents_of_deleted_sequential_children_carry_their_counter_on() -> None:
    tree = _tree()
    assert [n.path for n in sequence_parents(tree)] == ["/ledgers/idgen", "/ledgers/00"]
    target = MemoryTarget()
    result = write_tree(tree, target, force=False, say=lambda _: None)
    assert result.keys == 6
    # Created once, then put once per number ZooKeeper handed out (cversion).
    assert target.puts["/ledgers/idgen"] == 1 + 14
    assert target.puts["/admin/clusters/standalone"] == 1
    assert verify_tree(tree, target, say=lambda _: None).ok


def test_a_target_with_keys_is_refused_unless_forced() -> None:
    target = MemoryTarget()
    target.put_many([("/admin", b"old")], create_only=False)
    with pytest.raises(TargetNotEmptyError, match="/admin"):
        write_tree(_tree(), target, force=False, say=lambda _: None)
    assert target.keys == {"/admin": b"old"}
    write_tree(_tree(), target, force=True, say=lambda _: None)
    assert target.keys["/admin"] == b""


def test_verification_names_missing_changed_and_extra_keys() -> None:
    tree = _tree()
    target = MemoryTarget()
    write_tree(tree, target, force=False, say=lambda _: None)
    target.keys["/admin/clusters/standalone"] = b"changed"
    del target.keys["/ledgers/00"]
    target.keys["/admin/clusters/extra"] = b""
    found = verify_tree(tree, target, say=lambda _: None)
    assert not found.ok
    text = "\n".join(found.differences)
    assert "/admin/clusters/standalone: 7 bytes in the target" in text
    assert "/ledgers/00: missing" in text
    assert "children only in the target: ['extra']" in text
    assert "children missing from the target: ['00']" in text


def test_target_urls_are_pulsars_metadata_store_urls() -> None:
    for bad in ("zk:127.0.0.1:2181", "oxia://", "etcd:http://"):
        with pytest.raises(ValueError, match="expected"):
            parse_target(bad)
