"""Many watches on one stream (`WatchMany`) against a real server: a client's watches of one
table share one stream; each still gets its own changes, once and in order; one watch ending
(cancelled by its user, compacted, a bad request, too far behind in the client) leaves the
others running; and the SDK falls back to a stream per watch on a server without `WatchMany`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from tablekeeper import (
    AsyncClient,
    AsyncWatch,
    CompactedError,
    RetryPolicy,
    WatchCancelledError,
    _watch_mux,
)
from tablekeeper._context import ClientContext
from tablekeeper_proto.bookkeeper import kv_pb2
from tablekeeper_proto.v1 import watch_pb2, watch_pb2_grpc
from tests.support.server import ServerProcess
from tests.support.watches import fresh_table, take

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("watch-streams") / "data").start()
    yield server
    server.stop()


def _streams(client: AsyncClient) -> int:
    return len(client._context.watch_streams._streams)


async def test_watches_of_a_table_share_one_stream_and_each_gets_its_own_changes(
    server: ServerProcess,
) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "ws")
        # 40 watches: 20 pkeys (over both ranges), the whole pkey and one key of each.
        whole = [await table.watch(f"p{i}", start=b"").start() for i in range(20)]
        single = [await table.watch(f"p{i}", "k1").start() for i in range(20)]
        assert _streams(client) == 1
        for round_ in range(3):
            for i in range(20):
                await table.put(f"p{i}", "k0", f"{round_}")
                await table.put(f"p{i}", "k1", f"{round_}")
        for i, watch in enumerate(whole):
            events = await take(watch, 6)
            assert [(e.pkey, e.lkey, e.kv and e.kv.value) for e in events] == [
                (f"p{i}".encode(), f"k{j % 2}".encode(), f"{j // 2}".encode()) for j in range(6)
            ]
            assert [e.revision for e in events] == sorted({e.revision for e in events})
        for watch in single:
            events = await take(watch, 3)
            assert [(e.lkey, e.kv and e.kv.value) for e in events] == [
                (b"k1", b"0"),
                (b"k1", b"1"),
                (b"k1", b"2"),
            ]
        for watch in (*whole, *single):
            await watch.close()
        assert _streams(client) == 0  # closed with its last watch


async def test_closing_one_watch_leaves_the_others_on_the_stream(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "ws")
        first = await table.watch("p", start=b"").start()
        second = await table.watch("p", start=b"").start()
        await table.put("p", "a", "1")
        assert (await take(first, 1))[0].lkey == b"a"
        await first.close()
        await table.put("p", "b", "2")
        assert [e.lkey for e in await take(second, 2)] == [b"a", b"b"]
        assert _streams(client) == 1
        with pytest.raises(StopAsyncIteration):
            await first.__anext__()
        await second.close()


async def test_a_compacted_watch_ends_alone(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "ws")
        live = await table.watch("c", "live").start()
        items: list[tuple[str, str, str | int]] = [("c", f"k{i:05d}", "v") for i in range(6000)]
        assert not any(await table.batch_put(items))
        assert await table.delete_range("c", "k", "k~") == 6000  # > 10,000 events in all
        old = table.watch("c", start=b"", start_revision=1)
        with pytest.raises(CompactedError) as info:
            await old.start()
        assert info.value.oldest_revision > 1
        assert f"oldest available revision is {info.value.oldest_revision}" in str(info.value)
        await table.put("c", "live", "still here")
        event = (await take(live, 1))[0]
        assert event.kv is not None and event.kv.value == b"still here"
        await live.close()


async def test_a_duplicate_watch_id_is_refused_and_the_first_watch_goes_on(
    server: ServerProcess,
) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "ws")
        channel = grpc.aio.insecure_channel(server.target)
        try:
            call = watch_pb2_grpc.WatchStub(channel).WatchMany()
            request = watch_pb2.WatchRequest(stream_id=table.info.table_id, pkey=b"d", key=b"k")
            for _ in range(2):
                create = watch_pb2.WatchCreate(watch_id=7, watch=request)
                await call.write(watch_pb2.WatchStreamRequest(create=create))
            updates: list[watch_pb2.WatchUpdate] = []
            while len(updates) < 2:
                updates.extend((await call.read()).updates)
            created = next(u for u in updates if u.created)
            refused = next(u for u in updates if u.error_code)
            assert created.watch_id == refused.watch_id == 7
            assert refused.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert "duplicate watch id 7" in refused.error_message
            await table.put("d", "k", "v")
            (update,) = (await call.read()).updates
            assert (update.watch_id, [e.kv.value for e in update.events]) == (7, [b"v"])
            # A bad request ends its watch alone, with the one-watch stream's status.
            bad = watch_pb2.WatchCreate(watch_id=8, watch=watch_pb2.WatchRequest(stream_id=1))
            await call.write(watch_pb2.WatchStreamRequest(create=bad))
            (ended,) = (await call.read()).updates
            assert (ended.watch_id, ended.error_code) == (
                8,
                grpc.StatusCode.INVALID_ARGUMENT.value[0],
            )
            assert "needs a key" in ended.error_message
            call.cancel()
        finally:
            await channel.close()


async def test_a_watch_whose_events_are_not_read_is_cancelled_in_the_client_alone(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_watch_mux, "INBOX_UPDATES_MAX", 5)
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "ws")
        idle = await table.watch("s", start=b"").start()
        busy = await table.watch("s", start=b"").start()
        for i in range(20):
            await table.put("s", f"k{i}", "v")
            assert (await take(busy, 1))[0].lkey == f"k{i}".encode()
        with pytest.raises(WatchCancelledError, match="resume from revision"):
            await take(idle, 20)
        await table.put("s", "after", "v")
        assert (await take(busy, 1))[0].lkey == b"after"
        await busy.close()
        await idle.close()


class _OldWatchServer(watch_pb2_grpc.WatchServicer):
    """A server of the one-watch RPC only (`WatchMany` answers UNIMPLEMENTED, as a server
    without the method does)."""

    def __init__(self) -> None:
        self.calls = 0

    async def Watch(  # noqa: N802
        self, request: watch_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[watch_pb2.WatchResponse]:
        self.calls += 1
        yield watch_pb2.WatchResponse(created=True, revision=10)
        for revision in (11, 12):
            yield watch_pb2.WatchResponse(
                events=[
                    watch_pb2.WatchEvent(
                        kv=kv_pb2.KeyValue(key=request.key, value=b"v%d" % revision),
                        revision=revision,
                    )
                ]
            )
        await asyncio.Event().wait()  # the stream stays open

    async def WatchMany(  # noqa: N802
        self, request_iterator: AsyncIterator[watch_pb2.WatchStreamRequest], context: Any
    ) -> AsyncIterator[watch_pb2.WatchStreamResponse]:
        # What gRPC answers for a method a server does not have.
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield watch_pb2.WatchStreamResponse()  # unreachable: makes this a stream handler


async def test_a_server_without_shared_streams_gets_a_stream_per_watch() -> None:
    old = _OldWatchServer()
    grpc_server = grpc.aio.server()
    watch_pb2_grpc.add_WatchServicer_to_server(old, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    context = ClientContext(f"127.0.0.1:{port}", RetryPolicy(), direct_routing=False)
    try:
        watches = [AsyncWatch(context, 1024, b"p", key, b"") for key in (b"a", b"b")]
        for watch in watches:
            await watch.start()
        assert context.watch_streams_unsupported
        for watch, key in zip(watches, (b"a", b"b"), strict=True):
            events = await take(watch, 2)
            assert [(e.lkey, e.revision) for e in events] == [(key, 11), (key, 12)]
            await watch.close()
        assert old.calls == 2
    finally:
        await context.close()
        await grpc_server.stop(None)


async def test_closing_a_watch_ends_an_iteration_waiting_on_it(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "ws")
        other = await table.watch("q", start=b"").start()
        watch = await table.watch("q", start=b"").start()
        waiting = asyncio.ensure_future(watch.__anext__())
        subscription = watch._feed
        assert isinstance(subscription, _watch_mux.Subscription)
        while subscription._waiter is None:
            await asyncio.sleep(0)  # until the iteration waits for an update
        await watch.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 60)
        await other.close()
