"""The BookKeeper applier: BookKeeper's table-service writes (Put, Increment, DeleteRange, Txn)
applied to a range (see `range.apply` for the applier contract).

Semantics follow BookKeeper's table service, with its known bugs fixed: `expected_version` on
Put is honoured; Delete returns the real number of deleted keys; TTL hides expired keys (instead
of the inverted check); a Txn comparing a missing key answers KEY_NOT_FOUND deterministically.

TableKeeper extensions: CAS delete (`DeleteRangeRequest.expected_version`), per-key TTL
(`PutRequest.ttl_ms`: expiry = command timestamp + ttl), sequential puts (`PutRequest.sequential`:
a 20-digit counter per pkey, kept in a system key, is appended to the lkey) and ephemeral keys
(`PutRequest.lease` = a session id, see `range.session_apply`).

Previous values (`prev_kv`) are bounded by `RangeSettings.response_bytes_max`: `check` refuses a
write, before it is logged, whose previous values would carry more (a dry run over the applied
state); apply itself never refuses for it (replay, perhaps under another flag, must reach the
same state) but leaves out the values past the bound, with a warning in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import SEQUENCE_DIGITS, pkey_prefix, system_key
from tablekeeper_server.errors import Code, ResourceLimitError
from tablekeeper_server.range.apply import ApplyContext, Rejected, Response
from tablekeeper_server.range.bookkeeper_reads import (
    ReadBudget,
    header,
    key_span,
    read_range,
    row_bytes,
    to_key_value,
)
from tablekeeper_server.range.records import INT64_MAX, StoredRecord, encode_number, wrap_int64

log = logging.getLogger(__name__)

NAME = "bookkeeper"
Compare = kv_rpc_pb2.Compare
_SUCCESS = Code.SUCCESS
"""Looked up once: reading a value off a protobuf enum wrapper is a Python-level call."""
_PUT_SUCCESS = kv_rpc_pb2.PutResponse(header=header(_SUCCESS))


def put_success() -> kv_rpc_pb2.PutResponse:
    """A new SUCCESS PutResponse: copied from a template, a fifth of building one (hot path)."""
    response = kv_rpc_pb2.PutResponse()
    response.CopyFrom(_PUT_SUCCESS)
    return response


def sequence_counter_key(pkey: bytes) -> bytes:
    """The system key holding the next sequential-put counter of `pkey`."""
    return system_key(b"seq/" + pkey_prefix(pkey))


class BookKeeperApplier:
    """Applies `WalCommand.put`, `increment`, `delete_range` and `txn`."""

    name = NAME
    ops = ("put", "increment", "delete_range", "txn")
    keeps_history = True

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        return _Command(ctx, stop=False).run(command)

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        """Refuse a write whose previous values (`prev_kv` of a DeleteRange over a span, or of
        a txn's puts and deletes) would carry more than `response_bytes_max` bytes:
        `ResourceLimitError`. A dry run, stopped as soon as the bound is passed."""
        if not _asks_prev_kvs(command):
            return
        ctx = context()
        try:
            _Command(ctx, stop=True).run(command)
        except _OverBudgetError:
            bound = ctx.settings.response_bytes_max
            raise ResourceLimitError(
                f"the previous values (prev_kv) this write would return exceed "
                f"{bound} bytes (--max-response-bytes); ask without prev_kv, "
                "or delete a smaller span"
            ) from None

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        op = command.WhichOneof("op")
        if op == "increment":
            return kv_rpc_pb2.IncrementResponse(header=header(code))
        if op == "delete_range":
            return kv_rpc_pb2.DeleteRangeResponse(header=header(code))
        if op == "txn":
            return kv_rpc_pb2.TxnResponse(header=header(code))
        return kv_rpc_pb2.PutResponse(header=header(code))

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        return None  # every key (and counter) belongs to one pkey


class _PrevKvBudget(ReadBudget):
    """`ReadBudget` for the previous values of one command; `stop`: a dry run (`check`), which
    ends at the first value past the bound."""

    __slots__ = ("stop",)

    def __init__(self, total: int, *, stop: bool) -> None:
        super().__init__(total)
        self.stop = stop


class _OverBudgetError(Exception):
    """A dry run's previous values passed the bound."""


class _Command:
    """One command being applied: its context and what its previous values may still carry."""

    def __init__(self, ctx: ApplyContext, *, stop: bool) -> None:
        self.ctx = ctx
        self.revision = ctx.revision
        self.now = ctx.now_ms
        self.response_bytes_max = ctx.settings.response_bytes_max
        self.ttl_ms = ctx.settings.ttl_ms
        self.stop = stop
        self.prev_kvs: _PrevKvBudget | None = None
        """Made when the command first returns a previous value."""

    def run(self, command: wal_pb2.WalCommand) -> Response | Rejected:
        ctx = self.ctx
        op = command.WhichOneof("op")
        if op == "put":
            writes: dict[bytes, StoredRecord | None] = {}
            put_response = self.put(command.put, writes)
            if put_response.header.code == _SUCCESS:  # a refused put changes nothing
                ctx.stage_writes(writes)
            return put_response
        if op == "increment":
            writes = {}
            increment_response = self.increment(command.increment, writes)
            ctx.stage_writes(writes)
            return increment_response
        if op == "delete_range":
            ctx.write_settled()
            writes = {}
            delete_response = self.delete_range(command.delete_range, writes)
            ctx.stage_writes(writes)
            return delete_response
        assert op == "txn", op
        return self.txn(command.txn)

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

    def put(
        self, req: kv_rpc_pb2.PutRequest, writes: dict[bytes, StoredRecord | None]
    ) -> kv_rpc_pb2.PutResponse:
        ctx, revision, now = self.ctx, self.revision, self.now
        if req.lease and not ctx.session_exists(req.lease):
            return kv_rpc_pb2.PutResponse(header=header(Code.ILLEGAL_OP))
        lkey = req.key
        if req.sequential:
            counter_key = sequence_counter_key(req.header.r_key)
            counter = writes[counter_key] if counter_key in writes else ctx.get(counter_key)
            number = 0 if counter is None else counter.number
            writes[counter_key] = StoredRecord(0, revision, 0, True, 0, encode_number(number + 1))
            lkey = req.key + b"%0*d" % (SEQUENCE_DIGITS, number)
        key = pkey_prefix(req.header.r_key) + lkey
        prev = ctx.get_live(key, now)
        if req.HasField("expected_version"):
            expected = req.expected_version
            if expected < 0 and prev is not None:
                return kv_rpc_pb2.PutResponse(header=header(Code.KEY_EXISTS))
            if expected >= 0 and prev is None:
                return kv_rpc_pb2.PutResponse(header=header(Code.KEY_NOT_FOUND))
            if expected >= 0 and prev is not None and prev.version != expected:
                return kv_rpc_pb2.PutResponse(header=header(Code.BAD_VERSION))
        if prev is not None and prev.is_number:
            return kv_rpc_pb2.PutResponse(header=header(Code.BAD_REQUEST))
        expire = self._expire_at(now, req.ttl_ms) if req.ttl_ms > 0 else self._table_expiry(now)
        if expire is None:
            return kv_rpc_pb2.PutResponse(header=header(Code.BAD_REQUEST))
        if prev is None:
            record = StoredRecord(revision, revision, 0, False, expire, req.value)
        else:
            record = StoredRecord(
                prev.create_revision, revision, prev.version + 1, False, expire, req.value
            )
        writes[key] = record
        ctx.leases[key] = req.lease
        response = put_success()
        if req.sequential:
            response.key = lkey
        if req.prev_kv and prev is not None and self._prev_kv_fits(lkey, prev):
            response.prev_kv.CopyFrom(to_key_value(lkey, prev))
        return response

    def _prev_kv_fits(self, lkey: bytes, record: StoredRecord) -> bool:
        """Whether the previous value of `lkey` fits in what this command's prev_kvs may still
        carry (and takes its room). A dry run stops at the first that does not."""
        budget = self.prev_kvs
        if budget is None:
            budget = self.prev_kvs = _PrevKvBudget(self.response_bytes_max, stop=self.stop)
        size = row_bytes(lkey, record, False)
        if size <= budget.remaining:
            budget.remaining -= size
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

    def increment(
        self, req: kv_rpc_pb2.IncrementRequest, writes: dict[bytes, StoredRecord | None]
    ) -> kv_rpc_pb2.IncrementResponse:
        """Add to a number key. Inside a txn the write is collected like the txn's other
        writes, and an increment of a key this txn already wrote adds to that write (two
        increments of one key in one txn add up)."""
        revision, now = self.revision, self.now
        key = pkey_prefix(req.header.r_key) + req.key
        prev = writes[key] if key in writes else self.ctx.get_live(key, now)
        if prev is not None and not prev.is_number:
            return kv_rpc_pb2.IncrementResponse(header=header(Code.BAD_REQUEST))
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
        response = kv_rpc_pb2.IncrementResponse(header=header(_SUCCESS))
        if req.get_total:
            response.total_amount = total
        return response

    def delete_range(
        self, req: kv_rpc_pb2.DeleteRangeRequest, writes: dict[bytes, StoredRecord | None]
    ) -> kv_rpc_pb2.DeleteRangeResponse:
        ctx, now = self.ctx, self.now
        prefix = pkey_prefix(req.header.r_key)
        response = kv_rpc_pb2.DeleteRangeResponse(header=header(_SUCCESS))
        if not req.range_end:
            key = prefix + req.key
            raw_prev = ctx.get(key)
            if req.HasField("expected_version"):
                live = raw_prev if raw_prev is not None and raw_prev.is_live(now) else None
                if live is None:
                    return kv_rpc_pb2.DeleteRangeResponse(header=header(Code.KEY_NOT_FOUND))
                if live.version != req.expected_version:
                    return kv_rpc_pb2.DeleteRangeResponse(header=header(Code.BAD_VERSION))
            if raw_prev is not None:
                writes[key] = None
                if raw_prev.is_live(now):
                    response.deleted = 1
                    if req.prev_kv and self._prev_kv_fits(req.key, raw_prev):
                        response.prev_kvs.append(to_key_value(req.key, raw_prev))
            return response
        start, end = key_span(prefix, req.key, req.range_end)
        deleted = 0
        for key, record in ctx.scan(start, end):
            writes[key] = None
            if record.is_live(now):
                deleted += 1
                lkey = key[len(prefix) :]
                if req.prev_kv and self._prev_kv_fits(lkey, record):
                    response.prev_kvs.append(to_key_value(lkey, record))
        response.deleted = deleted
        return response

    def txn(self, req: kv_rpc_pb2.TxnRequest) -> kv_rpc_pb2.TxnResponse | Rejected:
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
        ctx, now = self.ctx, self.now
        prefix = pkey_prefix(req.header.r_key)
        succeeded = True
        for compare in req.compare:
            outcome = evaluate_compare(compare, ctx.get_live(prefix + compare.key, now))
            if outcome is None:
                return kv_rpc_pb2.TxnResponse(header=header(Code.KEY_NOT_FOUND), succeeded=False)
            if not outcome:
                succeeded = False
                break
        ops = req.success if succeeded else req.failure
        if any(_op_scans(op) for op in ops):
            ctx.write_settled()
        writes: dict[bytes, StoredRecord | None] = {}
        reads = ReadBudget(self.response_bytes_max)
        writing = any(op.WhichOneof("request") != "request_range" for op in ops)
        response = kv_rpc_pb2.TxnResponse(header=header(_SUCCESS), succeeded=succeeded)
        for index, op in enumerate(ops):
            kind = op.WhichOneof("request")
            result = response.responses.add()
            code = _SUCCESS
            if kind == "request_put":
                put = kv_rpc_pb2.PutRequest()
                put.CopyFrom(op.request_put)
                put.header.r_key = req.header.r_key
                result.response_put.CopyFrom(self.put(put, writes))
                code = result.response_put.header.code
            elif kind == "request_delete_range":
                delete = kv_rpc_pb2.DeleteRangeRequest()
                delete.CopyFrom(op.request_delete_range)
                delete.header.r_key = req.header.r_key
                result.response_delete_range.CopyFrom(self.delete_range(delete, writes))
                code = result.response_delete_range.header.code
            elif kind == "request_range":
                read = kv_rpc_pb2.RangeRequest()
                read.CopyFrom(op.request_range)
                read.header.r_key = req.header.r_key
                result.response_range.CopyFrom(
                    read_range(ctx.get, ctx.scan, read, now, self.response_bytes_max, reads)
                )
                if reads.exceeded and not writing:
                    return Rejected(
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
                result.response_increment.CopyFrom(self.increment(increment, writes))
                code = result.response_increment.header.code
            if code != _SUCCESS:
                ctx.leases.clear()
                failed = kv_rpc_pb2.TxnResponse(header=header(code), succeeded=succeeded)
                for earlier in ops[:index]:
                    failed.responses.append(_bare_response_op(earlier))
                failed.responses.append(result)
                return failed
        ctx.stage_writes(writes)
        return response


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


def _op_scans(op: kv_rpc_pb2.RequestOp) -> bool:
    kind = op.WhichOneof("request")
    if kind == "request_range":
        return bool(op.request_range.range_end)
    if kind == "request_delete_range":
        return bool(op.request_delete_range.range_end)
    return False


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
