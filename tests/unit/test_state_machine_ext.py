"""TableKeeper's state-machine extensions: CAS delete, per-key TTL, sequential keys, change
events and their bounded durable history."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.v1 import session_pb2, wal_pb2
from tablekeeper_server.core.keys import store_key
from tablekeeper_server.errors import BadRequestError as ServerBadRequest
from tablekeeper_server.errors import Code, InvalidKeyError
from tablekeeper_server.range import validation
from tablekeeper_server.range.events import EventHistory, iter_history
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS
from tests.unit.test_state_machine import NOW, Machine, delete, header, incr, put, txn

pytestmark = pytest.mark.unit


def cas_delete(key: bytes, version: int, pkey: bytes = b"p") -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(
        delete_range=kv.DeleteRangeRequest(key=key, header=header(pkey), expected_version=version)
    )


def test_cas_delete() -> None:
    m = Machine()
    m.one(put(b"a"))
    m.one(put(b"a"))  # version 1
    assert m.one(cas_delete(b"a", 0)).header.code == Code.BAD_VERSION
    assert m.one(cas_delete(b"missing", 0)).header.code == Code.KEY_NOT_FOUND
    assert m.get(b"a").count == 1
    r = m.one(cas_delete(b"a", 1))
    assert r.header.code == Code.SUCCESS and isinstance(r, kv.DeleteRangeResponse)
    assert r.deleted == 1
    assert m.get(b"a").count == 0
    assert m.one(cas_delete(b"a", 1)).header.code == Code.KEY_NOT_FOUND


def test_cas_delete_validation() -> None:
    limits = Limits()
    with pytest.raises(ServerBadRequest):
        validation.check_delete(
            kv.DeleteRangeRequest(key=b"a", range_end=b"z", expected_version=0), limits
        )
    with pytest.raises(ServerBadRequest):
        validation.check_delete(kv.DeleteRangeRequest(key=b"a", expected_version=-1), limits)
    with pytest.raises(ServerBadRequest):
        validation.check_put(kv.PutRequest(key=b"a", ttl_ms=-1), limits)
    with pytest.raises(InvalidKeyError):
        validation.check_put(kv.PutRequest(key=b""), limits)
    validation.check_put(kv.PutRequest(key=b"", sequential=True), limits)


def test_per_key_ttl_from_command_timestamp() -> None:
    m = Machine(ttl_seconds=100)
    m.one(put(b"short", ttl_ms=500))
    m.one(put(b"table"))
    assert m.get(b"short", now=NOW + 499).count == 1
    assert m.get(b"short", now=NOW + 500).count == 0
    assert m.get(b"table", now=NOW + 500).count == 1
    assert m.get(b"short").kvs[0].expire_time == NOW + 500
    assert m.get(b"table").kvs[0].expire_time == NOW + 100_000
    # An expired key is absent: create-only put succeeds, and a new version chain starts.
    r = m.one(put(b"short", expected_version=-1), now=NOW + 600)
    assert r.header.code == Code.SUCCESS
    assert m.get(b"short", now=NOW + 600).kvs[0].version == 0


def test_sequential_keys_unique_per_pkey_and_in_txn() -> None:
    m = Machine()
    keys = []
    for _ in range(3):
        r = m.one(put(b"n-", sequential=True))
        assert isinstance(r, kv.PutResponse) and r.header.code == Code.SUCCESS
        keys.append(r.key)
    assert keys == [b"n-%020d" % i for i in range(3)]
    other = m.one(put(b"n-", pkey=b"q", sequential=True))
    assert isinstance(other, kv.PutResponse) and other.key == b"n-" + b"0" * 20
    op = kv.RequestOp(request_put=kv.PutRequest(key=b"x", sequential=True))
    t = m.one(txn([], [op, op]))
    assert isinstance(t, kv.TxnResponse)
    assert [r.response_put.key for r in t.responses] == [
        b"x00000000000000000003",
        b"x" + b"%020d" % 4,
    ]
    assert [kv_.key for kv_ in m.scan().kvs] == [*keys, b"x%020d" % 3, b"x%020d" % 4]
    # The counter is not a table key: scans never see it, deletes do not reset it.
    m.one(delete(b"", b"\x00"))
    assert m.scan().count == 0
    again = m.one(put(b"n-", sequential=True))
    assert isinstance(again, kv.PutResponse) and again.key == b"n-%020d" % 5


def test_sequential_is_deterministic_on_replay() -> None:
    m = Machine()
    for i in range(5):
        m.one(put(b"s", pkey=b"p%d" % (i % 2), sequential=True))
    replica = RangeStateMachine(MemoryKvStore(), APPLIERS)
    replica.apply_batch(m.log)
    assert list(replica.store.scan(b"", b"\xff\xff")) == m.dump()


def test_change_events() -> None:
    m = Machine()
    m.one(put(b"a", b"1"))
    assert [(e.revision, e.key, e.record is not None, e.prev) for e in m.sm.last_events] == [
        (1, store_key(b"p", b"a"), True, None)
    ]
    m.one(put(b"a", b"2"))
    (event,) = m.sm.last_events
    assert event.prev is not None and event.prev.value == b"1"
    assert event.record is not None and event.record.value == b"2"
    m.one(incr(b"n", 1))
    assert m.sm.last_events[0].record is not None and m.sm.last_events[0].record.is_number
    m.apply(put(b"b"), put(b"c"))
    assert [e.revision for e in m.sm.last_events] == [4, 5]
    m.one(delete(b"", b"\x00"))
    assert [(e.revision, e.index, e.record) for e in m.sm.last_events] == [
        (6, 0, None),
        (6, 1, None),
        (6, 2, None),
        (6, 3, None),
    ]
    # Deleting a missing key or a failed CAS reports nothing.
    m.one(delete(b"a"))
    assert m.sm.last_events == []


def test_event_history_is_bounded_and_durable() -> None:
    store = MemoryKvStore()
    sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store, limit=5))
    for i in range(1, 13):
        cmd = put(b"k%d" % i)
        cmd.timestamp_ms = NOW
        sm.apply_batch([(i, cmd)])
    events = list(iter_history(store))
    assert [e.revision for e in events] == [8, 9, 10, 11, 12]
    reopened = EventHistory(store, limit=5)
    assert (reopened.count, reopened.trimmed_through) == (5, 7)
    assert [e.revision for e in reopened.read((9, 0), 10)] == [10, 11, 12]
    assert events[0].record is not None and events[0].key == store_key(b"p", b"k8")


def session(create_ttl_ms: int = 0, close_id: int = 0) -> wal_pb2.WalCommand:
    if create_ttl_ms:
        return wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=create_ttl_ms))
    return wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=close_id))


def test_sessions_and_ephemeral_keys() -> None:
    m = Machine()
    m.one(put(b"plain"))
    created = m.one(session(create_ttl_ms=2000))
    assert isinstance(created, session_pb2.SessionResponse)
    sid = created.session_id
    assert sid == 2 and m.sm.session_ttls() == [(2, 2000)]
    assert m.one(put(b"e1", lease=sid)).header.code == Code.SUCCESS
    assert m.one(put(b"e2", pkey=b"q", lease=sid)).header.code == Code.SUCCESS
    assert m.one(put(b"x", lease=99)).header.code == Code.ILLEGAL_OP
    m.one(put(b"e3", lease=sid))
    m.one(put(b"e3"))  # a put without the session detaches the key (etcd's semantics)
    m.one(put(b"e4", lease=sid))
    m.one(delete(b"e4"))
    closed = m.one(session(close_id=sid))
    assert closed.header.code == Code.SUCCESS
    deleted = sorted(e.key for e in m.sm.last_events)
    assert deleted == sorted([store_key(b"p", b"e1"), store_key(b"q", b"e2")])
    assert m.get(b"e1").count == 0 and m.get(b"e2", pkey=b"q").count == 0
    assert m.get(b"e3").count == 1 and m.get(b"plain").count == 1
    assert m.sm.session_ttls() == [] and m.sm.sessions == 0
    assert m.one(session(close_id=sid)).header.code == Code.KEY_NOT_FOUND
    assert m.one(put(b"late", lease=sid)).header.code == Code.ILLEGAL_OP
    # Only the table keys and bookkeeping that must stay are left: no index entries.
    assert not [k for k, _ in m.dump() if k.startswith((b"\xffse/", b"\xffsk/", b"\xffss/"))]
    # Replay reaches the same state.
    replica = RangeStateMachine(MemoryKvStore(), APPLIERS)
    replica.apply_batch(m.log)
    assert list(replica.store.scan(b"", b"\xff\xff")) == m.dump()


def test_event_history_bytes_limit_and_trim_cursor() -> None:
    store = MemoryKvStore()
    history = EventHistory(store, limit=1000, bytes_limit=2000)
    sm = RangeStateMachine(store, APPLIERS, history=history)
    for i in range(1, 21):
        cmd = put(b"k", b"x" * 200)
        cmd.timestamp_ms = NOW
        sm.apply_batch([(i, cmd)])
    kept = list(iter_history(store))
    assert 3 <= len(kept) <= 5 and kept[-1].revision == 20  # ~490 bytes per event
    assert history.bytes <= 2000 + 600  # one event's overshoot at most, then trimmed
    reopened = EventHistory(store, limit=1000, bytes_limit=2000)
    assert (reopened.count, reopened.bytes) == (history.count, history.bytes)
    assert reopened.trimmed_through == kept[0].revision - 1
