"""`rpc.asgi`: gRPC calls served as ASGI requests (what `--runtime envoy` runs on).

Driven here by a scripted ASGI peer (the request's body events in, the response's events out);
tests/integration/test_envoy_runtime.py drives the same code through Envoy with real clients."""

from __future__ import annotations

import asyncio
import base64
import struct
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_server.rpc.asgi import GrpcAsgi, certificate_auth
from tablekeeper_server.rpc.malformed import MalformedRequestInterceptor

pytestmark = pytest.mark.unit

SERVICE = "test.Echo"


def frame(message: bytes, *, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(message)) + message


class Peer:
    """One call: the request body (in chunks), then the events the app sent back."""

    def __init__(self, chunks: list[bytes], *, body_open: bool = False) -> None:
        """`body_open`: the client keeps its request stream open (a bidirectional call) until
        it goes away (`gone`)."""
        self.events: list[dict[str, Any]] = [
            {"type": "http.request", "body": c, "more_body": body_open or i < len(chunks) - 1}
            for i, c in enumerate(chunks)
        ] or [{"type": "http.request", "body": b"", "more_body": False}]
        self.body_open = body_open
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self.answering = asyncio.Event()  # a response message was sent

    async def receive(self) -> dict[str, Any]:
        if self.events:
            return self.events.pop(0)
        if self.body_open:
            await self.gone.wait()
        if self.gone.is_set():
            return {"type": "http.disconnect"}
        # After the request's end pyvoy answers at once with an empty body until the client
        # goes away (a server following the ASGI spec would block instead).
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)
        if event.get("body"):
            self.answering.set()

    @property
    def messages(self) -> list[bytes]:
        body = b"".join(e.get("body", b"") for e in self.sent if e["type"] == "http.response.body")
        out = []
        while body:
            flag, length = struct.unpack(">BI", body[:5])
            assert flag == 0
            out.append(body[5 : 5 + length])
            body = body[5 + length :]
        return out

    @property
    def trailers(self) -> dict[str, str]:
        [event] = [e for e in self.sent if e["type"] == "http.response.trailers"]
        return {k.decode(): v.decode() for k, v in event["headers"]}

    @property
    def status(self) -> tuple[int, str]:
        trailers = self.trailers
        return int(trailers["grpc-status"]), urllib.parse.unquote(trailers.get("grpc-message", ""))


def scope(method: str, headers: list[tuple[bytes, bytes]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "type": "http",
        "path": f"/{SERVICE}/{method}",
        "headers": [(b"content-type", b"application/grpc"), *headers],
        "client": ("127.0.0.1", 5555),
    }


def raw(x: bytes) -> bytes:
    return x


seen: dict[str, Any] = {}


async def echo(request: bytes, context: Any) -> bytes:
    seen["metadata"] = dict(context.invocation_metadata())
    seen["time_remaining"] = context.time_remaining()
    seen["peer"] = context.peer()
    return request.upper()


async def fail(request: bytes, context: Any) -> bytes:
    await context.abort(
        grpc.StatusCode.FAILED_PRECONDITION, "no such thing: ü%", (("tk-code", "403"),)
    )
    raise AssertionError("unreachable")


async def trailing(request: bytes, context: Any) -> bytes:
    context.set_trailing_metadata((("tk-reason", "why"), ("tk-blob-bin", b"\x00\xff")))
    return b"ok"


async def crash(request: bytes, context: Any) -> bytes:
    raise ValueError("boom")


async def count(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for i in range(int(request)):
        yield b"%d" % i


cancelled = asyncio.Event()


async def forever(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"first"
    try:
        await asyncio.Event().wait()
    finally:
        cancelled.set()


async def written(request: bytes, context: Any) -> None:
    await context.write(b"a")
    await context.write(b"b")


async def join(requests: AsyncIterator[bytes], context: Any) -> bytes:
    return b"+".join([r async for r in requests])


async def echo_each(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for r in requests:
        yield r[::-1]


async def echo_then_wait(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    """Answers the first request, then waits for events (a watch) whatever the client does."""
    async for r in requests:
        yield r
        break
    try:
        await asyncio.Event().wait()
    finally:
        cancelled.set()
    yield b"never"


big_progress: list[int] = []


async def big(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for i in range(3):
        big_progress.append(i)
        yield b"%d" % i * 600_000


async def put(request: kv.PutRequest, context: Any) -> kv.PutResponse:
    return kv.PutResponse()


def app(**kwargs: Any) -> GrpcAsgi:
    unary = {
        name: grpc.unary_unary_rpc_method_handler(fn, raw, raw)
        for name, fn in (("Echo", echo), ("Fail", fail), ("Trailing", trailing), ("Crash", crash))
    }
    handlers = {
        **unary,
        "Count": grpc.unary_stream_rpc_method_handler(count, raw, raw),
        "Big": grpc.unary_stream_rpc_method_handler(big, raw, raw),
        "Forever": grpc.unary_stream_rpc_method_handler(forever, raw, raw),
        "Written": grpc.unary_stream_rpc_method_handler(written, raw, raw),
        "Join": grpc.stream_unary_rpc_method_handler(join, raw, raw),
        "EchoEach": grpc.stream_stream_rpc_method_handler(echo_each, raw, raw),
        "EchoThenWait": grpc.stream_stream_rpc_method_handler(echo_then_wait, raw, raw),
        "Put": grpc.unary_unary_rpc_method_handler(
            put, kv.PutRequest.FromString, kv.PutResponse.SerializeToString
        ),
    }
    return GrpcAsgi([grpc.method_handlers_generic_handler(SERVICE, handlers)], **kwargs)


async def call(
    grpc_app: GrpcAsgi,
    method: str,
    chunks: list[bytes],
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
) -> Peer:
    peer = Peer(chunks)
    await grpc_app(scope(method, headers), peer.receive, peer.send)
    return peer


async def test_a_unary_call_in_any_chunking_answers_one_message_and_ok() -> None:
    whole = frame(b"hello")
    for chunks in ([whole], [whole[:2], whole[2:7], whole[7:]]):
        peer = await call(app(), "Echo", chunks)
        assert peer.messages == [b"HELLO"]
        assert peer.status == (0, "")
        start = peer.sent[0]
        assert start["type"] == "http.response.start" and start["trailers"] is True
        assert (b"content-type", b"application/grpc") in start["headers"]


def bodies(peer: Peer) -> list[tuple[bytes, bool]]:
    return [(e["body"], e["more_body"]) for e in peer.sent if e["type"] == "http.response.body"]


async def test_an_answer_takes_few_sends_messages_made_together_go_out_together() -> None:
    # Each send crosses to the HTTP/2 server's thread: a unary answer's message goes with the
    # end of the body, and what a stream yields at once goes in one body.
    peer = await call(app(), "Echo", [frame(b"x")])
    assert [e["type"] for e in peer.sent] == [
        "http.response.start",
        "http.response.body",
        "http.response.trailers",
    ]
    assert bodies(peer) == [(frame(b"X"), False)]
    peer = await call(app(), "Count", [frame(b"5")])
    assert bodies(peer) == [(b"".join(frame(b"%d" % i) for i in range(5)), True), (b"", False)]
    assert peer.status == (0, "")


async def test_a_stream_waits_for_its_sends_past_the_buffer_bound() -> None:
    big_progress.clear()
    peer = Peer([frame(b"")])
    sending, release = asyncio.Event(), asyncio.Event()

    async def slow(event: dict[str, Any]) -> None:
        if event["type"] == "http.response.body" and not release.is_set():
            sending.set()
            await release.wait()
        await peer.send(event)

    task = asyncio.ensure_future(app()(scope("Big"), peer.receive, slow))
    await asyncio.wait_for(sending.wait(), 5)
    assert big_progress == [0, 1]  # 1.2 MB queued: the stream waits for the send under way
    release.set()
    await asyncio.wait_for(task, 5)
    assert big_progress == [0, 1, 2]
    assert peer.messages == [b"%d" % i * 600_000 for i in range(3)] and peer.status == (0, "")


async def test_a_finite_stream_is_answered_as_a_unary_call_is() -> None:
    # Oxia's Read, List and RangeScan: their messages go with the end of the body, in as few
    # sends as a unary answer takes; past the buffer bound they go out on the way.
    finite = app(finite_streams=[f"/{SERVICE}/Count", f"/{SERVICE}/Big", f"/{SERVICE}/Crash"])
    peer = await call(finite, "Count", [frame(b"5")])
    assert [e["type"] for e in peer.sent] == [
        "http.response.start",
        "http.response.body",
        "http.response.trailers",
    ]
    assert bodies(peer) == [(b"".join(frame(b"%d" % i) for i in range(5)), False)]
    assert peer.status == (0, "")
    peer = await call(finite, "Count", [frame(b"0")])
    assert peer.messages == [] and peer.status == (0, "")
    big_progress.clear()
    peer = await call(finite, "Big", [frame(b"")])
    assert peer.messages == [b"%d" % i * 600_000 for i in range(3)] and peer.status == (0, "")
    assert [more for _, more in bodies(peer)] == [True, False]  # 1.2 MB held: sent on the way


async def test_a_finite_stream_that_fails_or_whose_client_left_ends_as_a_stream_does() -> None:
    async def two_then_fail(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"one"
        yield b"two"
        await context.abort(grpc.StatusCode.NOT_FOUND, "gone")

    handlers = {"Fails": grpc.unary_stream_rpc_method_handler(two_then_fail, raw, raw)}
    finite = GrpcAsgi(
        [grpc.method_handlers_generic_handler(SERVICE, handlers)],
        finite_streams=[f"/{SERVICE}/Fails", f"/{SERVICE}/Count"],
    )
    peer = await call(finite, "Fails", [frame(b"")])
    assert peer.messages == [b"one", b"two"] and peer.status == (5, "gone")

    async def refuse_sends(event: dict[str, Any]) -> None:
        raise OSError("client went away")

    gone = Peer([frame(b"3")])
    handlers = {"Count": grpc.unary_stream_rpc_method_handler(count, raw, raw)}
    finite = GrpcAsgi(
        [grpc.method_handlers_generic_handler(SERVICE, handlers)],
        finite_streams=[f"/{SERVICE}/Count"],
    )
    await finite(scope("Count"), gone.receive, refuse_sends)  # ends without raising
    assert gone.sent == []


async def test_metadata_deadline_and_peer_reach_the_handler() -> None:
    headers = [
        (b"bk-rt-sid-bin", base64.b64encode(b"\x00\x01\x02").rstrip(b"=")),
        (b"authorization", b"Bearer t"),
        (b"grpc-timeout", b"1500m"),
        (b"te", b"trailers"),
    ]
    peer = await call(app(), "Echo", [frame(b"x")], headers)
    assert peer.status == (0, "")
    assert seen["metadata"] == {"bk-rt-sid-bin": b"\x00\x01\x02", "authorization": "Bearer t"}
    assert 1.0 < seen["time_remaining"] <= 1.5
    assert seen["peer"] == "ipv4:127.0.0.1:5555"


@pytest.mark.parametrize(
    ("headers", "chunks", "code", "detail"),
    [
        ([(b"x-bin", b"!!!")], [frame(b"x")], grpc.StatusCode.INVALID_ARGUMENT, "x-bin"),
        ([(b"grpc-timeout", b"10q")], [frame(b"x")], grpc.StatusCode.INVALID_ARGUMENT, "timeout"),
        ([], [frame(b"x", compressed=1)], grpc.StatusCode.UNIMPLEMENTED, "compressed"),
        ([], [frame(b"x")[:3]], grpc.StatusCode.INTERNAL, "truncated"),
        ([], [frame(b"xyz")[:6]], grpc.StatusCode.INTERNAL, "truncated"),
        ([], [b""], grpc.StatusCode.INTERNAL, "no request"),
        ([], [frame(b"a") + frame(b"b")], grpc.StatusCode.INTERNAL, "more than one"),
        ([], [frame(b"x" * 65)], grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ],
)
async def test_bad_calls_get_a_status_not_a_crash(
    headers: list[tuple[bytes, bytes]], chunks: list[bytes], code: grpc.StatusCode, detail: str
) -> None:
    peer = await call(app(message_max=64), "Echo", chunks, headers)
    status, message = peer.status
    assert status == code.value[0], message
    assert detail in message
    assert peer.messages == []


async def test_an_unknown_method_is_unimplemented() -> None:
    peer = await call(app(), "Nope", [frame(b"x")])
    assert peer.status[0] == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert f"/{SERVICE}/Nope" in peer.status[1]


async def test_abort_sends_its_code_details_and_trailing_metadata() -> None:
    peer = await call(app(), "Fail", [frame(b"x")])
    assert peer.status == (grpc.StatusCode.FAILED_PRECONDITION.value[0], "no such thing: ü%")
    assert peer.trailers["tk-code"] == "403"
    assert peer.messages == []


async def test_trailing_metadata_of_a_successful_call() -> None:
    peer = await call(app(), "Trailing", [frame(b"x")])
    assert peer.messages == [b"ok"]
    assert peer.trailers["tk-reason"] == "why"
    blob = peer.trailers["tk-blob-bin"]
    assert base64.b64decode(blob + "=" * (-len(blob) % 4)) == b"\x00\xff"


async def test_a_handler_that_raises_answers_unknown() -> None:
    peer = await call(app(), "Crash", [frame(b"x")])
    assert peer.status[0] == grpc.StatusCode.UNKNOWN.value[0]
    assert "boom" in peer.status[1]


async def test_streams_in_every_direction() -> None:
    grpc_app = app()
    peer = await call(grpc_app, "Count", [frame(b"3")])
    assert peer.messages == [b"0", b"1", b"2"] and peer.status == (0, "")
    peer = await call(grpc_app, "Written", [frame(b"")])
    assert peer.messages == [b"a", b"b"] and peer.status == (0, "")
    peer = await call(grpc_app, "Join", [frame(b"a") + frame(b"b"), frame(b"c")])
    assert peer.messages == [b"a+b+c"] and peer.status == (0, "")
    peer = await call(grpc_app, "EchoEach", [frame(b"ab"), frame(b"cd")])
    assert peer.messages == [b"ba", b"dc"] and peer.status == (0, "")


@pytest.mark.parametrize(
    ("method", "body_open"),
    [
        ("Forever", False),  # a server stream, its request over
        ("EchoThenWait", True),  # a bidirectional stream, gone mid-stream
        ("EchoThenWait", False),  # ... or after closing its side
    ],
)
async def test_a_client_going_away_ends_its_stream_without_an_answer(
    method: str, body_open: bool
) -> None:
    cancelled.clear()
    peer = Peer([frame(b"hello")], body_open=body_open)
    grpc_app = app(disconnect_poll_s=0.01)
    task = asyncio.ensure_future(grpc_app(scope(method), peer.receive, peer.send))
    await asyncio.wait_for(peer.answering.wait(), 5)
    assert peer.messages == [b"first" if method == "Forever" else b"hello"]
    peer.gone.set()
    await asyncio.wait_for(task, 5)
    assert cancelled.is_set()  # the handler was cancelled, as grpc.aio does
    assert not [e for e in peer.sent if e["type"] == "http.response.trailers"]


async def test_a_send_that_fails_ends_the_call_quietly(caplog: pytest.LogCaptureFixture) -> None:
    async def gone(event: dict[str, Any]) -> None:
        raise OSError("client disconnected")

    peer = Peer([frame(b"3")])
    await app()(scope("Count"), peer.receive, gone)  # no exception, nothing logged
    await app()(scope("Echo"), Peer([frame(b"x")]).receive, gone)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


async def test_interceptors_run_first_malformed_protobuf_is_invalid_argument() -> None:
    grpc_app = app(interceptors=[MalformedRequestInterceptor()])
    peer = await call(grpc_app, "Put", [frame(b"\xff\xff\xff")])
    status, message = peer.status
    assert status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "malformed request" in message
    ok = kv.PutRequest(key=b"k", value=b"v").SerializeToString()
    assert (await call(grpc_app, "Put", [frame(ok)])).status == (0, "")


async def test_drain_waits_for_calls_in_flight_and_refuses_new_ones() -> None:
    grpc_app = app()
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(request: bytes, context: Any) -> bytes:
        started.set()
        await release.wait()
        return b"done"

    grpc_app._found[f"/{SERVICE}/Slow"] = grpc.unary_unary_rpc_method_handler(slow, raw, raw)
    peer = Peer([frame(b"")])
    in_flight = asyncio.ensure_future(grpc_app(scope("Slow"), peer.receive, peer.send))
    await started.wait()
    drained = asyncio.ensure_future(grpc_app.drain(30))
    refused = await call(grpc_app, "Echo", [frame(b"x")])
    assert refused.status[0] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert not drained.done()
    release.set()
    await asyncio.wait_for(drained, 5)
    await in_flight
    assert peer.messages == [b"done"]


@pytest.mark.parametrize(
    ("name", "common_names"),
    [
        ("CN=alice", [b"alice"]),
        ("CN=alice,O=Example,C=DE", [b"alice"]),
        ("O=Example,CN=bob", [b"bob"]),
        (r"CN=smith\, john,O=Example", [b"smith, john"]),
        ("CN=a+UID=7", [b"a"]),
        ("O=no common name", []),
        ("", []),
    ],
)
def test_a_client_certificates_common_name_is_in_the_auth_context(
    name: str, common_names: list[bytes]
) -> None:
    found = certificate_auth({"extensions": {"tls": {"client_cert_name": name}}})
    assert found.get("x509_common_name", []) == common_names
    assert certificate_auth({}) == {}
