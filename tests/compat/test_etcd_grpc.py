"""The etcd API at the gRPC level (the project's own etcdserverpb stubs against a real server):
etcd's status codes and messages, count_only, watch filters, cancel, progress requests, and a
watch from a revision the history no longer holds."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest

from tablekeeper_proto.etcd import kv_pb2, rpc_pb2, rpc_pb2_grpc
from tests.support.server import ServerProcess, free_port

pytestmark = [
    pytest.mark.standalone_only("a server of its own, with --etcd-port"),
    pytest.mark.on_grpc_aio(
        "status codes, messages and watch streams as the HTTP/2 server sends them"
    ),
]
TIMEOUT_S = 30.0
Compare = rpc_pb2.Compare


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    port = free_port()
    server = ServerProcess(
        tmp_path_factory.mktemp("etcd-grpc") / "data", extra_args=["--etcd-port", str(port)]
    )
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        server.stop()


def put(kv: rpc_pb2_grpc.KVStub, key: bytes, value: bytes, **options: object) -> int:
    response = kv.Put(rpc_pb2.PutRequest(key=key, value=value, **options), timeout=TIMEOUT_S)  # type: ignore[arg-type]
    return int(response.header.revision)


def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as raised:
        assert callable(call)
        call()
    error = raised.value
    return error.code(), error.details()


def test_errors_have_etcds_codes_and_messages(channel: grpc.Channel) -> None:
    kv = rpc_pb2_grpc.KVStub(channel)
    lease = rpc_pb2_grpc.LeaseStub(channel)
    revision = put(kv, b"err/k", b"v")
    assert status_of(
        lambda: kv.Range(rpc_pb2.RangeRequest(key=b"err/k", revision=revision + 1000))
    ) == (
        grpc.StatusCode.OUT_OF_RANGE,
        "etcdserver: mvcc: required revision is a future revision",
    )
    assert status_of(lambda: kv.Put(rpc_pb2.PutRequest(key=b"err/k", lease=424242))) == (
        grpc.StatusCode.NOT_FOUND,
        "etcdserver: requested lease not found",
    )
    assert status_of(lambda: lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=424242))) == (
        grpc.StatusCode.NOT_FOUND,
        "etcdserver: requested lease not found",
    )
    assert status_of(lambda: kv.Put(rpc_pb2.PutRequest(key=b""))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: key is not provided",
    )
    assert status_of(lambda: kv.Put(rpc_pb2.PutRequest(key=b"err/missing", ignore_value=True))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: key not found",
    )
    twice = rpc_pb2.TxnRequest(
        success=[
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"err/d", value=b"1")),
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"err/d", value=b"2")),
        ]
    )
    assert status_of(lambda: kv.Txn(twice)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: duplicate key given in txn request",
    )
    many = rpc_pb2.TxnRequest(
        success=[
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"err/%d" % i)) for i in range(129)
        ]
    )
    assert status_of(lambda: kv.Txn(many)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: too many operations in txn request",
    )
    # A lease ID the client chose: granted as asked, and refused as etcd does while in use.
    chosen = 0x7AB000000001
    granted = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=10, ID=chosen))
    assert chosen == granted.ID and granted.TTL == 10
    assert status_of(lambda: lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=10, ID=chosen))) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "etcdserver: lease already exists",
    )
    kv.Put(rpc_pb2.PutRequest(key=b"err/leased", value=b"v", lease=chosen))
    lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=chosen))
    assert not kv.Range(rpc_pb2.RangeRequest(key=b"err/leased")).kvs
    assert chosen == lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=10, ID=chosen)).ID
    lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=chosen))
    assert status_of(lambda: kv.Compact(rpc_pb2.CompactionRequest(revision=10**9)))[0] == (
        grpc.StatusCode.OUT_OF_RANGE
    )
    nothing = kv.Range(rpc_pb2.RangeRequest(key=b"err/", range_end=b"err0", count_only=True))
    assert nothing.count >= 1 and not nothing.kvs


def test_a_key_or_value_over_the_servers_limits_is_too_large_and_writes_nothing(
    channel: grpc.Channel,
) -> None:
    """etcd's answer for a request over its size bound, for a key or a value over the limits the
    server's other front-ends hold them to (defaults: 64 KiB keys, 4 MiB values)."""
    kv = rpc_pb2_grpc.KVStub(channel)
    too_large = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
    long_key = b"big/" + b"k" * (64 * 1024)
    big_value = b"v" * (4 * 1024 * 1024 + 1)
    assert status_of(lambda: kv.Put(rpc_pb2.PutRequest(key=long_key, value=b"v"))) == too_large
    assert status_of(lambda: kv.Put(rpc_pb2.PutRequest(key=b"big/v", value=big_value))) == (
        too_large
    )
    in_txn = rpc_pb2.TxnRequest(
        success=[
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"big/t", value=b"1")),
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=long_key, value=b"2")),
        ]
    )
    assert status_of(lambda: kv.Txn(in_txn)) == too_large
    left = kv.Range(rpc_pb2.RangeRequest(key=b"big/", range_end=b"big0"), timeout=TIMEOUT_S)
    assert left.count == 0
    put(kv, b"big/" + b"k" * (64 * 1024 - 4), b"v" * (4 * 1024 * 1024))  # at the limits: taken


class WatchStream:
    """A Watch call fed from a queue; responses collected on a thread."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        self.responses: queue.Queue[rpc_pb2.WatchResponse] = queue.Queue()
        self._call = rpc_pb2_grpc.WatchStub(channel).Watch(iter(self._requests.get, None))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self.responses.put(response)
        except grpc.RpcError:
            pass

    def send(self, request: rpc_pb2.WatchRequest) -> None:
        self._requests.put(request)

    def next(self) -> rpc_pb2.WatchResponse:
        return self.responses.get(timeout=TIMEOUT_S)

    def half_close(self) -> None:
        self._requests.put(None)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


def test_watch_filters_cancel_and_progress(channel: grpc.Channel) -> None:
    kv = rpc_pb2_grpc.KVStub(channel)
    start = put(kv, b"wf/a", b"1")
    kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"wf/a"), timeout=TIMEOUT_S)
    stream = WatchStream(channel)
    try:
        create = rpc_pb2.WatchCreateRequest(
            key=b"wf/",
            range_end=b"wf0",
            start_revision=start,
            filters=[rpc_pb2.WatchCreateRequest.NOPUT],
            prev_kv=True,
            watch_id=5,
        )
        stream.send(rpc_pb2.WatchRequest(create_request=create))
        created = stream.next()
        assert created.created and created.watch_id == 5
        events = stream.next()
        assert [e.type for e in events.events] == [kv_pb2.Event.DELETE]
        assert events.events[0].kv.key == b"wf/a" and events.events[0].prev_kv.value == b"1"
        stream.send(rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest()))
        progress = stream.next()
        assert progress.watch_id == -1 and not progress.events
        assert progress.header.revision > start
        stream.send(rpc_pb2.WatchRequest(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=5)))
        cancelled = stream.next()
        assert cancelled.canceled and cancelled.watch_id == 5
    finally:
        stream.close()


def test_watch_streams_on_after_the_client_closes_its_side(channel: grpc.Channel) -> None:
    kv = rpc_pb2_grpc.KVStub(channel)
    stream = WatchStream(channel)
    try:
        create = rpc_pb2.WatchCreateRequest(key=b"hc/k")
        stream.send(rpc_pb2.WatchRequest(create_request=create))
        assert stream.next().created
        stream.half_close()  # as etcd does, the watch goes on until the call is cancelled
        put(kv, b"hc/k", b"after")
        event = stream.next()
        assert [e.kv.value for e in event.events] == [b"after"]
    finally:
        stream.close()


def test_watch_from_before_the_history_is_compacted(channel: grpc.Channel) -> None:
    kv = rpc_pb2_grpc.KVStub(channel)
    first = put(kv, b"old/k", b"v")
    # More changes than a range's event history keeps (about 10,000), 128 per txn.
    for batch in range(80):
        kv.Txn(
            rpc_pb2.TxnRequest(
                success=[
                    rpc_pb2.RequestOp(
                        request_put=rpc_pb2.PutRequest(key=b"old/%d/%d" % (batch, i), value=b"x")
                    )
                    for i in range(128)
                ]
            ),
            timeout=TIMEOUT_S,
        )
    stream = WatchStream(channel)
    try:
        create = rpc_pb2.WatchCreateRequest(key=b"old/k", start_revision=first)
        stream.send(rpc_pb2.WatchRequest(create_request=create))
        assert stream.next().created
        cancelled = stream.next()
        assert cancelled.canceled and cancelled.compact_revision > first
        assert "compacted" in cancelled.cancel_reason
    finally:
        stream.close()
    code, message = status_of(
        lambda: kv.Range(rpc_pb2.RangeRequest(key=b"old/k", revision=first), timeout=TIMEOUT_S)
    )
    assert (code, message) == (
        grpc.StatusCode.OUT_OF_RANGE,
        "etcdserver: mvcc: required revision has been compacted",
    )
