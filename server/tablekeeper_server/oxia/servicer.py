"""The `io.streamnative.oxia.proto.OxiaClient` servicer: thin, like TableKeeper's own.

Shards are ranges (`oxia.namespaces`); a write is one logged range command (`oxia.apply`);
reads run on the range's applied state (`oxia.reads`); sessions are the range's sessions
(`range.sessions`: a session id is the revision that created it); notifications come from the
range's change feed and history (`range.watch`). Errors are mapped once, in `oxia.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any, TypeAlias

import grpc

from tablekeeper_proto.oxia import apply_pb2, client_pb2, client_pb2_grpc
from tablekeeper_proto.v1 import session_pb2, wal_pb2
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.edge.limits import key_refusal, request_refusal, value_refusal
from tablekeeper_server.edge.streams import OpenStreams, Registration
from tablekeeper_server.errors import (
    BadRequestError,
    CompactedError,
    InvalidKeyError,
    KeyNotFoundError,
    ResourceLimitError,
    TableKeeperError,
    UnavailableError,
)
from tablekeeper_server.oxia import keys, reads
from tablekeeper_server.oxia.apply import sequence_key, sequence_state_key
from tablekeeper_server.oxia.errors import OxiaError, from_tablekeeper
from tablekeeper_server.oxia.leaders import ShardLeaders
from tablekeeper_server.oxia.namespaces import Namespaces, Shard
from tablekeeper_server.oxia.records import version_id
from tablekeeper_server.range.apply import failure_of
from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.records import decode_record
from tablekeeper_server.range.watch import KeySpan, Watcher, WatchHub

Context: TypeAlias = Any  # grpc.aio.ServicerContext
log = logging.getLogger(__name__)
WRITES_IN_FLIGHT_MAX = 1024
"""Writes one write stream may have in the range's queue before it stops reading requests."""


class _oxia_errors:  # noqa: N801 (used like a function: `async with _oxia_errors(context)`)
    """Aborts the call with Oxia's status for an error raised inside.

    A class, not a `contextlib.asynccontextmanager`: streaming methods yield inside it, and when
    the loop finalizes an abandoned stream (its shutdown, or the stream's generator collected)
    it closes every async generator at once, in any order; a generator-based manager closed
    before the stream's own generator makes the stream's close fail with "generator didn't
    stop after athrow()"."""

    def __init__(self, context: Context) -> None:
        self.context = context

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> bool:
        if isinstance(exc, OxiaError):
            await self.context.abort(exc.code, exc.message)
        elif isinstance(exc, TableKeeperError):
            error = from_tablekeeper(exc)
            await self.context.abort(error.code, error.message)
        return False


def _check_write(request: client_pb2.WriteRequest, limits: Limits) -> None:
    """Refuse what Oxia refuses before anything is logged (nothing of the request is applied),
    and what is over the limits every front-end shares (`edge.limits`): a key too long is
    INVALID_ARGUMENT, a value or the whole request too large RESOURCE_EXHAUSTED (what Oxia
    answers for a request over its gRPC frame; its clients fail the writes of the request)."""
    if reason := request_refusal(request.ByteSize(), limits):
        raise ResourceLimitError(reason)
    for put in request.puts:
        if reason := key_refusal(len(put.key.encode()), limits):
            raise InvalidKeyError(reason)
        if reason := value_refusal(len(put.value), limits):
            raise ResourceLimitError(reason)
        if put.sequence_key_delta:
            if not put.HasField("partition_key"):
                raise OxiaError.invalid("sequential key operation requires partition key")
            if put.HasField("expected_version_id"):
                raise OxiaError.invalid("sequential key operation cannot have an expected version")
            if put.sequence_key_delta[0] == 0:
                raise OxiaError.invalid("the first sequence key delta must be > 0")
        elif put.HasField("expected_version_id") and put.expected_version_id < -1:
            raise OxiaError.invalid("expected_version_id must be >= -1")
    for delete in request.deletes:
        if reason := key_refusal(len(delete.key.encode()), limits):
            raise InvalidKeyError(reason)


def _notification_batches(
    shard_id: int, events: Iterable[ChangeEvent], now_ms: int
) -> Iterable[client_pb2.NotificationBatch]:
    """One batch per revision (Oxia's offset), each key's last change in it."""
    batch: client_pb2.NotificationBatch | None = None
    for event in events:
        if batch is None or batch.offset != event.revision:
            if batch is not None:
                yield batch
            batch = client_pb2.NotificationBatch(
                shard=shard_id, offset=event.revision, timestamp=now_ms
            )
        notification = batch.notifications[keys.from_store_key(event.key)]
        if event.record is None:
            notification.Clear()
            notification.type = client_pb2.KEY_DELETED
        else:
            notification.type = (
                client_pb2.KEY_CREATED if event.record.version == 0 else client_pb2.KEY_MODIFIED
            )
            notification.version_id = version_id(event.record)
    if batch is not None:
        yield batch


def _write_response(result: object) -> client_pb2.WriteResponse:
    """The answer of an Oxia write from its range's response (raises its failure)."""
    assert isinstance(result, apply_pb2.ApplyResult), result
    failure = failure_of(result)
    if failure is not None:
        raise failure
    return result.response


def _stream_answer(done: object) -> client_pb2.WriteResponse:
    """A write stream's answer from what `OxiaServicer._submit`'s future gave: `_write`'s
    answer, or the one outcome of `Range.submit_many` (a response, or the error it raises)."""
    if isinstance(done, client_pb2.WriteResponse):
        return done
    assert isinstance(done, list) and len(done) == 1, done
    outcome = done[0]
    if isinstance(outcome, TableKeeperError):
        raise outcome
    return _write_response(outcome)


def start_after(hub: WatchHub, span: KeySpan, offset: int) -> Watcher:
    """A watcher of the changes after `offset`. An offset older than the range's event history
    resumes at the oldest change still held, as Oxia does once its notifications are trimmed:
    the client skips what it can no longer get instead of retrying forever."""
    try:
        watcher, _ = hub.start(span, max(1, offset + 1))
    except CompactedError as compacted:
        log.warning(
            "%s: notifications after %d are trimmed; resuming at %d",
            hub.name,
            offset,
            compacted.oldest_revision,
        )
        watcher, _ = hub.start(span, compacted.oldest_revision)
    return watcher


class OxiaServicer(client_pb2_grpc.OxiaClientServicer):
    def __init__(
        self,
        namespaces: Namespaces,
        leaders: ShardLeaders,
        limits: Limits,
        clock: Clock,
        streams: OpenStreams | None = None,
    ) -> None:
        self.namespaces = namespaces
        self.clock = clock
        """Stamps notification batches (the time they are sent)."""
        self.leaders = leaders
        """Each shard's leader: this front-end standalone, its container's owner in a cluster."""
        self.limits = limits
        self.streams = streams if streams is not None else OpenStreams()
        """The server's open streams (the change feeds here), ended by `shutdown`."""
        self._stopping = asyncio.Event()
        """Set by `shutdown`: the assignment and write streams end on it."""

    def shutdown(self) -> None:
        """End every open stream (the server is stopping: clients reconnect)."""
        self._stopping.set()
        self.streams.close(keys.FRONT_END)

    def _refuse_if_stopping(self) -> None:
        if self.streams.closed(keys.FRONT_END):
            raise UnavailableError("server shutting down")

    def _open_stream(self, method: str, watcher: Watcher) -> Registration:
        """Register a change feed in the server's open streams: when the server stops, its
        watcher fails and the stream ends with UNAVAILABLE (the client reconnects)."""
        shutting_down = UnavailableError("server shutting down")
        return self.streams.opened(keys.FRONT_END, method, lambda: watcher.fail(shutting_down))

    # ------------------------------------------------------------------ shard assignments

    async def _assignments(
        self, namespace: str, shards: list[Shard]
    ) -> client_pb2.ShardAssignments:
        assignment = client_pb2.NamespaceShardsAssignment(shard_key_router=client_pb2.XXHASH3)
        for shard in shards:
            assignment.assignments.append(
                client_pb2.ShardAssignment(
                    shard=shard.shard_id,
                    leader=await self.leaders.leader(shard.container_id),
                    int32_hash_range=client_pb2.Int32HashRange(
                        min_hash_inclusive=shard.hash_min,
                        max_hash_inclusive=shard.hash_max,
                    ),
                )
            )
        response = client_pb2.ShardAssignments()
        response.namespaces[namespace].CopyFrom(assignment)
        return response

    async def GetShardAssignments(  # noqa: N802
        self, request: client_pb2.ShardAssignmentsRequest, context: Context
    ) -> AsyncIterator[client_pb2.ShardAssignments]:
        """The namespace's shards and their leaders, then again whenever a leader changes
        (cluster mode: the assignment moved a container), until the server stops. A table's
        shards never change, so only the leaders are read again."""
        async with _oxia_errors(context):
            shards = await self.namespaces.shards(request.namespace)
            sent: client_pb2.ShardAssignments | None = None
            stopping = asyncio.ensure_future(self._stopping.wait())
            try:
                while True:
                    changed = self.leaders.next_change()
                    response = await self._assignments(request.namespace, shards)
                    if response != sent:
                        yield response
                        sent = response
                    change = asyncio.ensure_future(changed.wait())
                    await asyncio.wait((change, stopping), return_when=asyncio.FIRST_COMPLETED)
                    change.cancel()
                    if stopping.done():
                        return
            finally:
                stopping.cancel()

    # ------------------------------------------------------------------ writes

    async def _write(
        self, shard_id: int, request: client_pb2.WriteRequest
    ) -> client_pb2.WriteResponse:
        _check_write(request, self.limits)
        if not (request.puts or request.deletes or request.delete_ranges):
            return client_pb2.WriteResponse()
        range_ = await self.namespaces.range(shard_id)
        request.ClearField("shard")  # the log keeps what the write does, not where it came in
        result = await range_.execute(wal_pb2.WalCommand(oxia_write=request.SerializeToString()))
        return _write_response(result)

    def _submit(self, shard_id: int, request: client_pb2.WriteRequest) -> asyncio.Future[Any]:
        """A write stream's request, checked and queued in its range now (no task of its own
        when the range is open here and its queue has room: `Range.submit_many`), else through
        `_write`. What the returned future gives goes through `_stream_answer`."""
        _check_write(request, self.limits)
        if request.puts or request.deletes or request.delete_ranges:
            range_ = self.namespaces.open_range(shard_id)
            if range_ is not None:
                request.ClearField("shard")
                command = wal_pb2.WalCommand(oxia_write=request.SerializeToString())
                submitted = range_.submit_many([command])
                if submitted is not None:
                    return submitted
                request.shard = shard_id
        return asyncio.ensure_future(self._write(shard_id, request))

    async def Write(  # noqa: N802
        self, request: client_pb2.WriteRequest, context: Context
    ) -> client_pb2.WriteResponse:
        async with _oxia_errors(context):
            if not request.HasField("shard"):
                raise OxiaError.invalid("a write needs a shard")
            return await self._write(request.shard, request)
        raise AssertionError("unreachable")  # abort raised

    async def WriteStream(  # noqa: N802
        self, request_iterator: AsyncIterator[client_pb2.WriteRequest], context: Context
    ) -> AsyncIterator[client_pb2.WriteResponse]:
        """Requests are answered in order; several are in the range's queue at once (group
        commit), up to `WRITES_IN_FLIGHT_MAX`. A failed request ends the stream with its error
        (the client fails what it had in flight and opens a new stream). When the server stops,
        the stream stops reading, answers what it has and ends, so it does not hold the drain.

        So it does too when this server stops leading the stream's shard (cluster mode: the
        assignment moved its container to another server, e.g. back to a restarted one). Oxia's
        clients keep one write stream per shard and open another only once it has ended, to the
        leader their assignment stream names by then; a stream left open here would fail the
        client's next write with "not leader" instead.

        Per request: its write is queued in the range as it is read (`_submit`), and the answer
        loop waits on one future that the reader, its end and the stream's ends complete (no
        `asyncio.wait` per message)."""
        header_shard = None
        for key, value in context.invocation_metadata() or ():
            if key == "shard-id":
                with contextlib.suppress(ValueError):
                    header_shard = int(value)
        pending: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue(maxsize=WRITES_IN_FLIGHT_MAX)
        wake: list[asyncio.Future[None] | None] = [None]

        def poke(_: object = None) -> None:
            waiting = wake[0]
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

        async def read_requests() -> None:
            async for request in request_iterator:
                shard = request.shard if request.HasField("shard") else header_shard
                if shard is None:
                    raise OxiaError.invalid("a write stream needs a shard-id")
                await pending.put(self._submit(shard, request))
                poke()

        reader = asyncio.ensure_future(read_requests())
        stop = asyncio.ensure_future(self._stopping.wait())
        moved: asyncio.Future[None] | None = None
        if self.leaders.clustered and header_shard is not None:
            moved = asyncio.ensure_future(self._until_not_leader(header_shard))
        ends = (stop,) if moved is None else (stop, moved)
        for future in (reader, *ends):
            future.add_done_callback(poke)
        loop = asyncio.get_running_loop()
        try:
            async with _oxia_errors(context):
                while True:
                    if any(end.done() for end in ends):
                        # The server is stopping, or no longer leads the shard: read no more,
                        # answer what was sent, end the stream (the client opens a new one, to
                        # the shard's leader of its latest assignment).
                        reader.cancel()
                        while not pending.empty():
                            yield _stream_answer(await pending.get_nowait())
                        return
                    if not pending.empty():
                        # Writes are in the range's queue: answer the oldest when it is done
                        # (the stream's ends are looked at again before the next).
                        yield _stream_answer(await pending.get_nowait())
                        continue
                    if reader.done():
                        reader.result()  # a bad request ends the stream with its error
                        return
                    waiting = wake[0] = loop.create_future()
                    await waiting
                    wake[0] = None
        finally:
            for future in (reader, stop, moved, wake[0]):
                if future is not None:
                    future.cancel()
            # The client ended the call while we waited: collect the reader's end, or asyncio
            # logs "Task exception was never retrieved" for a normal close.
            if reader.done() and not reader.cancelled():
                reader.exception()
            while not pending.empty():
                pending.get_nowait().cancel()

    async def _until_not_leader(self, shard_id: int) -> None:
        """Returns once the assignment gives the shard's container to another server; never
        for a shard that cannot be resolved here (its writes fail on their own)."""
        try:
            shard = await self.namespaces.shard(shard_id)
        except Exception:  # unknown shard, catalog unreachable: nothing to watch
            await asyncio.get_running_loop().create_future()  # until cancelled
            return
        while True:
            changed = self.leaders.next_change()
            if not self.leaders.leads(shard.container_id):
                return
            await changed.wait()

    # ------------------------------------------------------------------ reads

    async def Read(  # noqa: N802
        self, request: client_pb2.ReadRequest, context: Context
    ) -> AsyncIterator[client_pb2.ReadResponse]:
        async with _oxia_errors(context):
            range_ = self.namespaces.open_range(request.shard) or await self.namespaces.range(
                request.shard
            )
            store = range_.applied_state().store
            # Every get on one view of the applied state, then sent in pages (Oxia's sizes).
            for message in list(reads.read_responses(store, request.gets)):
                yield message

    async def List(  # noqa: N802
        self, request: client_pb2.ListRequest, context: Context
    ) -> AsyncIterator[client_pb2.ListResponse]:
        async with _oxia_errors(context):
            if request.HasField("secondary_index_name"):
                raise OxiaError.invalid("secondary indexes are not supported")
            range_ = self.namespaces.open_range(request.shard) or await self.namespaces.range(
                request.shard
            )
            store = range_.applied_state().store
            # Read the whole answer at once: one consistent view of the applied state.
            pages = list(reads.list_pages(store, request.start_inclusive, request.end_exclusive))
            for page in pages:
                yield client_pb2.ListResponse(keys=page)

    async def RangeScan(  # noqa: N802
        self, request: client_pb2.RangeScanRequest, context: Context
    ) -> AsyncIterator[client_pb2.RangeScanResponse]:
        async with _oxia_errors(context):
            if request.HasField("secondary_index_name"):
                raise OxiaError.invalid("secondary indexes are not supported")
            range_ = self.namespaces.open_range(request.shard) or await self.namespaces.range(
                request.shard
            )
            store = range_.applied_state().store
            pages = list(reads.scan_pages(store, request.start_inclusive, request.end_exclusive))
            for page in pages:
                yield client_pb2.RangeScanResponse(records=page)

    # ------------------------------------------------------------------ sessions

    async def CreateSession(  # noqa: N802
        self, request: client_pb2.CreateSessionRequest, context: Context
    ) -> client_pb2.CreateSessionResponse:
        async with _oxia_errors(context):
            range_ = await self.namespaces.range(request.shard)
            try:
                response = await range_.sessions.create(request.session_timeout_ms)
            except BadRequestError:
                raise OxiaError.invalid_session_timeout() from None
            if response.header.code != 0:
                raise OxiaError(grpc.StatusCode.UNKNOWN, "oxia: could not create the session")
            return client_pb2.CreateSessionResponse(session_id=response.session_id)
        raise AssertionError("unreachable")

    async def KeepAlive(  # noqa: N802
        self, request: client_pb2.SessionHeartbeat, context: Context
    ) -> client_pb2.KeepAliveResponse:
        async with _oxia_errors(context):
            range_ = await self.namespaces.range(request.shard)
            try:
                range_.sessions.keep_alive(request.session_id)
            except KeyNotFoundError:
                raise OxiaError.session_not_found() from None
            return client_pb2.KeepAliveResponse()
        raise AssertionError("unreachable")

    async def CloseSession(  # noqa: N802
        self, request: client_pb2.CloseSessionRequest, context: Context
    ) -> client_pb2.CloseSessionResponse:
        async with _oxia_errors(context):
            range_ = await self.namespaces.range(request.shard)
            response: session_pb2.SessionResponse = await range_.sessions.close(
                request.session_id, "closed"
            )
            if response.header.code != 0:
                raise OxiaError.session_not_found()
            return client_pb2.CloseSessionResponse()
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ change feeds

    async def GetNotifications(  # noqa: N802
        self, request: client_pb2.NotificationsRequest, context: Context
    ) -> AsyncIterator[client_pb2.NotificationBatch]:
        """From `start_offset_exclusive` on, every change, one batch per revision; without it,
        first an empty batch at the current revision (Oxia's way to tell the client where it
        starts), then every later change."""
        async with _oxia_errors(context):
            range_ = await self.namespaces.range(request.shard)
            hub = range_.watch
            span = KeySpan(keys.PREFIX, keys.END)
            self._refuse_if_stopping()  # nothing awaited from here to the registration
            first: client_pb2.NotificationBatch | None = None
            if request.HasField("start_offset_exclusive"):
                watcher = start_after(hub, span, request.start_offset_exclusive)
            else:
                watcher, applied = hub.start(span, 0)
                first = client_pb2.NotificationBatch(shard=request.shard, offset=applied)
            with self._open_stream("GetNotifications", watcher):
                if first is not None:
                    yield first
                async with contextlib.aclosing(hub.events(watcher)) as batches:
                    async for events in batches:
                        now_ms = self.clock.now_ms()
                        for batch in _notification_batches(request.shard, events, now_ms):
                            yield batch

    async def GetSequenceUpdates(  # noqa: N802
        self, request: client_pb2.GetSequenceUpdatesRequest, context: Context
    ) -> AsyncIterator[client_pb2.GetSequenceUpdatesResponse]:
        """The highest key generated under the prefix `key`, now (if any) and after each new one."""
        async with _oxia_errors(context):
            if not request.key:
                raise OxiaError.invalid("GetSequenceUpdates needs a key")
            range_ = await self.namespaces.range(request.shard)
            hub = range_.watch
            self._refuse_if_stopping()  # nothing awaited from here to the registration
            watcher, _ = hub.start(KeySpan(keys.PREFIX, keys.END), 0)
            with self._open_stream("GetSequenceUpdates", watcher):
                # No await between registering and reading: nothing is missed in between.
                raw = range_.applied_state().store.get(sequence_state_key(request.key))
                highest = ""
                if raw is not None:
                    value = decode_record(raw).value
                    parts = [int.from_bytes(value[i : i + 8]) for i in range(0, len(value), 8)]
                    highest = sequence_key(request.key, parts)
                    yield client_pb2.GetSequenceUpdatesResponse(highest_sequence_key=highest)
                prefix = request.key + "-"
                async with contextlib.aclosing(hub.events(watcher)) as batches:
                    async for events in batches:
                        newest = highest
                        for event in events:
                            if event.record is None or event.prev is not None:
                                continue
                            key = keys.from_store_key(event.key)
                            if key.startswith(prefix) and key > newest:
                                newest = key
                        if newest != highest:
                            highest = newest
                            yield client_pb2.GetSequenceUpdatesResponse(
                                highest_sequence_key=highest
                            )
