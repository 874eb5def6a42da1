"""Hostile input and resource limits against a real server process: memory bounded in bytes
while large values stream through a range, Batch size and response bounds, name and
`initial_num_ranges` bounds, malformed protobuf."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tablekeeper import Client
from tablekeeper_proto.v1 import watch_pb2, watch_pb2_grpc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

_MIB = 1024 * 1024
VALUE_BYTES = 512 * 1024
HISTORY_BYTES = 8 * _MIB
HISTORY_BYTES_TOTAL = 16 * _MIB
QUEUE_BYTES = 8 * _MIB
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
        ],
    )
    server_factory.append(server)
    server.start()
    assert server.process is not None
    pid = server.process.pid
    total_bytes = int(os.environ.get("TK_HOSTILE_BYTES", str(600 * _MIB)))
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
    growth = peak - before
    # What the limits allow in memory: the rings (HISTORY_BYTES_TOTAL), two watcher queues, the
    # batch each watch stream is sending, RocksDB's memtables (16 MiB, two of them) for the
    # data and the durable history, and gRPC's buffers: about 100 MiB. Before these bounds the
    # ring alone held 4,096 events with value and previous value: 4 GiB at this value size.
    bound = HISTORY_BYTES_TOTAL + 2 * QUEUE_BYTES + 150 * _MIB
    print(f"RSS {before / _MIB:.0f} MiB before, peak {peak / _MIB:.0f} MiB, {puts} puts")
    assert growth < bound, f"RSS grew by {growth / _MIB:.0f} MiB (bound {bound / _MIB:.0f})"
