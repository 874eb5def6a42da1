"""One contract for every `KvStore`: the in-memory one the unit tests and the simulation use must
behave as RocksDB does, or what they prove says nothing about the server."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tablekeeper_server.errors import StoreCorruptionError
from tablekeeper_server.storage.api import KvStore
from tablekeeper_server.storage.memory import MemoryKvStore
from tablekeeper_server.storage.rocksdb import RocksKvStore

pytestmark = pytest.mark.contract
Factory = Callable[[], KvStore]


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KvStore]:
    opened: KvStore = (
        MemoryKvStore() if request.param == "memory" else RocksKvStore(tmp_path / "db")
    )
    yield opened
    opened.close()


def write(store: KvStore, *ops: tuple[str, bytes, bytes]) -> None:
    batch = store.new_batch()
    for op, a, b in ops:
        if op == "put":
            batch.put(a, b)
        elif op == "del":
            batch.delete(a)
        else:
            batch.delete_range(a, b)
    store.write(batch)


def test_put_get_delete(store: KvStore) -> None:
    assert store.get(b"k") is None
    write(store, ("put", b"k", b"v1"))
    assert store.get(b"k") == b"v1"
    write(store, ("put", b"k", b"v2"), ("put", b"", b"empty key"))
    assert store.get(b"k") == b"v2"
    assert store.get(b"") == b"empty key"
    write(store, ("del", b"k", b""), ("del", b"never-there", b""))
    assert store.get(b"k") is None


def test_a_batch_applies_in_order(store: KvStore) -> None:
    write(store, ("put", b"a", b"1"), ("del", b"a", b""), ("put", b"b", b"2"), ("put", b"b", b"3"))
    assert store.get(b"a") is None
    assert store.get(b"b") == b"3"


def test_scan_is_ordered_half_open_and_bytewise(store: KvStore) -> None:
    keys = [b"\x00", b"a", b"a\x00", b"ab", b"a\xff", b"b", b"\xff", b"\xff\xff"]  # bytewise
    write(store, *(("put", k, k) for k in reversed(keys)))
    assert [k for k, _ in store.scan(b"", b"\xff" * 4)] == keys
    assert [k for k, _ in store.scan(b"a", b"ab")] == [b"a", b"a\x00"]
    assert [k for k, _ in store.scan(b"b", b"b")] == []
    assert [v for _, v in store.scan(b"ab", b"b\x00")] == [b"ab", b"a\xff", b"b"]


def test_keys_are_the_scans_keys_without_values(store: KvStore) -> None:
    keys = [b"\x00", b"a", b"a\x00", b"ab", b"a\xff", b"b", b"\xff", b"\xff\xff"]
    write(store, *(("put", k, b"value of " + k) for k in reversed(keys)))
    spans = [(b"", b"\xff" * 4), (b"a", b"ab"), (b"b", b"b"), (b"b", b"a"), (b"ab", b"b\x00")]
    for start, end in spans:
        assert store.keys(start, end) == [k for k, _ in store.scan(start, end)]
    write(store, ("del", b"ab", b""))
    assert store.keys(b"a", b"b") == [b"a", b"a\x00", b"a\xff"]


def test_delete_range_is_half_open(store: KvStore) -> None:
    write(store, *(("put", bytes([c]), b"x") for c in b"abcdef"))
    write(store, ("range", b"b", b"e"))
    assert [k for k, _ in store.scan(b"", b"\xff")] == [b"a", b"e", b"f"]
    write(store, ("range", b"z", b"zz"))  # nothing there: nothing happens
    assert store.estimate_num_keys() >= 0


def test_a_scan_is_a_consistent_view(store: KvStore) -> None:
    write(store, *(("put", b"k%d" % i, b"old") for i in range(5)))
    scan = store.scan(b"k", b"l")
    first = next(scan)
    write(store, ("put", b"k3", b"new"), ("del", b"k4", b""), ("put", b"k2x", b"added"))
    rest = list(scan)
    assert [first, *rest] == [(b"k%d" % i, b"old") for i in range(5)]


def test_random_operations_match_a_dict(store: KvStore) -> None:
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    for _ in range(300):
        ops: list[tuple[str, bytes, bytes]] = []
        for _ in range(rng.randint(1, 5)):
            key = bytes([rng.randint(0, 5), rng.randint(0, 255)])
            roll = rng.random()
            if roll < 0.6:
                value = rng.randbytes(rng.randint(0, 8))
                ops.append(("put", key, value))
                model[key] = value
            elif roll < 0.85:
                ops.append(("del", key, b""))
                model.pop(key, None)
            else:
                end = bytes([key[0], min(255, key[1] + rng.randint(0, 40))])
                ops.append(("range", key, end))
                for k in [k for k in model if key <= k < end]:
                    del model[k]
        write(store, *ops)
        low, high = sorted((rng.randbytes(2), rng.randbytes(2)))
        assert list(store.scan(low, high)) == sorted(
            (k, v) for k, v in model.items() if low <= k < high
        )
    assert list(store.scan(b"", b"\xff" * 3)) == sorted(model.items())


def test_compaction_keeps_exactly_the_live_keys(store: KvStore) -> None:
    write(store, *(("put", b"k%03d" % i, b"v%d" % i) for i in range(200)))
    write(store, ("range", b"k050", b"k150"), ("put", b"k010", b"new"), ("del", b"k199", b""))
    store.flush()
    before = list(store.scan(b"", b"\xff"))
    store.compact()
    assert list(store.scan(b"", b"\xff")) == before
    assert len(before) == 99 and store.get(b"k010") == b"new" and store.get(b"k100") is None


def test_a_sound_store_reports_no_damage(store: KvStore) -> None:
    write(store, *(("put", b"k%04d" % i, b"v" * 100) for i in range(100)))
    assert [k for k, _ in store.scan(b"", b"\xff")] == [b"k%04d" % i for i in range(100)]
    assert store.damage is None


def test_rocksdb_reports_a_flipped_byte_as_damage_on_get_and_scan(tmp_path: Path) -> None:
    """A block failing its checksum is `StoreCorruptionError` (UNEXPECTED on the wire), never a
    silently short scan, and the store remembers it (its range rebuilds it)."""
    path = tmp_path / "db"
    store = RocksKvStore(path)
    write(
        store, *(("put", b"k%05d" % i, bytes(random.Random(i).randbytes(100))) for i in range(2000))
    )
    store.close()
    sst = max(path.glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(sst.read_bytes())
    data[len(data) // 4] ^= 0xFF  # a data block (index and footer are at the end)
    sst.write_bytes(bytes(data))
    for read in ("scan", "get"):
        store = RocksKvStore(path)
        with pytest.raises(StoreCorruptionError, match="Corruption"):
            if read == "scan":
                list(store.scan(b"", b"\xff"))
            else:
                for i in range(2000):
                    store.get(b"k%05d" % i)
        assert store.damage is not None and "checksum" in store.damage
        store.close()
