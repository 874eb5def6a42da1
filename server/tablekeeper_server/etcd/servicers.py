"""etcd v3 gRPC servicers: check the request as etcd does, call the keyspace, answer etcd's way.

Errors become statuses once, in `_unary` / the streams, from `etcd.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from tablekeeper_proto.etcd import kv_pb2, rpc_pb2, rpc_pb2_grpc
from tablekeeper_server.backup.format import BackupError
from tablekeeper_server.core.keys import prefix_end
from tablekeeper_server.edge.limits import key_refusal, request_refusal, value_refusal
from tablekeeper_server.edge.streams import OpenStreams, Registration
from tablekeeper_server.errors import (
    Code,
    CompactedError,
    KeyNotFoundError,
    TableKeeperError,
    WatcherTooSlowError,
)
from tablekeeper_server.etcd.apply import TXN_OPS_MAX, read_only_txn
from tablekeeper_server.etcd.errors import COMPACTED_REASON, EtcdError, from_tablekeeper
from tablekeeper_server.etcd.keys import PREFIX, span, to_kv
from tablekeeper_server.etcd.keyspace import MEMBER_ID, Keyspace
from tablekeeper_server.etcd.names import front_end_name
from tablekeeper_server.etcd.snapshot import KeyspaceSnapshots
from tablekeeper_server.etcd.state import PastView, StoreView, members_prefix
from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.replica import Range
from tablekeeper_server.range.sessions import TTL_MS_MAX
from tablekeeper_server.range.watch import ConvertedEvents, KeySpan, Watcher

log = logging.getLogger(__name__)

Context: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type stubs)
M = TypeVar("M")
SERVER_VERSION = "3.5.0"
"""The etcd API version reported by Status (what clients may rely on)."""
LEASE_TTL_MIN_S = 2
"""etcd's minimum lease TTL with its default election timeout; shorter requests get this."""
PROGRESS_INTERVAL_S = 600.0
_EMPTY = StoredRecord(0, 0, 0, False, 0, b"")
"""etcd's default interval of progress notifications for watches that ask for them."""


async def _unary(context: Context, handler: Callable[[], Awaitable[M]]) -> M:
    try:
        return await handler()
    except EtcdError as exc:
        await context.abort(exc.code, exc.message)
    except TableKeeperError as exc:
        error = from_tablekeeper(exc)
        await context.abort(error.code, error.message)
    raise AssertionError("unreachable")  # context.abort raises


def _check_put(req: rpc_pb2.PutRequest, limits: Limits) -> None:
    if not req.key:
        raise EtcdError("empty_key")
    if req.ignore_value and req.value:
        raise EtcdError("value_provided")
    if req.ignore_lease and req.lease:
        raise EtcdError("lease_provided")
    # etcd's one size bound is the whole request's ("request is too large"); the key and the
    # value a put stores are held to the limits every front-end shares (`edge.limits`).
    if key_refusal(len(req.key), limits) or value_refusal(len(req.value), limits):
        raise EtcdError("request_too_large")


def _check_request_size(req: rpc_pb2.PutRequest | rpc_pb2.TxnRequest, limits: Limits) -> None:
    if request_refusal(req.ByteSize(), limits):
        raise EtcdError("request_too_large")


def _check_txn(req: rpc_pb2.TxnRequest, limits: Limits) -> None:
    if len(req.compare) > TXN_OPS_MAX or max(len(req.success), len(req.failure)) > TXN_OPS_MAX:
        raise EtcdError("too_many_ops")
    for op in (*req.success, *req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put":
            _check_put(op.request_put, limits)
        elif kind in ("request_range", "request_delete_range"):
            if not getattr(op, kind).key:
                raise EtcdError("empty_key")
        elif kind == "request_txn":
            _check_txn(op.request_txn, limits)


class KVServicer(rpc_pb2_grpc.KVServicer):
    def __init__(self, keyspace: Keyspace, limits: Limits) -> None:
        self._keyspace = keyspace
        self._limits = limits

    async def Range(  # noqa: N802 (gRPC method names)
        self, request: rpc_pb2.RangeRequest, context: Context
    ) -> rpc_pb2.RangeResponse:
        return await _unary(context, lambda: self._keyspace.read(request))

    async def Put(self, request: rpc_pb2.PutRequest, context: Context) -> rpc_pb2.PutResponse:  # noqa: N802
        async def handle() -> rpc_pb2.PutResponse:
            _check_put(request, self._limits)
            _check_request_size(request, self._limits)
            txn = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_put=request)])
            result = await self._keyspace.write(txn)
            response = result.responses[0].response_put
            response.header.CopyFrom(result.header)
            return response

        return await _unary(context, handle)

    async def DeleteRange(  # noqa: N802
        self, request: rpc_pb2.DeleteRangeRequest, context: Context
    ) -> rpc_pb2.DeleteRangeResponse:
        async def handle() -> rpc_pb2.DeleteRangeResponse:
            if not request.key:
                raise EtcdError("empty_key")
            txn = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_delete_range=request)])
            result = await self._keyspace.write(txn)
            response = result.responses[0].response_delete_range
            response.header.CopyFrom(result.header)
            return response

        return await _unary(context, handle)

    async def Txn(self, request: rpc_pb2.TxnRequest, context: Context) -> rpc_pb2.TxnResponse:  # noqa: N802
        async def handle() -> rpc_pb2.TxnResponse:
            _check_txn(request, self._limits)
            _check_request_size(request, self._limits)
            if read_only_txn(request):
                return await self._keyspace.read_txn(request)
            return await self._keyspace.write(request)

        return await _unary(context, handle)

    async def Compact(  # noqa: N802
        self, request: rpc_pb2.CompactionRequest, context: Context
    ) -> rpc_pb2.CompactionResponse:
        async def handle() -> rpc_pb2.CompactionResponse:
            # Logged (every server that opens the keyspace agrees on it); `physical` needs no
            # wait: the history is dropped when the command's batch commits.
            result = await self._keyspace.compact(request.revision)
            return rpc_pb2.CompactionResponse(header=result.header)

        return await _unary(context, handle)


def _open_stream(streams: OpenStreams, keyspace: Keyspace, method: str) -> Registration:
    """Register the calling stream in the server's open streams, under the keyspace's front-end
    name (ended, by cancelling its task, when that port stops); etcd's "server stopped" once
    they are closed."""
    front_end = front_end_name(keyspace.name)
    if streams.closed(front_end):
        raise EtcdError("stopped")
    task = asyncio.current_task()
    assert task is not None  # a gRPC handler runs in a task

    def end() -> None:
        task.cancel()

    return streams.opened(front_end, method, end)


class LeaseServicer(rpc_pb2_grpc.LeaseServicer):
    """Leases are the keyspace range's sessions: granting one is a logged command (its id is
    the client's choice, or that command's revision); keep-alives only renew its in-memory
    deadline; revoking or expiry deletes its keys through the log, each key a DELETE event."""

    def __init__(self, keyspace: Keyspace, streams: OpenStreams) -> None:
        self._keyspace = keyspace
        self.streams = streams

    async def LeaseGrant(  # noqa: N802
        self, request: rpc_pb2.LeaseGrantRequest, context: Context
    ) -> rpc_pb2.LeaseGrantResponse:
        async def handle() -> rpc_pb2.LeaseGrantResponse:
            if request.ID < 0:
                raise EtcdError(
                    "negative_lease_id",
                    code=grpc.StatusCode.INVALID_ARGUMENT,
                    message="tablekeeper: a lease ID must be positive (or 0: the server picks)",
                )
            if request.TTL * 1000 > TTL_MS_MAX:
                raise EtcdError("lease_ttl_too_large")
            ttl_s = max(LEASE_TTL_MIN_S, request.TTL)
            range_ = await self._keyspace.range()
            created = await range_.sessions.create(ttl_s * 1000, session_id=request.ID)
            if created.header.code == Code.KEY_EXISTS:
                raise EtcdError("lease_exists")
            if created.header.code:
                raise EtcdError(
                    "grant", code=grpc.StatusCode.UNAVAILABLE, message="lease grant failed"
                )
            return rpc_pb2.LeaseGrantResponse(
                header=self._keyspace.header(range_.applied_sequence),
                ID=created.session_id,
                TTL=ttl_s,
            )

        return await _unary(context, handle)

    async def LeaseRevoke(  # noqa: N802
        self, request: rpc_pb2.LeaseRevokeRequest, context: Context
    ) -> rpc_pb2.LeaseRevokeResponse:
        async def handle() -> rpc_pb2.LeaseRevokeResponse:
            range_ = await self._keyspace.range()
            if range_.sessions.remaining_s(request.ID) is None:
                raise EtcdError("lease_not_found")
            closed = await range_.sessions.close(request.ID, "revoked")
            if closed.header.code:
                raise EtcdError("lease_not_found")
            return rpc_pb2.LeaseRevokeResponse(
                header=self._keyspace.header(range_.applied_sequence)
            )

        return await _unary(context, handle)

    async def LeaseKeepAlive(  # noqa: N802
        self, request_iterator: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest], context: Context
    ) -> AsyncIterator[rpc_pb2.LeaseKeepAliveResponse]:
        try:
            with _open_stream(self.streams, self._keyspace, "LeaseKeepAlive"):
                async for request in request_iterator:
                    range_ = await self._keyspace.range()
                    try:
                        ttl_s = range_.sessions.keep_alive(request.ID) // 1000
                    except KeyNotFoundError:
                        ttl_s = 0  # etcd answers an unknown lease with TTL 0
                    yield rpc_pb2.LeaseKeepAliveResponse(
                        header=self._keyspace.header(range_.applied_sequence),
                        ID=request.ID,
                        TTL=ttl_s,
                    )
        except EtcdError as exc:
            await context.abort(exc.code, exc.message)
        except TableKeeperError as exc:
            error = from_tablekeeper(exc)
            await context.abort(error.code, error.message)

    async def LeaseTimeToLive(  # noqa: N802
        self, request: rpc_pb2.LeaseTimeToLiveRequest, context: Context
    ) -> rpc_pb2.LeaseTimeToLiveResponse:
        async def handle() -> rpc_pb2.LeaseTimeToLiveResponse:
            range_ = await self._keyspace.range()
            view = StoreView(range_.applied_state())
            header = self._keyspace.header(view.revision)
            remaining = range_.sessions.remaining_s(request.ID)
            if remaining is None:
                return rpc_pb2.LeaseTimeToLiveResponse(header=header, ID=request.ID, TTL=-1)
            ttl_s, left_s = remaining
            response = rpc_pb2.LeaseTimeToLiveResponse(
                header=header, ID=request.ID, TTL=int(left_s), grantedTTL=round(ttl_s)
            )
            if request.keys:
                members = members_prefix(request.ID)
                for member, _ in view.store.scan(members, prefix_end(members)):
                    response.keys.append(member[len(members) + len(PREFIX) :])
            return response

        return await _unary(context, handle)

    async def LeaseLeases(  # noqa: N802
        self, request: rpc_pb2.LeaseLeasesRequest, context: Context
    ) -> rpc_pb2.LeaseLeasesResponse:
        async def handle() -> rpc_pb2.LeaseLeasesResponse:
            range_ = await self._keyspace.range()
            sm = range_.applied_state()
            return rpc_pb2.LeaseLeasesResponse(
                header=self._keyspace.header(sm.applied_sequence),
                leases=[rpc_pb2.LeaseStatus(ID=sid) for sid, _ in sm.session_ttls()],
            )

        return await _unary(context, handle)


class WatchServicer(rpc_pb2_grpc.WatchServicer):
    """One bidirectional stream carries many watches; each runs as a task over the keyspace
    range's watch hub (history catch-up, then live events) and sends into the stream's queue."""

    def __init__(
        self,
        keyspace: Keyspace,
        streams: OpenStreams,
        *,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self._keyspace = keyspace
        self._progress_interval_s = progress_interval_s
        self._events = _EventCache()
        self.streams = streams

    async def Watch(  # noqa: N802
        self, request_iterator: AsyncIterator[rpc_pb2.WatchRequest], context: Context
    ) -> AsyncIterator[rpc_pb2.WatchResponse]:
        try:
            registration = _open_stream(self.streams, self._keyspace, "Watch")
        except EtcdError as exc:
            await context.abort(exc.code, exc.message)
        with registration:
            stream = _WatchStream(self._keyspace, self._progress_interval_s, self._events)
            reader = asyncio.create_task(stream.read(request_iterator))
            try:
                while True:
                    yield await stream.next(reader)
            except EtcdError as exc:  # e.g. the keyspace is not open here (cluster mode)
                await context.abort(exc.code, exc.message)
            except TableKeeperError as exc:
                error = from_tablekeeper(exc)
                await context.abort(error.code, error.message)
            finally:
                reader.cancel()
                await stream.close()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader


class _Watch:
    def __init__(self, watch_id: int, create: rpc_pb2.WatchCreateRequest, now_s: float) -> None:
        self.id = watch_id
        self.create = create
        self.watcher: Watcher | None = None
        self.task: asyncio.Task[None] | None = None
        self.sent_at = now_s
        """When the watch last sent something (`Clock.monotonic_s`): progress is due after
        `progress_interval_s` of silence."""


class _WatchStream:
    QUEUE_MAX = 16
    """Responses waiting to be sent on one stream. Small on purpose: events wait in the range's
    per-watcher queue, which is bounded in bytes (--max-watcher-queue-bytes), not here."""

    def __init__(self, keyspace: Keyspace, progress_interval_s: float, events: _EventCache) -> None:
        self.keyspace = keyspace
        self.events = events
        self.progress_interval_s = progress_interval_s
        self.queue: asyncio.Queue[rpc_pb2.WatchResponse] = asyncio.Queue(self.QUEUE_MAX)
        self.watches: dict[int, _Watch] = {}
        self.next_id = 0
        self.ticker: asyncio.Task[None] | None = None

    async def next(self, reader: asyncio.Task[None]) -> rpc_pb2.WatchResponse:
        """The next response to send. A client that closed its sending side still gets its
        watches' events (as from etcd) until it cancels the call; a failed read ends the
        stream with its error."""
        with contextlib.suppress(asyncio.QueueEmpty):
            return self.queue.get_nowait()
        if not reader.done():
            getter = asyncio.ensure_future(self.queue.get())
            await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                return getter.result()
            getter.cancel()
        reader.result()
        return await self.queue.get()

    async def read(self, requests: AsyncIterator[rpc_pb2.WatchRequest]) -> None:
        async for request in requests:
            kind = request.WhichOneof("request_union")
            if kind == "create_request":
                await self.create(request.create_request)
            elif kind == "cancel_request":
                await self.cancel(request.cancel_request.watch_id)
            elif kind == "progress_request":
                await self.queue.put(
                    rpc_pb2.WatchResponse(header=await self.progress_header(None), watch_id=-1)
                )

    async def header(self) -> rpc_pb2.ResponseHeader:
        return self.keyspace.header(await self.keyspace.revision())

    async def progress_header(self, watch: _Watch | None) -> rpc_pb2.ResponseHeader:
        """A revision no later event of the watch(es) can be at or below: every event up to it
        was delivered (or did not match)."""
        revision = await self.keyspace.revision()
        watches = [watch] if watch is not None else list(self.watches.values())
        for each in watches:
            if each.watcher is not None and each.watcher.pending:
                revision = min(revision, each.watcher.last[0])
            elif each.watcher is not None:
                revision = min(revision, max(each.watcher.last[0], revision))
        return self.keyspace.header(revision)

    async def create(self, create: rpc_pb2.WatchCreateRequest) -> None:
        watch_id = create.watch_id if create.watch_id > 0 else self.next_id
        if watch_id in self.watches:
            await self.queue.put(
                rpc_pb2.WatchResponse(
                    header=await self.header(),
                    watch_id=watch_id,
                    created=True,
                    canceled=True,
                    cancel_reason="etcdserver: duplicate watch ID",
                )
            )
            return
        self.next_id = max(self.next_id, watch_id) + 1
        watch = _Watch(watch_id, create, self.keyspace.clock.monotonic_s())
        range_ = await self.keyspace.range()
        start, end = span(create.key, create.range_end)
        header = self.keyspace.header(range_.applied_sequence)
        try:
            watch.watcher, _ = range_.watch.start(KeySpan(start, end), create.start_revision)
        except CompactedError as exc:
            await self.queue.put(
                rpc_pb2.WatchResponse(header=header, watch_id=watch_id, created=True)
            )
            await self.queue.put(
                rpc_pb2.WatchResponse(
                    header=header,
                    watch_id=watch_id,
                    canceled=True,
                    compact_revision=exc.oldest_revision,
                    cancel_reason=COMPACTED_REASON,
                )
            )
            return
        self.watches[watch_id] = watch
        await self.queue.put(rpc_pb2.WatchResponse(header=header, watch_id=watch_id, created=True))
        watch.task = asyncio.create_task(self.run(range_, watch))
        if create.progress_notify and self.ticker is None:
            self.ticker = asyncio.create_task(self.tick())

    async def cancel(self, watch_id: int) -> None:
        watch = self.watches.pop(watch_id, None)
        if watch is None:
            return
        if watch.task is not None:
            watch.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch.task
        await self.queue.put(
            rpc_pb2.WatchResponse(header=await self.header(), watch_id=watch_id, canceled=True)
        )

    async def run(self, range_: Range, watch: _Watch) -> None:
        """Send the watch's events. etcd never drops a watcher for being slow: when the range
        cancels this one (its queue overflowed while the client read slowly), it registers
        again right after the last event it sent and catches up from the event history; only
        a history that no longer reaches back that far cancels it (with compact_revision)."""
        assert watch.watcher is not None
        create = watch.create
        no_put = rpc_pb2.WatchCreateRequest.NOPUT in create.filters
        no_delete = rpc_pb2.WatchCreateRequest.NODELETE in create.filters
        try:
            while True:
                try:
                    async for batch in range_.watch.events(watch.watcher):
                        events = [
                            self.events.get(range_, event, create.prev_kv)
                            for event in batch
                            if not (no_put if event.record is not None else no_delete)
                        ]
                        if events:
                            watch.sent_at = self.keyspace.clock.monotonic_s()
                            await self.queue.put(
                                rpc_pb2.WatchResponse(
                                    header=self.keyspace.header(range_.applied_sequence),
                                    watch_id=watch.id,
                                    events=events,
                                )
                            )
                    return
                except WatcherTooSlowError:
                    last = watch.watcher.last
                    log.info("etcd watch %d fell behind; catching up after %s", watch.id, last)
                    watcher, _ = range_.watch.start(watch.watcher.span, max(1, last[0]))
                    watcher.last = last
                    watch.watcher = watcher
        except CompactedError as exc:
            await self.cancel_compacted(range_, watch, exc.oldest_revision)
        except TableKeeperError as exc:
            self.watches.pop(watch.id, None)
            await self.queue.put(
                rpc_pb2.WatchResponse(
                    header=self.keyspace.header(range_.applied_sequence),
                    watch_id=watch.id,
                    canceled=True,
                    cancel_reason=exc.message,
                )
            )

    async def cancel_compacted(self, range_: Range, watch: _Watch, oldest: int) -> None:
        self.watches.pop(watch.id, None)
        await self.queue.put(
            rpc_pb2.WatchResponse(
                header=self.keyspace.header(range_.applied_sequence),
                watch_id=watch.id,
                canceled=True,
                compact_revision=oldest,
                cancel_reason=COMPACTED_REASON,
            )
        )

    async def tick(self) -> None:
        clock = self.keyspace.clock
        while True:
            await clock.sleep(self.progress_interval_s / 2)
            now = clock.monotonic_s()
            for watch in list(self.watches.values()):
                if watch.create.progress_notify and now - watch.sent_at >= self.progress_interval_s:
                    watch.sent_at = now
                    await self.queue.put(
                        rpc_pb2.WatchResponse(
                            header=await self.progress_header(watch), watch_id=watch.id
                        )
                    )

    async def close(self) -> None:
        tasks = [w.task for w in self.watches.values() if w.task is not None]
        if self.ticker is not None:
            tasks.append(self.ticker)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.watches.clear()


class _EventCache:
    """The etcd form of recent changes: a change is converted once however many watchers
    receive it (bounded in entries and bytes; see `ConvertedEvents`)."""

    def __init__(self) -> None:
        self._converted: ConvertedEvents[kv_pb2.Event] = ConvertedEvents()

    def get(self, range_: Range, event: ChangeEvent, prev_kv: bool) -> kv_pb2.Event:
        key = (range_.name.log_name, event.revision, event.index, prev_kv)
        return self._converted.get(key, event, lambda: _convert_event(range_, event, prev_kv))


def _convert_event(range_: Range, event: ChangeEvent, prev_kv: bool) -> kv_pb2.Event:
    out = kv_pb2.Event()
    if event.record is None:
        out.type = kv_pb2.Event.DELETE
        out.kv.key = to_kv(event.key, _EMPTY, 0).key
        out.kv.mod_revision = event.revision
    else:
        out.type = kv_pb2.Event.PUT
        # The event does not carry the key's lease: the key's current one is reported.
        out.kv.CopyFrom(to_kv(event.key, event.record, _lease_now(range_, event.key)))
    if prev_kv and event.prev is not None:
        out.prev_kv.CopyFrom(to_kv(event.key, event.prev, 0))
    return out


def _lease_now(range_: Range, key: bytes) -> int:
    try:
        return StoreView(range_.applied_state()).lease(key)
    except TableKeeperError:
        return 0


class ClusterServicer(rpc_pb2_grpc.ClusterServicer):
    """MemberList: the etcd client URL of every server (clients discover endpoints from it).
    Standalone that is this server; in cluster mode `members()` gives every live server's."""

    def __init__(
        self,
        client_url: str,
        members: Callable[[], Awaitable[list[tuple[str, str]]]] | None = None,
        scheme: str = "http",
    ) -> None:
        self._client_url = client_url
        self._members = members
        self._scheme = scheme

    async def MemberList(  # noqa: N802
        self, request: rpc_pb2.MemberListRequest, context: Context
    ) -> rpc_pb2.MemberListResponse:
        if self._members is None:
            members = [("tablekeeper", MEMBER_ID, self._client_url)]
        else:
            members = [
                (endpoint, _member_id(endpoint), f"{self._scheme}://{address}")
                for endpoint, address in await self._members()
            ]
        return rpc_pb2.MemberListResponse(
            header=Keyspace.header(0),
            members=[
                rpc_pb2.Member(ID=member_id, name=name, peerURLs=[url], clientURLs=[url])
                for name, member_id, url in members
            ],
        )


def _member_id(endpoint: str) -> int:
    """A stable, non-zero member id for a server of a cluster (etcd's are 64-bit)."""
    digest = hashlib.blake2b(endpoint.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1 or 1


class MaintenanceServicer(rpc_pb2_grpc.MaintenanceServicer):
    def __init__(self, keyspace: Keyspace) -> None:
        self._keyspace = keyspace
        self.snapshots: KeyspaceSnapshots | None = None
        """What Snapshot streams (`etcd.snapshot`); None: UNIMPLEMENTED."""

    async def Snapshot(  # noqa: N802
        self, request: rpc_pb2.SnapshotRequest, context: Context
    ) -> AsyncIterator[rpc_pb2.SnapshotResponse]:
        snapshots = self.snapshots
        if snapshots is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "snapshots are not enabled here")
            return
        try:
            async with contextlib.aclosing(snapshots.stream()) as responses:
                async for response in responses:
                    yield response
        except EtcdError as exc:
            await context.abort(exc.code, exc.message)
        except TableKeeperError as exc:
            error = from_tablekeeper(exc)
            await context.abort(error.code, error.message)
        except BackupError as exc:
            log.warning("etcd snapshot failed: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcdserver: snapshot failed: {exc}")

    async def Alarm(  # noqa: N802
        self, request: rpc_pb2.AlarmRequest, context: Context
    ) -> rpc_pb2.AlarmResponse:
        return rpc_pb2.AlarmResponse(header=self._keyspace.header(0))

    async def Defragment(  # noqa: N802
        self, request: rpc_pb2.DefragmentRequest, context: Context
    ) -> rpc_pb2.DefragmentResponse:
        async def handle() -> rpc_pb2.DefragmentResponse:
            # etcd rewrites its database file; here the keyspace range's RocksDB is compacted.
            range_ = await self._keyspace.range()
            if not await range_.compact_store():
                raise EtcdError("stopped")
            return rpc_pb2.DefragmentResponse(header=self._keyspace.header(range_.applied_sequence))

        return await _unary(context, handle)

    async def HashKV(  # noqa: N802
        self, request: rpc_pb2.HashKVRequest, context: Context
    ) -> rpc_pb2.HashKVResponse:
        async def handle() -> rpc_pb2.HashKVResponse:
            # A CRC-32 of every key at the revision (key, value, revisions, version; not its
            # lease) in key order: equal for equal keyspaces, stable across restarts and
            # failovers (not etcd's own bytes, which hash its database layout).
            range_ = await self._keyspace.range()
            current = StoreView(range_.applied_state())
            revision = request.revision or current.revision
            if revision > current.revision:
                raise EtcdError("future_rev")
            view: StoreView | PastView = (
                current if revision == current.revision else PastView(current, revision)
            )
            digest = 0
            for key, record in view.scan(PREFIX, prefix_end(PREFIX)):
                kv = to_kv(key, record, 0)
                digest = zlib.crc32(kv.SerializeToString(deterministic=True), digest)
            return rpc_pb2.HashKVResponse(
                header=self._keyspace.header(current.revision),
                hash=digest,
                compact_revision=current.compacted,
                hash_revision=revision,
            )

        return await _unary(context, handle)

    async def Status(  # noqa: N802
        self, request: rpc_pb2.StatusRequest, context: Context
    ) -> rpc_pb2.StatusResponse:
        async def handle() -> rpc_pb2.StatusResponse:
            range_ = await self._keyspace.range()
            revision = range_.applied_sequence
            size = range_.wal_bytes()
            return rpc_pb2.StatusResponse(
                header=self._keyspace.header(revision),
                version=SERVER_VERSION,
                dbSize=size,
                dbSizeInUse=size,
                leader=MEMBER_ID,
                raftIndex=revision,
                raftTerm=1,
                raftAppliedIndex=revision,
            )

        return await _unary(context, handle)
