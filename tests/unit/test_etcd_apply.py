"""etcd semantics of the etcd front-end's writes and reads, on the range state machine itself
(memory store; no gRPC): versions, compares, txn rules, leases, Range options, past revisions,
and that replaying the log gives the same state."""

from __future__ import annotations

import pytest

from tablekeeper_proto.etcd import apply_pb2, rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.etcd.apply import read_only_txn, run_read_only_txn
from tablekeeper_server.etcd.errors import EtcdError
from tablekeeper_server.etcd.state import PastView, StoreView, do_range
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

Compare = rpc_pb2.Compare
RangeRequest = rpc_pb2.RangeRequest


class Keyspace:
    """A state machine fed etcd commands, as `etcd.keyspace.Keyspace` feeds a range."""

    def __init__(self, history_limit: int = 10_000) -> None:
        self.store = MemoryKvStore()
        self.sm = RangeStateMachine(
            self.store, APPLIERS, history=EventHistory(self.store, history_limit)
        )
        self.log: list[tuple[int, wal_pb2.WalCommand]] = []

    def command(self, command: wal_pb2.WalCommand) -> object:
        sequence = len(self.log) + 1
        command.timestamp_ms = 1000 + sequence
        self.log.append((sequence, command))
        return self.sm.apply_batch([(sequence, command)])[0]

    def txn(self, request: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        if read_only_txn(request):
            return run_read_only_txn(StoreView(self.sm), request)
        result = self.command(wal_pb2.WalCommand(etcd_txn=request.SerializeToString()))
        assert isinstance(result, apply_pb2.ApplyResult)
        if result.error:
            raise EtcdError(result.error)
        return result.response

    def put(self, key: bytes, value: bytes, **options: object) -> rpc_pb2.PutResponse:
        op = rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, **options))  # type: ignore[arg-type]
        response = self.txn(rpc_pb2.TxnRequest(success=[op]))
        out = response.responses[0].response_put
        out.header.revision = response.header.revision
        return out

    def delete(self, key: bytes, range_end: bytes = b"", prev_kv: bool = False) -> int:
        op = rpc_pb2.RequestOp(
            request_delete_range=rpc_pb2.DeleteRangeRequest(
                key=key, range_end=range_end, prev_kv=prev_kv
            )
        )
        return self.txn(rpc_pb2.TxnRequest(success=[op])).responses[0].response_delete_range.deleted

    def get(self, key: bytes, **options: object) -> rpc_pb2.RangeResponse:
        request = RangeRequest(key=key, **options)  # type: ignore[arg-type]
        view: StoreView | PastView = StoreView(self.sm)
        if request.revision and request.revision < self.sm.applied_sequence:
            view = PastView(StoreView(self.sm), request.revision)
        return do_range(view, request)

    def compact(self, revision: int) -> rpc_pb2.TxnResponse:
        result = self.command(wal_pb2.WalCommand(etcd_compact=revision))
        assert isinstance(result, apply_pb2.ApplyResult)
        if result.error:
            raise EtcdError(result.error)
        return result.response

    def lease(self, ttl_ms: int = 5000, chosen: int = 0) -> int:
        """The new lease's id; 0 if `chosen` was refused (in use)."""
        command = wal_pb2.WalCommand(
            session=wal_pb2.SessionCommand(create_ttl_ms=ttl_ms, create_id=chosen)
        )
        response = self.command(command)
        return int(response.session_id)  # type: ignore[attr-defined]

    def revoke(self, lease: int) -> None:
        self.command(wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=lease)))


def put_op(key: bytes, value: bytes) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value))


def get_op(key: bytes, range_end: bytes = b"") -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_range=RangeRequest(key=key, range_end=range_end))


def test_versions_and_revisions_as_etcd() -> None:
    ks = Keyspace()
    first = ks.put(b"a", b"1").header.revision
    kv = ks.get(b"a").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version) == (first, first, 1)
    second = ks.put(b"a", b"2", prev_kv=True)
    assert second.prev_kv.value == b"1" and second.prev_kv.version == 1
    kv = ks.get(b"a").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version) == (first, second.header.revision, 2)
    assert ks.delete(b"a") == 1
    assert ks.delete(b"a") == 0
    third = ks.put(b"a", b"3").header.revision
    kv = ks.get(b"a").kvs[0]
    assert (kv.create_revision, kv.version) == (third, 1)  # a delete resets the version


def test_range_count_limit_sort_filters() -> None:
    ks = Keyspace()
    for key, value in [(b"p/c", b"1"), (b"p/a", b"3"), (b"p/b", b"2"), (b"q", b"0")]:
        ks.put(key, value)
    everything = ks.get(b"p/", range_end=b"p0")
    assert [kv.key for kv in everything.kvs] == [b"p/a", b"p/b", b"p/c"]
    assert everything.count == 3 and not everything.more
    limited = ks.get(b"p/", range_end=b"p0", limit=2)
    assert len(limited.kvs) == 2 and limited.more and limited.count == 3
    counted = ks.get(b"p/", range_end=b"p0", count_only=True)
    assert counted.count == 3 and not counted.kvs
    keys_only = ks.get(b"p/", range_end=b"p0", keys_only=True)
    assert all(not kv.value for kv in keys_only.kvs)
    by_value = ks.get(
        b"p/", range_end=b"p0", sort_target=RangeRequest.VALUE, sort_order=RangeRequest.DESCEND
    )
    assert [kv.value for kv in by_value.kvs] == [b"3", b"2", b"1"]
    by_create = ks.get(b"p/", range_end=b"p0", sort_target=RangeRequest.CREATE, limit=1)
    assert [kv.key for kv in by_create.kvs] == [b"p/c"] and by_create.more
    newer = ks.get(b"\x00", range_end=b"\x00", min_create_revision=3)
    assert [kv.key for kv in newer.kvs] == [b"p/b", b"q"] and newer.count == 4
    with pytest.raises(EtcdError) as empty:
        ks.get(b"")
    assert empty.value.name == "empty_key"


def test_compares_on_missing_and_present_keys() -> None:
    ks = Keyspace()

    def holds(*compares: Compare) -> bool:
        return ks.txn(rpc_pb2.TxnRequest(compare=list(compares))).succeeded

    assert holds(Compare(key=b"m", target=Compare.VERSION, version=0))
    assert holds(Compare(key=b"m", target=Compare.CREATE, create_revision=0))
    assert not holds(Compare(key=b"m", target=Compare.VALUE, value=b""))  # no key: value fails
    revision = ks.put(b"k", b"v").header.revision
    assert holds(Compare(key=b"k", target=Compare.MOD, mod_revision=revision))
    assert holds(Compare(key=b"k", result=Compare.GREATER, target=Compare.VERSION, version=0))
    assert holds(Compare(key=b"k", result=Compare.LESS, target=Compare.VALUE, value=b"w"))
    assert not holds(Compare(key=b"k", result=Compare.NOT_EQUAL, target=Compare.VALUE, value=b"v"))
    ks.put(b"k2", b"v")
    # A compare over a range holds only if it holds for every key in it.
    assert holds(Compare(key=b"k", range_end=b"l", target=Compare.VALUE, value=b"v"))
    ks.put(b"k3", b"x")
    assert not holds(Compare(key=b"k", range_end=b"l", target=Compare.VALUE, value=b"v"))


def test_txn_branches_nested_ops_and_rules() -> None:
    ks = Keyspace()
    ks.put(b"x", b"1")
    request = rpc_pb2.TxnRequest(
        compare=[Compare(key=b"x", target=Compare.VALUE, value=b"1")],
        success=[
            put_op(b"x", b"2"),
            get_op(b"x"),  # later ops see earlier writes of the txn
            rpc_pb2.RequestOp(
                request_txn=rpc_pb2.TxnRequest(
                    compare=[Compare(key=b"y", target=Compare.VERSION, version=0)],
                    success=[put_op(b"y", b"new")],
                )
            ),
        ],
        failure=[put_op(b"x", b"failed")],
    )
    response = ks.txn(request)
    assert response.succeeded
    assert response.responses[1].response_range.kvs[0].value == b"2"
    assert response.responses[2].response_txn.succeeded
    x, y = ks.get(b"x").kvs[0], ks.get(b"y").kvs[0]
    assert x.mod_revision == y.mod_revision == y.create_revision == response.header.revision
    assert not ks.txn(request).succeeded
    assert ks.get(b"x").kvs[0].value == b"failed"

    before = ks.sm.applied_sequence
    with pytest.raises(EtcdError) as duplicate:
        ks.txn(rpc_pb2.TxnRequest(success=[put_op(b"d", b"1"), put_op(b"d", b"2")]))
    assert duplicate.value.name == "duplicate_key"
    assert not ks.get(b"d").kvs and ks.sm.applied_sequence == before + 1  # nothing changed


def test_leases_attach_detach_and_revoke() -> None:
    ks = Keyspace()
    lease = ks.lease()
    ks.put(b"e", b"1", lease=lease)
    ks.put(b"kept", b"1", lease=lease)
    assert ks.get(b"e").kvs[0].lease == lease
    holds = ks.txn(
        rpc_pb2.TxnRequest(compare=[Compare(key=b"e", target=Compare.LEASE, lease=lease)])
    )
    assert holds.succeeded
    ks.put(b"kept", b"2")  # a put without the lease detaches the key (etcd's semantics)
    ks.put(b"e", b"", ignore_value=True, ignore_lease=True)
    kv = ks.get(b"e").kvs[0]
    assert (kv.value, kv.lease, kv.version) == (b"1", lease, 2)
    ks.revoke(lease)
    assert not ks.get(b"e").kvs and ks.get(b"kept").kvs[0].value == b"2"
    for options in ({"lease": lease}, {"ignore_value": True}):
        with pytest.raises(EtcdError) as refused:
            ks.put(b"gone", b"", **options)
        assert refused.value.name in ("lease_not_found", "key_not_found")


def test_reads_at_a_past_revision_and_compaction() -> None:
    ks = Keyspace(history_limit=5)
    r1 = ks.put(b"a", b"1").header.revision
    r2 = ks.put(b"a", b"2").header.revision
    ks.put(b"b", b"1")
    assert ks.get(b"a", revision=r1).kvs[0].value == b"1"
    assert [kv.key for kv in ks.get(b"a", range_end=b"c", revision=r1).kvs] == [b"a"]
    ks.delete(b"a")
    assert ks.get(b"a", revision=r2).kvs[0].value == b"2"
    for i in range(10):
        ks.put(b"c", b"%d" % i)
    with pytest.raises(EtcdError) as compacted:
        ks.get(b"a", revision=r1)
    assert compacted.value.name == "compacted"


def test_compact_refuses_reads_and_watches_from_before_it() -> None:
    ks = Keyspace()
    r1 = ks.put(b"a", b"1").header.revision
    r2 = ks.put(b"a", b"2").header.revision
    r3 = ks.put(b"a", b"3").header.revision
    history = ks.sm.history
    assert history is not None
    for target, refused in ((r3 + 1, "future_rev"), (0, "compacted")):
        with pytest.raises(EtcdError) as error:
            ks.compact(target)
        assert error.value.name == refused
    done = ks.compact(r2)
    # The command's own revision (refused commands took theirs too); no key changed.
    assert done.header.revision == len(ks.log)
    assert ks.get(b"a").kvs[0].mod_revision == r3
    # etcd: reads at the compacted revision and later work, earlier ones are refused ...
    assert ks.get(b"a", revision=r2).kvs[0].value == b"2"
    with pytest.raises(EtcdError) as compacted:
        ks.get(b"a", revision=r1)
    assert compacted.value.name == "compacted"
    # ... and so are watches: the history keeps revisions from r2 on, and says so.
    assert [e.revision for e in history.read((0, 0), 100)] == [r2, r3]
    assert history.trimmed_through == r2 - 1
    # Compacting again to the same revision or an older one is refused, as by etcd.
    for target in (r1, r2):
        with pytest.raises(EtcdError) as again:
            ks.compact(target)
        assert again.value.name == "compacted"
    # Compacting to the current revision drops the whole history.
    ks.compact(len(ks.log))
    assert history.read((0, 0), 100) == []
    assert history.trimmed_through == len(ks.log) - 2
    assert ks.get(b"a").kvs[0].value == b"3"


def test_compact_survives_replay_and_restart() -> None:
    ks = Keyspace()
    for i in range(5):
        ks.put(b"k", b"%d" % i)
    ks.compact(4)
    replayed = Keyspace()
    replayed.sm.apply_batch(ks.log)  # the same commands in one batch
    assert list(replayed.store.scan(b"", b"\xff")) == list(ks.store.scan(b"", b"\xff"))
    reopened = RangeStateMachine(ks.store, APPLIERS, history=EventHistory(ks.store))
    assert StoreView(reopened).compacted == 4
    assert reopened.history is not None and reopened.history.trimmed_through == 3


def test_leases_with_ids_the_client_chose() -> None:
    ks = Keyspace()
    ks.put(b"a", b"1")
    # The next command's revision is 2: a client takes that id first, so the lease granted
    # with ID 0 at revision 3 ... and one chosen as 3 pushes the next server-picked id along.
    assert ks.lease(chosen=3) == 3
    step = 1 << 48
    assert ks.lease() == 3 + step
    assert ks.lease(chosen=3) == 0  # in use: refused
    ks.put(b"b", b"1", lease=3)
    ks.revoke(3)
    assert not ks.get(b"b").kvs
    assert ks.lease(chosen=3) == 3  # free again
    replayed = RangeStateMachine(MemoryKvStore(), APPLIERS)
    replayed.apply_batch(ks.log)
    assert list(replayed.store.scan(b"", b"\xff")) == list(ks.store.scan(b"", b"\xff"))


def test_replay_gives_the_same_state() -> None:
    ks = Keyspace()
    lease = ks.lease()
    ks.put(b"a", b"1", lease=lease)
    ks.txn(rpc_pb2.TxnRequest(success=[put_op(b"b", b"1"), put_op(b"c", b"1")]))
    ks.delete(b"b")
    ks.revoke(lease)
    replayed = RangeStateMachine(MemoryKvStore(), APPLIERS)
    replayed.apply_batch(ks.log)
    assert list(replayed.store.scan(b"", b"\xff")) == list(ks.store.scan(b"", b"\xff"))
