"""Table handles: `(pkey, lkey)` keys, put / get / scan / delete / increment / txn.

`pkey` routes the key to a range; every operation on one pkey is served by one range, so scans,
delete_range and txns are atomic within a pkey. Keys and values may be `bytes` or `str` (UTF-8).

Every call takes `timeout=` (seconds; None: only the client's `RetryPolicy` bounds it): the
whole call, its retries included, must finish within it, or it raises `DeadlineExceededError`
(a read) or `WriteTimeoutError` (a write, which may have been applied). Both are
`UnavailableError`s and built-in `TimeoutError`s.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from tablekeeper._context import ContextSource, context_of
from tablekeeper._reads import check_read_from, follower_range
from tablekeeper._transport import check_timeout, within
from tablekeeper.bulk import send_batch
from tablekeeper.errors import (
    SessionExpiredError,
    TableKeeperError,
    TableNotFoundError,
    error_for_code,
    error_for_result,
)
from tablekeeper.session import AsyncSession
from tablekeeper.types import CompareOp, Key, KeyValue, ReadInfo, TableInfo, TxnResult
from tablekeeper.watch import AsyncWatch
from tablekeeper_proto.bookkeeper import kv_rpc_pb2, kv_rpc_pb2_grpc
from tablekeeper_proto.v1 import tablekeeper_pb2

_COALESCED = {"Put": "put", "Increment": "increment", "Delete": "delete_range", "Range": "range"}
_STREAM_ID = struct.Struct(">q")
ReadFrom = Literal["leader", "follower"]


def _bytes(value: Key) -> bytes:
    """A key or value as bytes: str is UTF-8 encoded, bytes-like taken as is. Anything else is
    refused (`bytes(5)` would silently be five zero bytes)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"keys and values are str or bytes, not {type(value).__name__}")


def _session_id(session: AsyncSession) -> int:
    if not session.id:
        raise ValueError("the session is not started (await session.start())")
    if session.expired.is_set():
        raise SessionExpiredError(
            f"session {session.id} expired or was closed: its ephemeral keys are gone"
        )
    return session.id


def _ttl_ms(ttl_s: float) -> int:
    if ttl_s <= 0:
        raise ValueError("ttl_s must be > 0")
    return max(1, round(ttl_s * 1000))


# On the wire a range end of b"\x00" means "to the end of the pkey" (etcd's convention).
_TO_THE_END = b"\x00"


def _wire_span(start: Key, end: Key | None) -> tuple[bytes, bytes] | None:
    """(key, range_end) for the inclusive lkey range [start, end]; None if it is empty.

    An explicit inclusive end of b"\x00" cannot go on the wire as is (it means "no end"), but
    as no key is empty, [start, b"\x00"] holds at most the key b"\x00": a point request.
    """
    first = _bytes(start)
    if end is None:
        return first, _TO_THE_END
    last = _bytes(end)
    if first > last:
        return None
    if last == _TO_THE_END:
        return _TO_THE_END, b""
    return first, last


_COMPARE_OPS: dict[str, int] = {
    "==": kv_rpc_pb2.Compare.EQUAL,
    "!=": kv_rpc_pb2.Compare.NOT_EQUAL,
    ">": kv_rpc_pb2.Compare.GREATER,
    "<": kv_rpc_pb2.Compare.LESS,
}


class AsyncTxn:
    """Builds a conditional multi-key transaction on one pkey. Commit with `await txn.commit()`.

    Compares form an AND. Ops see the state before the txn, and all of them take one revision.
    A compare on the version / create / mod revision of a missing key makes the whole txn fail
    with `KeyNotFoundError`; use `if_absent` / `if_exists` (value compares) for existence.
    """

    def __init__(self, table: AsyncTable, pkey: Key) -> None:
        self._table = table
        self._pkey = _bytes(pkey)
        self._request = kv_rpc_pb2.TxnRequest()

    def _compare(self, lkey: Key, target: int, op: CompareOp, **value: Any) -> AsyncTxn:
        if op not in _COMPARE_OPS:
            raise ValueError(f"compare op must be one of {sorted(_COMPARE_OPS)}")
        self._request.compare.add(
            key=_bytes(lkey),
            target=target,
            result=_COMPARE_OPS[op],
            **value,
        )
        return self

    def if_version(self, lkey: Key, op: CompareOp, version: int) -> AsyncTxn:
        """Compare: the key's version `op` `version` (a missing key fails the txn)."""
        return self._compare(lkey, kv_rpc_pb2.Compare.VERSION, op, version=version)

    def if_create_revision(self, lkey: Key, op: CompareOp, revision: int) -> AsyncTxn:
        """Compare: the revision that created the key `op` `revision`."""
        return self._compare(lkey, kv_rpc_pb2.Compare.CREATE, op, create_revision=revision)

    def if_mod_revision(self, lkey: Key, op: CompareOp, revision: int) -> AsyncTxn:
        """Compare: the revision of the key's last change `op` `revision`."""
        return self._compare(lkey, kv_rpc_pb2.Compare.MOD, op, mod_revision=revision)

    def if_value(self, lkey: Key, op: CompareOp, value: Key) -> AsyncTxn:
        """Compare: the key's value `op` `value`."""
        return self._compare(lkey, kv_rpc_pb2.Compare.VALUE, op, value=_bytes(value))

    def if_absent(self, lkey: Key) -> AsyncTxn:
        """Compare: the key does not exist."""
        return self._compare(lkey, kv_rpc_pb2.Compare.VALUE, "==", value=b"")

    def if_exists(self, lkey: Key) -> AsyncTxn:
        """Compare: the key exists."""
        return self._compare(lkey, kv_rpc_pb2.Compare.VALUE, "!=", value=b"")

    def _ops(self, success: bool) -> Any:
        return self._request.success if success else self._request.failure

    def _put(self, success: bool, lkey: Key, value: Key) -> AsyncTxn:
        op = self._ops(success).add()
        op.request_put.key = _bytes(lkey)
        op.request_put.value = _bytes(value)
        op.request_put.prev_kv = True
        return self

    @staticmethod
    def _txn_span(lkey: Key, end: Key | None) -> tuple[bytes, bytes]:
        if end is None:
            return _bytes(lkey), b""
        span = _wire_span(lkey, end)
        if span is None:
            raise ValueError(f"empty key range: start {lkey!r} is after end {end!r}")
        return span

    def _delete(self, success: bool, lkey: Key, end: Key | None) -> AsyncTxn:
        key, range_end = self._txn_span(lkey, end)
        op = self._ops(success).add()
        op.request_delete_range.key = key
        op.request_delete_range.range_end = range_end
        return self

    def _get(self, success: bool, lkey: Key, end: Key | None) -> AsyncTxn:
        key, range_end = self._txn_span(lkey, end)
        op = self._ops(success).add()
        op.request_range.key = key
        op.request_range.range_end = range_end
        return self

    def then_put(self, lkey: Key, value: Key) -> AsyncTxn:
        """If the compares hold: put `value`."""
        return self._put(True, lkey, value)

    def then_delete(self, lkey: Key, end: Key | None = None) -> AsyncTxn:
        """If the compares hold: delete the key (or the keys in [lkey, end])."""
        return self._delete(True, lkey, end)

    def then_get(self, lkey: Key, end: Key | None = None) -> AsyncTxn:
        """If the compares hold: read the key (or the keys in [lkey, end])."""
        return self._get(True, lkey, end)

    def otherwise_put(self, lkey: Key, value: Key) -> AsyncTxn:
        """If a compare fails: put `value`."""
        return self._put(False, lkey, value)

    def otherwise_delete(self, lkey: Key, end: Key | None = None) -> AsyncTxn:
        """If a compare fails: delete the key (or the keys in [lkey, end])."""
        return self._delete(False, lkey, end)

    def otherwise_get(self, lkey: Key, end: Key | None = None) -> AsyncTxn:
        """If a compare fails: read the key (or the keys in [lkey, end])."""
        return self._get(False, lkey, end)

    async def commit(self, *, timeout: float | None = None) -> TxnResult:
        """Send the transaction: if every compare holds, its `then_*` ops are applied, else its
        `otherwise_*` ops, atomically and at one revision. `TxnResult.results` has one entry
        per applied op: the previous `KeyValue` (or None) of a put, the `KeyValue`s of a get,
        the count of a delete, or the error of an op that failed on its own."""
        request = kv_rpc_pb2.TxnRequest()
        request.CopyFrom(self._request)
        response = await self._table._call(
            "Txn", request, self._pkey, idempotent=False, timeout=timeout, what="txn"
        )
        results: list[Any] = []
        for op in response.responses:
            kind = op.WhichOneof("response")
            inner = getattr(op, str(kind))
            if inner.header.code:
                results.append(error_for_code(inner.header.code))
            elif kind == "response_put":
                has_prev = inner.HasField("prev_kv")
                results.append(KeyValue.from_proto(self._pkey, inner.prev_kv) if has_prev else None)
            elif kind == "response_range":
                results.append([KeyValue.from_proto(self._pkey, kv) for kv in inner.kvs])
            else:
                results.append(inner.deleted)
        return TxnResult(succeeded=response.succeeded, results=results)


class AsyncTable:
    """A handle on one table. Cheap; share it between tasks."""

    def __init__(self, client: ContextSource, info: TableInfo) -> None:
        """`client`: the `AsyncClient` (or its context) the table's calls go through."""
        self._context = context_of(client)
        self.info = info

    def _header(self, pkey: bytes) -> kv_rpc_pb2.RoutingHeader:
        return kv_rpc_pb2.RoutingHeader(stream_id=self.info.table_id, r_key=pkey)

    async def _call(
        self,
        method: str,
        request: Any,
        pkey: bytes,
        *,
        idempotent: bool,
        timeout: float | None = None,
        what: str = "",
    ) -> Any:
        """One op, bounded by `timeout` (see the module docstring)."""
        check_timeout(timeout)
        return await within(
            self._send(method, request, pkey, idempotent=idempotent),
            timeout,
            what=what or method.lower(),
            write=not idempotent,
        )

    async def _send(self, method: str, request: Any, pkey: bytes, *, idempotent: bool) -> Any:
        request.header.CopyFrom(self._header(pkey))
        metadata = (
            ("bk-rt-sid-bin", _STREAM_ID.pack(self.info.table_id)),
            ("bk-rt-key-bin", pkey),
        )
        context = self._context
        coalescer = context.coalescer()
        try:
            if coalescer is not None and method in _COALESCED:
                return await coalescer.call(
                    _COALESCED[method], request, metadata, idempotent=idempotent
                )
            return await context.call(
                context.routed(
                    "table", kv_rpc_pb2_grpc.TableServiceStub, method, self.info.table_id, pkey
                ),
                request,
                metadata=metadata,
                idempotent=idempotent,
                status_of=lambda r: r.header.code,
            )
        except TableNotFoundError:
            context.routes.forget_table(self.info.table_id)
            raise

    async def put(
        self,
        pkey: Key,
        lkey: Key,
        value: Key,
        *,
        expected_version: int | None = None,
        prev_kv: bool = False,
        ttl_s: float | None = None,
        session: AsyncSession | None = None,
        timeout: float | None = None,
    ) -> KeyValue | None:
        """Store `value`. Durable when this returns.

        `expected_version`: None = unconditional; -1 = the key must not exist (else
        `KeyExistsError`); N = the key's version must be N (`BadVersionError`, or
        `KeyNotFoundError` if it is missing). Returns the previous value if `prev_kv`.
        `ttl_s`: the key is invisible `ttl_s` seconds after this write (instead of the table's
        TTL). `session`: make the key ephemeral (deleted when the session closes or expires;
        `SessionExpiredError` if this client saw it expire or closed it, `IllegalOpError` if
        the server finds it gone or on another range). A put on a number key raises
        `BadRequestError`. `timeout`: see the module docstring.
        """
        pk = _bytes(pkey)
        request = kv_rpc_pb2.PutRequest(key=_bytes(lkey), value=_bytes(value), prev_kv=prev_kv)
        if expected_version is not None:
            request.expected_version = expected_version
        if ttl_s is not None:
            request.ttl_ms = _ttl_ms(ttl_s)
        if session is not None:
            request.lease = _session_id(session)
        response = await self._call(
            "Put", request, pk, idempotent=False, timeout=timeout, what="put"
        )
        return KeyValue.from_proto(pk, response.prev_kv) if response.HasField("prev_kv") else None

    async def put_sequential(
        self,
        pkey: Key,
        prefix: Key,
        value: Key,
        *,
        ttl_s: float | None = None,
        session: AsyncSession | None = None,
        timeout: float | None = None,
    ) -> bytes:
        """Create the key `prefix` + a zero-padded 20-digit counter, unique under `pkey` (the
        counter only grows, also across deletes); returns the created lkey. `ttl_s`, `session`
        and `timeout` as for `put`."""
        request = kv_rpc_pb2.PutRequest(key=_bytes(prefix), value=_bytes(value), sequential=True)
        if ttl_s is not None:
            request.ttl_ms = _ttl_ms(ttl_s)
        if session is not None:
            request.lease = _session_id(session)
        response = await self._call(
            "Put", request, _bytes(pkey), idempotent=False, timeout=timeout, what="put_sequential"
        )
        return bytes(response.key)

    def session(self, pkey: Key, ttl_s: float) -> AsyncSession:
        """A session on the range of `pkey` (not started: `await session.start()` or
        `async with table.session(...) as session:`)."""
        return AsyncSession(self._context, self.info.table_id, _bytes(pkey), ttl_s)

    async def _read(
        self,
        request: kv_rpc_pb2.RangeRequest,
        pkey: bytes,
        *,
        timeout: float | None,
        what: str,
        read_from: ReadFrom,
        max_staleness_s: float | None,
    ) -> tuple[kv_rpc_pb2.RangeResponse, ReadInfo | None]:
        """A Range call from the leader (the range's owner), or from a follower."""
        if read_from == "leader" and max_staleness_s is None:
            response = await self._call(
                "Range", request, pkey, idempotent=True, timeout=timeout, what=what
            )
            return response, None
        check_read_from(read_from, max_staleness_s)
        check_timeout(timeout)
        request.header.CopyFrom(self._header(pkey))
        routing = (
            ("bk-rt-sid-bin", _STREAM_ID.pack(self.info.table_id)),
            ("bk-rt-key-bin", pkey),
        )
        return await within(
            follower_range(self._context, self.info.table_id, request, routing, max_staleness_s),
            timeout,
            what=what,
            write=False,
        )

    async def get(
        self,
        pkey: Key,
        lkey: Key,
        *,
        read_from: ReadFrom = "leader",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> KeyValue | None:
        """The key's current value, or None if it does not exist (or expired).

        `read_from="follower"`: answered by the server this client was given (its service URI)
        from its follower of the range, a read-only copy that tails the range's log, when
        another server owns the range; it then includes every write acknowledged more than
        `max_staleness_s` before the call (default 5 s; 0: linearizable, as from the leader).
        A client's follower reads never go backwards. See `get_with_info` for the staleness.
        """
        kv, _ = await self._get(pkey, lkey, read_from, max_staleness_s, timeout)
        return kv

    async def get_with_info(
        self,
        pkey: Key,
        lkey: Key,
        *,
        read_from: ReadFrom = "follower",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> tuple[KeyValue | None, ReadInfo]:
        """`get` (a follower read by default), and who answered it how fresh (`ReadInfo`)."""
        kv, info = await self._get(pkey, lkey, read_from, max_staleness_s, timeout)
        return kv, info or ReadInfo(replica="leader", range_id=0, applied=0, staleness_s=0.0)

    async def _get(
        self,
        pkey: Key,
        lkey: Key,
        read_from: ReadFrom,
        max_staleness_s: float | None,
        timeout: float | None,
    ) -> tuple[KeyValue | None, ReadInfo | None]:
        pk = _bytes(pkey)
        response, info = await self._read(
            kv_rpc_pb2.RangeRequest(key=_bytes(lkey)),
            pk,
            timeout=timeout,
            what="get",
            read_from=read_from,
            max_staleness_s=max_staleness_s,
        )
        return (KeyValue.from_proto(pk, response.kvs[0]) if response.kvs else None), info

    async def scan(
        self,
        pkey: Key,
        start: Key = b"",
        end: Key | None = None,
        *,
        limit: int | None = None,
        page_size: int = 1000,
        keys_only: bool = False,
        read_from: ReadFrom = "leader",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[KeyValue]:
        """Iterate the keys of `pkey` with start <= lkey <= end (inclusive; None = to the end),
        in key order, fetching `page_size` keys per request. Each page is a consistent read;
        the iteration as a whole is not a snapshot. `limit`: stop after that many keys;
        `keys_only`: values are left empty. `timeout` bounds each page's request.
        `read_from`, `max_staleness_s`: as for `get`, per page."""
        check_timeout(timeout)
        pk = _bytes(pkey)
        span = _wire_span(start, end)
        if span is None:
            return
        next_key, range_end = span
        returned = 0
        while True:
            page = page_size if limit is None else min(page_size, limit - returned)
            if page <= 0:
                return
            request = kv_rpc_pb2.RangeRequest(
                key=next_key, range_end=range_end, limit=page, keys_only=keys_only
            )
            response, _ = await self._read(
                request,
                pk,
                timeout=timeout,
                what="scan",
                read_from=read_from,
                max_staleness_s=max_staleness_s,
            )
            for kv in response.kvs:
                yield KeyValue.from_proto(pk, kv)
            returned += len(response.kvs)
            if not response.more or not response.kvs or not range_end:
                return
            next_key = response.kvs[-1].key + b"\x00"

    async def count(
        self,
        pkey: Key,
        start: Key = b"",
        end: Key | None = None,
        *,
        read_from: ReadFrom = "leader",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> int:
        """How many keys of `pkey` lie in [start, end] (None = to the end). `read_from`,
        `max_staleness_s`: as for `get`."""
        check_timeout(timeout)
        span = _wire_span(start, end)
        if span is None:
            return 0
        request = kv_rpc_pb2.RangeRequest(key=span[0], range_end=span[1], count_only=True)
        response, _ = await self._read(
            request,
            _bytes(pkey),
            timeout=timeout,
            what="count",
            read_from=read_from,
            max_staleness_s=max_staleness_s,
        )
        return int(response.count)

    async def delete(
        self,
        pkey: Key,
        lkey: Key,
        *,
        expected_version: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Delete one key; returns 1 if it existed, else 0. With `expected_version`, only if
        the key's version is that (`BadVersionError`; `KeyNotFoundError` if it is missing)."""
        request = kv_rpc_pb2.DeleteRangeRequest(key=_bytes(lkey))
        if expected_version is not None:
            request.expected_version = expected_version
        response = await self._call(
            "Delete", request, _bytes(pkey), idempotent=False, timeout=timeout, what="delete"
        )
        return int(response.deleted)

    async def delete_range(
        self, pkey: Key, start: Key = b"", end: Key | None = None, *, timeout: float | None = None
    ) -> int:
        """Atomically delete the keys of `pkey` in [start, end] (None = to the end); returns
        how many existed."""
        check_timeout(timeout)
        span = _wire_span(start, end)
        if span is None:
            return 0
        request = kv_rpc_pb2.DeleteRangeRequest(key=span[0], range_end=span[1])
        response = await self._call(
            "Delete", request, _bytes(pkey), idempotent=False, timeout=timeout, what="delete_range"
        )
        return int(response.deleted)

    async def increment(
        self,
        pkey: Key,
        lkey: Key,
        amount: int = 1,
        *,
        get_total: bool = False,
        timeout: float | None = None,
    ) -> int | None:
        """Add `amount` to a number key (created at `amount` if missing). Returns the new total
        if `get_total`. Raises `BadRequestError` on a bytes key. Never retried once sent."""
        request = kv_rpc_pb2.IncrementRequest(key=_bytes(lkey), amount=amount, get_total=get_total)
        response = await self._call(
            "Increment", request, _bytes(pkey), idempotent=False, timeout=timeout, what="increment"
        )
        return int(response.total_amount) if get_total else None

    def txn(self, pkey: Key) -> AsyncTxn:
        """A transaction on the keys of `pkey`: add compares and ops, then `await commit()`."""
        return AsyncTxn(self, pkey)

    def watch(
        self,
        pkey: Key,
        lkey: Key | None = None,
        *,
        start: Key | None = None,
        end: Key | None = None,
        start_revision: int = 0,
        prev_kv: bool = False,
    ) -> AsyncWatch:
        """Watch one key (`lkey`) or the lkeys in [start, end] of `pkey` (`end` None = to the
        end of the pkey), from `start_revision` (0 = changes from now on). Use as
        `async with table.watch(...) as w: async for event in w: ...` (see `tablekeeper.watch`).
        """
        if (lkey is None) == (start is None):
            raise ValueError("watch one lkey, or a range from start (not both)")
        if lkey is not None:
            key, range_end = _bytes(lkey), b""
        else:
            assert start is not None
            span = _wire_span(start, end)
            if span is None:
                raise ValueError(f"empty key range: start {start!r} is after end {end!r}")
            key, range_end = span
        return AsyncWatch(
            self._context,
            self.info.table_id,
            _bytes(pkey),
            key,
            range_end,
            start_revision=start_revision,
            prev_kv=prev_kv,
        )

    async def batch_put(
        self,
        items: Sequence[tuple[Key, Key, Key | int]],
        *,
        mode: Literal["put", "increment"] = "put",
        timeout: float | None = None,
    ) -> list[TableKeeperError | None]:
        """Write many independent keys in one request per server (TableKeeper's Batch RPC).

        `items` are (pkey, lkey, value) for puts or (pkey, lkey, amount) for increments.
        Returns one entry per item: None on success, else the error. Only what the server
        reports as not applied is sent again. `timeout` bounds the whole call
        (`WriteTimeoutError`: some items may have been applied).
        """
        check_timeout(timeout)
        request = tablekeeper_pb2.BatchRequest()
        for pkey, lkey, value in items:
            op = request.ops.add()
            header = self._header(_bytes(pkey))
            if mode == "put":
                if isinstance(value, int):
                    raise TypeError("batch_put(mode='put') takes bytes or str values")
                op.put.CopyFrom(
                    kv_rpc_pb2.PutRequest(key=_bytes(lkey), value=_bytes(value), header=header)
                )
            else:
                if not isinstance(value, int):
                    raise TypeError("batch_put(mode='increment') takes int amounts")
                op.increment.CopyFrom(
                    kv_rpc_pb2.IncrementRequest(key=_bytes(lkey), amount=value, header=header)
                )
        out: list[TableKeeperError | None] = []
        results = await within(
            send_batch(self._context, request.ops, idempotent=False),
            timeout,
            what="batch_put",
            write=True,
        )
        for result in results:
            inner = getattr(result, str(result.WhichOneof("result")))
            code = inner.header.code
            out.append(error_for_result(code, result.error, result.retryable) if code else None)
        return out


__all__ = [
    "AsyncTable",
    "AsyncTxn",
    "CompareOp",
    "Key",
    "KeyValue",
    "TableInfo",
    "TxnResult",
]
