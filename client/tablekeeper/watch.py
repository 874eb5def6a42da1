"""Watches: a stream of the changes of one key, or an lkey range of one pkey.

    async with table.watch("pkey", "lkey", start_revision=rev) as watch:
        async for event in watch:
            ...

Events arrive in revision order, each exactly once. If the stream breaks (the server restarts,
the range moves), the watch reconnects by itself and resumes right after the last event it
delivered, for up to `RetryPolicy.deadline_s` of failed attempts; the stream goes to the range's
owner (located again on every reconnect, see `_routes`). Older revisions come from
each range's bounded event history; when a revision is no longer held the watch raises
`CompactedError` (with `oldest_revision`); a watcher that falls too far behind is cancelled by
the server (`WatchCancelledError`) and may watch again from its last revision.

A client's watches of one table on one server share one stream (`_watch_mux`); against a server
without the shared streams each watch has a stream of its own.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Protocol

import grpc

from tablekeeper._context import ClientContext
from tablekeeper._loop import LoopThread
from tablekeeper._routes import BOOTSTRAP, Target
from tablekeeper._watch_mux import Created, Ended, Item, convert_events
from tablekeeper.errors import (
    CompactedError,
    UnavailableError,
    WatchCancelledError,
    error_for_status,
)
from tablekeeper.types import WatchEvent
from tablekeeper_proto.v1 import watch_pb2, watch_pb2_grpc

_INDEX_MAX = 2**32 - 1
_RESUMABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
)


class _Feed(Protocol):
    """One watch's messages from the server, whichever way they come."""

    async def next(self) -> Item: ...

    async def close(self) -> None: ...


class _OwnStream:
    """A watch on a stream of its own (the `Watch` RPC)."""

    def __init__(self, call: Any, pkey: bytes) -> None:
        self._call = call
        self._pkey = pkey
        self._created: Created | None = None

    async def next(self) -> Item:
        if self._created is not None:  # the first message also had events
            created, self._created = self._created, None
            return created
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as error:
            return Ended(
                error.code(), error.details() or "", error.trailing_metadata() or (), error
            )
        if message is grpc.aio.EOF:  # the server is stopping or gave the range away
            return Ended(None, "the server ended the watch stream")
        events = convert_events(self._pkey, message.events, {})
        if message.created:
            if not events:
                return Created(message.revision)
            self._created = Created(message.revision)
        return events

    async def close(self) -> None:
        self._call.cancel()


class AsyncWatch:
    """An async iterator of `WatchEvent`s; also an async context manager (closes the stream)."""

    def __init__(
        self,
        context: ClientContext,
        table_id: int,
        pkey: bytes,
        key: bytes,
        range_end: bytes,
        *,
        start_revision: int = 0,
        prev_kv: bool = False,
    ) -> None:
        """A watch of [key, range_end) (range_end b"": the key alone) of `pkey` in the table;
        see `AsyncTable.watch`."""
        self._context = context
        self._pkey = pkey
        self._request = watch_pb2.WatchRequest(
            stream_id=table_id,
            pkey=pkey,
            key=key,
            range_end=range_end,
            start_revision=start_revision,
            prev_kv=prev_kv,
        )
        self._last: tuple[int, int] | None = None
        self._feed: _Feed | None = None
        self._target = BOOTSTRAP
        """Where `_feed` went (forgotten by the route cache if the stream breaks)."""
        self._buffer: deque[WatchEvent] = deque()
        self._closed = False
        self.revision = 0
        """The range's revision when the watch (first) started; set by `start()`."""

    async def start(self) -> AsyncWatch:
        """Open the stream and wait until the server has registered the watch: no change after
        `self.revision` is missed from then on."""
        if self._feed is None:
            await self._open()
        return self

    async def _subscribe(self, target: Target, request: watch_pb2.WatchRequest) -> _Feed:
        context = self._context
        if context.watch_streams_unsupported:
            stub = context.stub("watch", watch_pb2_grpc.WatchStub, target.endpoint)
            return _OwnStream(stub.Watch(request), request.pkey)
        return await context.watch_streams.subscribe(target.endpoint, request)

    async def _open(self) -> None:
        context = self._context
        policy = context.retry
        deadline = time.monotonic() + policy.deadline_s
        backoff = policy.initial_backoff_s
        while True:
            request = watch_pb2.WatchRequest()
            request.CopyFrom(self._request)
            if self._last is not None:
                # Resume: from the revision after the last whole one delivered (events up to
                # `_last` are skipped if the server repeats them).
                revision, index = self._last
                request.start_revision = revision + 1 if index == _INDEX_MAX else revision
            target = await context.routes.locate(request.stream_id, request.pkey)
            feed = await self._subscribe(target, request)
            first = await feed.next()
            if isinstance(first, Ended):
                await feed.close()
                if (
                    first.code == grpc.StatusCode.UNIMPLEMENTED
                    and first.rpc_error is not None
                    and not context.watch_streams_unsupported
                ):
                    # A server without shared watch streams: a stream per watch, from now on.
                    context.watch_streams_unsupported = True
                    continue
                self._raise_final(first)
                self._failed(target, first)
                if time.monotonic() >= deadline:
                    name = first.code.name if first.code is not None else "ENDED"
                    raise UnavailableError(f"watch: {name}: {first.details}")
                await asyncio.sleep(random.uniform(0, backoff))
                backoff = min(policy.max_backoff_s, backoff * 2)
                continue
            if not isinstance(first, Created):
                await feed.close()
                raise UnavailableError("watch: the server ended the stream before creating it")
            if self._last is None:
                self.revision = first.revision
                start = self._request.start_revision
                self._last = (start - 1 if start else first.revision, _INDEX_MAX)
            self._feed = feed
            self._target = target
            return

    def _failed(self, target: Target, ended: Ended) -> None:
        """Tell the route cache: a stream that broke, or a watch ended as not served there,
        makes it look the range's owner up again."""
        if ended.rpc_error is not None:
            self._context.routes.failed(target, ended.rpc_error)
        elif ended.code in (None, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
            self._context.routes.failed(target)

    def _raise_final(self, ended: Ended) -> None:
        """Raise the error if resuming cannot help: the error tables' reading of it, except
        that a watch the server ends with RESOURCE_EXHAUSTED was cancelled (too far behind)."""
        code = ended.code
        if code is None or code in _RESUMABLE:
            return
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            last = f"; resume from revision {self._last[0]}" if self._last is not None else ""
            if "resume from revision" in ended.details:
                last = ""
            raise WatchCancelledError((ended.details or "watch cancelled") + last)
        final = error_for_status(code, ended.details, ended.trailers, idempotent=True)
        if isinstance(final, CompactedError):
            raise final
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            message = ended.details or "bad watch request"
        else:
            message = f"watch: {code.name}: {ended.details}"
        raise type(final)(message, code=final.code or None)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            if self._feed is None:
                await self._open()
                assert self._feed is not None
            message = await self._feed.next()
            if isinstance(message, Ended):
                if self._closed:
                    raise StopAsyncIteration
                await self._feed.close()
                self._feed = None  # resume after the last delivered event
                self._raise_final(message)
                self._failed(self._target, message)
                continue
            if isinstance(message, Created):  # a server repeating it: nothing to deliver
                continue
            assert self._last is not None
            for event in message:
                position = (event.revision, event.index)
                if position > self._last:
                    self._buffer.append(event)
                    self._last = position
        return self._buffer.popleft()

    async def close(self) -> None:
        """Stop watching (ends the stream, or this watch's share of it)."""
        self._closed = True
        if self._feed is not None:
            feed, self._feed = self._feed, None
            await feed.close()

    async def __aenter__(self) -> AsyncWatch:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Watch:
    """Synchronous twin of `AsyncWatch`: an iterator and a context manager."""

    def __init__(self, runner: LoopThread, watch: AsyncWatch) -> None:
        self._runner = runner
        self._watch = watch

    @property
    def revision(self) -> int:
        """The range's revision when the watch (first) started (0 until started)."""
        return self._watch.revision

    def start(self) -> Watch:
        """Start watching: the watch is created on the server when this returns."""
        self._runner.run(self._watch.start())
        return self

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        async def step() -> WatchEvent | None:
            try:
                return await self._watch.__anext__()
            except StopAsyncIteration:
                return None

        event = self._runner.run(step())
        if event is None:
            raise StopIteration
        return event

    def close(self) -> None:
        """Stop watching (ends the stream)."""
        self._runner.run(self._watch.close())

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["AsyncWatch", "CompactedError", "Watch", "WatchCancelledError", "WatchEvent"]
