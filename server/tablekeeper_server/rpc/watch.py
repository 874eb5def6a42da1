"""The Watch servicer (TableKeeper's `tablekeeper.v1.Watch`): thin, like the others.

The domain work is in `range.watch`; errors become gRPC statuses in `rpc.status.stream_errors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

from tablekeeper_proto.bookkeeper import kv_pb2
from tablekeeper_proto.v1 import watch_pb2, watch_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.keys import pkey_prefix
from tablekeeper_server.errors import BadRequestError, NotServedHereError, UnavailableError
from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.range.state_machine import key_span, to_key_value
from tablekeeper_server.range.validation import Limits
from tablekeeper_server.range.watch import KeySpan, Watcher
from tablekeeper_server.rpc.proxy import WATCH_SERVICE, Forwarder, was_forwarded
from tablekeeper_server.rpc.status import stream_errors

Context: TypeAlias = Any  # grpc.aio.ServicerContext


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


class WatchServicer(watch_pb2_grpc.WatchServicer):
    """In cluster mode a watch on a range owned elsewhere is relayed from the owner."""

    def __init__(
        self, registry: ContainerRegistry, limits: Limits, forwarder: Forwarder | None = None
    ) -> None:
        self._registry = registry
        self._limits = limits
        self._forwarder = forwarder
        self._stopping = False
        self._active: set[Watcher] = set()

    def shutdown(self) -> None:
        """End every open stream (the server is stopping): clients resume elsewhere."""
        self._stopping = True
        for watcher in self._active:
            watcher.fail(
                UnavailableError(f"server shutting down; resume from revision {watcher.last[0]}")
            )

    async def Watch(  # noqa: N802
        self, request: watch_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[watch_pb2.WatchResponse]:
        async with stream_errors("Watch", context):
            if not request.stream_id:
                raise BadRequestError("watch needs a table (stream) id")
            if not request.key and not request.range_end:
                raise BadRequestError("watch needs a key or a key range")
            if max(len(request.pkey), len(request.key)) > self._limits.key_bytes_max:
                raise BadRequestError("key too long")
            if request.start_revision < 0:
                raise BadRequestError("start_revision must be >= 0")
            if self._stopping:
                raise UnavailableError("server shutting down")
            prefix = pkey_prefix(request.pkey)
            start, end = key_span(prefix, request.key, request.range_end)
            try:
                range_ = await self._registry.table_range(request.stream_id, request.pkey)
            except NotServedHereError as elsewhere:
                if self._forwarder is None or was_forwarded(context):
                    raise
                relayed = self._forwarder.relay(
                    elsewhere.container_id,
                    WATCH_SERVICE + "Watch",
                    request,
                    watch_pb2.WatchResponse,
                    context,
                )
                async with contextlib.aclosing(relayed) as responses:
                    async for response in responses:
                        yield response
                return
            hub = range_.watch
            watcher, revision = hub.start(KeySpan(start, end), request.start_revision)
            self._active.add(watcher)
            try:
                yield watch_pb2.WatchResponse(created=True, revision=revision)
                # Ends by raising the watcher's error (closed range, too slow, shutdown).
                async with contextlib.aclosing(hub.events(watcher)) as events:
                    async for batch in events:
                        yield watch_pb2.WatchResponse(
                            events=[_event(len(prefix), e, request.prev_kv) for e in batch]
                        )
            finally:
                self._active.discard(watcher)
