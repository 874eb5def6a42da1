"""Watch against real server processes: every change in order, exactly once, across a server
kill -9 and restart (the SDK resumes from the last revision it delivered); a revision older than
the range's event history gives a clear "compacted" error."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablekeeper import AsyncClient, CompactedError, WatchEvent
from tests.support.server import ServerProcess
from tests.support.watches import fresh_table, take

pytestmark = pytest.mark.integration


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data").start()
    yield server
    assert server.process is not None
    if server.process.poll() is None:
        server.stop()


def _summary(events: list[WatchEvent]) -> list[tuple[str, bytes, bytes | None]]:
    return [(e.type, e.lkey, e.kv.value if e.kv else None) for e in events]


async def test_watch_every_change_once_in_order_across_restart(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "w")
        expected: list[tuple[str, bytes, bytes | None]] = []
        async with table.watch("w", start=b"", prev_kv=True) as watch:
            for i in range(30):
                await table.put("w", f"k{i % 7}", f"v{i}")
                expected.append(("put", f"k{i % 7}".encode(), f"v{i}".encode()))
            await table.put("other-pkey", "k1", "x")  # same table, not watched
            first = await take(watch, 30)
            assert _summary(first) == expected
            revisions = [(e.revision, e.index) for e in first]
            assert revisions == sorted(set(revisions))

            server.kill()
            server.start()
            more: list[tuple[str, bytes, bytes | None]] = []
            for i in range(30, 40):
                await table.put("w", f"k{i % 7}", f"v{i}")
                more.append(("put", f"k{i % 7}".encode(), f"v{i}".encode()))
            assert await table.delete_range("w", "k0", "k2") == 3
            more += [("delete", b"k0", None), ("delete", b"k1", None), ("delete", b"k2", None)]
            second = await take(watch, len(more))
            assert _summary(second) == more
            assert second[0].revision > first[-1].revision
            assert second[-1].prev is not None  # prev_kv asked for
            last_seen = first[-1].revision

        # A new watch resumed from the last revision seen before the restart gets exactly the
        # rest, from the durable history.
        async with table.watch("w", start=b"", start_revision=last_seen + 1) as resumed:
            assert _summary(await take(resumed, len(more))) == more

        # A single-key watch from now on.
        async with table.watch("w", "k3") as one:
            await table.put("w", "k4", "no")
            await table.put("w", "k3", "yes")
            (event,) = await take(one, 1)
            assert (event.lkey, event.kv and event.kv.value) == (b"k3", b"yes")


async def test_compacted_revision_is_a_clear_error(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "w")
        items: list[tuple[str, str, str | int]] = [("c", f"k{i:05d}", "v") for i in range(6000)]
        assert not any(await table.batch_put(items))
        assert await table.delete_range("c") == 6000  # 6,000 more events: > 10,000 in all
        watch = table.watch("c", start=b"", start_revision=1)
        with pytest.raises(CompactedError) as info:
            await watch.start()
        assert info.value.oldest_revision > 1
        assert "compacted" in str(info.value)
        assert f"oldest available revision is {info.value.oldest_revision}" in str(info.value)
        # From the oldest available revision on, the history is served.
        async with table.watch(
            "c", start=b"", start_revision=info.value.oldest_revision
        ) as watch_ok:
            events = await take(watch_ok, 10)
            assert events[0].revision == info.value.oldest_revision
            assert [e.revision for e in events] == list(
                range(events[0].revision, events[0].revision + 10)
            )


def test_sync_watch(server: ServerProcess) -> None:
    from tablekeeper import Client

    with Client(server.service) as client:
        ns = "w" + uuid.uuid4().hex[:8]
        client.create_namespace(ns)
        client.create_table(ns, "t", ranges=2)
        table = client.table(ns, "t")
        table.put("p", "a", "0")
        with table.watch("p", "a", prev_kv=True) as watch:
            assert watch.revision >= 1
            table.put("p", "a", "1")
            table.delete("p", "a")
            put, deleted = next(watch), next(watch)
        assert (put.type, put.kv and put.kv.value, put.prev and put.prev.value) == (
            "put",
            b"1",
            b"0",
        )
        assert (deleted.type, deleted.kv, deleted.revision > put.revision) == ("delete", None, True)


async def test_graceful_stop_ends_open_watches_at_once(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(tmp_path / "data", extra_args=["--shutdown-grace", "120s"])
    server_factory.append(server)  # stopped at the end, whatever happens
    server.start()
    async with AsyncClient(server.service) as client:
        table = await fresh_table(client, "w")
        async with table.watch("w", start=b"") as watch:
            await table.put("w", "a", "1")
            assert (await take(watch, 1))[0].lkey == b"a"
            started = asyncio.get_running_loop().time()
            await asyncio.to_thread(server.stop, 90)
            # Without ending the streams first, stop would wait the whole grace period (the
            # bound is far from both: what it tells apart is 120 s from a moment).
            assert asyncio.get_running_loop().time() - started < 60
            server.start()
            await table.put("w", "b", "2")
            assert (await take(watch, 1))[0].lkey == b"b"  # resumed by itself
