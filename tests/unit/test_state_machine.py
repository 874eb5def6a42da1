"""The range state machine: BookKeeper's semantics (bugs fixed) and deterministic replay."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.errors import Code
from tablekeeper_server.range.apply import Response
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000
Compare = kv.Compare


def header(pkey: bytes = b"p") -> kv.RoutingHeader:
    return kv.RoutingHeader(stream_id=1024, r_key=pkey)


def put(key: bytes, value: bytes = b"v", pkey: bytes = b"p", **kw: object) -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(put=kv.PutRequest(key=key, value=value, header=header(pkey), **kw))  # type: ignore[arg-type]


def incr(key: bytes, amount: int, pkey: bytes = b"p", total: bool = True) -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(
        increment=kv.IncrementRequest(key=key, amount=amount, header=header(pkey), get_total=total)
    )


def delete(
    key: bytes, end: bytes = b"", pkey: bytes = b"p", prev: bool = False
) -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(
        delete_range=kv.DeleteRangeRequest(
            key=key, range_end=end, header=header(pkey), prev_kv=prev
        )
    )


def txn(
    compares: list[Compare], success: list[kv.RequestOp], failure: Sequence[kv.RequestOp] = ()
) -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(
        txn=kv.TxnRequest(compare=compares, success=success, failure=failure, header=header())
    )


class Machine:
    """A state machine plus the log it has applied, so tests can replay it."""

    def __init__(self, ttl_seconds: int = 0) -> None:
        self.ttl_seconds = ttl_seconds
        self.sm = RangeStateMachine(MemoryKvStore(), APPLIERS, ttl_seconds=ttl_seconds)
        self.log: list[tuple[int, wal_pb2.WalCommand]] = []

    def apply(self, *commands: wal_pb2.WalCommand, now: int = NOW) -> list[Response]:
        batch = []
        for command in commands:
            command.timestamp_ms = now
            batch.append((len(self.log) + 1, command))
            self.log.append(batch[-1])
        return self.sm.apply_batch(batch)

    def one(self, command: wal_pb2.WalCommand, now: int = NOW) -> Response:
        return self.apply(command, now=now)[0]

    def get(self, key: bytes, pkey: bytes = b"p", now: int = NOW) -> kv.RangeResponse:
        return self.sm.read(kv.RangeRequest(key=key, header=header(pkey)), now)

    def scan(
        self, start: bytes = b"", end: bytes = b"\x00", pkey: bytes = b"p", **kw: object
    ) -> kv.RangeResponse:
        request = kv.RangeRequest(key=start, range_end=end, header=header(pkey), **kw)  # type: ignore[arg-type]
        return self.sm.read(request, NOW)

    def dump(self) -> list[tuple[bytes, bytes]]:
        return list(self.sm.store.scan(b"", b"\xff\xff"))


def test_put_versions_and_revisions() -> None:
    m = Machine()
    m.one(put(b"a", b"1"))
    m.one(put(b"a", b"2"))
    r = m.one(put(b"a", b"3", prev_kv=True))
    assert isinstance(r, kv.PutResponse)
    assert r.prev_kv.value == b"2" and r.prev_kv.version == 1
    got = m.get(b"a").kvs[0]
    assert (got.value, got.version, got.create_revision, got.mod_revision) == (b"3", 2, 1, 3)
    assert not got.is_number


def test_expected_version_is_honoured() -> None:
    m = Machine()
    assert m.one(put(b"a", expected_version=-1)).header.code == Code.SUCCESS
    assert m.one(put(b"a", expected_version=-1)).header.code == Code.KEY_EXISTS
    assert m.one(put(b"a", expected_version=1)).header.code == Code.BAD_VERSION
    assert m.one(put(b"a", expected_version=0)).header.code == Code.SUCCESS
    assert m.one(put(b"missing", expected_version=0)).header.code == Code.KEY_NOT_FOUND
    assert m.get(b"a").kvs[0].version == 1
    assert m.get(b"missing").count == 0


def test_increment_creates_adds_and_wraps() -> None:
    m = Machine()
    r = m.one(incr(b"c", 5))
    assert isinstance(r, kv.IncrementResponse) and r.total_amount == 5
    assert m.one(incr(b"c", -7)).total_amount == -2  # type: ignore[attr-defined]
    got = m.get(b"c").kvs[0]
    assert got.is_number and got.number_value == -2 and got.version == 1
    assert got.value == (-2).to_bytes(8, "big", signed=True)
    m.one(incr(b"w", 2**63 - 1))
    assert m.one(incr(b"w", 1)).total_amount == -(2**63)  # type: ignore[attr-defined]
    assert m.one(incr(b"c", 1, total=False)).total_amount == 0  # type: ignore[attr-defined]


def test_number_and_bytes_keys_do_not_mix() -> None:
    m = Machine()
    m.one(put(b"b", b"x"))
    m.one(incr(b"n", 1))
    assert m.one(incr(b"b", 1)).header.code == Code.BAD_REQUEST
    assert m.one(put(b"n", b"x")).header.code == Code.BAD_REQUEST
    assert m.get(b"n").kvs[0].number_value == 1
    assert m.get(b"b").kvs[0].value == b"x"


def test_delete_counts_for_real_and_stays_in_its_pkey() -> None:
    m = Machine()
    m.apply(*(put(bytes([c])) for c in b"abcde"), put(b"a", pkey=b"q"), put(b"a", pkey=b"p\x00"))
    r = m.one(delete(b"b", b"d", prev=True))
    assert isinstance(r, kv.DeleteRangeResponse)
    assert r.deleted == 3 and [kv_.key for kv_ in r.prev_kvs] == [b"b", b"c", b"d"]
    assert m.one(delete(b"zz")).deleted == 0  # type: ignore[attr-defined]
    assert m.one(delete(b"a")).deleted == 1  # type: ignore[attr-defined]
    assert m.one(delete(b"", b"\x00")).deleted == 1  # type: ignore[attr-defined]
    assert m.get(b"a", pkey=b"q").count == 1
    assert m.get(b"a", pkey=b"p\x00").count == 1


def test_scan_limit_more_count_keys_only_and_filters() -> None:
    m = Machine()
    m.apply(*(put(b"k%02d" % i, b"v%d" % i) for i in range(10)))
    page = m.scan(limit=4)
    assert [x.key for x in page.kvs] == [b"k00", b"k01", b"k02", b"k03"] and page.more
    assert page.count == 4
    last = m.scan(start=b"k08", limit=4)
    assert [x.key for x in last.kvs] == [b"k08", b"k09"] and not last.more
    inclusive = m.scan(start=b"k02", end=b"k04")
    assert [x.key for x in inclusive.kvs] == [b"k02", b"k03", b"k04"]
    counted = m.scan(count_only=True)
    assert counted.count == 10 and not counted.kvs
    keys = m.scan(keys_only=True, limit=1)
    assert keys.kvs[0].key == b"k00" and keys.kvs[0].value == b""
    recent = m.scan(min_mod_revision=8)
    assert [x.key for x in recent.kvs] == [b"k07", b"k08", b"k09"]
    old = m.scan(max_create_revision=2)
    assert [x.key for x in old.kvs] == [b"k00", b"k01"]


def test_txn_compares_branches_and_one_revision() -> None:
    m = Machine()
    m.one(put(b"a", b"1"))
    op_put_b = kv.RequestOp(request_put=kv.PutRequest(key=b"b", value=b"2"))
    op_put_c = kv.RequestOp(request_put=kv.PutRequest(key=b"c", value=b"3"))
    op_get_a = kv.RequestOp(request_range=kv.RangeRequest(key=b"a"))
    version_is_0 = Compare(target=Compare.VERSION, result=Compare.EQUAL, key=b"a", version=0)
    r = m.one(txn([version_is_0], [op_put_b, op_put_c, op_get_a]))
    assert isinstance(r, kv.TxnResponse) and r.succeeded
    assert r.responses[2].response_range.kvs[0].value == b"1"
    b, c = m.get(b"b").kvs[0], m.get(b"c").kvs[0]
    assert b.mod_revision == c.mod_revision == 2  # one revision for the whole txn
    version_is_5 = Compare(target=Compare.VERSION, result=Compare.EQUAL, key=b"a", version=5)
    r = m.one(txn([version_is_5], [op_put_b], [op_get_a]))
    assert not r.succeeded and len(r.responses) == 1  # type: ignore[attr-defined]
    assert m.get(b"b").kvs[0].version == 0


def test_txn_ops_see_the_state_before_the_txn() -> None:
    m = Machine()
    m.one(put(b"a", b"old"))
    r = m.one(
        txn(
            [],
            [
                kv.RequestOp(request_put=kv.PutRequest(key=b"a", value=b"new")),
                kv.RequestOp(request_range=kv.RangeRequest(key=b"a")),
                kv.RequestOp(request_range=kv.RangeRequest(key=b"", range_end=b"\x00")),
            ],
        )
    )
    assert r.responses[1].response_range.kvs[0].value == b"old"  # type: ignore[attr-defined]
    assert [x.value for x in r.responses[2].response_range.kvs] == [b"old"]  # type: ignore[attr-defined]
    assert m.get(b"a").kvs[0].value == b"new"


def test_txn_value_compares_and_missing_keys() -> None:
    m = Machine()
    absent = Compare(target=Compare.VALUE, result=Compare.EQUAL, key=b"x", value=b"")
    create_x = kv.RequestOp(request_put=kv.PutRequest(key=b"x", value=b"m"))
    assert m.one(txn([absent], [create_x])).succeeded  # type: ignore[attr-defined]
    assert not m.one(txn([absent], [create_x])).succeeded  # type: ignore[attr-defined]
    greater = Compare(target=Compare.VALUE, result=Compare.GREATER, key=b"x", value=b"a")
    less = Compare(target=Compare.VALUE, result=Compare.LESS, key=b"x", value=b"\xff")
    assert m.one(txn([greater, less], [])).succeeded  # type: ignore[attr-defined]
    missing_version = Compare(target=Compare.VERSION, result=Compare.EQUAL, key=b"nope", version=0)
    r = m.one(txn([missing_version], [create_x]))
    assert r.header.code == Code.KEY_NOT_FOUND and not r.succeeded  # type: ignore[attr-defined]


def test_a_failing_op_fails_the_whole_txn_and_applies_nothing() -> None:
    """Issue 17, defect 2 (this test asserted the non-atomic behaviour before): a txn applies
    all of its chosen branch or nothing, and names the op that failed."""
    m = Machine()
    m.one(incr(b"n", 1))
    r = m.one(
        txn(
            [],
            [
                kv.RequestOp(request_put=kv.PutRequest(key=b"ok", value=b"y")),
                kv.RequestOp(request_put=kv.PutRequest(key=b"n", value=b"x")),
                kv.RequestOp(request_put=kv.PutRequest(key=b"later", value=b"z")),
            ],
        )
    )
    assert isinstance(r, kv.TxnResponse)
    assert r.header.code == Code.BAD_REQUEST and r.succeeded
    assert len(r.responses) == 2  # ends with the failing op, at its position
    assert r.responses[1].response_put.header.code == Code.BAD_REQUEST
    assert r.responses[0].HasField("response_put")
    assert m.get(b"ok").count == 0 and m.get(b"later").count == 0
    assert m.get(b"n").kvs[0].number_value == 1


def test_ttl_hides_expired_keys_and_recreates_them_fresh() -> None:
    m = Machine(ttl_seconds=10)
    m.one(put(b"a", b"1"), now=NOW)
    m.one(put(b"a", b"2"), now=NOW + 1000)
    assert m.get(b"a", now=NOW + 5000).kvs[0].version == 1
    assert m.get(b"a", now=NOW + 11_000).count == 0
    assert m.scan().count == 1  # reads at NOW
    later = NOW + 20_000
    assert m.sm.read(kv.RangeRequest(key=b"", range_end=b"\x00", header=header()), later).count == 0
    m.one(put(b"a", b"3"), now=later)
    got = m.get(b"a", now=later).kvs[0]
    assert got.version == 0 and got.value == b"3"
    assert m.one(delete(b"a"), now=later + 11_000).deleted == 0  # type: ignore[attr-defined]


def test_replay_is_idempotent_and_deterministic() -> None:
    rng = random.Random(7)
    m = Machine()
    for _ in range(300):
        key = b"k%d" % rng.randrange(20)
        choice = rng.randrange(5)
        if choice == 0:
            m.one(put(key, b"%d" % rng.randrange(1000)))
        elif choice == 1:
            m.one(incr(b"n" + key, rng.randrange(-5, 6)))
        elif choice == 2:
            m.one(delete(key, key + b"\xff"))
        elif choice == 3:
            cmp = Compare(target=Compare.VERSION, result=Compare.GREATER, key=key, version=1)
            m.one(txn([cmp], [kv.RequestOp(request_put=kv.PutRequest(key=key + b"t", value=b"x"))]))
        else:
            m.apply(put(key, b"batched"), incr(b"n" + key, 1), delete(key))
    expected = m.dump()

    # Replaying the whole log in arbitrary batches yields byte-identical state.
    replayed = RangeStateMachine(MemoryKvStore(), APPLIERS)
    log = list(m.log)
    while log:
        n = rng.randrange(1, 40)
        replayed.apply_batch(log[:n])
        log = log[n:]
    assert list(replayed.store.scan(b"", b"\xff\xff")) == expected

    # Re-applying records at or below the applied position changes nothing.
    replayed.apply_batch(m.log[:50])
    assert list(replayed.store.scan(b"", b"\xff\xff")) == expected
    assert replayed.applied_sequence == len(m.log)


def test_applied_position_survives_reopen() -> None:
    store = MemoryKvStore()
    sm = RangeStateMachine(store, APPLIERS)
    sm.apply_batch([(1, put(b"a")), (2, put(b"b"))])
    assert RangeStateMachine(store, APPLIERS).applied_sequence == 2
