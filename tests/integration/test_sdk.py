"""The Python SDK (`Client`, `AsyncClient`, `Table`, `AsyncTable`) against a real server process.

One server is shared by the module; every test works in its own namespace. Tests that restart
the server use their own (function-scoped `server` fixture).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import struct
import time
from collections.abc import Iterator

import pytest

from tablekeeper import (
    AsyncClient,
    AsyncTable,
    BadRequestError,
    BadVersionError,
    Client,
    InvalidKeyError,
    InvalidNamespaceNameError,
    InvalidTableNameError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    NamespaceExistsError,
    NamespaceNotFoundError,
    Table,
    TableExistsError,
    TableInfo,
    TableNotFoundError,
)
from tests.support.cluster import TestCluster
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration
CLUSTER_ENV = "TABLEKEEPER_TEST_CLUSTER"

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
KEY_MAX = 64 * 1024
VALUE_MAX = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def shared_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """A standalone server; or, with TABLEKEEPER_TEST_CLUSTER=N, server 0 of an N-server
    cluster (real ZooKeeper and Pulsar): every test below then enters the cluster through that
    one endpoint, and requests for containers owned elsewhere are routed or forwarded."""
    servers = int(os.environ.get(CLUSTER_ENV, "0") or 0)
    if servers:
        pulsar = request.getfixturevalue("pulsar_service")
        with TestCluster(tmp_path_factory.mktemp("sdk-cluster"), pulsar).start(servers) as cluster:
            yield cluster.servers[0]
        return
    server = ServerProcess(tmp_path_factory.mktemp("sdk") / "data").start()
    yield server
    assert server.process is not None
    if server.process.poll() is None:
        server.stop()


@pytest.fixture(scope="module")
def client(shared_server: ServerProcess) -> Iterator[Client]:
    with Client(shared_server.service) as c:
        yield c


@pytest.fixture
def ns(client: Client, request: pytest.FixtureRequest) -> str:
    """A fresh namespace named after the test."""
    name = "ns_" + re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)
    client.create_namespace(name)
    return name


@pytest.fixture
def table(client: Client, ns: str) -> Table:
    client.create_table(ns, "t", ranges=4)
    return client.table(ns, "t")


def values(kvs: list[KeyValue]) -> list[tuple[bytes, bytes]]:
    return [(kv.lkey, kv.value) for kv in kvs]


# --------------------------------------------------------------------------- namespaces, tables


def test_namespace_admin_and_errors(client: Client) -> None:
    ns_id = client.create_namespace("admin_ns")
    assert isinstance(ns_id, int)
    assert client.get_namespace("admin_ns") == ns_id
    with pytest.raises(NamespaceExistsError):
        client.create_namespace("admin_ns")
    with pytest.raises(NamespaceNotFoundError):
        client.get_namespace("admin_ns_missing")
    with pytest.raises(NamespaceNotFoundError):
        client.delete_namespace("admin_ns_missing")
    for bad in ("", "has space", "a<b", "a>b", "nul\x00byte", "ctl\x01char"):
        with pytest.raises(InvalidNamespaceNameError):
            client.create_namespace(bad)
    # "/" is allowed by BookKeeper's name rules, but it separates NAMESPACE/TABLE in every
    # path: new names may not contain it.
    with pytest.raises(InvalidNamespaceNameError, match="separator"):
        client.create_namespace("admin/slash")
    other_id = client.create_namespace("admin.other")
    assert other_id != ns_id
    client.delete_namespace("admin_ns")
    with pytest.raises(NamespaceNotFoundError):
        client.get_namespace("admin_ns")
    assert client.get_namespace("admin.other") == other_id
    client.create_namespace("admin_ns")  # the name is free again


def test_table_admin_and_errors(client: Client, ns: str) -> None:
    info = client.create_table(ns, "users", ranges=6, ttl_seconds=0)
    assert (info.namespace, info.name, info.ranges, info.ttl_seconds) == (ns, "users", 6, 0)
    fetched = client.get_table(ns, "users")
    assert fetched == info
    assert client.table(ns, "users").info == info
    other = client.create_table(ns, "events", ranges=2, ttl_seconds=60)
    assert other.table_id != info.table_id
    assert client.get_table(ns, "events").ttl_seconds == 60
    with pytest.raises(TableExistsError):
        client.create_table(ns, "users")
    with pytest.raises(TableNotFoundError):
        client.get_table(ns, "missing")
    with pytest.raises(TableNotFoundError):
        client.table(ns, "missing")
    with pytest.raises(TableNotFoundError):
        client.delete_table(ns, "missing")
    with pytest.raises(NamespaceNotFoundError):
        client.create_table("no_such_namespace", "users")
    for bad in ("", "has space", "a<b", "nul\x00byte"):
        with pytest.raises(InvalidTableNameError):
            client.create_table(ns, bad)
    client.delete_table(ns, "users")
    with pytest.raises(TableNotFoundError):
        client.get_table(ns, "users")
    assert client.get_table(ns, "events") == other  # untouched


def test_create_table_refuses_nonsense_sizes(client: Client, ns: str) -> None:
    for ranges in (0, -5):
        with pytest.raises(ValueError, match="at least 1 range"):
            client.create_table(ns, "t", ranges=ranges)
    with pytest.raises(ValueError, match="ttl_seconds"):
        client.create_table(ns, "t", ttl_seconds=-1)
    assert client.create_table(ns, "t", ranges=1).ranges == 2  # 1 rounds up, as documented


def test_delete_namespace_removes_its_tables(client: Client, ns: str) -> None:
    client.create_table(ns, "a")
    client.create_table(ns, "b")
    client.table(ns, "a").put("p", "k", "v")
    client.table(ns, "b").put("p", "k", "v")
    client.delete_namespace(ns)
    with pytest.raises(NamespaceNotFoundError):
        client.get_table(ns, "a")
    client.create_namespace(ns)
    for name in ("a", "b"):
        with pytest.raises(TableNotFoundError):
            client.get_table(ns, name)
    client.create_table(ns, "a")
    fresh = client.table(ns, "a")
    assert fresh.get("p", "k") is None
    assert fresh.count("p") == 0


def test_recreated_table_starts_empty(client: Client, ns: str) -> None:
    client.create_table(ns, "t")
    old = client.table(ns, "t")
    for i in range(10):
        old.put(f"p{i % 3}", f"k{i}", f"v{i}")
    old.increment("n", "counter", 5)
    client.delete_table(ns, "t")
    with pytest.raises(TableNotFoundError):
        old.get("p0", "k0")  # a handle on the deleted table
    client.create_table(ns, "t")
    new = client.table(ns, "t")
    assert new.info.table_id != old.info.table_id
    for p in ("p0", "p1", "p2", "n"):
        assert list(new.scan(p)) == []
        assert new.count(p) == 0
    assert new.get("p0", "k0") is None
    assert new.increment("n", "counter", 1, get_total=True) == 1
    new.put("p0", "k0", "again")
    got = new.get("p0", "k0")
    assert got is not None and got.version == 0 and got.value == b"again"


def test_async_client_admin_and_errors(shared_server: ServerProcess) -> None:
    async def scenario() -> None:
        async with AsyncClient(shared_server.service) as c:
            ns_id = await c.create_namespace("async_admin")
            assert await c.get_namespace("async_admin") == ns_id
            with pytest.raises(NamespaceExistsError):
                await c.create_namespace("async_admin")
            with pytest.raises(InvalidNamespaceNameError):
                await c.create_namespace("bad name")
            info = await c.create_table("async_admin", "t", ranges=2)
            assert (await c.get_table("async_admin", "t")).table_id == info.table_id
            with pytest.raises(TableExistsError):
                await c.create_table("async_admin", "t")
            with pytest.raises(InvalidTableNameError):
                await c.create_table("async_admin", "bad name")
            t = await c.table("async_admin", "t")
            assert await t.put("p", "k", "v") is None
            kv = await t.get("p", "k")
            assert kv is not None and kv.value == b"v" and kv.version == 0
            await c.delete_table("async_admin", "t")
            with pytest.raises(TableNotFoundError):
                await c.table("async_admin", "t")
            await c.delete_namespace("async_admin")
            with pytest.raises(NamespaceNotFoundError):
                await c.get_namespace("async_admin")

    asyncio.run(scenario())


# --------------------------------------------------------------------------- put / get


def test_service_uri_with_several_host_names(shared_server: ServerProcess, table: Table) -> None:
    """`bk://name:port,name:port` (the README recommends several addresses) is resolved into an
    address list gRPC accepts."""
    table.put("p", "named", "v")
    service = f"bk://localhost:{shared_server.port},localhost:{shared_server.port}"
    with Client(service) as named:
        assert named.get_namespace(table.info.namespace) >= 0
        kv = named.table(table.info.namespace, table.info.name).get("p", "named")
        assert kv is not None and kv.value == b"v"


def test_put_get_versions_and_revisions(table: Table) -> None:
    assert table.get("p", "k") is None
    assert table.put("p", "k", "v0") is None
    first = table.get("p", "k")
    assert first is not None
    assert (first.pkey, first.lkey, first.value, first.number) == (b"p", b"k", b"v0", None)
    assert not first.is_number
    assert first.version == 0
    assert first.create_revision == first.mod_revision > 0

    prev = table.put("p", "k", "v1", prev_kv=True)
    assert prev is not None and prev.value == b"v0" and prev.version == 0
    second = table.get("p", "k")
    assert second is not None and second.value == b"v1" and second.version == 1
    assert second.create_revision == first.create_revision
    assert second.mod_revision > first.mod_revision

    assert table.put(b"p", b"k", b"v2") is None  # prev_kv not requested
    third = table.get(b"p", b"k")  # bytes and str address the same key
    assert third is not None and third.value == b"v2" and third.version == 2
    assert third.create_revision == first.create_revision
    assert third.mod_revision > second.mod_revision

    # prev_kv on an absent key is None; binary values round-trip unchanged.
    blob = bytes(range(256)) * 3
    assert table.put("p", "binary", blob, prev_kv=True) is None
    got = table.get("p", "binary")
    assert got is not None and got.value == blob
    # An empty value is a value (the key exists).
    table.put("p", "empty", b"")
    empty = table.get("p", "empty")
    assert empty is not None and empty.value == b"" and empty.version == 0
    # The same lkey under another pkey is another key.
    assert table.get("q", "k") is None


def test_keys_and_values_must_be_str_or_bytes(table: Table) -> None:
    for bad in (5, 1.5, None, ["x"]):
        with pytest.raises(TypeError, match="str or bytes"):
            table.put("p", "k", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="str or bytes"):
            table.get("p", bad)  # type: ignore[arg-type]
    assert table.get("p", "k") is None  # nothing was written
    table.put("p", bytearray(b"k"), memoryview(b"v"))  # type: ignore[arg-type]
    kv = table.get("p", "k")
    assert kv is not None and kv.value == b"v"


def test_expected_version(table: Table) -> None:
    table.put("p", "k", "a", expected_version=-1)  # absent: ok
    kv = table.get("p", "k")
    assert kv is not None and kv.version == 0 and kv.value == b"a"
    with pytest.raises(KeyExistsError):
        table.put("p", "k", "b", expected_version=-1)
    table.put("p", "k", "c", expected_version=0)  # matches
    with pytest.raises(BadVersionError):
        table.put("p", "k", "d", expected_version=0)  # now 1
    with pytest.raises(BadVersionError):
        table.put("p", "k", "d", expected_version=7)
    kv = table.get("p", "k")
    assert kv is not None and kv.version == 1 and kv.value == b"c"  # failures wrote nothing
    table.put("p", "k", "e", expected_version=1)
    kv = table.get("p", "k")
    assert kv is not None and kv.version == 2 and kv.value == b"e"

    with pytest.raises(KeyNotFoundError):
        table.put("p", "missing", "x", expected_version=0)
    with pytest.raises(KeyNotFoundError):
        table.put("p", "missing", "x", expected_version=3)
    assert table.get("p", "missing") is None
    with pytest.raises(BadRequestError):
        table.put("p", "k", "x", expected_version=-2)

    # After a delete the key is absent again: -1 succeeds and the version restarts at 0.
    assert table.delete("p", "k") == 1
    table.put("p", "k", "f", expected_version=-1)
    kv = table.get("p", "k")
    assert kv is not None and kv.version == 0 and kv.value == b"f"


# --------------------------------------------------------------------------- increment


def test_increment(table: Table) -> None:
    assert table.increment("p", "n", 5) is None  # no total unless asked
    kv = table.get("p", "n")
    assert kv is not None and kv.is_number and kv.number == 5 and kv.version == 0
    assert kv.value == struct.pack(">q", 5)
    assert table.increment("p", "n", 10, get_total=True) == 15
    assert table.increment("p", "n", -20, get_total=True) == -5
    assert table.increment("p", "n", get_total=True) == -4  # default amount 1
    assert table.increment("p", "n", 0, get_total=True) == -4
    kv = table.get("p", "n")
    assert kv is not None and kv.number == -4 and kv.version == 4

    # A new key starts at the amount, negative too.
    assert table.increment("p", "neg", -3, get_total=True) == -3

    # int64 wrap-around, like Java's long.
    assert table.increment("p", "big", INT64_MAX, get_total=True) == INT64_MAX
    assert table.increment("p", "big", 1, get_total=True) == INT64_MIN
    assert table.increment("p", "big", -1, get_total=True) == INT64_MAX
    assert table.increment("p", "small", INT64_MIN, get_total=True) == INT64_MIN
    assert table.increment("p", "small", -1, get_total=True) == INT64_MAX

    # Bytes and number keys do not mix.
    table.put("p", "bytes", "hello")
    with pytest.raises(BadRequestError):
        table.increment("p", "bytes", 1)
    with pytest.raises(BadRequestError):
        table.put("p", "n", "text")
    kv = table.get("p", "bytes")
    assert kv is not None and kv.value == b"hello" and kv.version == 0
    kv = table.get("p", "n")
    assert kv is not None and kv.number == -4 and kv.version == 4

    # A deleted number key can become a bytes key, and vice versa.
    assert table.delete("p", "n") == 1
    table.put("p", "n", "now bytes")
    kv = table.get("p", "n")
    assert kv is not None and not kv.is_number and kv.version == 0


# --------------------------------------------------------------------------- scan, count


def test_scan_order_bounds_limit(table: Table) -> None:
    lkeys = [b"b", b"\xff", b"a", b"\x00", b"aa", b"A", b"\x7f", b"a\x00", b"ab", b"z"]
    for lkey in lkeys:
        table.put("p", lkey, b"v-" + lkey)
    expected = sorted(lkeys)  # unsigned byte order
    assert [kv.lkey for kv in table.scan("p")] == expected
    assert values(list(table.scan("p"))) == [(k, b"v-" + k) for k in expected]

    # start and end are inclusive.
    assert [kv.lkey for kv in table.scan("p", "a", "ab")] == [b"a", b"a\x00", b"aa", b"ab"]
    assert [kv.lkey for kv in table.scan("p", "aa")] == [b"aa", b"ab", b"b", b"z", b"\x7f", b"\xff"]
    assert [kv.lkey for kv in table.scan("p", b"", b"A")] == [b"\x00", b"A"]
    # bounds that are not keys
    assert [kv.lkey for kv in table.scan("p", "a\x01", "az")] == [b"aa", b"ab"]
    assert list(table.scan("p", "c", "y")) == []
    assert list(table.scan("p", "z", "a")) == []  # start after end

    assert [kv.lkey for kv in table.scan("p", limit=3)] == expected[:3]
    assert [kv.lkey for kv in table.scan("p", "a", limit=2)] == [b"a", b"a\x00"]
    assert [kv.lkey for kv in table.scan("p", limit=4, page_size=3)] == expected[:4]
    assert list(table.scan("p", limit=0)) == []
    assert [kv.lkey for kv in table.scan("p", limit=100)] == expected

    assert table.count("p") == len(lkeys)
    assert table.count("p", "a", "ab") == 4
    assert table.count("p", "c", "y") == 0
    assert table.count("nobody") == 0
    assert list(table.scan("nobody")) == []


def test_scan_paging(table: Table) -> None:
    lkeys = [f"key-{i:03d}" for i in range(100)]
    for i in (37, 5, 99, 0, 64):  # a few out of order first
        table.put("pages", lkeys[i], str(i))
    for i, lkey in enumerate(lkeys):
        table.put("pages", lkey, str(i))
    # A paging bug tends to loop forever: take at most one page more than there is, so such a
    # bug fails here (too many keys) instead of hanging.
    got = list(itertools.islice(table.scan("pages", page_size=7), 107))
    assert [kv.lkey.decode() for kv in got] == lkeys
    assert [kv.value.decode() for kv in got] == [str(i) for i in range(100)]
    assert len({kv.lkey for kv in got}) == 100  # no page repeated a key
    # paging with bounds and a limit that is not a multiple of the page size
    bounded = list(table.scan("pages", "key-010", "key-059", page_size=7, limit=23))
    assert [kv.lkey.decode() for kv in bounded] == lkeys[10:33]
    bounded = list(itertools.islice(table.scan("pages", "key-010", "key-059", page_size=7), 57))
    assert [kv.lkey.decode() for kv in bounded] == lkeys[10:60]
    assert [kv.lkey.decode() for kv in table.scan("pages", page_size=1, limit=5)] == lkeys[:5]
    assert table.count("pages") == 100


def test_scan_keys_only(table: Table) -> None:
    table.put("p", "a", "alpha")
    table.put("p", "b", "beta")
    table.put("p", "b", "beta2")
    table.increment("p", "c", 3)
    kvs = list(table.scan("p", keys_only=True))
    assert [kv.lkey for kv in kvs] == [b"a", b"b", b"c"]
    assert [kv.value for kv in kvs] == [b"", b"", b""]
    assert [kv.version for kv in kvs] == [0, 1, 0]
    assert all(kv.mod_revision > 0 for kv in kvs)
    full = list(table.scan("p"))
    assert [kv.value for kv in full[:2]] == [b"alpha", b"beta2"]
    assert full[2].number == 3


def test_pkeys_are_isolated(table: Table) -> None:
    pkeys = [b"a", b"ab", b"a\x00", b"a\x00b", b"\x00", b"b", b"a\xff"]
    lkeys = [b"\x00", b"b", b"k1", b"k2", b"\xff"]
    for pkey in pkeys:
        for lkey in lkeys:
            table.put(pkey, lkey, pkey + b"|" + lkey)
    for pkey in pkeys:
        kvs = list(table.scan(pkey))
        assert [(kv.pkey, kv.lkey, kv.value) for kv in kvs] == [
            (pkey, lkey, pkey + b"|" + lkey) for lkey in lkeys
        ], pkey
        assert table.count(pkey) == len(lkeys)
        assert table.get(pkey, b"k1") is not None
    # a pkey that is a prefix of used pkeys has no keys of its own
    assert list(table.scan(b"a\x00\x00")) == []
    assert table.count(b"a\x00\x00") == 0
    # deleting one pkey's keys leaves the others alone
    assert table.delete_range(b"a") == len(lkeys)
    assert table.delete_range(b"a\x00", b"b", b"k2") == 3
    assert table.count(b"a") == 0
    assert [kv.lkey for kv in table.scan(b"a\x00")] == [b"\x00", b"\xff"]
    for pkey in (b"ab", b"a\x00b", b"\x00", b"b", b"a\xff"):
        assert table.count(pkey) == len(lkeys), pkey
    # txns on one pkey do not see another pkey's keys
    result = table.txn(b"a").if_absent(b"k1").then_put(b"k1", b"back").commit()
    assert result.succeeded
    kv = table.get(b"ab", b"k1")
    assert kv is not None and kv.value == b"ab|k1"


def test_pkeys_that_prefix_each_other_never_share_keys(client: Client, ns: str) -> None:
    # Two ranges, many families of pkeys: in BookKeeper's `0x01 + pkey + 0x00 + lkey` layout
    # (pkey b"a", lkey b"\x00x") and (pkey b"a\x00", lkey b"x") would be one stored key.
    client.create_table(ns, "two", ranges=2)
    t = client.table(ns, "two")
    bases = [bytes([c]) for c in b"abcdefghijkl"]
    pkeys = [p for base in bases for p in (base, base + b"\x00", base + b"\x00x", base + b"x")]
    lkeys = [b"\x00", b"\x00x", b"k", b"x\x00"]
    items = [(p, lkey, p + b"|" + lkey) for p in pkeys for lkey in lkeys]
    assert t.batch_put(items) == [None] * len(items)
    for pkey in pkeys:
        got = [(kv.lkey, kv.value, kv.version) for kv in t.scan(pkey)]
        assert got == [(lkey, pkey + b"|" + lkey, 0) for lkey in lkeys], pkey
    for base in bases:
        assert t.delete_range(base) == len(lkeys)
    for pkey in pkeys:
        assert t.count(pkey) == (0 if pkey in bases else len(lkeys)), pkey


def test_explicit_end_nul_byte_is_inclusive_not_unbounded(table: Table) -> None:
    # On the wire b"\x00" as range end means "no end"; the SDK must not send it for an
    # explicit inclusive end b"\x00" (which, keys being non-empty, holds only b"\x00").
    for lkey in (b"\x00", b"\x00\x01", b"a", b"b"):
        table.put("p", lkey, "v")
    assert [kv.lkey for kv in table.scan("p", b"", b"\x00")] == [b"\x00"]
    assert table.count("p", b"", b"\x00") == 1
    assert table.count("p", b"a", b"\x00") == 0  # empty range: start after end
    assert list(table.scan("p", b"b", b"a")) == []
    assert table.delete_range("p", b"\x00", b"\x00") == 1
    assert table.count("p") == 3
    result = table.txn("p").then_get(b"", b"\x00").then_delete(b"\x00\x01", b"\x00\x01").commit()
    assert result.results == [[], 1]
    with pytest.raises(ValueError, match="empty key range"):
        table.txn("p").then_get(b"b", b"a")


# --------------------------------------------------------------------------- delete


def test_delete_and_delete_range_counts(table: Table) -> None:
    table.put("p", "k", "v")
    assert table.delete("p", "k") == 1
    assert table.delete("p", "k") == 0
    assert table.get("p", "k") is None
    assert table.delete("p", "never") == 0
    table.increment("p", "num", 1)
    assert table.delete("p", "num") == 1  # number keys can be deleted

    for i in range(20):
        table.put("r", f"k{i:02d}", "v")
    table.put("r2", "k05", "other pkey")
    table.put("rr", "k05", "other pkey")
    assert table.delete_range("r", "k05", "k09") == 5  # inclusive
    assert table.delete_range("r", "k05", "k09") == 0
    assert table.delete_range("r", "k04", "k10") == 2  # k04, k10
    assert [kv.lkey for kv in table.scan("r")] == [
        f"k{i:02d}".encode() for i in (0, 1, 2, 3, 11, 12, 13, 14, 15, 16, 17, 18, 19)
    ]
    assert table.delete_range("r", "k15") == 5  # open end
    assert table.delete_range("r") == 8  # the whole pkey
    assert table.count("r") == 0
    kv = table.get("r2", "k05")
    assert kv is not None and kv.value == b"other pkey"
    assert table.count("rr") == 1


# --------------------------------------------------------------------------- txn


def test_txn_compares_and_branches(table: Table) -> None:
    table.put("p", "k", "v0")
    table.put("p", "k", "v1")  # version 1
    kv = table.get("p", "k")
    assert kv is not None

    # version compares
    ok = table.txn("p").if_version("k", "==", 1).then_put("k", "v2").otherwise_put("f", "x")
    result = ok.commit()
    assert result.succeeded
    assert len(result.results) == 1
    prev = result.results[0]
    assert isinstance(prev, KeyValue) and prev.value == b"v1" and prev.version == 1
    assert table.get("p", "f") is None

    result = table.txn("p").if_version("k", "==", 1).then_put("k", "no").otherwise_get("k").commit()
    assert not result.succeeded
    assert [values(r) for r in result.results] == [[(b"k", b"v2")]]
    now = table.get("p", "k")
    assert now is not None and now.value == b"v2" and now.version == 2

    assert table.txn("p").if_version("k", ">", 1).commit().succeeded
    assert not table.txn("p").if_version("k", "<", 2).commit().succeeded
    assert table.txn("p").if_version("k", "!=", 5).commit().succeeded
    assert table.txn("p").if_create_revision("k", "==", kv.create_revision).commit().succeeded
    assert table.txn("p").if_mod_revision("k", ">", kv.mod_revision).commit().succeeded
    assert not table.txn("p").if_mod_revision("k", "==", kv.mod_revision).commit().succeeded

    # value compares (bytes, unsigned)
    assert table.txn("p").if_value("k", "==", "v2").commit().succeeded
    assert not table.txn("p").if_value("k", "==", "v1").commit().succeeded
    assert table.txn("p").if_value("k", "!=", "v1").commit().succeeded
    assert table.txn("p").if_value("k", ">", "v1").commit().succeeded
    assert table.txn("p").if_value("k", "<", "v3").commit().succeeded
    assert table.txn("p").if_value("k", "<", b"\xff").commit().succeeded
    assert not table.txn("p").if_value("k", ">", "w").commit().succeeded

    # existence
    assert table.txn("p").if_exists("k").commit().succeeded
    assert not table.txn("p").if_absent("k").commit().succeeded
    assert table.txn("p").if_absent("missing").commit().succeeded
    assert not table.txn("p").if_exists("missing").commit().succeeded
    table.put("p", "empty", b"")
    assert table.txn("p").if_exists("empty").commit().succeeded  # empty value, key exists
    assert not table.txn("p").if_absent("empty").commit().succeeded
    assert not table.txn("p").if_value("missing", ">", "a").commit().succeeded

    # compares are an AND; the otherwise branch runs when any fails
    result = (
        table.txn("p")
        .if_exists("k")
        .if_absent("k")
        .then_put("then", "1")
        .otherwise_put("else", "1")
        .otherwise_delete("empty")
        .commit()
    )
    assert not result.succeeded
    assert result.results == [None, 1]
    assert table.get("p", "then") is None
    assert table.get("p", "else") is not None
    assert table.get("p", "empty") is None

    # create-if-absent
    create = table.txn("p").if_absent("lock").then_put("lock", "me").otherwise_get("lock")
    assert create.commit().succeeded
    again = table.txn("p").if_absent("lock").then_put("lock", "you").otherwise_get("lock")
    second = again.commit()
    assert not second.succeeded
    assert [values(r) for r in second.results] == [[(b"lock", b"me")]]


def test_txn_ops_see_pre_txn_state_and_share_a_revision(table: Table) -> None:
    table.put("p", "a", "old-a")
    table.put("p", "b", "old-b")
    result = (
        table.txn("p")
        .if_exists("a")
        .then_put("a", "new-a")
        .then_get("a")
        .then_delete("b")
        .then_get("b")
        .then_put("c", "new-c")
        .then_get("a", "z")
        .commit()
    )
    assert result.succeeded
    prev_a, get_a, deleted_b, get_b, prev_c, scan = result.results
    assert isinstance(prev_a, KeyValue) and prev_a.value == b"old-a"
    assert values(get_a) == [(b"a", b"old-a")]  # the put is not visible inside the txn
    assert deleted_b == 1
    assert values(get_b) == [(b"b", b"old-b")]
    assert prev_c is None
    assert values(scan) == [(b"a", b"old-a"), (b"b", b"old-b")]
    a, c = table.get("p", "a"), table.get("p", "c")
    assert a is not None and c is not None
    assert a.value == b"new-a" and a.version == 1
    assert c.value == b"new-c" and c.version == 0
    assert a.mod_revision == c.mod_revision == c.create_revision  # one revision per txn
    assert table.get("p", "b") is None

    # a range delete inside a txn returns the real count
    for i in range(5):
        table.put("p", f"r{i}", "v")
    result = table.txn("p").then_delete("r1", "r3").then_get("r0", "r9").commit()
    assert result.succeeded  # no compares: succeeds
    assert result.results[0] == 3
    assert [kv.lkey for kv in result.results[1]] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert [kv.lkey for kv in table.scan("p", "r0", "r9")] == [b"r0", b"r4"]


def test_txn_compare_on_missing_key_version(table: Table) -> None:
    table.put("p", "k", "v")
    for txn in (
        table.txn("p").if_version("missing", "==", 0),
        table.txn("p").if_create_revision("missing", ">", 0),
        table.txn("p").if_mod_revision("missing", "!=", 0),
        # even after a compare that holds
        table.txn("p").if_exists("k").if_version("missing", "==", 0),
    ):
        txn = txn.then_put("k", "then").otherwise_put("k", "otherwise")
        with pytest.raises(KeyNotFoundError):
            txn.commit()
    kv = table.get("p", "k")
    assert kv is not None and kv.value == b"v" and kv.version == 0  # nothing applied
    # the range still works afterwards (the failed txn is replay-safe)
    assert table.txn("p").if_version("k", "==", 0).then_put("k", "w").commit().succeeded


def test_txn_per_op_errors(table: Table) -> None:
    """A failing op fails the whole txn: nothing of its branch is applied (issue 17)."""
    table.increment("p", "num", 1)
    with pytest.raises(BadRequestError):
        table.txn("p").then_put("num", "not a number").then_put("ok", "yes").commit()
    assert table.get("p", "ok") is None
    num = table.get("p", "num")
    assert num is not None and num.number == 1 and num.version == 0


def test_txn_rejects_bad_input(table: Table) -> None:
    with pytest.raises(InvalidKeyError):
        table.txn("p").if_exists("").commit()
    with pytest.raises(InvalidKeyError):
        table.txn("p").then_put("", "v").commit()
    with pytest.raises(BadRequestError, match="limit"):
        table.txn("p").then_put("k", b"x" * (VALUE_MAX + 1)).commit()
    with pytest.raises(ValueError):
        table.txn("p").if_version("k", "<=", 1)  # type: ignore[arg-type]
    assert table.get("p", "k") is None


# --------------------------------------------------------------------------- batch


def test_a_batch_applies_its_ops_on_one_key_in_their_order(
    client: Client, shared_server: ServerProcess, ns: str
) -> None:
    """Puts at the head of a Batch are queued on their ranges at once, the ops after the first
    other op through the general path, and (cluster mode) the writes on ranges another server
    owns are forwarded to it as one Batch per container: either way each range gets them in the
    Batch's order."""
    import grpc

    from tablekeeper_proto.bookkeeper import kv_rpc_pb2
    from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc

    info = client.create_table(ns, "order", ranges=4)
    table = client.table(ns, "order")
    for i in range(8):  # the route cached, every range open: the leading puts are queued at once
        table.put(f"p{i}", "k", "0")

    def header(pkey: str) -> kv_rpc_pb2.RoutingHeader:
        return kv_rpc_pb2.RoutingHeader(stream_id=info.table_id, r_key=pkey.encode())

    def put(pkey: str, value: str) -> tablekeeper_pb2.BatchOp:
        request = kv_rpc_pb2.PutRequest(header=header(pkey), key=b"k", value=value.encode())
        return tablekeeper_pb2.BatchOp(put=request)

    def delete(pkey: str) -> tablekeeper_pb2.BatchOp:
        request = kv_rpc_pb2.DeleteRangeRequest(header=header(pkey), key=b"k")
        return tablekeeper_pb2.BatchOp(delete_range=request)

    with grpc.insecure_channel(shared_server.target) as channel:
        batch = tablekeeper_pb2_grpc.TableKeeperStub(channel).Batch
        ops = [put(f"p{i}", "1") for i in range(8)] + [delete("p0"), put("p1", "2"), delete("p2")]
        response = batch(tablekeeper_pb2.BatchRequest(ops=ops), timeout=30)
        assert [r.error for r in response.results] == [""] * len(ops)
        ops = [delete("p3"), put("p3", "again"), put("p4", "2"), delete("p4")]
        response = batch(tablekeeper_pb2.BatchRequest(ops=ops), timeout=30)
        assert [r.error for r in response.results] == [""] * len(ops)
    values = {f"p{i}": table.get(f"p{i}", "k") for i in range(8)}
    assert {p: kv.value if kv else None for p, kv in values.items()} == {
        "p0": None,
        "p1": b"2",
        "p2": None,
        "p3": b"again",
        "p4": None,
        "p5": b"1",
        "p6": b"1",
        "p7": b"1",
    }


def test_batch_put(client: Client, shared_server: ServerProcess, ns: str) -> None:
    client.create_table(ns, "t")

    async def scenario() -> None:
        async with AsyncClient(shared_server.service) as c:
            t = await c.table(ns, "t")
            items: list[tuple[str, str, str]] = [(f"p{i % 5}", f"k{i}", f"v{i}") for i in range(30)]
            assert await t.batch_put(items) == [None] * 30
            for pkey, lkey, value in items:
                kv = await t.get(pkey, lkey)
                assert kv is not None and kv.value == value.encode() and kv.version == 0

            amounts: list[tuple[str, str, int]] = [("n", f"c{i % 3}", i) for i in range(9)]
            assert await t.batch_put(amounts, mode="increment") == [None] * 9
            totals = {lkey: 0 for _, lkey, _ in amounts}
            for _, lkey, amount in amounts:
                totals[lkey] += amount
            for lkey, total in totals.items():
                kv = await t.get("n", lkey)
                assert kv is not None and kv.number == total and kv.version == 2

            # per-item errors; the other items are applied
            mixed = await t.batch_put(
                [("p0", "k0", "again"), ("n", "c0", "bytes?"), ("p1", "", "x")]
            )
            assert mixed[0] is None
            assert isinstance(mixed[1], BadRequestError)
            assert isinstance(mixed[2], InvalidKeyError)
            kv = await t.get("p0", "k0")
            assert kv is not None and kv.value == b"again" and kv.version == 1
            wrong = await t.batch_put([("p0", "k0", 1), ("n", "c0", 1)], mode="increment")
            assert isinstance(wrong[0], BadRequestError)
            assert wrong[1] is None
            assert await t.batch_put([]) == []

    asyncio.run(scenario())

    # the synchronous twin
    t = client.table(ns, "t")
    assert t.batch_put([("s", "a", "1"), ("s", "b", "2")]) == [None, None]
    assert values(list(t.scan("s"))) == [(b"a", b"1"), (b"b", b"2")]
    assert t.batch_put([("s", "n", 4), ("s", "n", 6)], mode="increment") == [None, None]
    assert t.increment("s", "n", 0, get_total=True) == 10
    with pytest.raises(TypeError):
        t.batch_put([("s", "a", 5)])  # an int is an amount, not a value
    with pytest.raises(TypeError):
        t.batch_put([("s", "n", "5")], mode="increment")
    kv = t.get("s", "a")
    assert kv is not None and kv.value == b"1"


# --------------------------------------------------------------------------- TTL


def test_ttl_hides_expired_keys(client: Client, ns: str) -> None:
    # The TTL must outlast the few calls below that read the keys before it passes, however
    # busy the machine; then the test waits for it to pass (that wait is the feature's own).
    info = client.create_table(ns, "ttl", ttl_seconds=5)
    assert info.ttl_seconds == 5
    t = client.table(ns, "ttl")
    t.put("p", "other", "x")
    t.increment("p", "n", 7)
    t.put("p", "k", "v")
    t.put("p", "k", "v2")
    before = t.get("p", "k")
    assert before is not None and before.value == b"v2" and before.version == 1
    assert t.count("p") == 3
    deadline = time.monotonic() + 60  # a hang guard
    while t.get("p", "k") is not None:  # the last of the keys written
        assert time.monotonic() < deadline, "the table's TTL never hid the key"
        time.sleep(0.1)
    assert t.get("p", "n") is None
    assert list(t.scan("p")) == []
    assert t.count("p") == 0
    assert t.delete("p", "other") == 0  # an expired key counts as absent
    # A write after expiry creates a fresh key.
    t.put("p", "k", "new", expected_version=-1)
    after = t.get("p", "k")
    assert after is not None and after.value == b"new" and after.version == 0
    assert after.create_revision > before.create_revision
    assert t.increment("p", "n", 1, get_total=True) == 1
    assert not t.txn("p").if_exists("other").commit().succeeded


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_rejected_and_server_stays_healthy(
    client: Client, shared_server: ServerProcess, table: Table
) -> None:
    table.put("p", "keep", "safe")
    table.increment("p", "count", 41)

    for call in (
        lambda: table.put("p", "", "v"),
        lambda: table.get("p", ""),
        lambda: table.increment("p", "", 1),
        lambda: table.delete("p", ""),
    ):
        with pytest.raises(InvalidKeyError, match="empty"):
            call()

    too_long = "k" * (KEY_MAX + 1)
    for call in (
        lambda: table.put("p", too_long, "v"),
        lambda: table.get("p", too_long),
        lambda: table.increment("p", too_long, 1),
        lambda: table.delete("p", too_long),
        lambda: table.put(too_long, "k", "v"),  # pkey too
    ):
        with pytest.raises(InvalidKeyError) as excinfo:
            call()
        assert f"{KEY_MAX + 1} bytes" in str(excinfo.value)
        assert str(KEY_MAX) in str(excinfo.value)

    with pytest.raises(BadRequestError) as bad_value:
        table.put("p", "big", b"x" * (VALUE_MAX + 1))
    message = str(bad_value.value)
    assert "value" in message and f"{VALUE_MAX + 1} bytes" in message and str(VALUE_MAX) in message
    assert table.get("p", "big") is None

    # the limits themselves are allowed
    table.put("p", "k" * KEY_MAX, "at the key limit")
    at_limit = table.get("p", "k" * KEY_MAX)
    assert at_limit is not None and at_limit.value == b"at the key limit"
    big_value = bytes(range(256)) * (VALUE_MAX // 256)
    table.put("p", "big", big_value)
    big = table.get("p", "big")
    assert big is not None and big.value == big_value

    # a table id the server never issued
    async def unknown_table() -> None:
        async with AsyncClient(shared_server.service) as c:
            ghost = AsyncTable(c, TableInfo("ghost_ns", "ghost", 987_654_321, 4, 0))
            with pytest.raises(TableNotFoundError):
                await ghost.get("p", "k")
            with pytest.raises(TableNotFoundError):
                await ghost.put("p", "k", "v")
            with pytest.raises(TableNotFoundError):
                await ghost.increment("p", "k", 1)
            with pytest.raises(TableNotFoundError):
                await ghost.delete("p", "k")
            with pytest.raises(TableNotFoundError):
                await ghost.count("p")
            with pytest.raises(TableNotFoundError):
                await ghost.txn("p").then_put("k", "v").commit()
            result = await ghost.batch_put([("p", "k", "v")])
            assert isinstance(result[0], TableNotFoundError)

    started = time.monotonic()
    asyncio.run(unknown_table())
    assert time.monotonic() - started < 10  # answered, not retried until the deadline

    # still healthy, data intact
    assert shared_server.process is not None and shared_server.process.poll() is None
    assert client.server_info().num_storage_containers > 0
    keep = table.get("p", "keep")
    assert keep is not None and keep.value == b"safe" and keep.version == 0
    assert table.increment("p", "count", 1, get_total=True) == 42
    table.put("p", "after", "ok")
    assert [kv.lkey for kv in table.scan("p", "after", "keep")] == [
        b"after",
        b"big",
        b"count",
        b"keep",
    ]
    assert table.count("p") == 5  # keep, count, big, after, the 64 KiB key


# --------------------------------------------------------------------------- async, concurrency


def test_async_concurrent_puts(client: Client, shared_server: ServerProcess, ns: str) -> None:
    client.create_table(ns, "t", ranges=4)
    n = 200

    async def scenario() -> None:
        async with AsyncClient(shared_server.service) as c:
            t = await c.table(ns, "t")
            results = await asyncio.gather(
                *(t.put(f"p{i % 10}", f"k{i:03d}", f"v{i}") for i in range(n))
            )
            assert results == [None] * n
            got = await asyncio.gather(*(t.get(f"p{i % 10}", f"k{i:03d}") for i in range(n)))
            for i, kv in enumerate(got):
                assert kv is not None and kv.value == f"v{i}".encode() and kv.version == 0
            # concurrent increments of one key are all applied
            await asyncio.gather(*(t.increment("counter", "c", 1) for _ in range(100)))
            assert await t.increment("counter", "c", 0, get_total=True) == 100
            kvs = [kv async for kv in t.scan("p3")]
            assert [kv.lkey for kv in kvs] == [f"k{i:03d}".encode() for i in range(3, n, 10)]

    asyncio.run(scenario())
    total = sum(client.table(ns, "t").count(f"p{i}") for i in range(10))
    assert total == n


# --------------------------------------------------------------------------- restart


def test_data_survives_restart(server: ServerProcess) -> None:
    with Client(server.service) as c:
        c.create_namespace("persist")
        info = c.create_table("persist", "t", ranges=4)
        t = c.table("persist", "t")
        for i in range(30):
            t.put(f"p{i % 3}", f"k{i:02d}", f"v{i}")
        t.put("p0", "k00", "updated")
        t.increment("n", "c", 41)
        t.delete("p1", "k01")
        t.txn("p2").then_put("tx", "in-txn").commit()
        before = t.get("p0", "k00")
        assert before is not None and before.version == 1

    assert server.stop() == 0
    server.start()

    with Client(server.service) as c:
        assert c.get_table("persist", "t") == info
        t = c.table("persist", "t")
        after = t.get("p0", "k00")
        assert after == before
        assert t.get("p1", "k01") is None
        assert t.count("p0") + t.count("p1") + t.count("p2") == 30 - 1 + 1
        tx = t.get("p2", "tx")
        assert tx is not None and tx.value == b"in-txn"
        assert [kv.lkey for kv in t.scan("p1")] == [
            f"k{i:02d}".encode() for i in range(30) if i % 3 == 1 and i != 1
        ]
        # versions and revisions continue
        t.put("p0", "k00", "after restart")
        again = t.get("p0", "k00")
        assert again is not None and again.version == 2
        assert again.create_revision == before.create_revision
        assert again.mod_revision > before.mod_revision
        assert t.increment("n", "c", 1, get_total=True) == 42
        with pytest.raises(NamespaceExistsError):
            c.create_namespace("persist")
        with pytest.raises(TableExistsError):
            c.create_table("persist", "t")
        # new tables get fresh ids
        assert c.create_table("persist", "t2").table_id != info.table_id
