"""The range state machine: applies write-ahead-log commands to the range's KvStore.

Applying is deterministic: the result of a command depends only on the store's state, the
command (including the timestamp it was accepted at) and its log sequence number, which is the
revision of every key it writes. Replaying the log from any applied position therefore rebuilds
the same keys, versions and revisions, and produces the same responses.

Every `KvStore.write` also records the sequence number of the last command it contains (the
*applied position*), so a crash between log append and store write loses nothing: recovery
replays the log after the applied position.

Semantics follow BookKeeper's table service, with its known bugs fixed: `expected_version` on
Put is honoured; Delete returns the real number of deleted keys; TTL hides expired keys (instead
of the inverted check); a Txn comparing a missing key answers KEY_NOT_FOUND deterministically.

TableKeeper extensions: CAS delete (`DeleteRangeRequest.expected_version`), per-key TTL
(`PutRequest.ttl_ms`: expiry = command timestamp + ttl) and sequential puts
(`PutRequest.sequential`: a 20-digit counter per pkey, kept in a system key, is appended to the
lkey), sessions (`WalCommand.session`: a session's id is its create command's revision; puts with
`lease` = a session id make ephemeral keys, indexed under system keys and deleted by the session's
close command). Every change is reported as a `ChangeEvent` (`last_events` after `apply_batch`)
and written to the range's event history (`range.events`) in the same store batch.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator, Sequence

from tablekeeper_proto.bookkeeper import kv_pb2, kv_rpc_pb2
from tablekeeper_proto.etcd import apply_pb2 as etcd_apply_pb2
from tablekeeper_proto.oxia import apply_pb2 as oxia_apply_pb2
from tablekeeper_proto.v1 import session_pb2, tablekeeper_pb2, wal_pb2
from tablekeeper_server.core.keys import (
    SEQUENCE_DIGITS,
    SYSTEM_PREFIX,
    pkey_prefix,
    prefix_end,
    split_store_key,
    store_key,
    system_key,
)
from tablekeeper_server.core.routing import RangeRouter
from tablekeeper_server.errors import (
    Code,
    IllegalOpError,
    RangeMovedError,
    ResourceLimitError,
    TableKeeperError,
)
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.records import (
    INT64_MAX,
    StoredRecord,
    decode_record,
    encode_number,
    wrap_int64,
)
from tablekeeper_server.storage.api import KvStore, WriteBatch

log = logging.getLogger(__name__)

APPLIED_KEY = system_key(b"applied-sequence")
_SEQ = struct.Struct(">q")


def sequence_counter_key(pkey: bytes) -> bytes:
    """The system key holding the next sequential-put counter of `pkey`."""
    return system_key(b"seq/" + pkey_prefix(pkey))


SEAL_KEY = system_key(b"sealed")
"""Present once the range is sealed by a split: a record whose value is the `RangeSeal`."""
SESSION_PREFIX = system_key(b"ss/")
_SESSION_ID_STEP = 1 << 48
"""A session's id is its command's revision, or (if a client chose that id before) the first
free one of revision + k * step (deterministic, so replay agrees)."""
_MEMBER_PREFIX = system_key(b"se/")
_OWNER_PREFIX = system_key(b"sk/")
_SESSION_ROLE_PREFIX = system_key(b"sr/")
SESSION_HOME_PREFIX = system_key(b"sh/")
SPLIT_REFUSING_PREFIXES = (system_key(b"etcd-"), system_key(b"oxseq/"))
"""Bookkeeping a split cannot divide between two children by pkey (the etcd and Oxia
front-ends'): a range holding any of it refuses a seal. Sessions move with their pkey (see
`_seal`)."""
SESSION_KEY_PREFIXES = (
    SESSION_PREFIX,
    _SESSION_ROLE_PREFIX,
    SESSION_HOME_PREFIX,
    _MEMBER_PREFIX,
    _OWNER_PREFIX,
)
"""Every system key a session and its ephemeral keys keep (a split moves them together)."""


def session_key(session_id: int) -> bytes:
    """Holds a live session (a number record: its TTL in ms)."""
    return SESSION_PREFIX + _SEQ.pack(session_id)


def session_role_key(session_id: int) -> bytes:
    """Holds the role that created a session (only when authentication named one)."""
    return _SESSION_ROLE_PREFIX + _SEQ.pack(session_id)


def session_home_key(session_id: int) -> bytes:
    """Holds the pkey a session was created for (where its keep-alives are routed)."""
    return SESSION_HOME_PREFIX + _SEQ.pack(session_id)


def session_of_key(key: bytes) -> int | None:
    """The session id a session-bookkeeping key (`SESSION_KEY_PREFIXES`) belongs to, for the
    keys named by session id; None for an owner key (named by the ephemeral key instead)."""
    for prefix in (SESSION_PREFIX, _SESSION_ROLE_PREFIX, SESSION_HOME_PREFIX, _MEMBER_PREFIX):
        if key.startswith(prefix):
            (session_id,) = _SEQ.unpack_from(key, len(prefix))
            return int(session_id)
    return None


def member_store_key(key: bytes) -> bytes | None:
    """The ephemeral key (store key) a member or owner index key names; None for other keys."""
    if key.startswith(_MEMBER_PREFIX):
        return key[len(_MEMBER_PREFIX) + _SEQ.size :]
    if key.startswith(_OWNER_PREFIX):
        return key[len(_OWNER_PREFIX) :]
    return None


def _members_prefix(session_id: int) -> bytes:
    return _MEMBER_PREFIX + _SEQ.pack(session_id)


def _owner_key(key: bytes) -> bytes:
    return _OWNER_PREFIX + key


def _number_record(revision: int, value: int) -> StoredRecord:
    return StoredRecord(0, revision, 0, True, 0, encode_number(value))


# A scan response stops at whichever limit comes first; `more` tells the caller to continue.
SCAN_ROWS_MAX = 10_000
SCAN_BYTES_MAX = 3 * 1024 * 1024
RESPONSE_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
"""What one response may carry unless the server says otherwise (`Limits.response_bytes_max`)."""
ROW_OVERHEAD_BYTES = 48
"""What a returned key costs besides its key and value bytes (revisions, version, framing): so
that a page of many tiny keys is counted too."""

Compare = kv_rpc_pb2.Compare
_Getter = Callable[[bytes], StoredRecord | None]
_Scanner = Callable[[bytes, bytes], Iterator[tuple[bytes, StoredRecord]]]
Response = (
    etcd_apply_pb2.ApplyResult
    | kv_rpc_pb2.PutResponse
    | kv_rpc_pb2.DeleteRangeResponse
    | kv_rpc_pb2.TxnResponse
    | kv_rpc_pb2.IncrementResponse
    | oxia_apply_pb2.ApplyResult
    | session_pb2.SessionResponse
)


def key_span(prefix: bytes, key: bytes, range_end: bytes) -> tuple[bytes, bytes]:
    """The store interval [start, end) of a request's `key`..`range_end` within one pkey.

    `range_end` is inclusive (BookKeeper's semantics). An empty `range_end` means the single key;
    `range_end == b"\\x00"` means "to the end of the pkey" (etcd's convention, honoured here).
    """
    start = prefix + key
    if not range_end:
        return start, start + b"\x00"
    if range_end == b"\x00":
        return start, prefix_end(prefix)
    return start, prefix + range_end + b"\x00"


def to_key_value(lkey: bytes, record: StoredRecord, *, keys_only: bool = False) -> kv_pb2.KeyValue:
    kv = kv_pb2.KeyValue(
        key=lkey,
        create_revision=record.create_revision,
        mod_revision=record.mod_revision,
        version=record.version,
        is_number=record.is_number,
        expire_time=record.expire_ms,
    )
    if record.is_number:
        kv.number_value = record.number
    if not keys_only:
        kv.value = record.value
    return kv


_SUCCESS = Code.SUCCESS
"""Looked up once: reading a value off a protobuf enum wrapper is a Python-level call."""


def _header(code: int) -> kv_rpc_pb2.ResponseHeader:
    return kv_rpc_pb2.ResponseHeader(code=code)  # type: ignore[arg-type]


_PUT_SUCCESS = kv_rpc_pb2.PutResponse(header=_header(_SUCCESS))


def _put_success() -> kv_rpc_pb2.PutResponse:
    """A new SUCCESS PutResponse: copied from a template, a fifth of building one (hot path)."""
    response = kv_rpc_pb2.PutResponse()
    response.CopyFrom(_PUT_SUCCESS)
    return response


class _ApplyView:
    """Store state during one apply batch: the store plus this batch's not-yet-written changes.

    Each command's changes are *staged* (`put`, `delete`, `record_event`) and join the batch only
    when the command `settle`s; `rollback` forgets them, so a command that fails half-way
    changes nothing. `store_failure` is set when the store itself failed (a read or the write):
    that is no property of the command, so it must not be answered as one.
    """

    def __init__(self, store: KvStore, history: EventHistory | None, sessions: int) -> None:
        self.store = store
        self.history = history
        self.sessions = sessions
        """Live sessions; while there are none, writes skip the ephemeral-key index."""
        self.leases: dict[bytes, int] = {}
        self.pending: dict[bytes, StoredRecord | None] = {}
        self.read_cache: dict[bytes, StoredRecord | None] = {}
        self.batch: WriteBatch = store.new_batch()
        self.dirty = False
        """Changes not yet written to the store (staged or settled)."""
        self.events: list[ChangeEvent] = []
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

    def get(self, key: bytes) -> StoredRecord | None:
        if key in self.pending:
            return self.pending[key]
        if key in self.read_cache:
            return self.read_cache[key]
        try:
            raw = self.store.get(key)
            record = None if raw is None else decode_record(raw)
        except BaseException as exc:
            self.store_failure = exc
            raise
        self.read_cache[key] = record
        return record

    def record_event(
        self, revision: int, key: bytes, record: StoredRecord | None, prev: StoredRecord | None
    ) -> None:
        if revision != self.event_revision:
            self.event_revision, self.event_index = revision, 0
        event = ChangeEvent(revision, self.event_index, key, record, prev)
        self.event_index += 1
        self.events.append(event)  # written to the history when the command settles

    def get_live(self, key: bytes, now_ms: int) -> StoredRecord | None:
        record = self.get(key)
        if record is None or not record.is_live(now_ms):
            return None
        return record

    def put(self, key: bytes, record: StoredRecord) -> None:
        raw = record.encode()  # a record that cannot be stored fails here, before any change
        self._remember(key)
        self.pending[key] = record
        self._staged.append((key, raw))
        self.dirty = True

    def delete(self, key: bytes) -> None:
        self._remember(key)
        self.pending[key] = None
        self._staged.append((key, None))
        self.dirty = True

    def _remember(self, key: bytes) -> None:
        if key not in self._undo:
            self._undo[key] = (key in self.pending, self.pending.get(key))

    def settle(self) -> None:
        """The current command is applied: move its staged changes and events into the batch."""
        for key, raw in self._staged:
            if raw is None:
                self.batch.delete(key)
            else:
                self.batch.put(key, raw)
        if self.history is not None:
            for event in self.events[self._settled_events :]:
                self.history.append(self.batch, event)
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

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        """Scan the store. Only valid when nothing is pending (callers `commit` first)."""
        assert not self.dirty, "scan with uncommitted changes"
        try:
            for key, raw in self.store.scan(start, end):
                yield key, decode_record(raw)
        except GeneratorExit:
            raise
        except BaseException as exc:
            self.store_failure = exc
            raise

    def commit(self, applied_sequence: int) -> None:
        """Write the settled changes together with the applied position, atomically. Called
        between commands, or by a command before it has staged anything."""
        assert not self._staged, "commit with a command's changes staged"
        self.batch.put(APPLIED_KEY, _SEQ.pack(applied_sequence))
        try:
            if self.history is not None:
                self.history.seal(self.batch)
            self.store.write(self.batch)
        except BaseException as exc:
            self.store_failure = exc
            raise
        self.pending.clear()
        self.read_cache.clear()
        self.batch = self.store.new_batch()
        self.dirty = False
        self._settled_dirty = False


class RangeStateMachine:
    """Applies commands to one range's store. Owned by the range; one caller at a time."""

    def __init__(
        self,
        store: KvStore,
        *,
        ttl_seconds: int = 0,
        history: EventHistory | None = None,
        response_bytes_max: int = RESPONSE_BYTES_MAX_DEFAULT,
    ) -> None:
        self.store = store
        self.ttl_ms = max(0, ttl_seconds) * 1000
        self.response_bytes_max = max(1, response_bytes_max)
        """Bytes of keys and values one Range response, or the reads of one Txn, may carry."""
        raw = store.get(APPLIED_KEY)
        self.applied_sequence: int = 0 if raw is None else int(_SEQ.unpack(raw)[0])
        self.history = history
        self.sessions = sum(1 for _ in store.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX)))
        raw_seal = store.get(SEAL_KEY)
        self.sealed: tuple[int, ...] | None = (
            None
            if raw_seal is None
            else tuple(wal_pb2.RangeSeal.FromString(decode_record(raw_seal).value).children)
        )
        """The children of a range a split sealed (it refuses every command after the seal),
        or None."""
        self.last_events: list[ChangeEvent] = []
        """The changes of the last `apply_batch`, in order (for live watchers)."""
        self.last_rejections: dict[int, TableKeeperError] = {}
        """Commands of the last `apply_batch` (by index) whose caller is to get this error
        instead of the response (which is then a bare response with the error's code). Only a
        command that changed nothing is rejected this way."""
        self._prev_kvs: _PrevKvBudget | None = None
        """What the previous values (`prev_kv`) of the command being applied may still carry."""

    def check_prev_kvs(self, command: wal_pb2.WalCommand) -> None:
        """Refuse, before it is logged, a write whose previous values (`prev_kv` of a
        DeleteRange over a span, or of a txn's puts and deletes) would carry more than
        `response_bytes_max` bytes: `ResourceLimitError`, nothing logged.

        It is a dry run of the command against the applied state, stopped as soon as the
        bound is passed. Apply itself never refuses for it (its decision would depend on the
        server's flag, and replay must reach the same state): should a write between this
        check and the apply make the previous values larger, apply leaves out those past the
        bound, with a warning in the log."""
        if not _asks_prev_kvs(command):
            return
        view = _ApplyView(self.store, None, self.sessions)  # discarded: nothing is written
        self._prev_kvs = _PrevKvBudget(self.response_bytes_max, stop=True)
        try:
            self._apply_one(view, self.applied_sequence, self.applied_sequence + 1, command)
        except _OverBudgetError:
            raise ResourceLimitError(
                f"the previous values (prev_kv) this write would return exceed "
                f"{self.response_bytes_max} bytes (--max-response-bytes); ask without prev_kv, "
                "or delete a smaller span"
            ) from None
        finally:
            self._prev_kvs = None

    # ------------------------------------------------------------------ writes

    def apply_batch(self, commands: Sequence[tuple[int, wal_pb2.WalCommand]]) -> list[Response]:
        """Apply commands in sequence order and return one response per command.

        Commands at or below the applied position are skipped (their response is a bare
        SUCCESS header); this is what makes replay idempotent.

        Apply is total: a command whose apply raises (a defect, or a record no validation
        stopped) changes nothing and is answered INTERNAL_SERVER_ERROR, and the batch goes on;
        the same record gets the same answer on every replay, so it can never wedge a range.
        Only a failure of the store itself (or of memory) propagates: it says nothing about the
        command, and the range must stop instead of answering for it.
        """
        view = _ApplyView(self.store, self.history, self.sessions)
        responses: list[Response] = []
        self.last_rejections = {}
        last = self.applied_sequence
        for index, (sequence, command) in enumerate(commands):
            if sequence <= self.applied_sequence:
                responses.append(_put_success())
                continue
            try:
                response = self._apply_one(view, last, sequence, command)
            except Exception as exc:
                if view.store_failure is not None or isinstance(exc, (MemoryError, RecursionError)):
                    raise
                view.rollback()
                log.exception(
                    "command %d could not be applied; it changes nothing and is answered "
                    "INTERNAL_SERVER_ERROR",
                    sequence,
                )
                response = error_response(command, Code.INTERNAL_SERVER_ERROR)
            else:
                if isinstance(response, _Rejected):
                    view.rollback()
                    self.last_rejections[index] = response.error
                    response = error_response(command, response.error.code)
                else:
                    view.settle()
            responses.append(response)
            last = sequence
        if last > self.applied_sequence:
            view.commit(last)
            self.applied_sequence = last
        self.sessions = view.sessions
        self.last_events = view.events
        return responses

    def _apply_one(
        self, view: _ApplyView, previous: int, revision: int, command: wal_pb2.WalCommand
    ) -> Response | _Rejected:
        if self._prev_kvs is not None and not self._prev_kvs.stop:  # not a dry run
            self._prev_kvs = None  # this command's budget, made if it asks for prev_kv
        now = command.timestamp_ms
        op = command.WhichOneof("op")
        if self.sealed is not None:
            return self._after_seal(op, command)
        if op == "put":
            writes: dict[bytes, StoredRecord | None] = {}
            put_response = self._put(view, revision, now, command.put, writes)
            if put_response.header.code == _SUCCESS:  # a refused put changes nothing
                _flush_writes(view, writes, revision, now)
            return put_response
        if op == "increment":
            writes = {}
            increment_response = self._increment(view, revision, now, command.increment, writes)
            _flush_writes(view, writes, revision, now)
            return increment_response
        if op == "delete_range":
            if view.dirty:
                view.commit(previous)
            writes = {}
            delete_response = self._delete_range(view, now, command.delete_range, writes)
            _flush_writes(view, writes, revision, now)
            return delete_response
        if op == "txn":
            return self._txn(view, previous, revision, now, command.txn)
        if op == "session":
            return self._session(view, previous, revision, now, command.session)
        if op == "etcd_txn":
            from tablekeeper_server.etcd.apply import apply_etcd_txn  # imports this module

            return apply_etcd_txn(view, previous, revision, now, command.etcd_txn)
        if op == "etcd_compact":
            from tablekeeper_server.etcd.apply import apply_etcd_compact  # imports this module

            return apply_etcd_compact(view, previous, revision, command.etcd_compact)
        if op == "oxia_write":
            from tablekeeper_server.oxia.apply import apply_oxia_write  # imports this module

            return apply_oxia_write(view, previous, revision, now, command.oxia_write)
        if op == "seal":
            return self._seal(view, previous, revision, command.seal)
        return kv_rpc_pb2.PutResponse(header=_header(Code.BAD_REQUEST))

    def _after_seal(self, op: str | None, command: wal_pb2.WalCommand) -> Response | _Rejected:
        """A command that reached the log after the seal (it was queued before): it changes
        nothing and is refused as "range moved", except the same seal again (a retried split)."""
        assert self.sealed is not None
        if op == "seal" and tuple(command.seal.children) == self.sealed:
            return kv_rpc_pb2.PutResponse(header=_header(_SUCCESS))
        children = ", ".join(map(str, self.sealed))
        return _Rejected(
            RangeMovedError(
                f"this range was split: its keys moved to ranges {children}", self.sealed
            )
        )

    def _seal(
        self, view: _ApplyView, previous: int, revision: int, seal: wal_pb2.RangeSeal
    ) -> Response | _Rejected:
        """Seal the range for a split (see `SEAL_KEY`): refused while the range holds
        bookkeeping that cannot be divided by pkey (`SPLIT_REFUSING_PREFIXES`)."""
        if len(seal.children) < 2:
            return _Rejected(IllegalOpError("a split needs at least two children"))
        if view.dirty:
            view.commit(previous)
        for prefix in SPLIT_REFUSING_PREFIXES:
            if next(view.scan(prefix, prefix_end(prefix)), None) is not None:
                return _Rejected(
                    IllegalOpError(
                        "this range holds etcd or Oxia bookkeeping: splitting it is not supported"
                    )
                )
        refused = self._sessions_divide(view, seal)
        if refused is not None:
            return _Rejected(IllegalOpError(refused))
        view.put(SEAL_KEY, StoredRecord(0, revision, 0, False, 0, seal.SerializeToString()))
        self.sealed = tuple(seal.children)
        return kv_rpc_pb2.PutResponse(header=_header(_SUCCESS))

    @staticmethod
    def _sessions_divide(view: _ApplyView, seal: wal_pb2.RangeSeal) -> str | None:
        """Why the range's sessions cannot move with their pkeys to the children of `seal`, or
        None: each session goes to the child holding the pkey it was created for, so that
        pkey and every ephemeral key of the session must fall to the same child."""
        sessions = view.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX))
        if next(sessions, None) is None:
            return None
        if len(seal.start_hashes) != len(seal.children):
            return "this range holds sessions, and the split did not say where its children begin"
        router = RangeRouter(list(seal.start_hashes), list(range(len(seal.children))))
        for key, _ in view.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX)):
            (session_id,) = _SEQ.unpack_from(key, len(SESSION_PREFIX))
            home = view.get(session_home_key(session_id))
            if home is None:
                return (
                    f"session {session_id} was created without its pkey (by an etcd or Oxia "
                    "client, or an older server): it cannot move with a split"
                )
            child = router.route(home.value)
            members = _members_prefix(session_id)
            for member, _ in view.scan(members, prefix_end(members)):
                pkey = split_store_key(member[len(members) :])[0]
                if router.route(pkey) != child:
                    return (
                        f"session {session_id} has ephemeral keys on pkeys that the split "
                        "divides (a session and its keys move to one child)"
                    )
        return None

    @staticmethod
    def _expire_at(now_ms: int, ttl_ms: int) -> int | None:
        """The expiry of a key written at `now_ms` with a per-key TTL; None when it lies beyond
        what a record can hold (validation refuses such TTLs; this keeps apply total for a
        record it never saw)."""
        expire = now_ms + ttl_ms
        return expire if expire <= INT64_MAX else None

    def _table_expiry(self, now_ms: int) -> int:
        """The expiry the table's TTL gives a key written at `now_ms` (0: never). A TTL that
        reaches past what a record can hold is held at the largest expiry ("never", in effect)."""
        return min(now_ms + self.ttl_ms, INT64_MAX) if self.ttl_ms else 0

    def _put(
        self,
        view: _ApplyView,
        revision: int,
        now: int,
        req: kv_rpc_pb2.PutRequest,
        writes: dict[bytes, StoredRecord | None],
    ) -> kv_rpc_pb2.PutResponse:
        if req.lease and view.get(session_key(req.lease)) is None:
            return kv_rpc_pb2.PutResponse(header=_header(Code.ILLEGAL_OP))
        lkey = req.key
        if req.sequential:
            counter_key = sequence_counter_key(req.header.r_key)
            counter = writes[counter_key] if counter_key in writes else view.get(counter_key)
            number = 0 if counter is None else counter.number
            writes[counter_key] = StoredRecord(0, revision, 0, True, 0, encode_number(number + 1))
            lkey = req.key + b"%0*d" % (SEQUENCE_DIGITS, number)
        key = pkey_prefix(req.header.r_key) + lkey
        prev = view.get_live(key, now)
        if req.HasField("expected_version"):
            expected = req.expected_version
            if expected < 0 and prev is not None:
                return kv_rpc_pb2.PutResponse(header=_header(Code.KEY_EXISTS))
            if expected >= 0 and prev is None:
                return kv_rpc_pb2.PutResponse(header=_header(Code.KEY_NOT_FOUND))
            if expected >= 0 and prev is not None and prev.version != expected:
                return kv_rpc_pb2.PutResponse(header=_header(Code.BAD_VERSION))
        if prev is not None and prev.is_number:
            return kv_rpc_pb2.PutResponse(header=_header(Code.BAD_REQUEST))
        expire = self._expire_at(now, req.ttl_ms) if req.ttl_ms > 0 else self._table_expiry(now)
        if expire is None:
            return kv_rpc_pb2.PutResponse(header=_header(Code.BAD_REQUEST))
        if prev is None:
            record = StoredRecord(revision, revision, 0, False, expire, req.value)
        else:
            record = StoredRecord(
                prev.create_revision, revision, prev.version + 1, False, expire, req.value
            )
        writes[key] = record
        view.leases[key] = req.lease
        response = _put_success()
        if req.sequential:
            response.key = lkey
        if req.prev_kv and prev is not None and self._prev_kv_fits(lkey, prev):
            response.prev_kv.CopyFrom(to_key_value(lkey, prev))
        return response

    def _prev_kv_fits(self, lkey: bytes, record: StoredRecord) -> bool:
        """Whether the previous value of `lkey` fits in what this command's prev_kvs may still
        carry (and takes its room). A dry run stops at the first that does not."""
        budget = self._prev_kvs
        if budget is None:
            budget = self._prev_kvs = _PrevKvBudget(self.response_bytes_max, stop=False)
        row_bytes = _row_bytes(lkey, record, False)
        if row_bytes <= budget.remaining:
            budget.remaining -= row_bytes
            return True
        if budget.stop:
            raise _OverBudgetError
        if not budget.exceeded:
            log.warning(
                "a write's previous values exceed %d bytes (--max-response-bytes): they grew "
                "after its check; the ones past the bound are left out of its response",
                self.response_bytes_max,
            )
        budget.exceeded = True
        return False

    def _increment(
        self,
        view: _ApplyView,
        revision: int,
        now: int,
        req: kv_rpc_pb2.IncrementRequest,
        writes: dict[bytes, StoredRecord | None],
    ) -> kv_rpc_pb2.IncrementResponse:
        """Add to a number key. Inside a txn (`writes` given) the write is collected like the
        txn's other writes, and an increment of a key this txn already wrote adds to that write
        (two increments of one key in one txn add up)."""
        key = pkey_prefix(req.header.r_key) + req.key
        prev = writes[key] if key in writes else view.get_live(key, now)
        if prev is not None and not prev.is_number:
            return kv_rpc_pb2.IncrementResponse(header=_header(Code.BAD_REQUEST))
        if prev is None:
            total = wrap_int64(req.amount)
            record = StoredRecord(
                revision, revision, 0, True, self._table_expiry(now), encode_number(total)
            )
        else:
            total = wrap_int64(prev.number + req.amount)
            record = StoredRecord(
                prev.create_revision,
                revision,
                prev.version + 1,
                True,
                self._table_expiry(now),
                encode_number(total),
            )
        writes[key] = record
        response = kv_rpc_pb2.IncrementResponse(header=_header(_SUCCESS))
        if req.get_total:
            response.total_amount = total
        return response

    def _delete_range(
        self,
        view: _ApplyView,
        now: int,
        req: kv_rpc_pb2.DeleteRangeRequest,
        writes: dict[bytes, StoredRecord | None],
    ) -> kv_rpc_pb2.DeleteRangeResponse:
        prefix = pkey_prefix(req.header.r_key)
        response = kv_rpc_pb2.DeleteRangeResponse(header=_header(_SUCCESS))
        if not req.range_end:
            key = prefix + req.key
            raw_prev = view.get(key)
            if req.HasField("expected_version"):
                live = raw_prev if raw_prev is not None and raw_prev.is_live(now) else None
                if live is None:
                    return kv_rpc_pb2.DeleteRangeResponse(header=_header(Code.KEY_NOT_FOUND))
                if live.version != req.expected_version:
                    return kv_rpc_pb2.DeleteRangeResponse(header=_header(Code.BAD_VERSION))
            if raw_prev is not None:
                writes[key] = None
                if raw_prev.is_live(now):
                    response.deleted = 1
                    if req.prev_kv and self._prev_kv_fits(req.key, raw_prev):
                        response.prev_kvs.append(to_key_value(req.key, raw_prev))
            return response
        start, end = key_span(prefix, req.key, req.range_end)
        deleted = 0
        for key, record in view.scan(start, end):
            writes[key] = None
            if record.is_live(now):
                deleted += 1
                lkey = key[len(prefix) :]
                if req.prev_kv and self._prev_kv_fits(lkey, record):
                    response.prev_kvs.append(to_key_value(lkey, record))
        response.deleted = deleted
        return response

    def _txn(
        self,
        view: _ApplyView,
        previous: int,
        revision: int,
        now: int,
        req: kv_rpc_pb2.TxnRequest,
    ) -> kv_rpc_pb2.TxnResponse | _Rejected:
        """Compare, then run the chosen branch: all of it or nothing.

        Ops see the state before the txn (BookKeeper's semantics); their writes are collected
        and applied together at the txn's revision (a later write to the same key wins). If an
        op fails, nothing is applied: the txn answers that op's code, and its `responses` end
        with that op's response, at its position in the branch (the ones before it are bare).

        The branch's range reads share `response_bytes_max`. A branch that only reads is refused
        (`ResourceLimitError`) when they would carry more; a branch that also writes is never
        refused for it, because that decision would depend on the server's flag, and replay,
        perhaps under another flag, must reach the same state: its reads stop early instead
        (`more = true`), like a Range that pages.
        """
        prefix = pkey_prefix(req.header.r_key)
        succeeded = True
        for compare in req.compare:
            outcome = evaluate_compare(compare, view.get_live(prefix + compare.key, now))
            if outcome is None:
                return kv_rpc_pb2.TxnResponse(header=_header(Code.KEY_NOT_FOUND), succeeded=False)
            if not outcome:
                succeeded = False
                break
        ops = req.success if succeeded else req.failure
        if view.dirty and any(_op_scans(op) for op in ops):
            view.commit(previous)
        writes: dict[bytes, StoredRecord | None] = {}
        reads = ReadBudget(self.response_bytes_max)
        writing = any(op.WhichOneof("request") != "request_range" for op in ops)
        response = kv_rpc_pb2.TxnResponse(header=_header(_SUCCESS), succeeded=succeeded)
        for index, op in enumerate(ops):
            kind = op.WhichOneof("request")
            result = response.responses.add()
            code = _SUCCESS
            if kind == "request_put":
                put = kv_rpc_pb2.PutRequest()
                put.CopyFrom(op.request_put)
                put.header.r_key = req.header.r_key
                result.response_put.CopyFrom(self._put(view, revision, now, put, writes))
                code = result.response_put.header.code
            elif kind == "request_delete_range":
                delete = kv_rpc_pb2.DeleteRangeRequest()
                delete.CopyFrom(op.request_delete_range)
                delete.header.r_key = req.header.r_key
                result.response_delete_range.CopyFrom(self._delete_range(view, now, delete, writes))
                code = result.response_delete_range.header.code
            elif kind == "request_range":
                read = kv_rpc_pb2.RangeRequest()
                read.CopyFrom(op.request_range)
                read.header.r_key = req.header.r_key
                result.response_range.CopyFrom(self._read(view.get, view.scan, read, now, reads))
                if reads.exceeded and not writing:
                    return _Rejected(
                        ResourceLimitError(
                            f"the txn's range reads would return more than "
                            f"{self.response_bytes_max} bytes (--max-response-bytes); "
                            "read less per txn, or page with Range requests"
                        )
                    )
            elif kind == "request_increment":
                increment = kv_rpc_pb2.IncrementRequest()
                increment.CopyFrom(op.request_increment)
                increment.header.r_key = req.header.r_key
                result.response_increment.CopyFrom(
                    self._increment(view, revision, now, increment, writes)
                )
                code = result.response_increment.header.code
            if code != _SUCCESS:
                view.leases.clear()
                failed = kv_rpc_pb2.TxnResponse(header=_header(code), succeeded=succeeded)
                for earlier in ops[:index]:
                    failed.responses.append(_bare_response_op(earlier))
                failed.responses.append(result)
                return failed
        _flush_writes(view, writes, revision, now)
        return response

    def _session(
        self,
        view: _ApplyView,
        previous: int,
        revision: int,
        now: int,
        command: wal_pb2.SessionCommand,
    ) -> session_pb2.SessionResponse:
        if command.WhichOneof("op") == "create_ttl_ms":
            session_id = command.create_id
            if session_id:
                if session_id < 0 or view.get(session_key(session_id)) is not None:
                    return session_pb2.SessionResponse(header=_header(Code.KEY_EXISTS))
            else:
                session_id = revision
                while view.get(session_key(session_id)) is not None:  # a chosen id took it
                    session_id += _SESSION_ID_STEP
            view.put(session_key(session_id), _number_record(revision, command.create_ttl_ms))
            if command.pkey:
                home = StoredRecord(0, revision, 0, False, 0, command.pkey)
                view.put(session_home_key(session_id), home)
            if command.role:
                role = StoredRecord(0, revision, 0, False, 0, command.role.encode())
                view.put(session_role_key(session_id), role)
            view.sessions += 1
            return session_pb2.SessionResponse(
                header=_header(_SUCCESS), session_id=session_id, ttl_ms=command.create_ttl_ms
            )
        session_id = command.close_id
        skey = session_key(session_id)
        if view.get(skey) is None:
            return session_pb2.SessionResponse(header=_header(Code.KEY_NOT_FOUND))
        if view.dirty:
            view.commit(previous)
        members = _members_prefix(session_id)
        writes: dict[bytes, StoredRecord | None] = {}
        for member, _ in view.scan(members, prefix_end(members)):
            key = member[len(members) :]
            if view.get(key) is not None:
                writes[key] = None
            else:  # defensive: an index entry whose key is gone
                view.delete(member)
                view.delete(_owner_key(key))
        _flush_writes(view, writes, revision, now)  # also drops the keys' index entries
        view.delete(skey)
        view.delete(session_role_key(session_id))
        view.delete(session_home_key(session_id))
        view.sessions -= 1
        return session_pb2.SessionResponse(header=_header(_SUCCESS), session_id=session_id)

    def session_ttls(self) -> list[tuple[int, int]]:
        """(session id, ttl ms) of every live session, from the applied state."""
        out = []
        for key, raw in self.store.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX)):
            (session_id,) = _SEQ.unpack_from(key, len(SESSION_PREFIX))
            out.append((int(session_id), decode_record(raw).number))
        return out

    def session_roles(self) -> dict[int, str]:
        """session id -> the role that created it, for sessions created with one."""
        out = {}
        end = prefix_end(_SESSION_ROLE_PREFIX)
        for key, raw in self.store.scan(_SESSION_ROLE_PREFIX, end):
            (session_id,) = _SEQ.unpack_from(key, len(_SESSION_ROLE_PREFIX))
            out[int(session_id)] = decode_record(raw).value.decode()
        return out

    # ------------------------------------------------------------------ reads

    def read(
        self, req: kv_rpc_pb2.RangeRequest, now_ms: int, budget: ReadBudget | None = None
    ) -> kv_rpc_pb2.RangeResponse:
        """Serve a Range request from the store (applied state only). A scan pages within
        `page_bytes`; with a `budget` (shared by a group of reads) it also stops where the
        budget runs out, and marks it exceeded."""

        def get(key: bytes) -> StoredRecord | None:
            raw = self.store.get(key)
            return None if raw is None else decode_record(raw)

        def scan(start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
            for key, raw in self.store.scan(start, end):
                yield key, decode_record(raw)

        return self._read(get, scan, req, now_ms, budget)

    def scan_range(
        self, req: tablekeeper_pb2.ScanRangeRequest, now_ms: int
    ) -> tablekeeper_pb2.ScanRangeResponse:
        """One page of every live key of the range, every pkey, in store order, resuming after
        `req.start_after`. The range's own bookkeeping keys (`SYSTEM_PREFIX`) are never seen.
        A page holds at most `SCAN_ROWS_MAX` keys and `page_bytes` bytes (one larger key goes
        alone)."""
        start = b""
        if req.HasField("start_after"):
            start = store_key(req.start_after.pkey, req.start_after.lkey) + b"\x00"
        limit = min(req.limit, SCAN_ROWS_MAX) if req.limit > 0 else SCAN_ROWS_MAX
        page = self.page_bytes
        response = tablekeeper_pb2.ScanRangeResponse(header=_header(_SUCCESS))
        rows = response.rows
        size = 0
        for key, raw in self.store.scan(start, SYSTEM_PREFIX):
            record = decode_record(raw)
            if not record.is_live(now_ms):
                continue
            row_bytes = _row_bytes(key, record, req.keys_only)
            if len(rows) >= limit or (rows and size + row_bytes > page):
                response.more = True
                break
            pkey, lkey = split_store_key(key)
            row = rows.add()
            row.pkey = pkey
            row.kv.CopyFrom(to_key_value(lkey, record, keys_only=req.keys_only))
            size += row_bytes
        return response

    @property
    def page_bytes(self) -> int:
        """The bytes one scan page (Range or ScanRange) carries at most."""
        return min(SCAN_BYTES_MAX, self.response_bytes_max)

    def _read(
        self,
        get: _Getter,
        scan: _Scanner,
        req: kv_rpc_pb2.RangeRequest,
        now: int,
        budget: ReadBudget | None = None,
    ) -> kv_rpc_pb2.RangeResponse:
        """A Range request. A scan stops early (`more = true`) at `limit`, `SCAN_ROWS_MAX` keys
        or `page_bytes`; a single key larger than a page is returned alone. Inside a txn,
        `budget` is what the txn's reads may still carry: a key that does not fit ends the read
        with `more = true` and marks the budget exceeded."""
        prefix = pkey_prefix(req.header.r_key)
        response = kv_rpc_pb2.RangeResponse(header=_header(_SUCCESS))
        bound = self.response_bytes_max if budget is None else budget.remaining
        if not req.range_end:
            record = get(prefix + req.key)
            if record is not None and record.is_live(now) and _matches(req, record):
                row_bytes = 0 if req.count_only else _row_bytes(req.key, record, req.keys_only)
                if budget is not None and row_bytes > bound:
                    budget.exceeded = True
                    response.more = True
                    return response
                response.count = 1
                if not req.count_only:
                    response.kvs.append(to_key_value(req.key, record, keys_only=req.keys_only))
                if budget is not None:
                    budget.remaining -= row_bytes
            return response
        start, end = key_span(prefix, req.key, req.range_end)
        limit = req.limit if req.limit > 0 else 0
        page = min(SCAN_BYTES_MAX, bound)
        count = 0
        size = 0
        for key, record in scan(start, end):
            if not record.is_live(now) or not _matches(req, record):
                continue
            if req.count_only:
                count += 1
                continue
            if (limit and count >= limit) or count >= SCAN_ROWS_MAX:
                response.more = True
                break
            lkey = key[len(prefix) :]
            row_bytes = _row_bytes(lkey, record, req.keys_only)
            # A page is full, unless this is its first key: that one goes alone (a scan must
            # make progress), within the budget if there is one. A key the budget cannot take
            # means the group's reads exceed their bound.
            first = count == 0 and (budget is None or row_bytes <= bound)
            if size + row_bytes > page and not first:
                if budget is not None and size + row_bytes > bound:
                    budget.exceeded = True
                response.more = True
                break
            response.kvs.append(to_key_value(lkey, record, keys_only=req.keys_only))
            count += 1
            size += row_bytes
        if budget is not None:
            budget.remaining -= size
        response.count = count
        return response


class ReadBudget:
    """What a group of reads (the range reads of one txn; the Range ops of one Batch RPC) may
    still carry, in bytes. Each read given it takes what it returns from `remaining`; a key that
    does not fit ends that read early (`more = true`) and sets `exceeded`, so the work a group
    does stays bounded however many reads it has."""

    __slots__ = ("exceeded", "remaining")

    def __init__(self, total: int) -> None:
        self.remaining = total
        self.exceeded = False


class _PrevKvBudget(ReadBudget):
    """`ReadBudget` for the previous values of one command; `stop`: a dry run (`check_prev_kvs`),
    which ends at the first value past the bound."""

    __slots__ = ("stop",)

    def __init__(self, total: int, *, stop: bool) -> None:
        super().__init__(total)
        self.stop = stop


class _OverBudgetError(Exception):
    """A dry run's previous values passed the bound."""


def _asks_prev_kvs(command: wal_pb2.WalCommand) -> bool:
    """Whether `command` may return more previous values than one value (which the value size
    limit bounds): a DeleteRange over a span, or a txn, asking for them."""
    op = command.WhichOneof("op")
    if op == "delete_range":
        return command.delete_range.prev_kv and bool(command.delete_range.range_end)
    if op == "txn":
        return any(
            o.request_put.prev_kv or o.request_delete_range.prev_kv
            for o in (*command.txn.success, *command.txn.failure)
        )
    return False


class _Rejected:
    """A command that changed nothing and whose caller is to get `error` (not a response)."""

    __slots__ = ("error",)

    def __init__(self, error: TableKeeperError) -> None:
        self.error = error


_ERROR_RESPONSES: dict[str | None, Callable[..., Response]] = {
    "put": kv_rpc_pb2.PutResponse,
    "increment": kv_rpc_pb2.IncrementResponse,
    "delete_range": kv_rpc_pb2.DeleteRangeResponse,
    "txn": kv_rpc_pb2.TxnResponse,
    "session": session_pb2.SessionResponse,
}


def error_response(command: wal_pb2.WalCommand, code: int) -> Response:
    """A bare response of the command's kind with status `code`."""
    factory = _ERROR_RESPONSES.get(command.WhichOneof("op"), kv_rpc_pb2.PutResponse)
    return factory(header=_header(code))


def _bare_response_op(op: kv_rpc_pb2.RequestOp) -> kv_rpc_pb2.ResponseOp:
    kind = op.WhichOneof("request")
    result = kv_rpc_pb2.ResponseOp()
    if kind == "request_put":
        result.response_put.SetInParent()
    elif kind == "request_delete_range":
        result.response_delete_range.SetInParent()
    elif kind == "request_range":
        result.response_range.SetInParent()
    elif kind == "request_increment":
        result.response_increment.SetInParent()
    return result


def _row_bytes(key: bytes, record: StoredRecord, keys_only: bool) -> int:
    return len(key) + (0 if keys_only else len(record.value)) + ROW_OVERHEAD_BYTES


def _flush_writes(
    view: _ApplyView, writes: dict[bytes, StoredRecord | None], revision: int, now: int
) -> None:
    """Apply a command's collected writes and report each table-key change as an event (a
    delete of an already expired key is not reported: watchers never saw it live)."""
    for key, record in writes.items():
        if key[:1] != SYSTEM_PREFIX:
            prev = view.get(key)
            if prev is not None and not prev.is_live(now):
                prev = None
            if record is not None or prev is not None:
                view.record_event(revision, key, record, prev)
        if record is None:
            view.delete(key)
        else:
            view.put(key, record)
        if view.sessions and key[:1] != SYSTEM_PREFIX:
            _index_lease(view, key, view.leases.get(key, 0) if record is not None else 0, revision)
    view.leases.clear()


def _index_lease(view: _ApplyView, key: bytes, lease: int, revision: int) -> None:
    """Keep the ephemeral-key index of `key` in step with its latest write: a put replaces the
    key's session (0 = none, etcd's semantics), a delete removes it."""
    owner_key = _owner_key(key)
    owner = view.get(owner_key)
    old = owner.number if owner is not None else 0
    if old == lease:
        return
    if old:
        view.delete(owner_key)
        view.delete(_members_prefix(old) + key)
    if lease:
        view.put(owner_key, _number_record(revision, lease))
        view.put(_members_prefix(lease) + key, StoredRecord(0, revision, 0, False, 0, b""))


def _op_scans(op: kv_rpc_pb2.RequestOp) -> bool:
    kind = op.WhichOneof("request")
    if kind == "request_range":
        return bool(op.request_range.range_end)
    if kind == "request_delete_range":
        return bool(op.request_delete_range.range_end)
    return False


def _matches(req: kv_rpc_pb2.RangeRequest, record: StoredRecord) -> bool:
    if req.min_mod_revision > 0 and record.mod_revision < req.min_mod_revision:
        return False
    if req.max_mod_revision > 0 and record.mod_revision > req.max_mod_revision:
        return False
    if req.min_create_revision > 0 and record.create_revision < req.min_create_revision:
        return False
    return not (req.max_create_revision > 0 and record.create_revision > req.max_create_revision)


def evaluate_compare(compare: kv_rpc_pb2.Compare, record: StoredRecord | None) -> bool | None:
    """The outcome of one Txn compare; None when it compares a number of a missing key.

    VALUE compares bytes, unsigned and lexicographically; an empty compare value means "absent"
    (a missing key EQUALs it, a present key is GREATER and NOT_EQUAL). VERSION, CREATE and MOD
    on a missing key have no outcome: the txn answers KEY_NOT_FOUND.
    """
    result = compare.result
    if compare.target == Compare.VALUE:
        expected = compare.value
        if record is None:
            if result == Compare.EQUAL:
                return not expected
            if result == Compare.NOT_EQUAL:
                return bool(expected)
            return False
        if not expected:
            return result in (Compare.GREATER, Compare.NOT_EQUAL)
        actual = record.value
        return _cmp(result, (actual > expected) - (actual < expected))
    if record is None:
        return None
    if compare.target == Compare.VERSION:
        actual_n, expected_n = record.version, compare.version
    elif compare.target == Compare.CREATE:
        actual_n, expected_n = record.create_revision, compare.create_revision
    else:
        actual_n, expected_n = record.mod_revision, compare.mod_revision
    return _cmp(result, (actual_n > expected_n) - (actual_n < expected_n))


def _cmp(result: int, sign: int) -> bool:
    if result == Compare.EQUAL:
        return sign == 0
    if result == Compare.GREATER:
        return sign > 0
    if result == Compare.LESS:
        return sign < 0
    return sign != 0
