"""The applier seam: how a logged command changes a range, whatever protocol it came from.

The range knows no protocol. Its state machine (`range.state_machine`) owns the applied
position, the seal of a split and the total `apply_batch`; each logged command it hands to the
`Applier` registered for it, with an `ApplyContext` over the range's store. BookKeeper's table
ops (`range.bookkeeper_apply`), sessions (`range.session_apply`) and each front-end's writes
(`etcd.apply`, `oxia.apply`, ...) are appliers. `main` builds one `Appliers` registry holding
all of them (`tablekeeper_server.appliers.server_appliers`) and passes it down to every range,
follower and split: it never depends on flags, so replay always finds the applier of every
command ever logged.

How a command reaches its applier: a `WalCommand`'s `op` names it. The ops of the first
protocols have their own fields (`put`, `txn`, `session`, `etcd_txn`, `oxia_write`, ...); an
applier claims them in `ops`. A new front-end adds no field: it logs `front_end_command(name,
payload)` (`WalCommand.front_end`: its applier's `name` and its own opaque bytes), and the
registry hands it to the applier of that `name`. On its hot path a front-end may queue a
`FrontEndCommand` instead (the same record in the log, without a message made per write, with
what the front-end decoded of its payload); an applier that also takes payloads
(`PayloadApplier`) is then handed the payload and that decoding, any other the message.

What an applier may do (the contract; `tests/unit/test_apply_seam.py` holds a toy applier to it):

- **Determinism.** The result and every change may depend only on the store as the context shows
  it, the command (including `ctx.now_ms`, the time the range accepted it, and
  `ctx.revision`, its log sequence number) and the range's settings. Never on the clock, a
  random number, a flag of this server or anything outside the range: replay, on this server or
  another, and after any restart, must rebuild the same keys, versions, revisions, events and
  responses.
- **Revisions.** Every key a command writes gets the command's revision (`ctx.revision`) as its
  mod revision; a command writes each key at most once (collect the writes, then stage them),
  except as "Events of its own" below says.
- **Staging.** `ctx.get`/`get_live` read the store plus what earlier commands of the batch and
  this command staged. `ctx.stage_writes(writes)` stages a command's table-key writes (store key
  -> new record, None = delete): each one is recorded as a change event (watchers, history) and
  keeps the session index in step (`ctx.leases`). `ctx.put`/`ctx.delete` stage a bookkeeping
  key (under `core.keys.SYSTEM_PREFIX`) without an event. Nothing reaches the store until the
  command returns: the state machine then settles it into the batch's one atomic store write,
  together with the applied position.
- **Scans.** `ctx.scan` reads the store only, so it needs what earlier commands of the batch
  settled to be written first: call `ctx.write_settled()` before scanning, and before staging
  anything of this command (its staged writes cannot be written early). Keep this command's
  own writes in an overlay of your own while you scan (see `etcd.apply`).
- **Refusing.** Return `Rejected(error)` to refuse a command: nothing it staged is kept, and the
  caller gets `error` (a `TableKeeperError`) instead of a response. A protocol's own refusals
  (etcd's "lease not found", Oxia's UNEXPECTED_VERSION_ID) are results, not rejections: they
  travel in the applier's response, which the front-end reads.
- **Exceptions.** An exception from `apply` (a defect, or a record no validation stopped) rolls
  the command back (`ctx.rollback`: nothing it staged is kept, its events and session count are
  forgotten) and the command is answered `error_response(command, INTERNAL_SERVER_ERROR)`; the
  batch goes on. The same record gets the same answer on every replay, so it can never wedge a
  range. Only a failure of the store itself (`ctx.store_failure` set), MemoryError or
  RecursionError propagates and stops the range.
- **Sessions.** A session is created and ended by the session applier's commands only
  (`WalCommand.session`); an applier makes a key ephemeral by setting `ctx.leases[key] =
  session_id` before `stage_writes` (0 detaches it), checks that a session exists with
  `ctx.session_exists`, and reads a key's session with `ctx.session_of`. Ending a session
  deletes its ephemeral keys through `stage_writes`, so their events reach every watcher. An
  applier that keeps ephemeral state of its own ends it in the same command through the
  session applier's `session_ending` hooks (`range.session_apply.SessionEnding`; the ZooKeeper
  front-end's ephemeral nodes, whose parents change with them).
- **Events of its own.** An applier whose command changes a key more than once (a ZooKeeper
  multi), or whose events must come in its own order, stages with `ctx.put`/`ctx.delete` and
  reports each change with `ctx.record_event`, in order.
- **Results.** `apply` returns a protobuf message with a `header` (a
  `bookkeeper.proto.kv.rpc.ResponseHeader`: SUCCESS unless the range itself failed the command)
  and whatever the front-end needs besides; the range passes it back to the front-end's
  `Range.execute` untouched and never looks inside (see `Response`).
- **Before the log.** `check(command, context)` may refuse a command before it is logged (raise
  a `TableKeeperError`); `context()` makes a throwaway context over the applied state (nothing
  staged on it is written). It runs for every command on the write path: return at once when
  there is nothing to check.
- **History.** `keeps_history`: whether its commands' change events also go into the range's
  durable event history (`range.events`), from which watches resume at a past revision. They
  always reach the range's live watchers. An applier whose protocol never watches from the past
  says False: its commands then cost no history write, and the history answers any watch from
  their revision or before "compacted" (it does not hold them).
- **Splits.** `refuse_split(ctx, seal)` says why the range cannot be sealed for `seal` (the
  applier keeps bookkeeping a split cannot divide between the children by pkey), or None.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import SYSTEM_PREFIX, system_key
from tablekeeper_server.core.varint import length
from tablekeeper_server.errors import Code, TableKeeperError
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.records import StoredRecord, decode_record, encode_number
from tablekeeper_server.range.session_keys import members_prefix, owner_key, session_key
from tablekeeper_server.storage.api import KvStore, WriteBatch

APPLIED_KEY = system_key(b"applied-sequence")
"""The store's applied position: the sequence number of the last command it contains."""
_APPLIED = struct.Struct(">q")

FRONT_END_OP = "front_end"
"""The `WalCommand` op that carries a front-end's own command (see `front_end_command`)."""


def front_end_command(applier: str, payload: bytes) -> wal_pb2.WalCommand:
    """The command that logs `payload` for the applier registered under the name `applier`: the
    log needs no new field for a new protocol (the range never reads `payload`)."""
    command = wal_pb2.WalCommand()
    front_end = command.front_end  # set in place: half the cost of building it from kwargs
    front_end.applier = applier
    front_end.payload = payload
    if not applier and not payload:
        front_end.SetInParent()  # (an empty one is still a front-end command)
    return command


class FrontEndCommand:
    """A front-end's command on its way to the log and the apply, without a `WalCommand`
    message: what `front_end_command(applier, payload)` logs, with its `timestamp_ms` (set by
    the range when it accepts it). `SerializeToString` gives exactly that message's bytes (the
    log holds the same records, and replay reads them as `WalCommand`s), and the state machine
    hands `payload` straight to an applier that takes it (`PayloadApplier`; any other gets the
    message, `message()`).

    `prepared` is what the front-end already decoded from `payload` to check it, for its
    applier to use instead of decoding it again: it is never logged, so it must be exactly what
    the applier would decode from `payload` (replay passes None). One is made per write: making
    the slotted object costs about a third of making the message, and the range reads its
    fields without protobuf's accessors."""

    __slots__ = ("applier", "payload", "prepared", "timestamp_ms")

    def __init__(self, applier: str, payload: bytes, prepared: object = None) -> None:
        self.applier = applier
        self.payload = payload
        self.prepared = prepared
        self.timestamp_ms = 0

    def SerializeToString(self) -> bytes:  # noqa: N802
        """The bytes of `message()` (protobuf's encoding, field by field, in field order)."""
        payload = self.payload
        applier = _APPLIER_FIELDS.get(self.applier)
        if applier is None:
            applier = _APPLIER_FIELDS[self.applier] = _applier_field(self.applier)
        size = len(payload)
        if size:
            head = applier + _PAYLOAD_TAG + length(size)
            size += len(head)
        else:
            head = applier
            size = len(head)
        body = _FRONT_END_TAG + length(size) + head
        timestamp = self.timestamp_ms
        if not timestamp:
            return body + payload
        field = _TIMESTAMP_FIELD.get(timestamp)
        if field is None:  # (the commands of one submission share their timestamp)
            _TIMESTAMP_FIELD.clear()
            field = wal_pb2.WalCommand(timestamp_ms=timestamp).SerializeToString()
            _TIMESTAMP_FIELD[timestamp] = field  # (protobuf's varint: faster than ours)
        return field + body + payload

    def message(self) -> wal_pb2.WalCommand:
        """The command as a `WalCommand` (for what takes only messages)."""
        command = front_end_command(self.applier, self.payload)
        command.timestamp_ms = self.timestamp_ms
        return command


Command = wal_pb2.WalCommand | FrontEndCommand
"""What a range queues, logs and applies: a message, or a front-end's command without one."""

_FRONT_END_TAG = b"\xba\x01"
"""`WalCommand.front_end` (field 23, length-delimited)."""
_PAYLOAD_TAG = b"\x12"
"""`FrontEndCommand.payload` (field 2, length-delimited)."""
_APPLIER_FIELDS: dict[str, bytes] = {}
"""Each applier name's `FrontEndCommand.applier` field, encoded."""


def _applier_field(applier: str) -> bytes:
    name = applier.encode()
    return b"\x0a" + length(len(name)) + name if name else b""


_TIMESTAMP_FIELD: dict[int, bytes] = {}
"""The last timestamp a `FrontEndCommand` serialized, and its field's bytes."""


def encode_applied(sequence: int) -> bytes:
    return _APPLIED.pack(sequence)


def decode_applied(raw: bytes) -> int:
    return int(_APPLIED.unpack(raw)[0])


def applied_sequence(store: KvStore) -> int:
    """The sequence number of the last command `store` contains (0: none)."""
    raw = store.get(APPLIED_KEY)
    return 0 if raw is None else decode_applied(raw)


class Response(Protocol):
    """What applying one command answers: a protobuf message whose `header.code` is the range's
    status code for it (SUCCESS unless the range refused or failed it). Everything else in it
    is its applier's, opaque to the range (BookKeeper's responses, etcd's `ApplyResult`, ...)."""

    @property
    def header(self) -> kv_rpc_pb2.ResponseHeader: ...

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...  # noqa: N802


def failure_of(response: Response) -> TableKeeperError | None:
    """The error to answer for a response the range failed (its header's code is not
    SUCCESS: the command changed nothing), or None. For front-ends whose applier answers their
    protocol's own results, which the range's codes are not part of."""
    code = response.header.code
    if code == 0:
        return None
    name = Code.Name(code) if code in Code.values() else str(code)
    return TableKeeperError(f"the range could not apply the write ({name}); it changed nothing")


class Rejected:
    """An applier's refusal of a command: it changes nothing (what it staged is rolled back) and
    its caller gets `error` instead of a response (the response is then the applier's
    `error_response` with the error's code)."""

    __slots__ = ("error",)

    def __init__(self, error: TableKeeperError) -> None:
        self.error = error


@dataclass(frozen=True, slots=True)
class RangeSettings:
    """What a range's commands may depend on besides the store and the command: fixed when the
    range opens, the same on every replay of the range."""

    ttl_ms: int = 0
    """The table's TTL: keys written without their own expire this long after their command
    (0: never). Only BookKeeper's ops honour it."""
    response_bytes_max: int = 16 * 1024 * 1024
    """Bytes of keys and values one response may carry (the server's `--max-response-bytes`).
    A write is never refused for it at apply time (the flag may differ on replay): an applier
    bounds what it returns instead."""


class ApplyContext:
    """The range's state during one apply batch: the store plus this batch's not-yet-written
    changes, and the command being applied (`previous`, `revision`, `now_ms`).

    Each command's changes are *staged* (`put`, `delete`, `stage_writes`) and join the batch
    only when the state machine `settle`s the command; `rollback` forgets them, so a command
    that fails half-way changes nothing. `store_failure` is set when the store itself failed (a
    read or the write): that is no property of the command, so it must not be answered as one.

    `begin`, `settle`, `rollback` and `commit` are the state machine's; an applier calls the
    others (see the module's docstring for the contract).
    """

    def __init__(
        self,
        store: KvStore,
        history: EventHistory | None,
        sessions: int,
        settings: RangeSettings | None = None,
    ) -> None:
        self._store = store
        self.history = history
        """The range's event history (None: it keeps none). An applier may `compact` it."""
        self.settings = settings or RangeSettings()
        self.sessions = sessions
        """Live sessions; while there are none, writes skip the ephemeral-key index. The
        session applier counts them."""
        self.leases: dict[bytes, int] = {}
        """The session each key of the current command's puts belongs to (0: none), read by
        `stage_writes`; cleared by it, `settle` and `rollback`."""
        self.previous = 0
        """The sequence number of the command before this one (what `write_settled` records)."""
        self.revision = 0
        """The current command's sequence number: the revision of every key it writes."""
        self.now_ms = 0
        """The time the range accepted the current command (`WalCommand.timestamp_ms`)."""
        self.keep_history = True
        """Whether the current command's events go into the history (its applier's
        `keeps_history`; set by the state machine)."""
        self.pending: dict[bytes, StoredRecord | None] = {}
        self.read_cache: dict[bytes, StoredRecord | None] = {}
        self.batch: WriteBatch = store.new_batch()
        self.dirty = False
        """Changes not yet written to the store (staged or settled)."""
        self.events: list[ChangeEvent] = []
        """The batch's change events, in order (settled and the current command's)."""
        self.event_revision = 0
        self.event_index = 0
        self.store_failure: BaseException | None = None
        # The current command's staged writes, and how to undo them in `pending`.
        self._staged: list[tuple[bytes, bytes | None]] = []
        self._undo: dict[bytes, tuple[bool, StoredRecord | None]] = {}
        self._settled_dirty = False
        self._settled_events = 0
        self._settled_sessions = sessions
        self._settled_event_position = (0, 0)

    # ------------------------------------------------------------------ for appliers

    def get(self, key: bytes) -> StoredRecord | None:
        """The record of store key `key` as this batch left it so far (expired ones too)."""
        if key in self.pending:
            return self.pending[key]
        if key in self.read_cache:
            return self.read_cache[key]
        try:
            raw = self._store.get(key)
            record = None if raw is None else decode_record(raw)
        except BaseException as exc:
            self.store_failure = exc
            raise
        self.read_cache[key] = record
        return record

    def get_live(self, key: bytes, now_ms: int) -> StoredRecord | None:
        """`get`, with a key expired at `now_ms` read as missing."""
        record = self.get(key)
        if record is None or not record.is_live(now_ms):
            return None
        return record

    def put(self, key: bytes, record: StoredRecord) -> None:
        """Stage `record` under `key` (no change event: for bookkeeping keys)."""
        raw = record.encode()  # a record that cannot be stored fails here, before any change
        self._remember(key)
        self.pending[key] = record
        self._staged.append((key, raw))
        self.dirty = True

    def delete(self, key: bytes) -> None:
        """Stage the deletion of `key` (no change event: for bookkeeping keys)."""
        self._remember(key)
        self.pending[key] = None
        self._staged.append((key, None))
        self.dirty = True

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        """The store's records in [start, end), in key order. Only valid when nothing is
        pending: call `write_settled` first (and before staging anything)."""
        assert not self.dirty, "scan with uncommitted changes"
        try:
            for key, raw in self._store.scan(start, end):
                yield key, decode_record(raw)
        except GeneratorExit:
            raise
        except BaseException as exc:
            self.store_failure = exc
            raise

    def write_settled(self) -> None:
        """Write what earlier commands of this batch settled (with their applied position), so
        that `scan` sees it. Call it before staging anything of the current command."""
        if self.dirty:
            self.commit(self.previous)

    def stage_writes(self, writes: dict[bytes, StoredRecord | None]) -> None:
        """Stage a command's collected writes (store key -> new record, None = delete) at its
        revision. Each change of a table key (outside `SYSTEM_PREFIX`) is recorded as a
        `ChangeEvent` (a delete of an already expired key is not: watchers never saw it live),
        and the ephemeral-key index follows `leases` (a put without one detaches the key)."""
        revision, now = self.revision, self.now_ms
        for key, record in writes.items():
            if key[:1] != SYSTEM_PREFIX:
                prev = self.get(key)
                if prev is not None and not prev.is_live(now):
                    prev = None
                if record is not None or prev is not None:
                    self._record_event(revision, key, record, prev)
            if record is None:
                self.delete(key)
            else:
                self.put(key, record)
            if self.sessions and key[:1] != SYSTEM_PREFIX:
                lease = self.leases.get(key, 0) if record is not None else 0
                self._index_lease(key, lease, revision)
        self.leases.clear()

    def record_event(
        self, key: bytes, record: StoredRecord | None, prev: StoredRecord | None
    ) -> None:
        """Report one change of table key `key` at the current command's revision (`record`:
        its new record, None for a delete; `prev`: its record before this change), for an
        applier that stages its writes with `put`/`delete` and reports its changes itself:
        one event per change, in the order they happened, a key changed twice in one command
        reported twice (`stage_writes` reports one per key). The events reach watchers and the
        history only if the command completes."""
        self._record_event(self.revision, key, record, prev)

    def session_exists(self, session_id: int) -> bool:
        """Whether `session_id` is a live session of this range."""
        return self.get(session_key(session_id)) is not None

    def session_of(self, key: bytes) -> int:
        """The session the ephemeral key `key` belongs to (0: none), as staged so far."""
        if not self.sessions:
            return 0
        owner = self.get(owner_key(key))
        return 0 if owner is None else owner.number

    # ------------------------------------------------------------------ for the state machine

    def begin(self, previous: int, revision: int, now_ms: int) -> None:
        """The next command to apply: its sequence number, its predecessor's and its time."""
        self.previous, self.revision, self.now_ms = previous, revision, now_ms

    def settle(self) -> None:
        """The current command is applied: move its staged changes and events into the batch."""
        for key, raw in self._staged:
            if raw is None:
                self.batch.delete(key)
            else:
                self.batch.put(key, raw)
        history = self.history
        if history is not None and len(self.events) > self._settled_events:
            if self.keep_history:
                for event in self.events[self._settled_events :]:
                    history.append(self.batch, event)
            else:
                history.forget(self.events[-1].revision)
        self._settled_dirty = self._settled_dirty or bool(self._staged)
        self._staged.clear()
        self._undo.clear()
        self.leases.clear()
        self._settled_events = len(self.events)
        self._settled_sessions = self.sessions
        self._settled_event_position = (self.event_revision, self.event_index)

    def rollback(self) -> None:
        """Forget everything the current command staged, as if it had never run."""
        for key, (was_pending, record) in self._undo.items():
            if was_pending:
                self.pending[key] = record
            else:
                self.pending.pop(key, None)
        self._staged.clear()
        self._undo.clear()
        self.leases.clear()
        del self.events[self._settled_events :]
        self.sessions = self._settled_sessions
        self.event_revision, self.event_index = self._settled_event_position
        self.dirty = self._settled_dirty

    def commit(self, applied_sequence: int, *, last: bool = False) -> None:
        """Write the settled changes together with the applied position, atomically. Called
        between commands, or (through `write_settled`) by a command before it staged anything.
        `last`: the batch ends here (the context takes no more changes, so it makes no new
        store batch for them)."""
        assert not self._staged, "commit with a command's changes staged"
        self.batch.put(APPLIED_KEY, encode_applied(applied_sequence))
        try:
            if self.history is not None:
                self.history.seal(self.batch)
            self._store.write(self.batch)
        except BaseException as exc:
            self.store_failure = exc
            raise
        self.pending.clear()
        self.read_cache.clear()
        if not last:
            self.batch = self._store.new_batch()
        self.dirty = False
        self._settled_dirty = False

    # ------------------------------------------------------------------ internals

    def _remember(self, key: bytes) -> None:
        if key not in self._undo:
            self._undo[key] = (key in self.pending, self.pending.get(key))

    def _record_event(
        self, revision: int, key: bytes, record: StoredRecord | None, prev: StoredRecord | None
    ) -> None:
        if revision != self.event_revision:
            self.event_revision, self.event_index = revision, 0
        event = ChangeEvent(revision, self.event_index, key, record, prev)
        self.event_index += 1
        self.events.append(event)  # written to the history when the command settles

    def _index_lease(self, key: bytes, lease: int, revision: int) -> None:
        """Keep the ephemeral-key index of `key` in step with its latest write: a put replaces
        the key's session (0 = none, etcd's semantics), a delete removes it."""
        owner = owner_key(key)
        record = self.get(owner)
        old = record.number if record is not None else 0
        if old == lease:
            return
        if old:
            self.delete(owner)
            self.delete(members_prefix(old) + key)
        if lease:
            self.put(owner, number_record(revision, lease))
            self.put(members_prefix(lease) + key, StoredRecord(0, revision, 0, False, 0, b""))


def number_record(revision: int, value: int) -> StoredRecord:
    """A bookkeeping record holding the number `value`, written at `revision`."""
    return StoredRecord(0, revision, 0, True, 0, encode_number(value))


class Applier(Protocol):
    """Applies one protocol's logged commands to a range (see the module's docstring for what
    it may do). One instance serves every range of the server: it keeps no state of its own
    between calls; everything of a range is in the `ApplyContext`."""

    @property
    def name(self) -> str:
        """Its registered name: the `applier` of its `WalCommand.front_end` commands."""
        ...

    @property
    def ops(self) -> tuple[str, ...]:
        """The `WalCommand` op fields it applies besides `front_end` (the first protocols have
        their own fields; a new front-end claims none)."""
        ...

    @property
    def keeps_history(self) -> bool:
        """Whether its commands' change events go into the range's durable event history (see
        the module's docstring); they reach live watchers either way."""
        ...

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        """Apply `command` at `ctx.revision` (at `ctx.now_ms`) and return its response."""
        ...

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        """A bare response of `command`'s kind with the range's status `code` (the answer to a
        command the range refused or that failed)."""
        ...

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        """Refuse `command` before it is logged by raising a `TableKeeperError`, or return.
        `context()` makes a throwaway context over the applied state (nothing staged on it is
        written); make one only when needed (this runs for every command)."""
        ...

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        """Why the range cannot be sealed for `seal` (see `range.split`), or None. Called with
        the batch's settled changes written (`ctx.scan` works)."""
        ...


@runtime_checkable
class PayloadApplier(Protocol):
    """A front-end's applier that also takes its commands as `FrontEndCommand`s: their
    payload, and what the front-end decoded of it (`FrontEndCommand.prepared`; None on
    replay), with no `WalCommand` made. Both methods must do exactly what `apply` and `check`
    do with the message that carries the payload."""

    @property
    def keeps_history(self) -> bool: ...

    def apply_payload(
        self, ctx: ApplyContext, payload: bytes, prepared: object
    ) -> Response | Rejected: ...

    def check_payload(self, payload: bytes, context: Callable[[], ApplyContext]) -> None: ...


class Appliers:
    """The registry of appliers: which one applies each logged command. Built once, in `main`
    (`tablekeeper_server.appliers.server_appliers`), with every applier whatever the flags
    say, and shared by every range of the server."""

    def __init__(self, appliers: Iterable[Applier]) -> None:
        self._all = tuple(appliers)
        self._by_op: dict[str, Applier] = {}
        self._by_name: dict[str, Applier] = {}
        self._payload: dict[str, PayloadApplier] = {}
        for applier in self._all:
            if applier.name in self._by_name:
                raise ValueError(f"two appliers are named {applier.name!r}")
            self._by_name[applier.name] = applier
            if isinstance(applier, PayloadApplier):
                self._payload[applier.name] = applier
            for op in applier.ops:
                if op == FRONT_END_OP or op in self._by_op:
                    raise ValueError(f"the op {op!r} cannot be {applier.name!r}'s")
                self._by_op[op] = applier

    def __iter__(self) -> Iterator[Applier]:
        return iter(self._all)

    def for_command(self, command: wal_pb2.WalCommand) -> Applier | None:
        """The applier of `command`, or None when no registered applier claims it."""
        return self.for_op(command.WhichOneof("op"), command)

    def for_op(self, op: str | None, command: wal_pb2.WalCommand) -> Applier | None:
        """`for_command`, given the command's op (`command.WhichOneof("op")`)."""
        if op == FRONT_END_OP:
            return self._by_name.get(command.front_end.applier)
        return self._by_op.get(op) if op is not None else None

    def named(self, name: str) -> Applier:
        return self._by_name[name]

    def taking_payload(self, name: str) -> PayloadApplier | None:
        """The applier registered under `name` if it takes `FrontEndCommand`s' payloads
        (`PayloadApplier`), else None (it is given their `message()`)."""
        return self._payload.get(name)
