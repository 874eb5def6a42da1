"""The range state machine: applies write-ahead-log commands to the range's KvStore.

It knows no protocol: it owns the applied position, the seal of a split and the total
`apply_batch`, and hands each logged command to the applier registered for it (`range.apply`:
BookKeeper's ops, sessions, and each front-end's writes are appliers, all registered once, in
`main`).

Applying is deterministic: the result of a command depends only on the store's state, the
command (including the timestamp it was accepted at) and its log sequence number, which is the
revision of every key it writes. Replaying the log from any applied position therefore rebuilds
the same keys, versions and revisions, and produces the same responses.

Every `KvStore.write` also records the sequence number of the last command it contains (the
*applied position*), so a crash between log append and store write loses nothing: recovery
replays the log after the applied position.

Every change is reported as a `ChangeEvent` (`last_events` after `apply_batch`) and written to
the range's event history (`range.events`) in the same store batch.

Reads of BookKeeper's protocol (`read`, `scan_range`) are in `range.bookkeeper_reads`; the state
machine serves them from its store.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2, wal_pb2
from tablekeeper_server.core.keys import prefix_end, system_key
from tablekeeper_server.errors import Code, IllegalOpError, RangeMovedError, TableKeeperError
from tablekeeper_server.range.apply import (
    Appliers,
    ApplyContext,
    Command,
    FrontEndCommand,
    RangeSettings,
    Rejected,
    Response,
    applied_sequence,
)
from tablekeeper_server.range.bookkeeper_reads import (
    RESPONSE_BYTES_MAX_DEFAULT,
    ReadBudget,
    header,
    page_bytes,
    read_range,
    scan_range,
)
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.records import StoredRecord, decode_record
from tablekeeper_server.range.session_keys import (
    SESSION_PREFIX,
    SESSION_ROLE_PREFIX,
    session_id_of,
)
from tablekeeper_server.storage.api import KvStore

log = logging.getLogger(__name__)

SEAL_KEY = system_key(b"sealed")
"""Present once the range is sealed by a split: a record whose value is the `RangeSeal`."""
_SUCCESS = Code.SUCCESS
_SKIPPED = kv_rpc_pb2.PutResponse(header=header(_SUCCESS))


def _skipped() -> kv_rpc_pb2.PutResponse:
    """The answer to a command at or below the applied position (a bare SUCCESS)."""
    response = kv_rpc_pb2.PutResponse()
    response.CopyFrom(_SKIPPED)
    return response


class RangeStateMachine:
    """Applies commands to one range's store. Owned by the range; one caller at a time."""

    def __init__(
        self,
        store: KvStore,
        appliers: Appliers,
        *,
        ttl_seconds: int = 0,
        history: EventHistory | None = None,
        response_bytes_max: int = RESPONSE_BYTES_MAX_DEFAULT,
    ) -> None:
        self.store = store
        self.appliers = appliers
        self.settings = RangeSettings(
            ttl_ms=max(0, ttl_seconds) * 1000, response_bytes_max=max(1, response_bytes_max)
        )
        self.applied_sequence: int = applied_sequence(store)
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

    @property
    def response_bytes_max(self) -> int:
        """Bytes of keys and values one Range response, or the reads of one Txn, may carry."""
        return self.settings.response_bytes_max

    def check(self, command: Command) -> None:
        """Let `command`'s applier refuse it before it is logged (`Applier.check`: e.g. a write
        whose previous values would not fit in one response raises `ResourceLimitError`);
        nothing is logged then. It runs against the applied state and changes nothing."""
        if self.sealed is not None:
            return
        if isinstance(command, FrontEndCommand):
            taking = self.appliers.taking_payload(command.applier)
            if taking is not None:
                taking.check_payload(command.payload, lambda: self._throwaway_context(command))
                return
            command = command.message()
        applier = self.appliers.for_command(command)
        if applier is not None:
            applier.check(command, lambda: self._throwaway_context(command))

    def _throwaway_context(self, command: Command) -> ApplyContext:
        """A context over the applied state for `command` as the next command (discarded)."""
        ctx = ApplyContext(self.store, None, self.sessions, self.settings)
        ctx.begin(self.applied_sequence, self.applied_sequence + 1, command.timestamp_ms)
        return ctx

    # ------------------------------------------------------------------ writes

    def apply_batch(self, commands: Sequence[tuple[int, Command]]) -> list[Response]:
        """Apply commands in sequence order and return one response per command.

        Commands at or below the applied position are skipped (their response is a bare
        SUCCESS header); this is what makes replay idempotent.

        Apply is total: a command whose apply raises (a defect, or a record no validation
        stopped) changes nothing and is answered INTERNAL_SERVER_ERROR, and the batch goes on;
        the same record gets the same answer on every replay, so it can never wedge a range.
        Only a failure of the store itself (or of memory) propagates: it says nothing about the
        command, and the range must stop instead of answering for it.
        """
        ctx = ApplyContext(self.store, self.history, self.sessions, self.settings)
        responses: list[Response] = []
        self.last_rejections = {}
        last = self.applied_sequence
        for index, (sequence, command) in enumerate(commands):
            if sequence <= self.applied_sequence:
                responses.append(_skipped())
                continue
            ctx.begin(last, sequence, command.timestamp_ms)
            try:
                response = self._apply_one(ctx, command)
            except Exception as exc:
                if ctx.store_failure is not None or isinstance(exc, (MemoryError, RecursionError)):
                    raise
                ctx.rollback()
                log.exception(
                    "command %d could not be applied; it changes nothing and is answered "
                    "INTERNAL_SERVER_ERROR",
                    sequence,
                )
                response = self._error_response(command, Code.INTERNAL_SERVER_ERROR)
            else:
                if isinstance(response, Rejected):
                    ctx.rollback()
                    self.last_rejections[index] = response.error
                    response = self._error_response(command, response.error.code)
                else:
                    ctx.settle()
            responses.append(response)
            last = sequence
        if last > self.applied_sequence:
            ctx.commit(last, last=True)
            self.applied_sequence = last
        self.sessions = ctx.sessions
        self.last_events = ctx.events
        return responses

    def _apply_one(self, ctx: ApplyContext, command: Command) -> Response | Rejected:
        if isinstance(command, FrontEndCommand):
            taking = self.appliers.taking_payload(command.applier)
            if taking is not None and self.sealed is None:
                ctx.keep_history = taking.keeps_history
                return taking.apply_payload(ctx, command.payload, command.prepared)
            command = command.message()
        op = command.WhichOneof("op")
        ctx.keep_history = True
        if self.sealed is not None:
            return self._after_seal(op, command)
        if op == "seal":
            return self._seal(ctx, command.seal)
        applier = self.appliers.for_op(op, command)
        if applier is None:  # no applier claims it (a newer server's command?): nothing changes
            return kv_rpc_pb2.PutResponse(header=header(Code.BAD_REQUEST))
        ctx.keep_history = applier.keeps_history
        return applier.apply(ctx, command)

    def _error_response(self, command: Command, code: int) -> Response:
        """A bare response of the command's kind with status `code`."""
        if isinstance(command, FrontEndCommand):
            command = command.message()
        applier = self.appliers.for_command(command)
        if applier is None:
            return kv_rpc_pb2.PutResponse(header=header(code))
        return applier.error_response(command, code)

    def _after_seal(self, op: str | None, command: wal_pb2.WalCommand) -> Response | Rejected:
        """A command that reached the log after the seal (it was queued before): it changes
        nothing and is refused as "range moved", except the same seal again (a retried split)."""
        assert self.sealed is not None
        if op == "seal" and tuple(command.seal.children) == self.sealed:
            return kv_rpc_pb2.PutResponse(header=header(_SUCCESS))
        children = ", ".join(map(str, self.sealed))
        return Rejected(
            RangeMovedError(
                f"this range was split: its keys moved to ranges {children}", self.sealed
            )
        )

    def _seal(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> Response | Rejected:
        """Seal the range for a split (see `SEAL_KEY`): refused while an applier keeps
        bookkeeping the split cannot divide (`Applier.refuse_split`)."""
        if len(seal.children) < 2:
            return Rejected(IllegalOpError("a split needs at least two children"))
        ctx.write_settled()
        for applier in self.appliers:
            refused = applier.refuse_split(ctx, seal)
            if refused is not None:
                return Rejected(IllegalOpError(refused))
        ctx.put(SEAL_KEY, StoredRecord(0, ctx.revision, 0, False, 0, seal.SerializeToString()))
        self.sealed = tuple(seal.children)
        return kv_rpc_pb2.PutResponse(header=header(_SUCCESS))

    # ------------------------------------------------------------------ sessions

    def session_ttls(self) -> list[tuple[int, int]]:
        """(session id, ttl ms) of every live session, from the applied state."""
        out = []
        for key, raw in self.store.scan(SESSION_PREFIX, prefix_end(SESSION_PREFIX)):
            out.append((session_id_of(key), decode_record(raw).number))
        return out

    def session_roles(self) -> dict[int, str]:
        """session id -> the role that created it, for sessions created with one."""
        out = {}
        end = prefix_end(SESSION_ROLE_PREFIX)
        for key, raw in self.store.scan(SESSION_ROLE_PREFIX, end):
            out[session_id_of(key, SESSION_ROLE_PREFIX)] = decode_record(raw).value.decode()
        return out

    # ------------------------------------------------------------------ reads

    def get(self, key: bytes) -> StoredRecord | None:
        """The applied record of store key `key` (expired ones too)."""
        raw = self.store.get(key)
        return None if raw is None else decode_record(raw)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        """The applied records in [start, end), in key order."""
        for key, raw in self.store.scan(start, end):
            yield key, decode_record(raw)

    def read(
        self, req: kv_rpc_pb2.RangeRequest, now_ms: int, budget: ReadBudget | None = None
    ) -> kv_rpc_pb2.RangeResponse:
        """Serve a Range request from the store (applied state only). A scan pages within
        `page_bytes`; with a `budget` (shared by a group of reads) it also stops where the
        budget runs out, and marks it exceeded."""
        return read_range(self.get, self.scan, req, now_ms, self.response_bytes_max, budget)

    def scan_range(
        self, req: tablekeeper_pb2.ScanRangeRequest, now_ms: int
    ) -> tablekeeper_pb2.ScanRangeResponse:
        """One page of every live key of the range, every pkey, in store order, resuming after
        `req.start_after` (see `bookkeeper_reads.scan_range`)."""
        return scan_range(self.scan, req, now_ms, self.page_bytes)

    @property
    def page_bytes(self) -> int:
        """The bytes one scan page (Range or ScanRange) carries at most."""
        return page_bytes(self.response_bytes_max)
