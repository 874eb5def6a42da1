"""Hostile input and resource limits against a real server process: memory bounded in bytes
while large values stream through a range, Batch size and response bounds, name and
`initial_num_ranges` bounds, malformed protobuf."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tablekeeper import AsyncClient, Client, ResourceLimitError
from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc, watch_pb2, watch_pb2_grpc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

_MIB = 1024 * 1024
VALUE_BYTES = 512 * 1024
HISTORY_BYTES = 8 * _MIB
HISTORY_BYTES_TOTAL = 16 * _MIB
QUEUE_BYTES = 8 * _MIB
ROCKSDB_BYTES = 32 * _MIB
KEEP_UP_WINDOW = 8
"""Events the writer may be ahead of the keeping-up watcher (4 MiB: under the queue bound)."""


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class Reader:
    """Reads one watch stream in a thread, counting events, until the stream ends."""

    def __init__(self, responses: Iterator[watch_pb2.WatchResponse]) -> None:
        self.revisions: list[int] = []
        self.error: grpc.RpcError | None = None
        self.changed = threading.Condition()
        self._responses = responses
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for response in self._responses:
                with self.changed:
                    self.revisions += [e.revision for e in response.events]
                    self.changed.notify_all()
        except grpc.RpcError as error:
            with self.changed:
                self.error = error
                self.changed.notify_all()

    def wait_for(self, n: int, timeout_s: float = 60.0) -> None:
        with self.changed:
            ok = self.changed.wait_for(
                lambda: len(self.revisions) >= n or self.error is not None, timeout_s
            )
        assert ok and self.error is None, f"watcher saw {len(self.revisions)}: {self.error}"


def test_memory_stays_bounded_while_large_values_stream_through_one_range(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            "--max-history-bytes",
            str(HISTORY_BYTES),
            "--max-history-bytes-total",
            str(HISTORY_BYTES_TOTAL),
            "--max-watcher-queue-bytes",
            str(QUEUE_BYTES),
            "--rocksdb-memory",
            str(ROCKSDB_BYTES),
        ],
    )
    server_factory.append(server)
    server.start()
    assert server.process is not None
    pid = server.process.pid
    # 512 MiB: 1,024 events of value and previous value, 2.8x the bound below; before the
    # bounds the ring alone would have held them all (1 GiB). TK_HOSTILE_BYTES streams more.
    total_bytes = int(os.environ.get("TK_HOSTILE_BYTES", str(512 * _MIB)))
    puts = total_bytes // VALUE_BYTES
    options = [("grpc.max_receive_message_length", 64 * _MIB)]
    with Client(server.service) as client, grpc.insecure_channel(server.target, options) as ch:
        client.create_namespace("mem")
        info = client.create_table("mem", "t", ranges=2)
        table = client.table("mem", "t")
        table.put("p", "warm-up", b"x")
        stub = watch_pb2_grpc.WatchStub(ch)
        request = watch_pb2.WatchRequest(
            stream_id=info.table_id, pkey=b"p", key=b"\x00", range_end=b"\x00"
        )
        stalled = stub.Watch(request)
        assert next(stalled).created  # registered; never read again until the end
        keeping_up = Reader(stub.Watch(request))
        before = rss_bytes(pid)
        peak = before
        value = os.urandom(VALUE_BYTES)
        for i in range(puts):
            # Same key: the store's data stays small; every event carries value and prev.
            table.put("p", "k", value[i % 256 :] + value[: i % 256])
            keeping_up.wait_for(i + 1 - KEEP_UP_WINDOW)
            if i % 16 == 0:
                peak = max(peak, rss_bytes(pid))
        keeping_up.wait_for(puts)
        peak = max(peak, rss_bytes(pid))
        revisions = keeping_up.revisions
        assert len(revisions) == puts and revisions == sorted(set(revisions))
        # The watcher that never read was cancelled as too slow, with its reason.
        seen: list[int] = []
        with pytest.raises(grpc.RpcError) as raised:
            for response in stalled:
                seen += [e.revision for e in response.events]
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max-watcher-queue-bytes" in (raised.value.details() or "")
        assert seen == revisions[: len(seen)] and len(seen) < puts
        stalled.cancel()
        # Older than the ring holds (8 MiB: ~8 events of value and previous value) but in the
        # store's durable history: served from there, in order; older than that: compacted.
        last = revisions[-1]
        request.start_revision = last - 29
        older = stub.Watch(request)
        caught_up: list[int] = []
        for response in older:
            caught_up += [e.revision for e in response.events]
            if len(caught_up) >= 30:
                break
        older.cancel()
        assert caught_up == revisions[-30:]
        request.start_revision = revisions[1]
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Watch(request))
        assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE
    growth = peak - before
    # What the limits allow in memory: the rings (HISTORY_BYTES_TOTAL), two watcher queues, the
    # batch each watch stream is sending, RocksDB's shared memory (ROCKSDB_BYTES: blocks and
    # memtables, the latter a soft limit that a burst overshoots while flushes run) for the data
    # and the durable history, and gRPC's buffers. Before these bounds the ring alone held 4,096
    # events with value and previous value: 4 GiB at this value size.
    bound = HISTORY_BYTES_TOTAL + 2 * QUEUE_BYTES + ROCKSDB_BYTES + 118 * _MIB
    print(f"RSS {before / _MIB:.0f} MiB before, peak {peak / _MIB:.0f} MiB, {puts} puts")
    assert growth < bound, f"RSS grew by {growth / _MIB:.0f} MiB (bound {bound / _MIB:.0f})"


BATCH_OPS = 50
RESPONSE_BYTES = 1 * _MIB


@pytest.fixture
def limited(tmp_path: Path, server_factory: list[ServerProcess]) -> ServerProcess:
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            "--max-batch-ops",
            str(BATCH_OPS),
            "--max-response-bytes",
            str(RESPONSE_BYTES),
        ],
    )
    server_factory.append(server)
    return server.start()


def _header(table_id: int, pkey: bytes) -> kv_rpc_pb2.RoutingHeader:
    return kv_rpc_pb2.RoutingHeader(stream_id=table_id, r_key=pkey)


def _put(
    table_id: int, lkey: bytes, value: bytes, prev_kv: bool = False
) -> tablekeeper_pb2.BatchOp:
    put = kv_rpc_pb2.PutRequest(
        key=lkey, value=value, header=_header(table_id, b"p"), prev_kv=prev_kv
    )
    return tablekeeper_pb2.BatchOp(put=put)


def _get(table_id: int, lkey: bytes) -> tablekeeper_pb2.BatchOp:
    return tablekeeper_pb2.BatchOp(
        range=kv_rpc_pb2.RangeRequest(key=lkey, header=_header(table_id, b"p"))
    )


def test_batch_ops_and_response_bytes_are_bounded(limited: ServerProcess) -> None:
    options = [("grpc.max_receive_message_length", 64 * _MIB)]
    with Client(limited.service) as client, grpc.insecure_channel(limited.target, options) as ch:
        client.create_namespace("b")
        table_id = client.create_table("b", "t").table_id
        table = client.table("b", "t")
        batch = tablekeeper_pb2_grpc.TableKeeperStub(ch).Batch
        # Too many ops: refused whole, before anything is applied.
        ops = [_put(table_id, b"n%d" % i, b"") for i in range(BATCH_OPS + 1)]
        with pytest.raises(grpc.RpcError) as raised:
            batch(tablekeeper_pb2.BatchRequest(ops=ops), timeout=30)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-batch-ops" in (raised.value.details() or "")
        assert table.get("p", "n0") is None and table.get("p", "n50") is None

        big = os.urandom(64 * 1024)
        for i in range(40):
            table.put("p", b"r%d" % i, big + b"%d" % i)
        # 40 reads of 64 KiB (2.5 MiB) and 10 writes in one Batch: every write applied and
        # answered; reads fill the 1 MiB response, the rest are not executed and say why.
        ops = [_get(table_id, b"r%d" % i) for i in range(40)]
        ops += [_put(table_id, b"w%d" % i, b"x") for i in range(10)]
        response = batch(tablekeeper_pb2.BatchRequest(ops=ops), timeout=30)
        assert response.ByteSize() <= RESPONSE_BYTES + 64 * 1024  # + headers
        answered = 0
        for i, result in enumerate(response.results[:40]):
            if result.range.header.code == 0:
                assert result.range.kvs[0].value == big + b"%d" % i
                answered += 1
            else:
                assert result.range.header.code == 400 and result.retryable
                assert "--max-response-bytes" in result.error
        assert 1 <= answered < 40
        for i, result in enumerate(response.results[40:]):
            assert result.put.header.code == 0 and not result.error
            assert table.get("p", b"w%d" % i) is not None

        # Writes that may return more than a response may carry (prev_kv of up to 4 MiB each):
        # refused whole, nothing applied.
        ops = [_put(table_id, b"r%d" % i, b"new", prev_kv=True) for i in range(3)]
        with pytest.raises(grpc.RpcError) as raised:
            batch(tablekeeper_pb2.BatchRequest(ops=ops), timeout=30)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-response-bytes" in (raised.value.details() or "")
        kv = table.get("p", "r0")
        assert kv is not None and kv.value == big + b"0"


async def test_the_sdk_names_the_limit_and_its_coalesced_reads_fit(limited: ServerProcess) -> None:
    async with AsyncClient(limited.service) as client:
        await client.create_namespace("s")
        await client.create_table("s", "t")
        table = await client.table("s", "t")
        big = os.urandom(64 * 1024)
        await asyncio.gather(*(table.put("p", b"r%d" % i, big) for i in range(60)))
        # 60 concurrent gets coalesce into Batches whose responses would be 3.8 MiB: the reads
        # the server had no room for are sent again alone, and every get gets its value.
        got = await asyncio.gather(*(table.get("p", b"r%d" % i) for i in range(60)))
        assert all(kv is not None and kv.value == big for kv in got)
        # More ops than the server takes in one Batch (the SDK sends up to 1,000 per Batch):
        # a typed error carrying the server's reason.
        with pytest.raises(ResourceLimitError, match="--max-batch-ops"):
            await table.batch_put([("p", b"n%d" % i, b"v") for i in range(BATCH_OPS + 1)])
        assert await table.get("p", "n0") is None
