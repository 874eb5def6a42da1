"""The unmodified `apache-bookkeeper-client` (import name `bookkeeper`) against a real server.

The module's tests share one server process (tests/support/server.py), or with
`TABLEKEEPER_TEST_CLUSTER=3` one 3-server cluster, each test talking to one of its servers only
(conftest.py): each test creates namespaces and tables of its own and checks the ids it is given
against those it was given before. Only `test_a_fresh_server_numbers_from_0_and_1024` and the
test that restarts a server with a failpoint get one of their own (and the authentication test
starts its own, with authentication on). Never import `tablekeeper`, `tablekeeper_proto` or
`tablekeeper_server` here: their generated protos register the same `bookkeeper.proto.*`
symbols as the client's (see tests/compat/__init__.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from bookkeeper import admin, kv
from bookkeeper.common import constants
from bookkeeper.common import exceptions as bk_errors
from bookkeeper.common.exceptions import (
    KeyNotFoundError,
    NamespaceNotFoundError,
    StreamNotFoundError,
)
from bookkeeper.proto import storage_pb2, stream_pb2
from bookkeeper.types import StorageClientSettings
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.compat.cluster import Server, running
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = pytest.mark.compat

DEFAULT_TABLE_CONF = constants.__DEFAULT_TABLE_CONF__
DEFAULT_STREAM_CONF = constants.__DEFAULT_STREAM_CONF__
KiB = 1024
MiB = 1024 * KiB
# Name characters BookKeeper rejects (ProtoUtils.validateStreamName): empty, NUL, space, '<', '>',
# and characters strictly inside (0x00,0x1f), (0x7f,0x9f), (0xd800,0xf8ff), (0xfff0,0xffff).
INVALID_NAMES = ["", "a b", "a<b", "a>b", "a\x00b", "a\x01b", "a\tb", "a\nb", "a\x1eb", "a\x85b"]
# BookKeeper's own rule; TableKeeper also refuses `/` in new names (it separates NAMESPACE/TABLE).
INVALID_NEW_NAMES = ["a/b"]
VALID_ODD_NAMES = ["with.dots-and_underscores", "a\x7fb", "\u00e9t\u00e9"]


# --------------------------------------------------------------------------------------------
# helpers


def settings(server: Server) -> StorageClientSettings:
    return StorageClientSettings(service_uri=server.service)


def admin_client(server: Server) -> Any:
    return admin.Client(settings(server))


def health_status(server: Server) -> int:
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30).status)


def requests_counted(server: ServerProcess, method: str, code: int) -> float:
    """The server's `tablekeeper_requests_total{method, code}` counter (0 if absent)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith("tablekeeper_requests_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if labels.get("method") == method and labels.get("code") == str(code):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_listening(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def own_name(request: pytest.FixtureRequest) -> str:
    """A table name of the test's own: its name without `test_` (valid in BookKeeper's rules)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name.removeprefix("test_"))


def default_namespace_table(server: Server, name: str) -> Any:
    """A table `name` with the client's default table conf in the kv client's default namespace
    ("public", created unless an earlier test of the module's server did)."""
    client = admin_client(server)
    with contextlib.suppress(bk_errors.NamespaceExistsError):
        client.namespaces().create("public")
    client.namespace("public").create(name)
    return kv.Client(settings(server)).table(name)


@pytest.fixture
def table(request: pytest.FixtureRequest, server: Server) -> Any:
    """A table of the test's own (named after it) in the kv client's default namespace."""
    return default_namespace_table(server, own_name(request))


# --------------------------------------------------------------------------------------------
# admin: namespaces


def test_a_fresh_server_numbers_from_0_and_1024(fresh_server: Server) -> None:
    """A new service's first namespace gets id 0 and its first table (stream) id 1024, as
    BookKeeper's root range numbers them; the other tests share a server and check only that
    ids follow each other."""
    client = admin_client(fresh_server)
    assert client.namespaces().create("first").namespace_id == 0
    assert client.namespaces().create("second").namespace_id == 1
    assert client.namespace("second").create("t").stream_id == 1024
    assert client.namespace("first").create("t").stream_id == 1025


def test_namespace_create_get_delete(server: Server) -> None:
    namespaces = admin_client(server).namespaces()
    created = [namespaces.create(name) for name in ("ns-a", "ns-b", "ns-c")]

    first = created[0].namespace_id
    assert [p.namespace_id for p in created] == [first, first + 1, first + 2]
    for props in created:
        assert namespaces.get(props.namespace_name) == props
    assert created[0].namespace_name == "ns-a"
    assert created[0].default_stream_conf == DEFAULT_STREAM_CONF  # copied from the request

    assert namespaces.delete("ns-b") is None
    with pytest.raises(bk_errors.NamespaceNotFoundError):
        namespaces.get("ns-b")
    assert namespaces.get("ns-a") == created[0]
    assert namespaces.get("ns-c") == created[2]

    # ids are never reused, also not for a re-created name
    again = namespaces.create("ns-b")
    assert again.namespace_id == first + 3
    assert namespaces.get("ns-b") == again

    custom = stream_pb2.NamespaceConfiguration(default_stream_conf=DEFAULT_TABLE_CONF)
    props = namespaces.create("ns-custom", custom)
    assert props.default_stream_conf == DEFAULT_TABLE_CONF
    assert namespaces.get("ns-custom") == props


@pytest.mark.on_grpc_aio("error statuses and their messages")
@pytest.mark.on_cluster("errors of the root range's calls, forwarded to its owner")
def test_namespace_errors(server: Server) -> None:
    namespaces = admin_client(server).namespaces()
    dup = namespaces.create("dup")
    with pytest.raises(bk_errors.NamespaceExistsError):
        namespaces.create("dup")
    assert namespaces.get("dup") == dup  # the failed create changed nothing

    with pytest.raises(bk_errors.NamespaceNotFoundError) as not_found:
        namespaces.get("missing")
    assert not_found.value.bk_status_code == storage_pb2.NAMESPACE_NOT_FOUND
    with pytest.raises(bk_errors.NamespaceNotFoundError):
        namespaces.delete("missing")

    for name in INVALID_NAMES:
        with pytest.raises(bk_errors.InvalidNamespaceNameError) as invalid:
            namespaces.create(name)
        assert invalid.value.bk_status_code == storage_pb2.INVALID_NAMESPACE_NAME, repr(name)
        with pytest.raises(bk_errors.InvalidNamespaceNameError):
            namespaces.get(name)

    for name in INVALID_NEW_NAMES:
        with pytest.raises(bk_errors.InvalidNamespaceNameError) as invalid:
            namespaces.create(name)
        assert invalid.value.bk_status_code == storage_pb2.INVALID_NAMESPACE_NAME, repr(name)

    for name in VALID_ODD_NAMES:
        assert namespaces.get(namespaces.create(name).namespace_name).namespace_name == name
    # rejected names used no ids
    assert namespaces.get(VALID_ODD_NAMES[-1]).namespace_id == dup.namespace_id + len(
        VALID_ODD_NAMES
    )


# --------------------------------------------------------------------------------------------
# admin: tables (streams)


@pytest.mark.on_cluster("one id counter for tables in every container")
def test_table_create_get_delete(server: Server) -> None:
    client = admin_client(server)
    client.namespaces().create("tables-ns1")
    client.namespaces().create("tables-ns2")
    ns1, ns2 = client.namespace("tables-ns1"), client.namespace("tables-ns2")

    t1 = ns1.create("t1")
    t2 = ns2.create("t2")
    t1_in_ns2 = ns2.create("t1")  # same name, other namespace: another table
    # stream ids (from 1024) come from one global counter
    first = t1.stream_id
    assert first >= 1024
    assert [t1.stream_id, t2.stream_id, t1_in_ns2.stream_id] == [first, first + 1, first + 2]
    assert t1.stream_name == "t1"
    assert t1.stream_conf == DEFAULT_TABLE_CONF  # stored verbatim
    assert ns1.get("t1") == t1
    assert ns2.get("t2") == t2
    assert ns2.get("t1") == t1_in_ns2

    assert ns1.delete("t1") is None
    with pytest.raises(bk_errors.StreamNotFoundError):
        ns1.get("t1")
    assert ns2.get("t1") == t1_in_ns2

    again = ns1.create("t1")
    assert again.stream_id == first + 3
    assert ns1.get("t1") == again

    one_range = stream_pb2.StreamConfiguration()
    one_range.CopyFrom(DEFAULT_TABLE_CONF)
    one_range.key_type = stream_pb2.HASH
    one_range.min_num_ranges = one_range.initial_num_ranges = 1
    one_range.ttl_seconds = 3600
    props = ns1.create("custom", one_range)
    assert props.stream_conf == one_range
    assert ns1.get("custom") == props


@pytest.mark.on_grpc_aio("error statuses and their messages")
@pytest.mark.on_cluster("errors of the root range's calls, forwarded to its owner")
def test_table_errors(server: Server) -> None:
    client = admin_client(server)
    client.namespaces().create("table-errors")
    ns = client.namespace("table-errors")
    created = ns.create("t")

    with pytest.raises(bk_errors.StreamExistsError):
        ns.create("t")
    assert ns.get("t") == created

    with pytest.raises(bk_errors.StreamNotFoundError) as not_found:
        ns.get("missing")
    assert not_found.value.bk_status_code == storage_pb2.STREAM_NOT_FOUND
    with pytest.raises(bk_errors.StreamNotFoundError):
        ns.delete("missing")

    for name in INVALID_NAMES:
        with pytest.raises(bk_errors.InvalidStreamNameError) as invalid:
            ns.create(name)
        assert invalid.value.bk_status_code == storage_pb2.INVALID_STREAM_NAME, repr(name)

    missing_ns = client.namespace("no-such-ns")
    with pytest.raises(bk_errors.NamespaceNotFoundError):
        missing_ns.create("t")
    with pytest.raises(bk_errors.NamespaceNotFoundError):
        missing_ns.get("t")
    with pytest.raises(bk_errors.NamespaceNotFoundError):
        missing_ns.delete("t")

    # the kv client resolves its table through GetStream
    with pytest.raises(bk_errors.NamespaceNotFoundError):
        kv.Client(settings(server), namespace="no-such-ns").table("t")
    with pytest.raises(bk_errors.StreamNotFoundError):
        kv.Client(settings(server), namespace="table-errors").table("missing")

    # failed creates used no ids
    assert ns.create("next").stream_id == created.stream_id + 1


# --------------------------------------------------------------------------------------------
# kv


@pytest.mark.on_grpc_aio("plain calls")
@pytest.mark.on_cluster("table calls forwarded to the container's owner")
def test_put_get(table: Any) -> None:
    assert table.get(b"missing") is None
    assert table.put(b"key", b"v0") is None

    first = table.get(b"key")
    assert first.key == b"key"
    assert first.value == b"v0"
    assert first.is_number is False
    assert first.version == 0
    assert first.create_revision > 0
    assert first.mod_revision == first.create_revision

    previous = first
    for i in range(1, 4):
        table.put(b"key", b"v%d" % i)
        kv_ = table.get(b"key")
        assert (kv_.value, kv_.version, kv_.is_number) == (b"v%d" % i, i, False)
        assert kv_.create_revision == first.create_revision
        assert kv_.mod_revision > previous.mod_revision
        previous = kv_

    table.put_str("sch\u00fcssel", "w\u00e9rt")
    kv_ = table.get_str("sch\u00fcssel")
    assert kv_.key == "sch\u00fcssel".encode()
    assert kv_.value.decode() == "w\u00e9rt"
    assert table.get(b"missing") is None


@pytest.mark.on_cluster("table calls forwarded to the container's owner")
def test_incr(table: Any) -> None:
    assert table.incr(b"n", 5) is None
    kv_ = table.get(b"n")
    assert kv_.is_number is True
    assert kv_.number_value == 5
    assert kv_.version == 0
    assert kv_.value == struct.pack(">q", 5)
    assert kv_.create_revision == kv_.mod_revision > 0

    table.incr(b"n", -7)
    kv2 = table.get(b"n")
    assert (kv2.number_value, kv2.version) == (-2, 1)
    assert kv2.create_revision == kv_.create_revision
    assert kv2.mod_revision > kv_.mod_revision
    table.incr_str("n", 0)
    assert (table.get_str("n").number_value, table.get_str("n").version) == (-2, 2)

    # 64-bit two's-complement wrap, like Java's long
    table.incr(b"big", 2**63 - 1)
    table.incr(b"big", 1)
    assert table.get(b"big").number_value == -(2**63)

    table.put(b"bytes", b"not a number")
    with pytest.raises(bk_errors.BadRequest) as incr_on_bytes:
        table.incr(b"bytes", 1)
    assert incr_on_bytes.value.bk_status_code == storage_pb2.BAD_REQUEST
    with pytest.raises(bk_errors.BadRequest) as put_on_number:
        table.put(b"n", b"x")
    assert put_on_number.value.bk_status_code == storage_pb2.BAD_REQUEST

    # the rejected operations changed nothing
    assert (table.get(b"bytes").value, table.get(b"bytes").version) == (b"not a number", 0)
    assert (table.get(b"n").number_value, table.get(b"n").version) == (-2, 2)


def test_delete(table: Any) -> None:
    table.put(b"k", b"v")
    table.put(b"k", b"v2")
    assert table.delete(b"k") == 1  # TableKeeper returns the real count (Java always says 0)
    assert table.get(b"k") is None
    assert table.delete(b"k") == 0
    assert table.delete(b"never-written") == 0

    table.incr(b"n", 3)
    assert table.delete_str("n") == 1
    assert table.get(b"n") is None

    # a key written again after a delete starts over
    table.put(b"k", b"again")
    kv_ = table.get(b"k")
    assert (kv_.value, kv_.version) == (b"again", 0)
    table.incr(b"n", 4)
    assert (table.get(b"n").number_value, table.get(b"n").version) == (4, 0)


@pytest.mark.on_cluster("keys routed by their hash")
def test_binary_keys_and_values(table: Any) -> None:
    pairs = {
        b"\x00": b"\x00",
        b"\x00\x00": b"",
        b"a": b"1",
        b"a\x00": b"2",
        b"a\x00b": b"3",
        b"\xff": b"\xff" * 3,
        b"\xff\xfe\x00\x01": bytes(range(256)),
        b"\x80\x81": b"\x00" * 10,
    }
    for key, value in pairs.items():
        table.put(key, value)
    for key, value in pairs.items():
        kv_ = table.get(key)
        assert (kv_.key, kv_.value, kv_.version) == (key, value, 0), key
    assert table.get(b"a\x00\x00") is None

    big = os.urandom(1 * MiB)
    table.put(b"big", big)
    assert table.get(b"big").value == big


@pytest.mark.on_grpc_aio("the largest messages the server takes")
@pytest.mark.on_cluster("the largest keys and values, forwarded")
def test_key_and_value_limits(server: Server, table: Any) -> None:
    empty_key_calls: list[Callable[[], object]] = [
        lambda: table.put(b"", b"v"),
        lambda: table.get(b""),
        lambda: table.incr(b"", 1),
        lambda: table.delete(b""),
    ]
    for call in empty_key_calls:
        with pytest.raises(bk_errors.InvalidKeyError) as empty:
            call()
        assert empty.value.bk_status_code == storage_pb2.INVALID_KEY == 6000

    # keys up to 64 KiB work (the client also sends the key as gRPC metadata)
    for size in (9 * KiB, 20 * KiB, 64 * KiB):
        key = b"k" * size
        table.put(key, b"v")
        assert table.get(key).value == b"v"
        table.incr(b"n" * size, 2)
        assert table.get(b"n" * size).number_value == 2
    too_long = b"k" * (64 * KiB + 1)
    long_key_calls: list[Callable[[], object]] = [
        lambda: table.put(too_long, b"v"),
        lambda: table.get(too_long),
        lambda: table.incr(too_long, 1),
    ]
    for call in long_key_calls:
        with pytest.raises(bk_errors.InvalidKeyError):
            call()

    # The client's channel receives at most 4 MiB per message, so the largest value it can read
    # back is a little under the server's 4 MiB value limit.
    readable = os.urandom(4 * MiB - 4 * KiB)
    table.put(b"v4", readable)
    assert table.get(b"v4").value == readable
    table.put(b"v4-max", b"m" * (4 * MiB))  # the limit itself is accepted
    with pytest.raises(bk_errors.BadRequest) as over:
        table.put(b"v4", readable + b"x" * (4 * KiB + 1))
    assert over.value.bk_status_code == storage_pb2.BAD_REQUEST
    assert table.get(b"v4").value == readable

    # far over: rejected by the server's gRPC message size limit, not retried
    started = time.monotonic()
    with pytest.raises(bk_errors.BKGrpcCallError) as huge:
        table.put(b"v10", b"x" * (10 * MiB))
    assert huge.value.grpc_status_code == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Not retried: a retried call would have gone on for the client's retry deadline (60 s).
    assert time.monotonic() - started < 60
    assert table.get(b"v10") is None

    # the server is still healthy and serving
    assert health_status(server) == health_pb2.HealthCheckResponse.SERVING
    assert running(server)
    table.put(b"after", b"ok")
    assert table.get(b"after").value == b"ok"


@pytest.mark.on_cluster("tables whose ranges live on different servers")
def test_tables_are_isolated(server: Server) -> None:
    client = admin_client(server)
    ns1, ns2 = "isolated-ns1", "isolated-ns2"
    for ns in (ns1, ns2):
        client.namespaces().create(ns)
    client.namespace(ns1).create("a")
    client.namespace(ns1).create("b")
    client.namespace(ns2).create("a")
    tables = {
        (ns1, "a"): kv.Client(settings(server), namespace=ns1).table("a"),
        (ns1, "b"): kv.Client(settings(server), namespace=ns1).table("b"),
        (ns2, "a"): kv.Client(settings(server), namespace=ns2).table("a"),
    }
    for i, ((ns, name), table) in enumerate(tables.items()):
        table.put(b"shared", f"{ns}/{name}".encode())
        table.incr(b"counter", 10**i)
    for i, ((ns, name), table) in enumerate(tables.items()):
        assert table.get(b"shared").value == f"{ns}/{name}".encode()
        assert table.get(b"shared").version == 0
        assert table.get(b"counter").number_value == 10**i

    tables[(ns1, "a")].put(b"only-here", b"x")
    assert tables[(ns1, "b")].get(b"only-here") is None
    assert tables[(ns2, "a")].get(b"only-here") is None

    tables[(ns1, "b")].delete(b"shared")
    assert tables[(ns1, "b")].get(b"shared") is None
    assert tables[(ns1, "a")].get(b"shared").value == f"{ns1}/a".encode()
    assert tables[(ns2, "a")].get(b"shared").value == f"{ns2}/a".encode()


@pytest.mark.standalone_only(reason="stops and restarts the server process")
def test_data_survives_graceful_restart(server: Server) -> None:
    assert isinstance(server, ServerProcess)  # the module's server: restarted in place
    client = admin_client(server)
    ns_props = client.namespaces().create("restart")
    t1_props = client.namespace("restart").create("t1")
    t2_props = client.namespace("restart").create("t2")
    t1 = kv.Client(settings(server), namespace="restart").table("t1")
    t2 = kv.Client(settings(server), namespace="restart").table("t2")
    blob = os.urandom(256 * KiB)
    t1.put(b"bytes", b"v0")
    t1.put(b"bytes", b"v1")
    t1.put(b"\x00bin", blob)
    t1.incr(b"n", 40)
    t1.incr(b"n", 2)
    t1.put(b"deleted", b"x")
    t1.delete(b"deleted")
    t2.put(b"bytes", b"other table")
    before = {key: t1.get(key) for key in (b"bytes", b"\x00bin", b"n")}

    assert server.stop() == 0
    server.start()

    client = admin_client(server)
    assert client.namespaces().get("restart") == ns_props
    assert client.namespace("restart").get("t1") == t1_props
    assert client.namespace("restart").get("t2") == t2_props
    fresh = kv.Client(settings(server), namespace="restart").table("t1")
    for key, kv_ in before.items():
        assert fresh.get(key) == kv_  # value, version and revisions all kept
    assert fresh.get(b"deleted") is None
    assert kv.Client(settings(server), namespace="restart").table("t2").get(b"bytes").value == (
        b"other table"
    )

    # the table handle from before the restart reconnects by itself
    t1.incr(b"n", 1)
    n = t1.get(b"n")
    assert (n.number_value, n.version) == (43, 2)
    assert n.mod_revision > before[b"n"].mod_revision
    # id counters continue after the restart
    assert client.namespaces().create("restart2").namespace_id == ns_props.namespace_id + 1
    assert client.namespace("restart").create("t3").stream_id == t2_props.stream_id + 1


# --------------------------------------------------------------------------------------------
# Pulsar Functions' Python runtime (state_context.py / contextimpl.py), reimplemented as it is


def new_bk_table_conf(num_ranges: int) -> Any:
    """`state_context.new_bk_table_conf`."""
    return stream_pb2.StreamConfiguration(
        key_type=stream_pb2.HASH,
        min_num_ranges=num_ranges,
        initial_num_ranges=num_ranges,
        split_policy=stream_pb2.SplitPolicy(
            type=stream_pb2.FIXED,
            fixed_range_policy=stream_pb2.FixedRangeSplitPolicy(num_ranges=2),
        ),
        rolling_policy=stream_pb2.SegmentRollingPolicy(
            size_policy=stream_pb2.SizeBasedSegmentRollingPolicy(max_segment_size=128 * MiB)
        ),
        retention_policy=stream_pb2.RetentionPolicy(
            time_policy=stream_pb2.TimeBasedRetentionPolicy(retention_minutes=-1)
        ),
        storage_type=stream_pb2.TABLE,
    )


class BKManagedStateContext:
    """`state_context.BKManagedStateContext`, call for call."""

    def __init__(self, state_storage_serviceurl: str, table_ns: str, table_name: str) -> None:
        client_settings = StorageClientSettings(service_uri=state_storage_serviceurl)
        admin_client = admin.client.Client(storage_client_settings=client_settings)
        ns = admin_client.namespace(table_ns)
        try:
            ns.get(stream_name=table_name)
        except NamespaceNotFoundError:
            admin_client.namespaces().create(namespace=table_ns)
            ns.create(stream_name=table_name, stream_config=new_bk_table_conf(1))
        except StreamNotFoundError:
            ns.create(stream_name=table_name, stream_config=new_bk_table_conf(1))
        self.client = kv.Client(storage_client_settings=client_settings, namespace=table_ns)
        self.table = self.client.table(table_name=table_name)

    def incr(self, key: str, amount: int) -> None:
        return self.table.incr_str(key, amount)  # type: ignore[no-any-return]

    def get_amount(self, key: str) -> int | None:
        try:
            kv_ = self.table.get_str(key)
            return None if kv_ is None else int(kv_.number_value)
        except KeyNotFoundError:
            return None

    def get_value(self, key: str) -> bytes | None:
        try:
            kv_ = self.table.get_str(key)
            return None if kv_ is None else bytes(kv_.value)
        except KeyNotFoundError:
            return None

    def put(self, key: str, value: str) -> None:
        return self.table.put_str(key, value)  # type: ignore[no-any-return]


class FunctionContext:
    """The state part of `contextimpl.ContextImpl`."""

    def __init__(self, service_url: str, tenant: str, namespace: str, name: str) -> None:
        table_ns = f"{tenant}_{namespace}".replace("-", "_")
        self.state_context = BKManagedStateContext(service_url, table_ns, name)

    def incr_counter(self, key: str, amount: int) -> None:
        return self.state_context.incr(key, amount)

    def get_counter(self, key: str) -> int | None:
        return self.state_context.get_amount(key)

    def put_state(self, key: str, value: str) -> None:
        return self.state_context.put(key, value)

    def get_state(self, key: str) -> bytes | None:
        return self.state_context.get_value(key)


def test_pulsar_functions_state_flow(server: Server) -> None:
    # first start: neither namespace nor table exists; the runtime creates both
    ctx = FunctionContext(server.service, "public", "default", "word-count")
    client = admin_client(server)
    ns_props = client.namespaces().get("public_default")
    table_props = client.namespace("public_default").get("word-count")
    assert table_props.stream_conf == new_bk_table_conf(1)

    assert ctx.get_counter("hello") is None
    assert ctx.get_state("last") is None
    ctx.incr_counter("hello", 1)
    ctx.incr_counter("hello", 2)
    assert ctx.get_counter("hello") == 3
    ctx.put_state("last", "hello")
    ctx.put_state("last", "w\u00f6rld")
    assert ctx.get_state("last") == "w\u00f6rld".encode()

    # restart of the function: the table is found, nothing is created, the state is there
    again = FunctionContext(server.service, "public", "default", "word-count")
    assert client.namespaces().get("public_default") == ns_props
    assert client.namespace("public_default").get("word-count") == table_props
    assert again.get_counter("hello") == 3
    assert again.get_state("last") == "w\u00f6rld".encode()

    # another function of the same namespace: StreamNotFoundError path, its own table
    other = FunctionContext(server.service, "public", "default", "other-fn")
    other_props = client.namespace("public_default").get("other-fn")
    assert other_props.stream_id == table_props.stream_id + 1
    assert other_props.stream_conf == new_bk_table_conf(1)
    assert other.get_counter("hello") is None
    other.incr_counter("hello", 100)
    assert ctx.get_counter("hello") == 3


@pytest.mark.on_grpc_aio("concurrent calls on one channel")
@pytest.mark.on_cluster("concurrent increments, forwarded")
def test_pulsar_functions_concurrent_instances(server: Server) -> None:
    instances = [FunctionContext(server.service, "my-tenant", "my-ns", "counter") for _ in range(2)]
    rounds = 150
    barrier = threading.Barrier(len(instances))

    def run(index: int, ctx: FunctionContext) -> None:
        barrier.wait()
        for i in range(rounds):
            ctx.incr_counter("total", 1)
            ctx.incr_counter(f"per-instance-{index}", i)
            ctx.put_state(f"last-{index}", str(i))

    with ThreadPoolExecutor(len(instances)) as pool:
        for future in [pool.submit(run, i, ctx) for i, ctx in enumerate(instances)]:
            future.result(timeout=60)

    for ctx in instances:
        assert ctx.get_counter("total") == rounds * len(instances)
        for index in range(len(instances)):
            assert ctx.get_counter(f"per-instance-{index}") == sum(range(rounds))
            assert ctx.get_state(f"last-{index}") == str(rounds - 1).encode()
    # every increment was applied once: version 0 for the first, +1 for each later one
    assert instances[0].state_context.table.get_str("total").version == rounds * 2 - 1


# --------------------------------------------------------------------------------------------
# retries


@pytest.mark.on_grpc_aio("what a starting server answers")
@pytest.mark.standalone_only(reason="restarts a standalone server held at a failpoint")
def test_request_during_restart_is_retried_until_served(
    fresh_server: Server, tmp_path: Path
) -> None:
    """A put sent while the server restarts completes once the server is ready.

    The client retries only gRPC NOT_FOUND and 500s; a refused connection (UNAVAILABLE) fails at
    once. So the server listens before it recovers and answers NOT_FOUND until it is ready. The
    restarted server is held before recovery (a failpoint) until the put has been answered
    NOT_FOUND at least once, so the put certainly arrives during recovery, on any machine.
    """
    server = fresh_server  # restarted with a failpoint: a server of its own
    assert isinstance(server, ServerProcess)
    table = default_namespace_table(server, "t")
    table.put(b"before", b"1")

    assert server.stop() == 0
    release = tmp_path / "release-recovery"
    server.env = {"TABLEKEEPER_FAILPOINTS": f"server.before_recovery=wait:{release}"}
    # No health polling while it starts: a poll on a refused port would put the (shared)
    # connection to this address into reconnect backoff.
    server.launch()
    wait_listening(server.port, timeout_s=120)  # set-up: a busy machine starts slowly

    def metrics_answer() -> bool:
        try:
            requests_counted(server, "Put", -404)
        except OSError:
            return False
        return True

    with ThreadPoolExecutor(1) as pool:
        server.wait_for(metrics_answer, "metrics endpoint")
        put = pool.submit(table.put, b"during", b"2")
        server.wait_for(
            lambda: requests_counted(server, "Put", -404) >= 1, "put answered NOT_FOUND"
        )
        assert not put.done()
        assert health_status(server) != health_pb2.HealthCheckResponse.SERVING
        release.touch()
        put.result(timeout=60)

    server.wait_serving(30)
    assert requests_counted(server, "Put", 0) == 1
    assert table.get(b"during").value == b"2"
    assert table.get(b"before").value == b"1"


# --------------------------------------------------------------------------------------------
# authentication


_AS_ADMIN = """
import sys
from tablekeeper import Client
service, token = sys.argv[1], sys.argv[2]
with Client(service, token=token) as client:
    for namespace in ("public", "private"):
        client.create_namespace(namespace)
        client.create_table(namespace, "state", ranges=2)
    client.grant("public", "fn", ["read", "write"])
"""


@pytest.mark.on_grpc_aio("credentials in the call's metadata")
@pytest.mark.standalone_only(reason="starts servers of its own with authentication on")
def test_bookkeeper_client_through_the_anonymous_role(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """The BookKeeper client sends no token: with authentication on it works through
    --anonymous-role on what was granted to that role (PERMISSION_DENIED elsewhere), and is
    refused (UNAUTHENTICATED, not retried) by a server without one."""
    import subprocess
    import sys

    from tablekeeper_server.security.tokens import create_token  # no protos: safe in compat

    secret = tmp_path / "secret.key"
    secret.write_text("s" * 48)
    auth = ["--auth-secret-key", str(secret), "--superuser-roles", "admin"]
    open_server = ServerProcess(tmp_path / "open", extra_args=[*auth, "--anonymous-role", "fn"])
    server_factory.append(open_server)
    open_server.start()
    token = create_token(secret.read_bytes().strip(), "admin")
    subprocess.run(
        [sys.executable, "-c", _AS_ADMIN, open_server.service, token], check=True, timeout=60
    )
    table = kv.Client(settings(open_server), namespace="public").table("state")
    table.put_str("k", "v")
    assert table.get_str("k").value == b"v"
    with pytest.raises(bk_errors.BKGrpcCallError) as denied:
        kv.Client(settings(open_server), namespace="private").table("state").put_str("k", "v")
    assert denied.value.grpc_status_code == grpc.StatusCode.PERMISSION_DENIED

    closed_server = ServerProcess(tmp_path / "closed", extra_args=auth)
    server_factory.append(closed_server)
    closed_server.start()
    with pytest.raises(bk_errors.BKGrpcCallError) as refused:
        admin_client(closed_server).namespaces().create("public")
    assert refused.value.grpc_status_code == grpc.StatusCode.UNAUTHENTICATED


# --------------------------------------------------------------------------------------------
# a range split while the client writes


@pytest.mark.on_cluster("a split while writers' calls are forwarded")
def test_writes_go_on_through_a_range_split(request: pytest.FixtureRequest, server: Server) -> None:
    """Writers keep putting and incrementing while `tablekeeper table split` splits a range of
    their table: the client's requests to the sealed range are answered NOT_FOUND (retried), the
    server routes the retries (which still name the old range) to the children, and afterwards
    every acknowledged write is there."""
    name = own_name(request)
    table = default_namespace_table(server, name)
    acked: dict[bytes, int] = {}
    attempted: dict[bytes, int] = {}
    counted = {"acked": 0, "attempted": 0}
    done = threading.Event()
    progress = threading.Condition()
    ops = [0]

    def writer(w: int) -> None:
        n = 0
        while not done.is_set():
            key = f"w{w}-{n % 40}".encode()
            attempted[key] = n
            table.put(key, str(n).encode())
            acked[key] = n
            counted["attempted"] += 1
            table.incr(f"c{w}".encode(), 1)
            counted["acked"] += 1
            with progress:
                ops[0] += 1
                progress.notify_all()
            n += 1

    def until(more: int) -> None:
        with progress:
            target = ops[0] + more
            assert progress.wait_for(lambda: ops[0] >= target, timeout=120)

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(writer, w) for w in range(3)]
        until(150)
        split = subprocess.run(
            [str(SERVER_COMMAND), "--service", server.service, "table", "split"]
            + [f"public/{name}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert split.returncode == 0, split.stderr
        until(150)
        done.set()
        for future in futures:
            future.result(timeout=120)

    assert "split range" in split.stdout
    for key, n in acked.items():
        assert n <= int(table.get(key).value) <= attempted[key], key
    total = sum(table.get(f"c{w}".encode()).number_value for w in range(3))
    assert counted["acked"] <= total <= counted["attempted"]
