"""gRPC calls served as an ASGI application, for an HTTP/2 server other than grpc.aio's.

`--runtime envoy` serves the gRPC ports from Envoy's HTTP/2 (pyvoy hosts this process's Python
inside an Envoy process): Envoy parses HTTP/2 in C++, and the call reaches Python as one ASGI
request. This module is the gRPC part on top: it finds the method among the very handlers the
grpc.aio server registered, runs the same interceptors (malformed requests, authentication),
hands the servicer a stand-in for grpc.aio's servicer context, and writes the gRPC framing,
status and trailers itself. Unary, server-, client- and bidirectional streaming calls; messages
uncompressed (the clients we serve do not compress unless asked to).

A client certificate's subject reaches `auth_context()` as grpc.aio gives it
(`x509_common_name`), from the ASGI TLS extension's `client_cert_name`: certificate roles work
as on grpc.aio. What it leaves out of grpc.aio's context: initial metadata sent ahead of a
response, and per-call compression (compressed requests are refused). A call's `grpc-timeout`
reaches handlers as `time_remaining()` (forwarding passes it on), but a unary call is not
cancelled when it passes: the client stops waiting, and the answer, when it comes, is dropped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import struct
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any, NamedTuple

import grpc

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Metadata = tuple[tuple[str, str | bytes], ...]

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# Request headers that belong to HTTP/2, gRPC's transport or the proxy, not to the call's
# metadata (grpc.aio leaves the same out, but for user-agent, which nothing here reads).
_TRANSPORT_HEADERS = frozenset(
    {
        "content-type",
        "te",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "user-agent",
        "content-length",
        "host",
        "x-forwarded-proto",
        "x-request-id",
        "x-envoy-expected-rq-timeout-ms",
    }
)
_RESPONSE_HEADERS = [(b"content-type", b"application/grpc")]
STREAM_BUFFER_BYTES = 1 << 20
"""A stream's messages waiting for the writer beyond this many bytes make the next `write`
(or yield) wait for them to be sent."""
_HEADER = struct.Struct(">BI")  # compressed flag, message length
DISCONNECT_POLL_S = 1.0
"""How often a streaming call (a watch) looks for its client having gone away, by default."""


class HandlerCallDetails(NamedTuple):
    """What interceptors and generic handlers are given (as grpc.aio gives them)."""

    method: str
    invocation_metadata: Metadata


class _AbortError(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised by `context.abort`: a grpc.aio.AbortError, which servicers let through."""


class _StatusError(Exception):
    """The call ends with this status (a malformed frame, an over-long message, ...)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Context:
    """The part of grpc.aio.ServicerContext that TableKeeper's servicers and interceptors use."""

    __slots__ = (
        "_metadata",
        "_peer",
        "_deadline",
        "_send",
        "_auth",
        "code",
        "details",
        "trailing",
    )

    def __init__(
        self, metadata: Metadata, peer: str, deadline: float | None, send: _Responder
    ) -> None:
        self._metadata = metadata
        self._peer = peer
        self._deadline = deadline
        self._send = send
        self._auth: dict[str, list[bytes]] = {}
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.trailing: Metadata = ()

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self.trailing = tuple(metadata)

    async def write(self, message: Any) -> None:
        await self._send.message(message)

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort with OK")
        self.code, self.details = code, details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise _AbortError()


class _GoneError(Exception):
    """The client went away: nothing more can be sent on the call."""


class _Responder:
    """Writes one call's response: headers once, the messages' frames, then the trailers. A send
    that fails (the ASGI server raises once the client is gone) raises `_GoneError`.

    Every ASGI send crosses from Python to the HTTP/2 server's thread, so a response takes as
    few as it can: a unary call's message goes out with the end of the body (`hold`), and a
    stream's messages produced while a send is under way go out together in the next one (a
    writer task sends what has piled up; `message` waits for it only past
    `STREAM_BUFFER_BYTES`, as a transport's write would)."""

    __slots__ = ("_asgi_send", "_serialize", "_started", "_frames", "_buffered", "_writer")

    def __init__(self, send: Send, serialize: Callable[[Any], bytes] | None) -> None:
        self._asgi_send = send
        self._serialize = serialize
        self._started = False
        self._frames: list[bytes] = []
        self._buffered = 0
        self._writer: asyncio.Future[None] | None = None

    async def _send(self, event: Message) -> None:
        try:
            await self._asgi_send(event)
        except Exception as exc:
            raise _GoneError(str(exc)) from exc

    async def _start(self) -> None:
        if not self._started:
            self._started = True
            await self._send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": _RESPONSE_HEADERS,
                    "trailers": True,
                }
            )

    def _frame(self, message: Any) -> bytes:
        raw = self._serialize(message) if self._serialize is not None else message
        return _HEADER.pack(0, len(raw)) + raw

    def hold(self, message: Any) -> None:
        """A unary call's response: sent with the end of the body by `finish`."""
        self._frames.append(self._frame(message))

    async def hold_next(self, message: Any) -> None:
        """A short stream's next message (see `GrpcAsgi`'s `finite_streams`): held for `finish`
        like a unary call's, unless more than `STREAM_BUFFER_BYTES` are held: then they are
        sent now."""
        frame = self._frame(message)
        self._frames.append(frame)
        self._buffered += len(frame)
        if self._buffered > STREAM_BUFFER_BYTES:
            await self._write()

    async def message(self, message: Any) -> None:
        """A stream's next message: queued for the writer task (started if idle)."""
        frame = self._frame(message)
        writer = self._writer
        if writer is not None and writer.done():
            writer.result()  # raises _GoneError once a send failed
        self._frames.append(frame)
        self._buffered += len(frame)
        if writer is None or writer.done():
            self._writer = writer = asyncio.ensure_future(self._write())
        if self._buffered > STREAM_BUFFER_BYTES:
            await asyncio.shield(writer)

    async def _write(self) -> None:
        await self._start()
        while self._frames:
            body = b"".join(self._frames)
            self._frames.clear()
            self._buffered = 0
            await self._send({"type": "http.response.body", "body": body, "more_body": True})

    def close(self) -> None:
        """The call is over: nothing more is queued, and a send under way completes or fails by
        itself (never cancelled mid-send: the ASGI server would be left with it)."""
        self._frames.clear()
        writer = self._writer
        if writer is not None:
            _unawaited.add(writer)
            writer.add_done_callback(_background_done)

    async def finish(self, context: Context) -> None:
        if self._writer is not None:
            await asyncio.shield(self._writer)  # raises _GoneError if a send failed
        await self._start()
        body = b"".join(self._frames)
        self._frames.clear()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
        trailers = [(b"grpc-status", b"%d" % context.code.value[0])]
        if context.details:
            trailers.append((b"grpc-message", urllib.parse.quote(context.details).encode()))
        trailers += [_encode_entry(key, value) for key, value in context.trailing]
        await self._send(
            {"type": "http.response.trailers", "headers": trailers, "more_trailers": False}
        )


def _encode_entry(key: str, value: str | bytes) -> tuple[bytes, bytes]:
    if isinstance(value, bytes):  # a "-bin" entry: base64 on the wire, unpadded
        return key.encode("ascii"), base64.b64encode(value).rstrip(b"=")
    return key.encode("ascii"), value.encode("ascii")


def call_metadata(headers: Sequence[tuple[bytes, bytes]]) -> Metadata:
    """The call's metadata from its request headers ("-bin" values base64-decoded)."""
    entries: list[tuple[str, str | bytes]] = []
    for raw_key, raw_value in headers:
        key = raw_key.decode("latin-1")
        if key.startswith(":") or key in _TRANSPORT_HEADERS:
            continue
        if key.endswith("-bin"):
            try:
                value: str | bytes = base64.b64decode(
                    raw_value + b"=" * (-len(raw_value) % 4), validate=True
                )
            except binascii.Error:
                raise _StatusError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"metadata {key} is not base64"
                ) from None
            entries.append((key, value))
        else:
            entries.append((key, raw_value.decode("latin-1")))
    return tuple(entries)


def certificate_auth(scope: Scope) -> dict[str, list[bytes]]:
    """grpc.aio's auth context for a client certificate: its subject's common name(s), from
    the ASGI TLS extension's `client_cert_name` (an RFC 4514 name: `CN=alice,O=Example`)."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    name = tls.get("client_cert_name")
    if not name:
        return {}
    names = [value for key, value in _rdns(name) if key.upper() == "CN"]
    return {"x509_common_name": [n.encode() for n in names]} if names else {}


def _rdns(name: str) -> list[tuple[str, str]]:
    """`KEY=value` pairs of an RFC 4514 name, with its backslash escapes undone."""
    pairs: list[tuple[str, str]] = []
    value: list[str] = []
    key, escaped, in_value = "", False, False
    for char in name + ",":
        if escaped:
            value.append(char)
            escaped = False
        elif char == "\\" and in_value:
            escaped = True
        elif char in ",+":
            pairs.append((key.strip(), "".join(value)))
            key, value, in_value = "", [], False
        elif char == "=" and not in_value:
            in_value = True
        elif in_value:
            value.append(char)
        else:
            key += char
    return pairs


def call_deadline(headers: Sequence[tuple[bytes, bytes]], now: float) -> float | None:
    """The monotonic deadline a `grpc-timeout` header sets, if any."""
    for key, value in headers:
        if key == b"grpc-timeout":
            unit = _TIMEOUT_UNITS.get(chr(value[-1])) if value else None
            if unit is None or not value[:-1].isdigit():
                raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT, "malformed grpc-timeout")
            return now + int(value[:-1]) * unit
    return None


class _Requests:
    """The request body as gRPC messages, read from ASGI's `receive` as they arrive.

    `receive` is called by one reader at a time (`_lock`): the handler reading its request
    stream, or the disconnect watcher of a streaming call, which reads ahead into the buffer
    while the handler does not read (so a client that goes away is noticed either way)."""

    __slots__ = (
        "_receive",
        "_buffer",
        "_ended",
        "_lock",
        "_message_max",
        "_poll_s",
        "disconnected",
    )

    def __init__(self, receive: Receive, message_max: int, poll_s: float) -> None:
        self._receive = receive
        self._poll_s = poll_s
        self._buffer = bytearray()
        self._ended = False  # the body is over (or the client gone)
        self._lock = asyncio.Lock()
        self._message_max = message_max
        self.disconnected = False

    async def _read(self) -> None:
        """One `receive` into the buffer (the caller holds the lock)."""
        event = await self._receive()
        if event["type"] == "http.disconnect":
            self._ended = self.disconnected = True
            return
        self._buffer += event.get("body", b"")
        if not event.get("more_body", False):
            self._ended = True

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            if self._ended:
                return False
            async with self._lock:
                if len(self._buffer) < size and not self._ended:
                    await self._read()
        return True

    async def next(self) -> bytes | None:
        """The next message's bytes; None at the end of the stream."""
        if not await self._fill(5):
            if self._buffer and not self.disconnected:
                raise _StatusError(grpc.StatusCode.INTERNAL, "truncated gRPC message header")
            return None
        compressed, length = _HEADER.unpack_from(self._buffer)
        if compressed:
            raise _StatusError(
                grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not accepted"
            )
        if length > self._message_max:
            raise _StatusError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"received message larger than max ({length} vs. {self._message_max})",
            )
        if not await self._fill(5 + length):
            raise _StatusError(grpc.StatusCode.INTERNAL, "truncated gRPC message")
        message = bytes(self._buffer[5 : 5 + length])
        del self._buffer[: 5 + length]
        return message

    async def watch_disconnect(self, finished: asyncio.Event) -> None:
        """Return when the client goes away (`disconnected`), or soon after `finished` is set.

        While the request stream is open it reads ahead into the buffer (waiting for the
        client's next message or its going away). Once the body is over, an ASGI server may
        answer `receive` at once with an empty body (pyvoy does) until the client goes away,
        or may block until then (the ASGI spec): this asks every `poll_s` seconds. It is
        never cancelled while it waits in `receive` (a server may then try to complete a
        cancelled future); it returns by itself once `finished` is set."""
        while not finished.is_set() and not self.disconnected:
            if not self._ended:
                async with self._lock:
                    if not self._ended and not finished.is_set():
                        await self._read()
                continue
            async with self._lock:
                event = await self._receive()
            if event["type"] == "http.disconnect":
                self.disconnected = True
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self._poll_s)


Continuation = Callable[[HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class GrpcAsgi:
    """An ASGI application serving the methods of `handlers` (grpc.GenericRpcHandler, as
    registered on a grpc.aio server) through `interceptors` (grpc.aio.ServerInterceptor,
    outermost first), as grpc.aio would."""

    def __init__(
        self,
        handlers: Sequence[grpc.GenericRpcHandler],
        interceptors: Sequence[Any] = (),
        *,
        message_max: int = 4 * 1024 * 1024,
        disconnect_poll_s: float = DISCONNECT_POLL_S,
        finite_streams: Collection[str] = (),
    ) -> None:
        """`finite_streams`: server-streaming methods (full names, `/package.Service/Method`)
        that answer at once and end by themselves (Oxia's Read, List, RangeScan): served like
        unary calls, their messages held and sent with the end of the call (or whenever more
        than `STREAM_BUFFER_BYTES` are held), without a task that watches for the client going
        away meanwhile (a send to a client that went away fails, which ends the call)."""
        self._finite_streams = frozenset(finite_streams)
        self._handlers = list(handlers)
        self._interceptors = list(interceptors)
        self._message_max = message_max
        self._disconnect_poll_s = disconnect_poll_s
        self._found: dict[str, grpc.RpcMethodHandler | None] = {}
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._chain: Continuation = self._find
        for interceptor in reversed(self._interceptors):
            self._chain = _through(interceptor, self._chain)

    async def _find(self, details: HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method not in self._found:
            found = None
            for handler in self._handlers:
                found = handler.service(details)
                if found is not None:
                    break
            self._found[method] = found
        return self._found[method]

    def drain(self, grace_s: float) -> Awaitable[None]:
        """Refuse new calls (UNAVAILABLE) from now on; what it returns waits up to `grace_s`
        for those in flight."""
        self._draining = True
        return self._until_idle(grace_s)

    async def _until_idle(self, grace_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self._in_flight += 1
        self._idle.clear()
        try:
            await self._call(scope, receive, send)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _call(self, scope: Scope, receive: Receive, send: Send) -> None:
        requests = _Requests(receive, self._message_max, self._disconnect_poll_s)
        responder = _Responder(send, None)
        try:
            await self._answer(scope, requests, responder)
        finally:
            responder.close()

    async def _answer(self, scope: Scope, requests: _Requests, responder: _Responder) -> None:
        host, port = scope.get("client") or ("unknown", 0)
        context = Context((), f"ipv4:{host}:{port}", None, responder)
        try:
            if self._draining:
                raise _StatusError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
            headers: list[tuple[bytes, bytes]] = scope["headers"]
            context._metadata = call_metadata(headers)
            context._auth = certificate_auth(scope)
            context._deadline = call_deadline(headers, time.monotonic())
            details = HandlerCallDetails(scope["path"], context._metadata)
            handler = await self._chain(details)
            if handler is None:
                raise _StatusError(
                    grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {details.method}"
                )
            responder._serialize = handler.response_serializer
            await _run(
                handler, requests, context, responder, details.method in self._finite_streams
            )
        except _AbortError:
            pass
        except _StatusError as status:
            context.code, context.details = status.code, status.details
        except _GoneError:
            return  # nobody to answer
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s failed", scope.get("path"))
            context.code, context.details = grpc.StatusCode.UNKNOWN, f"Unexpected {exc!r}"
        if requests.disconnected:
            return  # nobody to answer
        with contextlib.suppress(_GoneError):
            await responder.finish(context)


async def refuse(send: Send, code: grpc.StatusCode, details: str) -> None:
    """Answer a call with `code` and `details` without serving it (nor reading its request)."""
    responder = _Responder(send, None)
    context = Context((), "", None, responder)
    context.code, context.details = code, details
    with contextlib.suppress(_GoneError):
        await responder.finish(context)


def _through(interceptor: Any, continuation: Continuation) -> Continuation:
    async def intercepted(details: HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler: grpc.RpcMethodHandler | None = await interceptor.intercept_service(
            continuation, details
        )
        return handler

    return intercepted


async def _run(
    handler: grpc.RpcMethodHandler,
    requests: _Requests,
    context: Context,
    responder: _Responder,
    finite: bool = False,
) -> None:
    deserialize = handler.request_deserializer or (lambda raw: raw)

    async def one_request() -> Any:
        raw = await requests.next()
        if raw is None:
            raise _StatusError(grpc.StatusCode.INTERNAL, "the call sent no request message")
        if await requests.next() is not None:
            raise _StatusError(grpc.StatusCode.INTERNAL, "a unary call sent more than one request")
        return deserialize(raw)

    async def request_stream() -> AsyncIterator[Any]:
        while (raw := await requests.next()) is not None:
            yield deserialize(raw)

    if not handler.request_streaming and not handler.response_streaming:
        request = await one_request()
        response = await _behave(handler.unary_unary(request, context))
        if response is not None:
            responder.hold(response)
        return
    if handler.request_streaming and not handler.response_streaming:
        response = await _behave(handler.stream_unary(request_stream(), context))
        if response is not None:
            responder.hold(response)
        return
    if handler.response_streaming and not handler.request_streaming:
        out = handler.unary_stream(await one_request(), context)
        if finite:
            await _held_out(out, responder)
            return
    else:
        out = handler.stream_stream(request_stream(), context)
    await _stream_out(out, responder, requests)


async def _behave(result: Any) -> Any:
    return await result if asyncio.iscoroutine(result) else result


async def _held_out(out: Any, responder: _Responder) -> None:
    """A finite stream's messages (see `GrpcAsgi`), held for the end of the call."""
    if asyncio.iscoroutine(out):  # writes with context.write, returns None
        await out
        return
    async with contextlib.aclosing(out) as messages:
        async for message in messages:
            await responder.hold_next(message)


async def _stream_out(out: Any, responder: _Responder, requests: _Requests) -> None:
    """Send what a streaming behaviour yields (or writes) until it ends; end it (cancelled, as
    grpc.aio would) when the client goes away meanwhile."""

    async def produce() -> None:
        if asyncio.iscoroutine(out):  # writes with context.write, returns None
            await out
            return
        async for message in out:
            await responder.message(message)

    finished = asyncio.Event()
    producer = asyncio.ensure_future(produce())
    watcher = asyncio.ensure_future(requests.watch_disconnect(finished))
    try:
        await asyncio.wait([producer, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        finished.set()  # the watcher returns by itself, soon: it is never cancelled
        _unawaited.add(watcher)
        watcher.add_done_callback(_background_done)
        if not producer.done():  # the client went away, or this call was cancelled
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
    if not producer.cancelled():
        producer.result()  # what the stream ended with (an abort, an error) is the call's


_unawaited: set[asyncio.Future[None]] = set()
"""Disconnect watchers and response writers still finishing (kept referenced until they do)."""


def _background_done(task: asyncio.Future[None]) -> None:
    _unawaited.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.debug("%r ended with %r", task, task.exception())
