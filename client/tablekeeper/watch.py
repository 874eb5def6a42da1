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
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

import grpc

from tablekeeper._context import ClientContext
from tablekeeper._loop import LoopThread
from tablekeeper._routes import BOOTSTRAP
from tablekeeper.errors import (
    CompactedError,
    UnavailableError,
    WatchCancelledError,
    error_for_rpc_error,
)
from tablekeeper.types import KeyValue, WatchEvent
from tablekeeper_proto.v1 import watch_pb2, watch_pb2_grpc

_INDEX_MAX = 2**32 - 1
_RESUMABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
)


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
        self._call: Any = None
        self._target = BOOTSTRAP
        """Where `_call` went (forgotten by the route cache if the stream breaks)."""
        self._buffer: list[WatchEvent] = []
        self._closed = False
        self.revision = 0
        """The range's revision when the watch (first) started; set by `start()`."""

    async def start(self) -> AsyncWatch:
        """Open the stream and wait until the server has registered the watch: no change after
        `self.revision` is missed from then on."""
        if self._call is None:
            await self._open()
        return self

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
            call = context.stub("watch", watch_pb2_grpc.WatchStub, target.endpoint).Watch(request)
            try:
                first = await call.read()
            except grpc.aio.AioRpcError as error:
                self._raise_final(error)
                context.routes.failed(target, error)
                if time.monotonic() >= deadline:
                    raise UnavailableError(
                        f"watch: {error.code().name}: {error.details()}"
                    ) from error
                await asyncio.sleep(random.uniform(0, backoff))
                backoff = min(policy.max_backoff_s, backoff * 2)
                continue
            if first is grpc.aio.EOF or not first.created:
                call.cancel()
                raise UnavailableError("watch: the server ended the stream before creating it")
            if self._last is None:
                self.revision = first.revision
                start = self._request.start_revision
                self._last = (start - 1 if start else first.revision, _INDEX_MAX)
            self._call = call
            self._target = target
            return

    def _raise_final(self, error: grpc.aio.AioRpcError) -> None:
        """Raise the error if resuming cannot help: the error tables' reading of it, except
        that a watch the server ends with RESOURCE_EXHAUSTED was cancelled (too far behind)."""
        code = error.code()
        if code in _RESUMABLE:
            return
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise WatchCancelledError(error.details() or "watch cancelled") from error
        final = error_for_rpc_error(error, idempotent=True)
        if isinstance(final, CompactedError):
            raise final from error
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            message = error.details() or "bad watch request"
        else:
            message = f"watch: {code.name}: {error.details()}"
        raise type(final)(message, code=final.code or None) from error

    def _convert(self, event: watch_pb2.WatchEvent) -> WatchEvent:
        is_put = event.type == watch_pb2.WatchEvent.PUT
        return WatchEvent(
            type="put" if is_put else "delete",
            pkey=self._pkey,
            lkey=event.kv.key,
            kv=KeyValue.from_proto(self._pkey, event.kv) if is_put else None,
            prev=KeyValue.from_proto(self._pkey, event.prev_kv)
            if event.HasField("prev_kv")
            else None,
            revision=event.revision,
            index=event.index,
        )

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            if self._call is None:
                await self._open()
            try:
                message = await self._call.read()
            except grpc.aio.AioRpcError as error:
                if self._closed:
                    raise StopAsyncIteration from None
                self._raise_final(error)
                self._context.routes.failed(self._target, error)
                self._call = None  # resume after the last delivered event
                continue
            if message is grpc.aio.EOF:  # the server is stopping or gave the range away
                self._context.routes.failed(self._target)
                self._call = None
                continue
            assert self._last is not None
            for event in message.events:
                position = (event.revision, event.index)
                if position > self._last:
                    self._buffer.append(self._convert(event))
                    self._last = position
        return self._buffer.pop(0)

    async def close(self) -> None:
        """Stop watching (ends the stream)."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

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
