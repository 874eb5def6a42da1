"""The applier seam (`range.apply`): a front-end's applier, registered beside the server's own,
gets its `WalCommand.front_end` commands, and the state machine holds it to the contract (its
changes are staged, settled or rolled back whole, reported as events, replayed to the same state;
sessions it attaches keys to end with them)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import store_key
from tablekeeper_server.errors import Code, CompactedError, IllegalOpError
from tablekeeper_server.etcd.apply import EtcdApplier
from tablekeeper_server.oxia.apply import OxiaApplier
from tablekeeper_server.range.apply import (
    Appliers,
    ApplyContext,
    FrontEndCommand,
    Rejected,
    Response,
    front_end_command,
)
from tablekeeper_server.range.bookkeeper_apply import BookKeeperApplier
from tablekeeper_server.range.events import EventHistory, iter_history
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.session_apply import SessionApplier
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.range.watch import KeySpan, WatchHub
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000


class CounterApplier:
    """A toy protocol: a payload `name[@session]` adds one to the counter `name` (a table key
    of pkey b"c", made ephemeral with the session); `boom` raises; `no` is refused."""

    name = "counter"
    ops: tuple[str, ...] = ()
    keeps_history = True

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        payload = command.front_end.payload
        if payload == b"boom":
            ctx.put(store_key(b"c", b"half-done"), StoredRecord(0, ctx.revision, 0, False, 0, b""))
            raise RuntimeError("a defect")
        if payload == b"no":
            ctx.put(store_key(b"c", b"half-done"), StoredRecord(0, ctx.revision, 0, False, 0, b""))
            return Rejected(IllegalOpError("no"))
        name, _, session = payload.partition(b"@")
        key = store_key(b"c", name)
        prev = ctx.get(key)
        count = 1 if prev is None else int(prev.value) + 1
        create = ctx.revision if prev is None else prev.create_revision
        record = StoredRecord(create, ctx.revision, count - 1, False, 0, b"%d" % count)
        if session:
            if not ctx.session_exists(int(session)):
                return kv_rpc_pb2.PutResponse(
                    header=kv_rpc_pb2.ResponseHeader(code=Code.ILLEGAL_OP)
                )
            ctx.leases[key] = int(session)
        ctx.stage_writes({key: record})
        return kv_rpc_pb2.PutResponse(header=kv_rpc_pb2.ResponseHeader())

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        return kv_rpc_pb2.PutResponse(header=kv_rpc_pb2.ResponseHeader(code=code))  # type: ignore[arg-type]

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        if command.front_end.payload == b"":
            raise IllegalOpError("an empty counter name")

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        return "counters stay put"


def appliers() -> Appliers:
    return Appliers(
        [BookKeeperApplier(), EtcdApplier(), OxiaApplier(), SessionApplier(), CounterApplier()]
    )


def machine(store: MemoryKvStore | None = None) -> RangeStateMachine:
    store = store or MemoryKvStore()
    return RangeStateMachine(store, appliers(), history=EventHistory(store))


def count(command: bytes) -> wal_pb2.WalCommand:
    command_ = front_end_command("counter", command)
    command_.timestamp_ms = NOW
    return command_


def dump(sm: RangeStateMachine) -> list[tuple[bytes, bytes]]:
    return list(sm.store.scan(b"", b"\xff" * 8))


def test_a_front_end_command_reaches_its_applier_and_replays_to_the_same_state() -> None:
    sm = machine()
    log = [(1, count(b"a")), (2, count(b"a")), (3, count(b"b"))]
    responses = sm.apply_batch(log)
    assert [r.header.code for r in responses] == [Code.SUCCESS] * 3
    assert sm.get(store_key(b"c", b"a")) == StoredRecord(1, 2, 1, False, 0, b"2")
    assert [(e.revision, e.key) for e in sm.last_events] == [
        (1, store_key(b"c", b"a")),
        (2, store_key(b"c", b"a")),
        (3, store_key(b"c", b"b")),
    ]
    replayed = machine()
    for sequence, command in log:  # one at a time: the batching does not matter
        replayed.apply_batch([(sequence, command)])
    assert dump(replayed) == dump(sm)
    assert replayed.apply_batch(log)[0].header.code == Code.SUCCESS  # applied: skipped
    assert dump(replayed) == dump(sm)


def test_an_applier_that_raises_or_refuses_changes_nothing_and_the_batch_goes_on() -> None:
    sm = machine()
    responses = sm.apply_batch([(1, count(b"a")), (2, count(b"boom")), (3, count(b"no"))])
    assert [r.header.code for r in responses] == [
        Code.SUCCESS,
        Code.INTERNAL_SERVER_ERROR,
        IllegalOpError.code,
    ]
    assert isinstance(sm.last_rejections[2], IllegalOpError)
    assert sm.get(store_key(b"c", b"half-done")) is None
    assert sm.applied_sequence == 3
    assert [e.revision for e in sm.last_events] == [1]


def test_keys_an_applier_attaches_to_a_session_end_with_it() -> None:
    sm = machine()
    create = wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=5000))
    sm.apply_batch([(1, create), (2, count(b"a@1")), (3, count(b"b@77"))])
    assert sm.get(store_key(b"c", b"a")) is not None
    assert sm.get(store_key(b"c", b"b")) is None  # no session 77: the applier refused the put
    close = wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=1))
    sm.apply_batch([(4, close)])
    assert sm.get(store_key(b"c", b"a")) is None
    assert [(e.revision, e.record) for e in sm.last_events] == [(4, None)]


def test_check_runs_before_the_log_and_an_applier_may_refuse_a_split() -> None:
    sm = machine()
    with pytest.raises(IllegalOpError):
        sm.check(count(b""))
    sm.check(count(b"a"))
    assert sm.applied_sequence == 0  # a check changes nothing
    seal = wal_pb2.WalCommand(seal=wal_pb2.RangeSeal(children=[2, 3], start_hashes=[0, 1]))
    sm.apply_batch([(1, seal)])
    assert isinstance(sm.last_rejections[0], IllegalOpError)
    assert "counters stay put" in sm.last_rejections[0].message
    assert sm.sealed is None


def test_a_command_no_applier_claims_is_refused_as_a_bad_request() -> None:
    sm = RangeStateMachine(MemoryKvStore(), APPLIERS)  # the server's: no "counter" applier
    (response,) = sm.apply_batch([(1, count(b"a"))])
    assert response.header.code == Code.BAD_REQUEST
    assert sm.applied_sequence == 1


def test_the_registry_refuses_two_appliers_of_one_name_or_op() -> None:
    with pytest.raises(ValueError, match="named"):
        Appliers([CounterApplier(), CounterApplier()])

    class Thief(CounterApplier):
        name = "thief"
        ops = ("put",)

    with pytest.raises(ValueError, match="put"):
        Appliers([BookKeeperApplier(), Thief()])


def test_a_session_ending_hook_ends_an_appliers_own_state_in_the_same_command() -> None:
    """`SessionApplier(session_ending=...)`: a hook scans before anything is staged, its finisher
    stages after the session's keys, and `record_event` reports the applier's own changes."""
    seen: list[tuple[int, list[bytes]]] = []
    mine = store_key(b"c", b"mine")

    def ending(ctx: ApplyContext, session_id: int) -> Callable[[], None] | None:
        seen.append((session_id, [key for key, _ in ctx.scan(mine, mine + b"\x00")]))
        if ctx.get(mine) is None:
            return None

        def finish() -> None:
            prev = ctx.get(mine)
            ctx.delete(mine)
            ctx.record_event(mine, None, prev)

        return finish

    store = MemoryKvStore()
    sm = RangeStateMachine(
        store,
        Appliers([BookKeeperApplier(), CounterApplier(), SessionApplier(session_ending=(ending,))]),
        history=EventHistory(store),
    )
    create = wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=5000))
    sm.apply_batch([(1, create), (2, create), (3, count(b"mine")), (4, count(b"a@1"))])
    close = wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=1))
    sm.apply_batch([(5, close)])
    assert seen == [(1, [mine])]
    assert sm.get(mine) is None and sm.get(store_key(b"c", b"a")) is None
    assert [(e.revision, e.key, e.record) for e in sm.last_events] == [
        (5, store_key(b"c", b"a"), None),
        (5, mine, None),
    ]
    sm.apply_batch([(6, wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=2)))])
    assert seen[-1] == (2, [])  # nothing of its own left: the hook returns None


def test_an_applier_that_keeps_no_history_reaches_live_watchers_only() -> None:
    class Forgetful(CounterApplier):
        name = "forgetful"
        keeps_history = False

    store = MemoryKvStore()
    registry = Appliers([SessionApplier(), CounterApplier(), Forgetful()])
    sm = RangeStateMachine(store, registry, history=EventHistory(store))
    forget = front_end_command("forgetful", b"b")
    forget.timestamp_ms = NOW
    sm.apply_batch([(1, count(b"a")), (2, forget), (3, forget), (4, count(b"a"))])
    assert [e.revision for e in sm.last_events] == [1, 2, 3, 4]  # live watchers get every one
    assert [e.revision for e in iter_history(store)] == [1, 4]
    assert sm.get(store_key(b"c", b"b")) == StoredRecord(2, 3, 1, False, 0, b"2")
    reopened = EventHistory(store)
    assert reopened.trimmed_through == 3  # recorded with the batch
    hub = WatchHub("r")
    hub.attach(reopened, sm.applied_sequence)
    span = KeySpan(store_key(b"c", b""), store_key(b"d", b""))
    with pytest.raises(CompactedError):
        hub.start(span, 3)  # revision 3's events were never kept
    hub.start(span, 4)


@pytest.mark.parametrize("applier", ["", "counter", "x" * 200])
@pytest.mark.parametrize("payload", [b"", b"\x00", b"p" * 127, b"q" * 128, b"r" * 70_000])
@pytest.mark.parametrize("timestamp", [0, 1, 127, 128, NOW, 2**63 - 1, -1, -(2**63)])
def test_a_front_end_command_without_a_message_serializes_as_the_message(
    applier: str, payload: bytes, timestamp: int
) -> None:
    command = FrontEndCommand(applier, payload)
    command.timestamp_ms = timestamp
    message = front_end_command(applier, payload)
    message.timestamp_ms = timestamp
    assert command.SerializeToString() == message.SerializeToString()
    assert wal_pb2.WalCommand.FromString(command.SerializeToString()) == message
    assert command.message() == message


def test_a_front_end_command_without_a_message_reaches_an_applier_of_messages() -> None:
    """An applier that takes no payloads (`PayloadApplier`) gets the command's message: checks,
    applies, refusals and failures as for the message itself."""
    queued, logged = machine(), machine()

    def both(payload: bytes) -> FrontEndCommand:
        command = FrontEndCommand("counter", payload)
        command.timestamp_ms = NOW
        return command

    batch = [both(b"a"), both(b"a"), both(b"no"), both(b"boom"), both(b"b")]
    with pytest.raises(IllegalOpError):
        queued.check(both(b""))
    responses = queued.apply_batch(list(enumerate(batch, start=1)))
    expected = logged.apply_batch(
        [(sequence, command.message()) for sequence, command in enumerate(batch, start=1)]
    )
    assert [r.SerializeToString() for r in responses] == [r.SerializeToString() for r in expected]
    assert list(queued.last_rejections) == [2]
    assert dump(queued) == dump(logged)
    assert queued.get(store_key(b"c", b"a")) == StoredRecord(1, 2, 1, False, 0, b"2")
