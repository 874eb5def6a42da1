"""Whole-range scans (`RangeStateMachine.scan_range`) and increments inside a txn."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.v1 import tablekeeper_pb2 as tk
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import split_store_key, store_key
from tablekeeper_server.errors import Code
from tablekeeper_server.range import validation
from tablekeeper_server.range.bookkeeper_reads import SCAN_ROWS_MAX
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000
Compare = kv.Compare


def _header(pkey: bytes) -> kv.RoutingHeader:
    return kv.RoutingHeader(stream_id=1024, r_key=pkey)


class Machine:
    def __init__(self, ttl_seconds: int = 0) -> None:
        self.sm = RangeStateMachine(MemoryKvStore(), APPLIERS, ttl_seconds=ttl_seconds)
        self.sequence = 0

    def apply(self, command: wal_pb2.WalCommand, now: int = NOW) -> object:
        command.timestamp_ms = now
        self.sequence += 1
        return self.sm.apply_batch([(self.sequence, command)])[0]

    def put(self, pkey: bytes, lkey: bytes, value: bytes = b"v", now: int = NOW) -> None:
        self.apply(
            wal_pb2.WalCommand(put=kv.PutRequest(key=lkey, value=value, header=_header(pkey))),
            now,
        )

    def scan(self, **fields: object) -> tk.ScanRangeResponse:
        return self.sm.scan_range(tk.ScanRangeRequest(**fields), NOW)  # type: ignore[arg-type]

    def scan_all(self, page: int) -> list[tuple[bytes, bytes, bytes]]:
        rows: list[tuple[bytes, bytes, bytes]] = []
        cursor: tk.KeyCursor | None = None
        while True:
            response = self.scan(limit=page, start_after=cursor)
            rows += [(r.pkey, r.kv.key, r.kv.value) for r in response.rows]
            if not response.more:
                return rows
            cursor = tk.KeyCursor(pkey=rows[-1][0], lkey=rows[-1][1])


def test_split_store_key_inverts_store_key() -> None:
    for pkey, lkey in [(b"p", b"k"), (b"", b"k"), (b"a\x00b", b"\x00"), (b"\xff" * 9, b"\xff")]:
        assert split_store_key(store_key(pkey, lkey)) == (pkey, lkey)
    with pytest.raises(ValueError):
        split_store_key(b"\xffapplied")


def test_scan_range_lists_every_pkey_in_pages_and_skips_bookkeeping() -> None:
    m = Machine()
    expected = []
    for p in range(30):
        for k in range(7):
            pkey, lkey = f"pk{p}".encode(), f"k{k}".encode()
            m.put(pkey, lkey, pkey + lkey)
            expected.append((pkey, lkey, pkey + lkey))
    m.put(b"", b"no-pkey", b"x")  # BookKeeper-style key with an empty pkey
    expected.append((b"", b"no-pkey", b"x"))
    for page in (1, 7, 50, 1000):
        rows = m.scan_all(page)
        assert sorted(rows) == sorted(expected)
        assert len(set(rows)) == len(rows)
    one = m.scan(limit=3)
    assert len(one.rows) == 3 and one.more
    assert one.rows[0].kv.version == 0 and one.rows[0].kv.create_revision > 0


def test_scan_range_keys_only_numbers_and_server_page_cap() -> None:
    m = Machine()
    m.apply(
        wal_pb2.WalCommand(increment=kv.IncrementRequest(key=b"n", amount=5, header=_header(b"p")))
    )
    m.put(b"p", b"b", b"bytes")
    response = m.scan(keys_only=True)
    by_key = {r.kv.key: r.kv for r in response.rows}
    assert by_key[b"n"].is_number and by_key[b"n"].number_value == 5
    assert by_key[b"b"].value == b""  # keys_only
    assert not response.more
    assert SCAN_ROWS_MAX >= 1000


def test_scan_range_hides_expired_keys() -> None:
    m = Machine(ttl_seconds=10)
    m.put(b"old", b"k", now=NOW - 20_000)
    m.put(b"new", b"k", now=NOW)
    assert [(r.pkey, r.kv.key) for r in m.scan().rows] == [(b"new", b"k")]


def test_txn_increment_with_marker_applies_once() -> None:
    """The connector's effectively-once protocol: increments and a marker in one txn, applied
    only while the marker is absent (or older)."""
    m = Machine()

    def once(batch: int) -> kv.TxnResponse:
        marker_value = batch.to_bytes(8, "big")
        previous = (batch - 1).to_bytes(8, "big") if batch else b""
        request = kv.TxnRequest(header=_header(b"p"))
        request.compare.add(
            key=b"\xffm", target=Compare.VALUE, result=Compare.GREATER, value=previous
        )
        for lkey, amount in [(b"a", 2), (b"b", 3), (b"a", 1)]:
            request.failure.add().request_increment.CopyFrom(
                kv.IncrementRequest(key=lkey, amount=amount)
            )
        request.failure.add().request_put.CopyFrom(kv.PutRequest(key=b"\xffm", value=marker_value))
        validation.check_txn(request, Limits())
        response = m.apply(wal_pb2.WalCommand(txn=request))
        assert isinstance(response, kv.TxnResponse)
        assert response.header.code == Code.SUCCESS
        return response

    def number(lkey: bytes) -> int:
        kvs = m.sm.read(kv.RangeRequest(key=lkey, header=_header(b"p")), NOW).kvs
        return kvs[0].number_value

    first = once(0)
    assert not first.succeeded  # the marker was absent: the increments ran
    assert first.responses[0].WhichOneof("response") == "response_increment"
    assert (number(b"a"), number(b"b")) == (3, 3)
    assert once(0).succeeded  # replay of batch 0: skipped
    assert (number(b"a"), number(b"b")) == (3, 3)
    assert not once(1).succeeded
    assert (number(b"a"), number(b"b")) == (6, 6)
    assert once(0).succeeded and once(1).succeeded  # an older batch never applies again
    assert (number(b"a"), number(b"b")) == (6, 6)


def test_txn_increment_on_a_bytes_key_fails_alone() -> None:
    m = Machine()
    m.put(b"p", b"s", b"bytes")
    request = kv.TxnRequest(header=_header(b"p"))
    request.success.add().request_increment.CopyFrom(kv.IncrementRequest(key=b"s", amount=1))
    response = m.apply(wal_pb2.WalCommand(txn=request))
    assert isinstance(response, kv.TxnResponse)
    assert response.responses[0].response_increment.header.code == Code.BAD_REQUEST
    with pytest.raises(Exception, match="empty"):
        bad = kv.TxnRequest()
        bad.success.add().request_increment.CopyFrom(kv.IncrementRequest(key=b"", amount=1))
        validation.check_txn(bad, Limits())
