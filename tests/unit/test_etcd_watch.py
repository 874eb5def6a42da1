"""The etcd Watch stream over a range's watch hub, without gRPC: a watcher whose client reads
slowly overflows the hub's per-watcher queue and catches up from the event history, as etcd
never cancels a slow watcher; a history that no longer reaches back cancels it with
compact_revision."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tablekeeper_proto.etcd import kv_pb2, rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import UnavailableError
from tablekeeper_server.etcd.keys import span
from tablekeeper_server.etcd.servicers import _EventCache, _Watch, _WatchStream
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.range.watch import KeySpan, WatchHub
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS


@dataclass
class _Name:
    log_name: str = "etcd-test"


class FakeRange:
    """What the watch stream uses of a range: its hub, applied revision and name."""

    def __init__(self, history_limit: int = 10_000) -> None:
        store = MemoryKvStore()
        self.sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store, history_limit))
        self.watch = WatchHub("etcd-test", limits=Limits(watcher_queue_bytes_max=4096))
        self.watch.attach(self.sm.history, 0)
        self.name = _Name()
        self.applied_sequence = 0

    def applied_state(self) -> RangeStateMachine:
        raise UnavailableError("no leases here")

    def put(self, key: bytes, value: bytes) -> None:
        txn = rpc_pb2.TxnRequest(
            success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value))]
        )
        command = wal_pb2.WalCommand(etcd_txn=txn.SerializeToString(), timestamp_ms=1)
        self.applied_sequence += 1
        self.sm.apply_batch([(self.applied_sequence, command)])
        self.watch.publish(self.sm.last_events, self.applied_sequence)


class FakeKeyspace:
    def __init__(self, range_: FakeRange) -> None:
        self.range_ = range_
        self.clock = ManualClock()

    @staticmethod
    def header(revision: int) -> rpc_pb2.ResponseHeader:
        return rpc_pb2.ResponseHeader(revision=revision)

    async def revision(self) -> int:
        return self.range_.applied_sequence

    async def range(self) -> FakeRange:
        return self.range_


def _start(range_: FakeRange) -> tuple[_WatchStream, _Watch]:
    stream = _WatchStream(FakeKeyspace(range_), 600.0, _EventCache())  # type: ignore[arg-type]
    create = rpc_pb2.WatchCreateRequest(key=b"w/", range_end=b"w0")
    watch = _Watch(0, create, 0.0)
    watch.watcher, _ = range_.watch.start(KeySpan(*span(create.key, create.range_end)), 0)
    stream.watches[0] = watch
    watch.task = asyncio.create_task(stream.run(range_, watch))  # type: ignore[arg-type]
    return stream, watch


async def _drain(stream: _WatchStream, count: int) -> list[rpc_pb2.WatchResponse]:
    responses = []
    seen = 0
    while seen < count:
        response = await asyncio.wait_for(stream.queue.get(), 10)
        responses.append(response)
        if response.canceled:
            break
        seen += len(response.events)
    return responses


async def test_a_slow_watcher_catches_up_from_the_history() -> None:
    range_ = FakeRange()
    stream, watch = _start(range_)
    first = watch.watcher
    expected = [b"w/%04d" % i for i in range(300)]
    for key in expected:  # nobody reads the stream meanwhile: the hub's queue overflows
        range_.put(key, b"v" * 100)
        await asyncio.sleep(0)
    responses = await _drain(stream, len(expected))
    assert not any(r.canceled for r in responses)
    keys = [e.kv.key for r in responses for e in r.events]
    assert keys == expected
    assert all(e.type == kv_pb2.Event.PUT for r in responses for e in r.events)
    assert watch.watcher is not first  # it was cancelled by the hub and registered again
    await stream.close()


async def test_a_watcher_behind_the_history_is_cancelled_as_compacted() -> None:
    range_ = FakeRange(history_limit=20)
    stream, _ = _start(range_)
    for i in range(300):
        range_.put(b"w/%04d" % i, b"v" * 100)
        await asyncio.sleep(0)
    responses = await _drain(stream, 300)
    assert responses[-1].canceled and responses[-1].compact_revision > 1
    await stream.close()


async def test_progress_notifications_follow_the_injected_clock() -> None:
    """A watch asking for progress gets one after `progress_interval_s` of silence on the
    server's clock (here a manual one: nothing comes until it is moved)."""
    range_ = FakeRange()
    keyspace = FakeKeyspace(range_)
    stream = _WatchStream(keyspace, 600.0, _EventCache())  # type: ignore[arg-type]
    create = rpc_pb2.WatchCreateRequest(key=b"w/", range_end=b"w0", progress_notify=True)
    await stream.create(create)
    created = await asyncio.wait_for(stream.queue.get(), 10)
    assert created.created and stream.ticker is not None
    range_.put(b"w/a", b"v")
    (event,) = (await asyncio.wait_for(stream.queue.get(), 10)).events
    assert event.kv.key == b"w/a"
    keyspace.clock.advance(599.0)  # a tick passes, but the watch sent an event 599 s ago
    for _ in range(10):
        await asyncio.sleep(0)
    assert stream.queue.empty()
    keyspace.clock.advance(301.0)  # the next tick: 900 s of silence
    progress = await asyncio.wait_for(stream.queue.get(), 10)
    assert not progress.events and not progress.created and progress.watch_id == 0
    assert progress.header.revision == range_.applied_sequence
    await stream.close()
