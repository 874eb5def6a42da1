"""Hostile input against the state machine (issue 17): numbers apply cannot hold, commands whose
apply raises, txns whose ops fail, and reads larger than a response may carry. Each must change
nothing (or everything, for a txn), keep the range going, and replay to the same state."""

from __future__ import annotations

import asyncio

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.v1 import tablekeeper_pb2, wal_pb2
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.core.keys import store_key
from tablekeeper_server.errors import BadRequestError, Code, ResourceLimitError
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.range import validation
from tablekeeper_server.range.apply import APPLIED_KEY, Response
from tablekeeper_server.range.bookkeeper_apply import sequence_counter_key
from tablekeeper_server.range.bookkeeper_reads import ROW_OVERHEAD_BYTES, SCAN_BYTES_MAX, ReadBudget
from tablekeeper_server.range.events import EventHistory, iter_history
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.records import INT64_MAX, StoredRecord
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS
from tests.unit.test_state_machine import NOW, Machine, delete, header, incr, put, txn

pytestmark = pytest.mark.unit

Compare = kv.Compare
LIMITS = Limits()


def op_put(key: bytes, value: bytes = b"v", **kw: object) -> kv.RequestOp:
    return kv.RequestOp(request_put=kv.PutRequest(key=key, value=value, **kw))  # type: ignore[arg-type]


def op_incr(key: bytes, amount: int = 1) -> kv.RequestOp:
    return kv.RequestOp(request_increment=kv.IncrementRequest(key=key, amount=amount))


def op_read(key: bytes, end: bytes = b"") -> kv.RequestOp:
    return kv.RequestOp(request_range=kv.RangeRequest(key=key, range_end=end))


def codes(responses: list[Response]) -> list[int]:
    return [r.header.code for r in responses]


def replay(
    log: list[tuple[int, wal_pb2.WalCommand]], store: MemoryKvStore | None = None, **kw: int
) -> RangeStateMachine:
    """A fresh state machine (on `store`, default empty) that applied `log` one at a time."""
    store = store if store is not None else MemoryKvStore()
    sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store), **kw)
    for entry in log:
        sm.apply_batch([entry])
    return sm


def history_machine(**kw: int) -> Machine:
    m = Machine()
    store = MemoryKvStore()
    m.sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store), **kw)
    return m


def dump(sm: RangeStateMachine) -> list[tuple[bytes, bytes]]:
    return list(sm.store.scan(b"", b"\xff\xff"))


def without_position(sm: RangeStateMachine) -> list[tuple[bytes, bytes]]:
    """The store without the applied position (which every command moves)."""
    return [(k, v) for k, v in dump(sm) if k != APPLIED_KEY]


# ---------------------------------------------------------------- validation


def test_validation_refuses_numbers_and_enums_apply_cannot_hold() -> None:
    def put_request(**kw: object) -> kv.PutRequest:
        return kv.PutRequest(key=b"k", value=b"v", header=header(), **kw)  # type: ignore[arg-type]

    with pytest.raises(BadRequestError, match="ttl_ms"):
        validation.check_put(put_request(ttl_ms=2**63 - 1), LIMITS)
    validation.check_put(put_request(ttl_ms=validation.TTL_MS_MAX), LIMITS)
    assert NOW + validation.TTL_MS_MAX <= INT64_MAX

    for sort in ({"sort_order": 7}, {"sort_target": 9}):
        with pytest.raises(BadRequestError, match="sort"):
            validation.check_range(
                kv.RangeRequest(key=b"a", range_end=b"z", header=header(), **sort),  # type: ignore[arg-type]
                LIMITS,
            )

    def txn_with(compare: Compare) -> kv.TxnRequest:
        return kv.TxnRequest(compare=[compare], header=header())

    bad_compares = {
        "result": Compare(key=b"a", result=9, target=Compare.VALUE, value=b"x"),  # type: ignore[arg-type]
        "target": Compare(key=b"a", target=8, version=1),  # type: ignore[arg-type]
        "carries": Compare(key=b"a", target=Compare.VERSION, value=b"1"),
        "needs a value": Compare(key=b"a", target=Compare.MOD),
    }
    for message, compare in bad_compares.items():
        with pytest.raises(BadRequestError, match=message):
            validation.check_txn(txn_with(compare), LIMITS)
    validation.check_txn(txn_with(Compare(key=b"a", target=Compare.VALUE)), LIMITS)
    validation.check_txn(
        txn_with(Compare(key=b"a", target=Compare.CREATE, create_revision=0)), LIMITS
    )


# ---------------------------------------------------------------- apply is total


def test_a_put_whose_expiry_overflows_changes_nothing_and_the_batch_goes_on() -> None:
    """The record of issue 17, defect 1, as it sits in a log written before validation caught
    it: applying it used to raise (struct.error) and wedge the range for good."""
    m = history_machine()
    hostile = put(b"b", ttl_ms=2**63 - 1)
    responses = m.apply(put(b"a"), hostile, put(b"c"), incr(b"n", 5))
    assert codes(responses) == [Code.SUCCESS, Code.BAD_REQUEST, Code.SUCCESS, Code.SUCCESS]
    assert m.get(b"b").count == 0
    assert m.get(b"c").kvs[0].mod_revision == 3  # the refused command still took its revision
    assert m.sm.applied_sequence == 4
    m.one(put(b"d"))
    assert [e.key for e in iter_history(m.sm.store)] == [
        store_key(b"p", k) for k in (b"a", b"c", b"n", b"d")
    ]
    again = replay(m.log)
    assert dump(again) == dump(m.sm)
    # A table TTL that reaches past what a record holds means "never", not a failure.
    forever = Machine(ttl_seconds=2**62)
    assert forever.one(put(b"t")).header.code == Code.SUCCESS
    assert forever.get(b"t", now=NOW + 10**15).count == 1


def _craft_max_version(store: MemoryKvStore, lkey: bytes) -> None:
    """A stored key whose next version cannot be stored: a put to it raises inside apply."""
    batch = store.new_batch()
    batch.put(store_key(b"p", lkey), StoredRecord(1, 1, INT64_MAX, False, 0, b"x").encode())
    store.write(batch)


def test_a_command_whose_apply_raises_changes_nothing_and_replays_the_same() -> None:
    store = MemoryKvStore()
    _craft_max_version(store, b"k")
    sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store))
    # The txn puts "a" first and fails on "k" while its writes are being flushed: "a" (and its
    # change event) must be undone, the batch's other commands applied.
    log = [
        (1, put(b"x")),
        (2, txn([], [op_put(b"a"), op_put(b"k")])),
        (3, incr(b"n", 2)),
        (4, put(b"k", b"again")),
    ]
    for _, command in log:
        command.timestamp_ms = NOW
    responses = sm.apply_batch(log)
    assert codes(responses) == [
        Code.SUCCESS,
        Code.INTERNAL_SERVER_ERROR,
        Code.SUCCESS,
        Code.INTERNAL_SERVER_ERROR,
    ]
    assert isinstance(responses[1], kv.TxnResponse) and isinstance(responses[3], kv.PutResponse)
    assert [e.revision for e in sm.last_events] == [1, 3]
    assert sm.applied_sequence == 4
    assert sm.store.get(store_key(b"p", b"a")) is None
    assert [e.revision for e in iter_history(sm.store)] == [1, 3]
    sm.apply_batch([(5, put(b"y"))])  # the range keeps going

    twin = MemoryKvStore()
    _craft_max_version(twin, b"k")
    again = replay([*log, (5, put(b"y"))], twin)
    assert dump(again) == dump(sm) and again.applied_sequence == 5


def test_a_failing_store_is_not_answered_for() -> None:
    """A store that cannot be read says nothing about the command: apply must raise (the range
    stops) instead of answering an error that a replay on a healthy disk would not give."""

    class BrokenStore(MemoryKvStore):
        broken = False

        def get(self, key: bytes) -> bytes | None:
            if self.broken:
                raise OSError(5, "Input/output error")
            return super().get(key)

    store = BrokenStore()
    sm = RangeStateMachine(store, APPLIERS)
    sm.apply_batch([(1, put(b"a"))])
    store.broken = True
    with pytest.raises(OSError):
        sm.apply_batch([(2, put(b"b"))])
    store.broken = False
    assert sm.applied_sequence == 1
    assert codes(sm.apply_batch([(2, put(b"b"))])) == [Code.SUCCESS]


async def test_a_range_replays_past_a_poisoned_record_and_serves() -> None:
    """A log that already holds the hostile put (written before validation refused it): the
    range opens, answers reads and writes, and reopens again to the same state."""
    backend = MemoryLogBackend()
    name = RangeName(1, 1024, 1025)
    writer = backend.open_writer(name.log_name)
    records = [put(b"a", b"1"), put(b"b", ttl_ms=2**63 - 1), put(b"c", b"3")]
    for command in records:
        command.timestamp_ms = NOW
    await writer.append([c.SerializeToString() for c in records])
    await writer.close()

    store = MemoryKvStore()
    range_ = Range(name, backend, lambda: store, ManualClock(NOW), appliers=APPLIERS)
    await range_.open()
    try:
        assert range_.applied_sequence == 3
        read = range_.read(kv.RangeRequest(key=b"", range_end=b"\x00", header=header()))
        assert [x.key for x in read.kvs] == [b"a", b"c"]
        response = await range_.execute(put(b"d", b"4"))
        assert response.header.code == Code.SUCCESS
    finally:
        await range_.close()
    reopened = Range(name, backend, MemoryKvStore, ManualClock(NOW), appliers=APPLIERS)
    await reopened.open()
    try:
        read = reopened.read(kv.RangeRequest(key=b"", range_end=b"\x00", header=header()))
        assert [x.key for x in read.kvs] == [b"a", b"c", b"d"]
    finally:
        await reopened.close()


# ---------------------------------------------------------------- txns are atomic


def test_txn_ops_that_fail_leave_nothing_behind() -> None:
    m = history_machine()
    m.apply(put(b"bytes", b"x"), incr(b"num", 1), put(b"cas", b"c"))
    before = without_position(m.sm)
    failing = {
        "increment of a bytes key": (
            [op_incr(b"num", 5), op_put(b"new"), op_incr(b"bytes")],
            Code.BAD_REQUEST,
            2,
        ),
        "put onto a number key": ([op_put(b"new"), op_put(b"num")], Code.BAD_REQUEST, 1),
        "create of an existing key": (
            [op_put(b"new"), op_put(b"cas", expected_version=-1)],
            Code.KEY_EXISTS,
            1,
        ),
        "CAS delete at a wrong version": (
            [
                op_put(b"new"),
                kv.RequestOp(
                    request_delete_range=kv.DeleteRangeRequest(key=b"cas", expected_version=7)
                ),
            ],
            Code.BAD_VERSION,
            1,
        ),
        "put with a session that does not exist": (
            [op_put(b"new"), op_put(b"eph", lease=99)],
            Code.ILLEGAL_OP,
            1,
        ),
        "sequential put beside a failing op": (
            [op_put(b"q-", sequential=True), op_put(b"num")],
            Code.BAD_REQUEST,
            1,
        ),
    }
    applied = m.sm.applied_sequence
    for what, (ops, code, failed_at) in failing.items():
        response = m.one(txn([], ops))
        assert isinstance(response, kv.TxnResponse), what
        assert response.header.code == code, what
        assert len(response.responses) == failed_at + 1, what
        last = response.responses[failed_at]
        assert getattr(last, str(last.WhichOneof("response"))).header.code == code, what
        assert m.sm.last_events == [], what
        applied += 1
        assert m.sm.applied_sequence == applied, what
        assert without_position(m.sm) == before, what
    assert m.sm.store.get(sequence_counter_key(b"p")) is None  # no counter was consumed
    # The failure branch is just as atomic.
    missing = Compare(target=Compare.VALUE, result=Compare.EQUAL, key=b"bytes", value=b"")
    response = m.one(txn([missing], [op_put(b"s")], [op_put(b"f"), op_put(b"num")]))
    assert response.header.code == Code.BAD_REQUEST and not response.succeeded  # type: ignore[attr-defined]
    assert m.get(b"f").count == 0 and m.get(b"s").count == 0
    ok = m.one(txn([], [op_incr(b"num", 5), op_put(b"new")]))
    assert ok.header.code == Code.SUCCESS and m.get(b"num").kvs[0].number_value == 6
    assert dump(replay(m.log)) == dump(m.sm)


def test_a_refused_plain_sequential_put_consumes_no_counter() -> None:
    m = Machine()
    m.one(incr(b"q-" + b"%020d" % 0, 1))
    assert m.one(put(b"q-", sequential=True)).header.code == Code.BAD_REQUEST
    first = m.one(put(b"x-", sequential=True, expected_version=0))
    assert first.header.code == Code.KEY_NOT_FOUND
    made = m.one(put(b"x-", sequential=True))
    assert isinstance(made, kv.PutResponse) and made.key == b"x-" + b"%020d" % 0


# ---------------------------------------------------------------- bounded responses


def _fill(m: Machine, n: int, value_bytes: int) -> list[bytes]:
    keys = [b"k%04d" % i for i in range(n)]
    m.apply(*(put(k, b"v" * value_bytes) for k in keys))
    return keys


def _bytes_of(response: kv.RangeResponse) -> int:
    return sum(len(x.key) + len(x.value) + ROW_OVERHEAD_BYTES for x in response.kvs)


def test_a_range_read_pages_within_the_response_bound() -> None:
    m = history_machine(response_bytes_max=2000)
    keys = _fill(m, 60, 100)
    seen: list[bytes] = []
    start = b""
    while True:
        page = m.scan(start=start)
        assert page.header.code == Code.SUCCESS
        assert 0 < _bytes_of(page) <= 2000
        seen += [x.key for x in page.kvs]
        if not page.more:
            break
        start = page.kvs[-1].key + b"\x00"
    assert seen == keys
    # One key larger than the bound still comes back, alone: a scan always makes progress.
    m.one(put(b"big", b"B" * 5000))
    page = m.scan(start=b"big", end=b"big\xff")
    assert [x.key for x in page.kvs] == [b"big"]
    assert m.get(b"big").kvs[0].value == b"B" * 5000
    counted = m.scan(count_only=True)
    assert counted.count == 61 and not counted.more


def test_scan_range_pages_within_the_response_bound() -> None:
    m = history_machine(response_bytes_max=1000)
    keys = _fill(m, 30, 100)
    response = m.sm.scan_range(tablekeeper_pb2.ScanRangeRequest(), NOW)
    assert response.more and 0 < len(response.rows) < 30
    assert sum(len(r.kv.key) + 2 + 100 + ROW_OVERHEAD_BYTES for r in response.rows) <= 1000
    assert [r.kv.key for r in response.rows] == keys[: len(response.rows)]


def test_a_read_only_txn_over_the_bound_is_refused_and_changes_nothing() -> None:
    m = history_machine(response_bytes_max=4000)
    _fill(m, 20, 100)
    before = m.sm.applied_sequence
    reads = [op_read(b"k", b"k\xff") for _ in range(5)]
    response = m.one(txn([], reads))
    assert response.header.code == Code.BAD_REQUEST
    rejection = m.sm.last_rejections.get(0)
    assert isinstance(rejection, ResourceLimitError)
    assert "--max-response-bytes" in rejection.message
    assert m.sm.applied_sequence == before + 1
    within = m.one(txn([], [op_read(b"k0000"), op_read(b"k0001", b"k0003")]))
    assert within.header.code == Code.SUCCESS and m.sm.last_rejections == {}
    assert [len(r.response_range.kvs) for r in within.responses] == [1, 3]  # type: ignore[attr-defined]


def test_a_writing_txn_is_never_refused_for_its_reads_and_replays_under_any_bound() -> None:
    """Refusing it would depend on the server's flag, and a replay under another flag must reach
    the same state: its reads stop early (more = true) and its writes apply."""
    m = history_machine(response_bytes_max=4000)
    _fill(m, 20, 100)
    response = m.one(txn([], [op_read(b"k", b"k\xff"), op_read(b"k", b"k\xff"), op_put(b"w")]))
    assert isinstance(response, kv.TxnResponse)
    assert response.header.code == Code.SUCCESS and m.sm.last_rejections == {}
    first, second = (r.response_range for r in response.responses[:2])
    assert _bytes_of(first) + _bytes_of(second) <= 4000
    assert second.more and len(first.kvs) + len(second.kvs) < 40
    assert m.get(b"w").count == 1
    for bound in (1, 4000, 1 << 30):
        assert dump(replay(m.log, response_bytes_max=bound)) == dump(m.sm)


def test_a_txn_reading_one_key_over_the_bound_is_refused() -> None:
    m = history_machine(response_bytes_max=1000)
    m.one(put(b"big", b"B" * 2000))
    m.one(txn([], [op_read(b"big")]))
    assert isinstance(m.sm.last_rejections.get(0), ResourceLimitError)


async def test_the_caller_of_a_refused_txn_hears_resource_limit_error() -> None:
    backend = MemoryLogBackend()
    store = MemoryKvStore()
    name = RangeName(1, 1024, 1025)
    range_ = Range(
        name, backend, lambda: store, ManualClock(NOW), response_bytes_max=600, appliers=APPLIERS
    )
    await range_.open()
    try:
        await asyncio.gather(*(range_.execute(put(b"k%d" % i, b"v" * 100)) for i in range(10)))
        refused = range_.execute(txn([], [op_read(b"k", b"k\xff"), op_read(b"k0")]))
        ok = range_.execute(put(b"after"))
        results = await asyncio.gather(refused, ok, return_exceptions=True)
        assert isinstance(results[0], ResourceLimitError)
        assert not isinstance(results[1], BaseException)
        assert results[1].header.code == Code.SUCCESS
        page = range_.read(kv.RangeRequest(key=b"k", range_end=b"k\xff", header=header()))
        assert page.more and 0 < len(page.kvs) < 10
    finally:
        await range_.close()


def test_delete_in_a_failed_txn_keeps_the_key() -> None:
    m = Machine()
    m.apply(put(b"a"), incr(b"n", 1))
    response = m.one(
        txn(
            [],
            [
                kv.RequestOp(request_delete_range=kv.DeleteRangeRequest(key=b"a")),
                op_put(b"n"),
            ],
        )
    )
    assert response.header.code == Code.BAD_REQUEST
    assert m.get(b"a").count == 1
    assert m.one(delete(b"a")).deleted == 1  # type: ignore[attr-defined]


def test_a_shared_read_budget_bounds_a_group_of_reads() -> None:
    """What a Batch of Range ops can use: however many reads, their work stops at the budget."""
    m = history_machine()
    _fill(m, 50, 1000)
    budget = ReadBudget(20_000)
    pages = [
        m.sm.read(kv.RangeRequest(key=b"k", range_end=b"k\xff", header=header()), NOW, budget)
        for _ in range(300)
    ]
    assert budget.exceeded and budget.remaining >= 0
    assert sum(_bytes_of(p) for p in pages) <= 20_000
    assert pages[0].more and all(not p.kvs for p in pages[2:])


def test_a_key_larger_than_a_page_is_read_in_a_txn_when_the_bound_allows() -> None:
    m = history_machine()  # the default bound (16 MiB) is above a page (3 MiB)
    big = b"B" * (SCAN_BYTES_MAX + 1)
    m.apply(put(b"a", big), put(b"b", big))
    response = m.one(txn([], [op_read(b"", b"\x00")]))
    assert response.header.code == Code.SUCCESS and m.sm.last_rejections == {}
    first = response.responses[0].response_range  # type: ignore[attr-defined]
    assert [x.key for x in first.kvs] == [b"a"] and first.more


def test_prev_kvs_over_the_bound_are_refused_before_logging_and_bounded_in_apply() -> None:
    bound = 20_000
    m = history_machine(response_bytes_max=bound)
    keys = _fill(m, 10, 4000)  # 40 KB of values, twice the bound
    before = dump(m.sm)
    wide = txn([], [op_put(k, b"new", prev_kv=True) for k in keys])
    span = delete(b"", b"\xff", prev=True)
    for command in (wide, span):
        command.timestamp_ms = NOW
        with pytest.raises(ResourceLimitError, match="prev_kv"):
            m.sm.check(command)  # a dry run: it wrote nothing
        assert dump(m.sm) == before
    narrow = txn([], [op_put(k, b"new", prev_kv=True) for k in keys[:3]])
    narrow.timestamp_ms = NOW
    m.sm.check(narrow)  # fits: no error
    m.sm.check(delete(b"", b"\xff"))  # no prev_kv: nothing to bound
    # Should values grow between the check and the apply, apply still applies everything (its
    # decision cannot depend on the flag) and leaves out the previous values past the bound.
    response = m.one(wide)
    assert isinstance(response, kv.TxnResponse) and response.header.code == Code.SUCCESS
    assert response.ByteSize() <= bound + 1024
    carried = [r.response_put.prev_kv.value for r in response.responses]
    assert 0 < sum(1 for v in carried if v) < len(keys)
    assert all(m.get(k).kvs[0].value == b"new" for k in keys)
    assert without_position(replay(m.log, response_bytes_max=10**9)) == without_position(m.sm)
