"""The Watch servicer (TableKeeper's `tablekeeper.v1.Watch`): thin, like the others.

Two RPCs: `Watch`, one watch per stream, and `WatchMany`, many watches on one stream (what the
SDK uses): the updates ready for any of a stream's watches go out in one message, and a change is
converted once (`_EventCache`) for every watcher of it on the server, so a change watched by a
thousand watchers over a few streams costs a few messages, not a thousand.

The domain work is in `range.watch`; errors become gRPC statuses in `rpc.status.stream_errors`
(`Watch`) or, in `WatchMany`, the same status carried in the ended watch's update.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc

from tablekeeper_proto.bookkeeper import kv_pb2
from tablekeeper_proto.v1 import watch_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.keys import pkey_prefix
from tablekeeper_server.core.varint import length, varint
from tablekeeper_server.edge.streams import OpenStreams
from tablekeeper_server.errors import (
    BadRequestError,
    CompactedError,
    NotServedHereError,
    TableKeeperError,
    UnavailableError,
    wire_rule,
)
from tablekeeper_server.range.bookkeeper_reads import key_span, to_key_value
from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.replica import Range
from tablekeeper_server.range.watch import ConvertedEvents, KeySpan, Watcher
from tablekeeper_server.rpc.proxy import WATCH_SERVICE, Forwarder, was_forwarded
from tablekeeper_server.rpc.status import (
    CODE_METADATA_KEY,
    COMPACTED_METADATA_KEY,
    grpc_status,
    stream_errors,
)

log = logging.getLogger(__name__)

Context: TypeAlias = Any  # grpc.aio.ServicerContext

FRONT_END = "bookkeeper"
"""This service's streams in the server's open streams (`edge.streams`)."""
UPDATES_PER_MESSAGE_MAX = 1024
"""Updates one `WatchMany` message carries at most (each update's events are bounded in bytes
by the range's watch hub)."""


def _tag(message: Any, field: str, wire_type: int) -> bytes:
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


_LENGTH_DELIMITED, _VARINT = 2, 0
_UPDATE_ID = _tag(watch_pb2.WatchUpdate, "watch_id", _VARINT)
_UPDATE_EVENT = _tag(watch_pb2.WatchUpdate, "events", _LENGTH_DELIMITED)
_RESPONSE_UPDATE = _tag(watch_pb2.WatchStreamResponse, "updates", _LENGTH_DELIMITED)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + length(len(payload)) + payload


def update_header(watch_id: int) -> bytes:
    """How every serialized `WatchUpdate` of the watch starts (its id)."""
    return _UPDATE_ID + varint(watch_id)


def response_field(update: bytes) -> bytes:
    """A serialized `WatchUpdate` as an `updates` entry of a `WatchStreamResponse`: a message
    is the join of such entries (repeated fields concatenate)."""
    return _RESPONSE_UPDATE + length(len(update)) + update


def events_update_field(header: bytes, events: bytes) -> bytes:
    """The `updates` entry of a watch's `WatchUpdate` of events, from its `update_header` and
    its events already encoded as `events` entries and joined (`_EventCache.encoded`): what a
    stream sends per watcher costs a join, not a conversion and a serialization."""
    return b"".join((_RESPONSE_UPDATE, length(len(header) + len(events)), header, events))


def _event(prefix_len: int, event: ChangeEvent, prev_kv: bool) -> watch_pb2.WatchEvent:
    lkey = event.key[prefix_len:]
    out = watch_pb2.WatchEvent(revision=event.revision, index=event.index)
    if event.record is None:
        out.type = watch_pb2.WatchEvent.DELETE
        out.kv.CopyFrom(kv_pb2.KeyValue(key=lkey, mod_revision=event.revision))
    else:
        out.type = watch_pb2.WatchEvent.PUT
        out.kv.CopyFrom(to_key_value(lkey, event.record))
    if prev_kv and event.prev is not None:
        out.prev_kv.CopyFrom(to_key_value(lkey, event.prev))
    return out


class _EventCache:
    """Changes in this service's wire form, converted once for all their watchers: as
    `WatchEvent`s (the one-watch stream) and as encoded `WatchUpdate.events` entries (the
    shared streams)."""

    def __init__(self) -> None:
        self._converted: ConvertedEvents[watch_pb2.WatchEvent] = ConvertedEvents()
        self._encoded: ConvertedEvents[bytes] = ConvertedEvents()

    def get(
        self, range_: Range, prefix_len: int, event: ChangeEvent, prev_kv: bool
    ) -> watch_pb2.WatchEvent:
        key = (range_.name.log_name, event.revision, event.index, prefix_len, prev_kv)
        return self._converted.get(key, event, lambda: _event(prefix_len, event, prev_kv))

    def encoded(self, range_: Range, prefix_len: int, event: ChangeEvent, prev_kv: bool) -> bytes:
        key = (range_.name.log_name, event.revision, event.index, prefix_len, prev_kv)
        return self._encoded.get(
            key,
            event,
            lambda: _length_delimited(
                _UPDATE_EVENT, self.get(range_, prefix_len, event, prev_kv).SerializeToString()
            ),
        )


def _check(request: watch_pb2.WatchRequest, limits: Limits) -> None:
    if not request.stream_id:
        raise BadRequestError("watch needs a table (stream) id")
    if not request.key and not request.range_end:
        raise BadRequestError("watch needs a key or a key range")
    if max(len(request.pkey), len(request.key)) > limits.key_bytes_max:
        raise BadRequestError("key too long")
    if request.start_revision < 0:
        raise BadRequestError("start_revision must be >= 0")


def _ended(watch_id: int, exc: TableKeeperError) -> watch_pb2.WatchUpdate:
    """The update that ends a watch with `exc`, as the one-watch stream's status would."""
    update = watch_pb2.WatchUpdate(
        watch_id=watch_id,
        error_code=grpc_status(wire_rule(exc).grpc).value[0],
        error_message=exc.message,
        error_status=exc.code,
    )
    if isinstance(exc, CompactedError):
        update.compacted_revision = exc.oldest_revision
    return update


def _relayed_end(watch_id: int, error: grpc.aio.AioRpcError, via: str) -> watch_pb2.WatchUpdate:
    """The update that ends a watch relayed from its owner the way the owner's stream ended."""
    code = error.code()
    if code == grpc.StatusCode.NOT_FOUND:
        code = grpc.StatusCode.UNAVAILABLE  # resume elsewhere
    update = watch_pb2.WatchUpdate(
        watch_id=watch_id,
        error_code=code.value[0],
        error_message=f"{error.details() or ''} (via {via})",
    )
    for key, value in error.trailing_metadata() or ():
        if key == CODE_METADATA_KEY and value.lstrip("-").isdigit():
            update.error_status = int(value)
        elif key == COMPACTED_METADATA_KEY and value.isdigit():
            update.compacted_revision = int(value)
    return update


class WatchServicer:
    """In cluster mode a watch on a range owned elsewhere is relayed from the owner."""

    def __init__(
        self,
        registry: ContainerRegistry,
        limits: Limits,
        forwarder: Forwarder | None = None,
        streams: OpenStreams | None = None,
    ) -> None:
        self._registry = registry
        self._limits = limits
        self._forwarder = forwarder
        self.streams = streams if streams is not None else OpenStreams()
        """The server's open streams (this service's watches here), ended by `shutdown`."""
        self._events = _EventCache()

    def shutdown(self) -> None:
        """End every open stream (the server is stopping): clients resume elsewhere."""
        self.streams.close(FRONT_END)

    def _refuse_if_stopping(self) -> None:
        if self.streams.closed(FRONT_END):
            raise UnavailableError("server shutting down")

    async def Watch(  # noqa: N802
        self, request: watch_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[watch_pb2.WatchResponse]:
        async with stream_errors("Watch", context):
            located = await self._locate(request, context)
            if isinstance(located, NotServedHereError):
                assert self._forwarder is not None
                relayed = self._forwarder.relay(
                    located.container_id,
                    WATCH_SERVICE + "Watch",
                    request,
                    watch_pb2.WatchResponse,
                    context,
                )
                async with contextlib.aclosing(relayed) as responses:
                    async for response in responses:
                        yield response
                return
            range_, prefix, span = located
            hub = range_.watch
            self._refuse_if_stopping()  # nothing awaited from here to the registration
            watcher, revision = hub.start(span, request.start_revision)

            def shut_down() -> None:
                resume = watcher.last[0]
                watcher.fail(
                    UnavailableError(f"server shutting down; resume from revision {resume}")
                )

            with self.streams.opened(FRONT_END, "Watch", shut_down):
                yield watch_pb2.WatchResponse(created=True, revision=revision)
                # Ends by raising the watcher's error (closed range, too slow, shutdown).
                async with contextlib.aclosing(hub.events(watcher)) as events:
                    async for batch in events:
                        yield watch_pb2.WatchResponse(
                            events=[
                                self._events.get(range_, len(prefix), e, request.prev_kv)
                                for e in batch
                            ]
                        )

    async def _locate(
        self, request: watch_pb2.WatchRequest, context: Context
    ) -> tuple[Range, bytes, KeySpan] | NotServedHereError:
        """The watch's range, its pkey's key prefix and the keys it follows; or, in cluster
        mode, the `NotServedHereError` of a range owned elsewhere, to relay from its owner."""
        _check(request, self._limits)
        self._refuse_if_stopping()
        prefix = pkey_prefix(request.pkey)
        span = KeySpan(*key_span(prefix, request.key, request.range_end))
        try:
            range_ = await self._registry.table_range(request.stream_id, request.pkey)
        except NotServedHereError as elsewhere:
            if self._forwarder is None or was_forwarded(context):
                raise
            return elsewhere
        return range_, prefix, span

    async def WatchMany(  # noqa: N802
        self, request_iterator: AsyncIterator[watch_pb2.WatchStreamRequest], context: Context
    ) -> AsyncIterator[bytes]:
        async with stream_errors("WatchMany", context):
            self._refuse_if_stopping()
            stream = _WatchStream(self, context)
            with self.streams.opened(FRONT_END, "WatchMany", stream.stop):
                reader = asyncio.create_task(stream.read(request_iterator))
                try:
                    while True:
                        message = await stream.next(reader)
                        if message is None:
                            return
                        yield message  # sent as is (`add_watch_service`)
                finally:
                    reader.cancel()
                    await stream.close()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await reader


def add_watch_service(servicer: WatchServicer, server: Any) -> None:
    """Register the Watch service: as generated, except that `WatchMany` sends the bytes its
    handler yields as they are (it serializes them itself, see `response_field`)."""
    handlers = {
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch,
            request_deserializer=watch_pb2.WatchRequest.FromString,
            response_serializer=watch_pb2.WatchResponse.SerializeToString,
        ),
        "WatchMany": grpc.stream_stream_rpc_method_handler(
            servicer.WatchMany,
            request_deserializer=watch_pb2.WatchStreamRequest.FromString,
            response_serializer=bytes,
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("tablekeeper.v1.Watch", handlers),)
    )


@dataclass(frozen=True, slots=True)
class _Live:
    """A watch of a `WatchMany` stream past its catch-up: its events come as they are applied."""

    watcher: Watcher
    range_: Range
    prefix_len: int
    prev_kv: bool
    header: bytes
    """The start of each of its updates (its id), encoded once."""


class _Outbox:
    """A `WatchMany` stream's updates waiting to be sent, each an encoded `updates` entry (a
    message is their join), at most `bound` of them: `put` waits for room; the pump `push`es
    what one wake-up brings and then waits for room (`wait_room`) if that filled it."""

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._entries: deque[bytes] = deque()
        self.readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, entry: bytes) -> bool:
        """Add `entry` without waiting; True if that filled the outbox (see `wait_room`)."""
        self._entries.append(entry)
        self.readable.set()
        if len(self._entries) >= self._bound:
            self._room.clear()
            return True
        return False

    async def wait_room(self) -> None:
        while len(self._entries) >= self._bound:
            await self._room.wait()

    async def put(self, entry: bytes) -> None:
        await self.wait_room()
        self.push(entry)

    def take(self, most: int) -> list[bytes]:
        """The oldest entries, at most `most` of them."""
        entries = self._entries
        taken = [entries.popleft() for _ in range(min(most, len(entries)))]
        if not entries:
            self.readable.clear()
        if len(entries) < self._bound:
            self._room.set()
        return taken


class _WatchStream:
    """The watches of one `WatchMany` stream. A task per watch creates it and sends its
    catch-up; then one pump for the whole stream sends the live events of the watches that
    have some (`Watcher.on_ready` names them), so a change wakes one task per stream, not one
    per watcher. Whatever updates are queued go out in one message."""

    QUEUE_MAX = 256
    """Updates waiting to be sent. Small on purpose: events wait in each watcher's queue in the
    range, which is bounded in bytes (--max-watcher-queue-bytes) and cancels a watcher that
    falls too far behind, not here."""

    def __init__(self, servicer: WatchServicer, context: Context) -> None:
        self._servicer = servicer
        self._context = context
        self._outbox = _Outbox(self.QUEUE_MAX)
        self._watches: dict[int, asyncio.Task[None]] = {}
        """Watches being created or catching up (or relayed from their owner)."""
        self._live: dict[int, _Live] = {}
        self._ready: set[int] = set()
        self._ready_event = asyncio.Event()
        self._pump = asyncio.create_task(self._send_live())
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """The server is stopping: end the stream at once (clients resume elsewhere, from the
        last event they had)."""
        self._stopped.set()

    async def next(self, reader: asyncio.Task[None]) -> bytes | None:
        """The next message to send (at least one update, encoded), or None to end the stream:
        the server is stopping (clients resume elsewhere), or the client has closed its side and
        no watch is left. A failed read ends the stream with its error."""
        outbox = self._outbox
        while not outbox:
            if self._stopped.is_set():
                return None
            if reader.done():
                reader.result()  # a failed read ends the stream with its error
                if not self._watches and not self._live:
                    return None
                # The client closed its side: its watches go on until it cancels the call.
            readable = asyncio.ensure_future(outbox.readable.wait())
            stopped = asyncio.ensure_future(self._stopped.wait())
            waits: set[asyncio.Future[Any]] = {readable, stopped}
            if not reader.done():
                waits.add(reader)
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                readable.cancel()
        if self._stopped.is_set():
            return None
        return b"".join(outbox.take(UPDATES_PER_MESSAGE_MAX))

    async def read(self, requests: AsyncIterator[watch_pb2.WatchStreamRequest]) -> None:
        async for request in requests:
            kind = request.WhichOneof("request")
            if kind == "create":
                watch_id = request.create.watch_id
                if watch_id in self._watches or watch_id in self._live:
                    await self._send(
                        _ended(watch_id, BadRequestError(f"duplicate watch id {watch_id}"))
                    )
                    continue
                self._start(watch_id, request.create.watch)
            elif kind == "cancel_id":
                self._end(request.cancel_id)

    def _end(self, watch_id: int) -> None:
        """Forget a watch (cancelled by the client, or ended)."""
        task = self._watches.pop(watch_id, None)
        if task is not None:
            task.cancel()
        live = self._live.pop(watch_id, None)
        if live is not None:
            live.range_.watch.stop(live.watcher)

    def _start(self, watch_id: int, request: watch_pb2.WatchRequest) -> None:
        task = asyncio.create_task(self._run(watch_id, request))
        self._watches[watch_id] = task

        def forget(_: asyncio.Task[None]) -> None:
            if self._watches.get(watch_id) is task:
                del self._watches[watch_id]

        task.add_done_callback(forget)

    async def _run(self, watch_id: int, request: watch_pb2.WatchRequest) -> None:
        servicer = self._servicer
        try:
            located = await servicer._locate(request, self._context)
            if isinstance(located, NotServedHereError):
                await self._relay(watch_id, located.container_id, request)
                return
            range_, prefix, span = located
            hub = range_.watch
            watcher, revision = hub.start(span, request.start_revision)
            try:
                outbox = self._outbox
                await self._send(
                    watch_pb2.WatchUpdate(watch_id=watch_id, created=True, revision=revision)
                )
                encoded = servicer._events.encoded
                prefix_len, prev_kv = len(prefix), request.prev_kv
                header = update_header(watch_id)
                async with contextlib.aclosing(hub.catch_up(watcher)) as backlog:
                    async for batch in backlog:
                        events = b"".join([encoded(range_, prefix_len, e, prev_kv) for e in batch])
                        await outbox.put(events_update_field(header, events))
            except BaseException:
                hub.stop(watcher)
                raise
            # Live from here: the stream's pump sends what comes (and what came meanwhile).
            self._live[watch_id] = _Live(watcher, range_, prefix_len, prev_kv, header)
            watcher.on_ready = functools.partial(self._mark_ready, watch_id)
            self._mark_ready(watch_id)
        except TableKeeperError as exc:
            await self._send(_ended(watch_id, exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("watch %d of a WatchMany stream failed", watch_id)
            await self._send(
                watch_pb2.WatchUpdate(
                    watch_id=watch_id,
                    error_code=grpc.StatusCode.INTERNAL.value[0],
                    error_message=f"watch failed: {exc}",
                )
            )

    def _mark_ready(self, watch_id: int) -> None:
        self._ready.add(watch_id)
        self._ready_event.set()

    async def _send_live(self) -> None:
        """The pump: sends the live events of every watch that has some, and ends the watches
        whose watcher ended (the range closed, it fell too far behind)."""
        try:
            await self._pump_live()
        except Exception:  # a defect: end the stream (its watches resume on a new one)
            log.exception("a WatchMany stream failed")
            self._stopped.set()

    async def _pump_live(self) -> None:
        encoded = self._servicer._events.encoded
        outbox = self._outbox
        while True:
            await self._ready_event.wait()
            self._ready_event.clear()
            ready, self._ready = self._ready, set()
            # The watches woken together mostly got the same change: its encoded events are
            # joined once per wake-up (keyed by the event objects, kept alive meanwhile).
            joined: dict[tuple[int, ...], tuple[bytes, list[ChangeEvent]]] = {}
            for watch_id in ready:
                live = self._live.get(watch_id)
                if live is None:
                    continue
                watcher = live.watcher
                try:
                    batch = live.range_.watch.take_live(watcher)
                except TableKeeperError as exc:
                    self._end(watch_id)
                    await self._send(_ended(watch_id, exc))
                    continue
                if batch:
                    range_, prefix_len, prev_kv = live.range_, live.prefix_len, live.prev_kv
                    key = (id(range_), prefix_len, prev_kv, *map(id, batch))
                    known = joined.get(key)
                    if known is None:
                        events = b"".join([encoded(range_, prefix_len, e, prev_kv) for e in batch])
                        joined[key] = (events, batch)
                    else:
                        events = known[0]
                    if outbox.push(events_update_field(live.header, events)):
                        await outbox.wait_room()
                if watcher.pending or watcher.error is not None:
                    self._mark_ready(watch_id)  # more than one batch, or its end

    async def _send(self, update: watch_pb2.WatchUpdate) -> None:
        await self._outbox.put(response_field(update.SerializeToString()))

    async def _relay(
        self, watch_id: int, container_id: int, request: watch_pb2.WatchRequest
    ) -> None:
        """Cluster mode: the watch's range is owned elsewhere; relay it from the owner."""
        forwarder = self._servicer._forwarder
        assert forwarder is not None
        endpoint = forwarder.owner(container_id)
        relayed = forwarder.stream(
            endpoint, WATCH_SERVICE + "Watch", request, watch_pb2.WatchResponse, self._context
        )
        try:
            async with contextlib.aclosing(relayed) as responses:
                async for response in responses:
                    await self._send(
                        watch_pb2.WatchUpdate(
                            watch_id=watch_id,
                            created=response.created,
                            revision=response.revision,
                            events=response.events,
                        )
                    )
        except grpc.aio.AioRpcError as error:
            await self._send(_relayed_end(watch_id, error, endpoint))
            return
        await self._send(
            _ended(watch_id, UnavailableError(f"the owner {endpoint} ended the watch"))
        )

    async def close(self) -> None:
        for watch_id in list(self._live):
            self._end(watch_id)
        tasks = [*self._watches.values(), self._pump]
        self._watches.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
