"""Many watches on one stream: the SDK's watches of one table on one server share a `WatchMany`
stream (as etcd's clientv3 shares one Watch stream among its watchers), so a change watched by
a thousand watches in one client is one message, not a thousand.

`WatchStreams` (one per client context) holds the streams, keyed by server and table: a
permission refused on a table ends only that table's watches. A `Subscription` is one watch on a
stream: `next()` gives its updates in order, then the `Ended` that ends it, which is either the
watch's own end (its status, as the one-watch RPC would have ended) or the whole stream's (every
watch on it ends alike and resumes on a new stream). The stream is closed when its last watch is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tablekeeper.errors import CODE_METADATA_KEY, COMPACTED_METADATA_KEY
from tablekeeper.types import KeyValue, WatchEvent
from tablekeeper_proto.v1 import watch_pb2

INBOX_UPDATES_MAX = 10_000
"""Updates one watch may have received and not yet consumed; beyond, it is ended as too slow
(RESOURCE_EXHAUSTED, like the server's bound on a watcher's queue) instead of holding the
stream's other watches back or growing without bound."""


@dataclass(frozen=True, slots=True)
class Ended:
    """How a watch's stream ended: a gRPC status (None: the server closed the stream without
    one), its details and `tk-*` trailers; `rpc_error` when the whole stream failed."""

    code: grpc.StatusCode | None
    details: str
    trailers: Sequence[tuple[str, str]] = ()
    rpc_error: grpc.aio.AioRpcError | None = None


@dataclass(frozen=True, slots=True)
class Created:
    """The watch is registered: no change after `revision` (the range's, then) is missed."""

    revision: int


Item = Created | list[WatchEvent] | Ended
"""What a watch receives: `Created` first, then lists of events, until its `Ended`."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}

EventKey = tuple[bytes, int, int, bool]


def convert_events(
    pkey: bytes, events: Sequence[watch_pb2.WatchEvent], converted: dict[EventKey, WatchEvent]
) -> list[WatchEvent]:
    """The SDK's form of a watch's events of `pkey`. `converted` holds what one message's
    other watches already converted (events are immutable, so watches share them)."""
    out = []
    for event in events:
        has_prev = event.HasField("prev_kv")
        key = (pkey, event.revision, event.index, has_prev)
        shared = converted.get(key)
        if shared is None:
            is_put = event.type == watch_pb2.WatchEvent.PUT
            shared = converted[key] = WatchEvent(
                type="put" if is_put else "delete",
                pkey=pkey,
                lkey=event.kv.key,
                kv=KeyValue.from_proto(pkey, event.kv) if is_put else None,
                prev=KeyValue.from_proto(pkey, event.prev_kv) if has_prev else None,
                revision=event.revision,
                index=event.index,
            )
        out.append(shared)
    return out


def _ended(update: watch_pb2.WatchUpdate) -> Ended:
    trailers = [(CODE_METADATA_KEY, str(update.error_status))]
    if update.compacted_revision:
        trailers.append((COMPACTED_METADATA_KEY, str(update.compacted_revision)))
    return Ended(
        _CODES.get(update.error_code, grpc.StatusCode.UNKNOWN), update.error_message, trailers
    )


class Subscription:
    """One watch on a shared stream."""

    def __init__(self, stream: _Stream, watch_id: int, pkey: bytes) -> None:
        self._stream = stream
        self.watch_id = watch_id
        self.pkey = pkey
        # A deque and one waiter rather than an asyncio.Queue: delivering to a thousand
        # watches per message is the client's hot path.
        self._inbox: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.ended: Ended | None = None

    def deliver(self, item: Item) -> None:
        self._inbox.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def backlog(self) -> int:
        """Updates received and not yet consumed."""
        return len(self._inbox)

    async def next(self) -> Item:
        """The watch's next update, or how it ended (then always that)."""
        if self.ended is not None:
            return self.ended
        while not self._inbox:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._inbox.popleft()
        if isinstance(item, Ended):
            self.ended = item
        return item

    async def close(self) -> None:
        """Stop the watch (the stream goes on for the others; closed after the last). A task
        waiting in `next()` gets CANCELLED."""
        await self._stream.unsubscribe(self)
        self.deliver(Ended(grpc.StatusCode.CANCELLED, "watch closed"))


class _Stream:
    def __init__(self, open_call: Callable[[], Any], on_closed: Callable[[_Stream], None]) -> None:
        self._call: Any = open_call()
        self._on_closed = on_closed
        self._subscriptions: dict[int, Subscription] = {}
        self._next_id = 1
        self._write_lock = asyncio.Lock()
        self._writes: set[asyncio.Task[None]] = set()
        self.closed = False
        self._reader = asyncio.create_task(self._read())

    async def subscribe(self, request: watch_pb2.WatchRequest) -> Subscription:
        subscription = Subscription(self, self._next_id, request.pkey)
        self._next_id += 1
        self._subscriptions[subscription.watch_id] = subscription
        create = watch_pb2.WatchCreate(watch_id=subscription.watch_id, watch=request)
        # A failed write means a failed stream: the reader ends every watch on it, this one too.
        await self._write_quietly(watch_pb2.WatchStreamRequest(create=create))
        if self.closed and subscription.ended is None:
            subscription.deliver(Ended(grpc.StatusCode.UNAVAILABLE, "watch stream closed"))
        return subscription

    async def unsubscribe(self, subscription: Subscription) -> None:
        if self._subscriptions.pop(subscription.watch_id, None) is None:
            return
        if not self._subscriptions:
            self.close()
            return
        if subscription.ended is None:
            await self._write_quietly(watch_pb2.WatchStreamRequest(cancel_id=subscription.watch_id))

    async def _read(self) -> None:
        ended: Ended
        try:
            async for response in self._call:
                converted: dict[EventKey, WatchEvent] = {}
                for update in response.updates:
                    subscription = self._subscriptions.get(update.watch_id)
                    if subscription is None:
                        continue  # a watch closed meanwhile
                    if update.error_code:
                        del self._subscriptions[update.watch_id]
                        subscription.deliver(_ended(update))
                    elif subscription.backlog >= INBOX_UPDATES_MAX:
                        self._too_slow(subscription)
                    else:
                        if update.created:
                            subscription.deliver(Created(update.revision))
                        if update.events:
                            subscription.deliver(
                                convert_events(subscription.pkey, update.events, converted)
                            )
            ended = Ended(None, "the server ended the watch stream")
        except grpc.aio.AioRpcError as error:
            ended = Ended(
                error.code(), error.details() or "", error.trailing_metadata() or (), error
            )
        except asyncio.CancelledError:
            ended = Ended(grpc.StatusCode.CANCELLED, "watch stream closed")
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                self._end_all(ended)
                raise
        self._end_all(ended)

    def _end_all(self, ended: Ended) -> None:
        self.closed = True
        subscriptions, self._subscriptions = list(self._subscriptions.values()), {}
        for subscription in subscriptions:
            subscription.deliver(ended)
        self._on_closed(self)

    def _too_slow(self, subscription: Subscription) -> None:
        del self._subscriptions[subscription.watch_id]
        subscription.deliver(
            Ended(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the watch fell {subscription.backlog} updates behind in the client (its "
                f"events were not read) and was cancelled",
            )
        )
        cancel = watch_pb2.WatchStreamRequest(cancel_id=subscription.watch_id)
        task = asyncio.create_task(self._write_quietly(cancel))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_quietly(self, request: watch_pb2.WatchStreamRequest) -> None:
        """Send `request` unless the stream has failed or been closed (its reader reports)."""
        try:
            async with self._write_lock:
                await self._call.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # The call was cancelled under the write (the stream closed), not this task.

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._call.cancel()
            self._on_closed(self)


class WatchStreams:
    """The watch streams of one client, one per (server endpoint, table)."""

    def __init__(self, stub_for: Callable[[str | None], Any]) -> None:
        """`stub_for(endpoint)`: the Watch stub on the channel to `endpoint` (None: the
        service's bootstrap endpoint)."""
        self._stub_for = stub_for
        self._streams: dict[tuple[str | None, int], _Stream] = {}

    async def subscribe(
        self, endpoint: str | None, request: watch_pb2.WatchRequest
    ) -> Subscription:
        """Start a watch on the stream to `endpoint` for the request's table (opened if need
        be). Its first update is `created` or its end."""
        key = (endpoint, request.stream_id)
        stream = self._streams.get(key)
        if stream is None or stream.closed:
            stub = self._stub_for(endpoint)

            def forget(closed: _Stream) -> None:
                if self._streams.get(key) is closed:
                    del self._streams[key]

            stream = self._streams[key] = _Stream(stub.WatchMany, forget)
        return await stream.subscribe(request)

    def close(self) -> None:
        for stream in list(self._streams.values()):
            stream.close()
        self._streams.clear()
