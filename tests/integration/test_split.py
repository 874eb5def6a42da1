"""Online range split against a real server process: under load from several writers, with a
watch across the switch, from the CLI, and with the server killed (a failpoint that exits as
kill -9 does) between the split's steps.

What must hold afterwards: every acknowledged put readable with its value (or a later attempted
one), every counter within [acknowledged, attempted] increments, the table has the children in
place of the parent, and a watch on a key of the split range saw each acknowledged change once,
in order, across the switch.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tablekeeper import AsyncClient, AsyncTable, Client
from tablekeeper.bulk import scan_range
from tablekeeper_server.core.failpoints import CRASH_EXIT_CODE, ENV_VAR
from tablekeeper_server.core.routing import routing_hash
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = pytest.mark.integration

PARENT = 1024  # the first range of a 2-range table: the negative half of the hash space
WRITERS = 6


def in_parent(prefix: str, count: int) -> list[str]:
    """`count` pkeys starting with `prefix` that the range `PARENT` holds."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        pkey = f"{prefix}{i}"
        if routing_hash(pkey.encode()) < 0:
            found.append(pkey)
        i += 1
    return found


@dataclass
class Load:
    """Writers that put increasing values and increment counters, remembering what was
    acknowledged and what was attempted."""

    table: AsyncTable
    acked_puts: dict[str, int] = field(default_factory=dict)
    attempted_puts: dict[str, int] = field(default_factory=dict)
    acked_incr: dict[str, int] = field(default_factory=dict)
    attempted_incr: dict[str, int] = field(default_factory=dict)
    acked_ops: int = 0
    stopping: bool = False
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    hot: str = field(default_factory=lambda: in_parent("hot-", 1)[0])
    """A key of the parent that a watch follows."""
    seen: list[int] = field(default_factory=list)
    acked_hot: list[int] = field(default_factory=list)
    _watching: asyncio.Event = field(default_factory=asyncio.Event)
    _watcher: asyncio.Task[None] | None = None

    async def writer(self, w: int) -> None:
        pkeys = [*in_parent(f"w{w}-", 6), f"w{w}-other"]
        counter = in_parent(f"c{w}-", 1)[0]
        n = 0
        while not self.stopping:
            pkey = pkeys[n % len(pkeys)]
            self.attempted_puts[pkey] = n
            await self.table.put(pkey, "k", str(n))
            self.acked_puts[pkey] = n
            self.attempted_incr[counter] = self.attempted_incr.get(counter, 0) + 1
            await self.table.increment(counter, "n", 1)
            self.acked_incr[counter] = self.acked_incr.get(counter, 0) + 1
            self.acked_ops += 2
            self.progress.set()
            n += 1

    async def start(self, writers: int) -> list[asyncio.Task[None]]:
        """Start a watch on a hot key of the parent, then `writers` writers and one that puts
        increasing values to the hot key; returns the writers' tasks (they end at `stopping`)."""
        self._watcher = asyncio.create_task(self._watch())
        await self._watching.wait()
        tasks = [asyncio.create_task(self.writer(w)) for w in range(writers)]
        return [*tasks, asyncio.create_task(self._hot_writer())]

    async def _watch(self) -> None:
        async with self.table.watch(self.hot, "k") as events:
            self._watching.set()
            async for event in events:
                assert event.kv is not None
                self.seen.append(int(event.kv.value))

    async def _hot_writer(self) -> None:
        while not self.stopping:
            await self.table.put(self.hot, "k", str(len(self.acked_hot)))
            self.acked_hot.append(len(self.acked_hot))

    async def verify_watch(self) -> None:
        """The watch saw each acknowledged change of the hot key once, in order."""
        last = self.acked_hot[-1]

        async def drained() -> None:
            while not self.seen or self.seen[-1] < last:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(drained(), 60)
        assert self._watcher is not None
        self._watcher.cancel()
        assert self.seen == list(range(last + 1))

    async def until(self, ops: int) -> None:
        """Wait until the writers have `ops` more acknowledged ops than now."""
        target = self.acked_ops + ops
        while self.acked_ops < target:
            self.progress.clear()
            await self.progress.wait()

    async def verify(self) -> None:
        for pkey, acked in self.acked_puts.items():
            got = await self.table.get(pkey, "k")
            assert got is not None, pkey
            assert acked <= int(got.value) <= self.attempted_puts[pkey], pkey
        for counter, acked in self.acked_incr.items():
            got = await self.table.get(counter, "n")
            assert got is not None and got.number is not None, counter
            assert acked <= got.number <= self.attempted_incr[counter], counter


async def test_a_split_under_load_loses_nothing_and_a_watch_sees_every_change_once(
    server: ServerProcess,
) -> None:
    async with AsyncClient(server.service) as client:
        await client.create_namespace("ns")
        await client.create_table("ns", "t", ranges=2)
        table = await client.table("ns", "t")
        load = Load(table)
        writers = await load.start(WRITERS)
        await load.until(300)
        split = await client.split_range("ns", "t", PARENT)
        await load.until(300)
        load.stopping = True
        await asyncio.gather(*writers)

        assert split.parent_range_id == PARENT
        assert [c.range_id for c in split.children] == [1026, 1027]
        assert split.keys_copied >= WRITERS * 7  # the writers' pkeys in the parent, at least
        layout = await client.layout("ns", "t")
        assert [r.range_id for r in layout.ranges] == [1026, 1027, 1025]
        await load.verify()
        await load.verify_watch()  # across the switch


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVER_COMMAND), "--service", server.service, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_splits_a_range_and_a_child_again(server: ServerProcess) -> None:
    with Client(server.service) as client:
        client.create_namespace("ns")
        client.create_table("ns", "t", ranges=2)
        table = client.table("ns", "t")
        pkeys = [f"p{i}" for i in range(200)]
        for pkey in pkeys:
            table.put(pkey, "k", pkey)

        first = cli(server, "-o", "json", "table", "split", "ns/t")
        assert first.returncode == 0, first.stderr
        doc = json.loads(first.stdout)
        # The widest range: the last one, which also holds INT64_MAX.
        assert doc["parent_range_id"] == 1025
        assert [c["range_id"] for c in doc["children"]] == [1026, 1027]
        assert doc["keys_copied"] == sum(1 for p in pkeys if routing_hash(p.encode()) >= 0)

        second = cli(server, "table", "split", "ns/t", "--range", "1027")
        assert second.returncode == 0, second.stderr
        assert "split range 1027 of ns/t into 1028" in second.stdout
        assert len(client.layout("ns", "t").ranges) == 4
        for pkey in pkeys:
            got = table.get(pkey, "k")
            assert got is not None and got.value == pkey.encode()

        refused = cli(server, "table", "split", "ns/t", "--range", "1025")  # retired
        assert refused.returncode != 0
        assert "no current range 1025" in refused.stderr


@pytest.mark.parametrize(
    "failpoint",
    [
        "split.during_copy",  # copying the parent's checkpoint, the parent serving
        "split.after_copy",  # before catching up on its log
        "split.after_seal",
        "split.before_switch",
    ],
)
def test_a_server_killed_mid_split_finishes_it_after_restart(
    tmp_path: Path, server_factory: list[ServerProcess], failpoint: str
) -> None:
    server = ServerProcess(tmp_path / "data", env={ENV_VAR: f"{failpoint}=crash"})
    server_factory.append(server)
    server.start()
    with Client(server.service) as client:
        client.create_namespace("ns")
        client.create_table("ns", "t", ranges=2)
        table = client.table("ns", "t")
        pkeys = [f"p{i}" for i in range(300)]
        for pkey in pkeys:
            table.put(pkey, "k", pkey)
            table.increment(pkey, "n", 1)

    result = cli(server, "table", "split", "ns/t", "--range", str(PARENT))
    assert result.returncode != 0
    assert server.process is not None
    assert server.process.wait(timeout=60) == CRASH_EXIT_CODE
    assert f"failpoint {failpoint}: crashing the process" in server.log_tail()

    server.env = None
    server.start()
    with Client(server.service) as client:
        table = client.table("ns", "t")
        for pkey in pkeys:  # served while (or after) the split finishes by itself
            got = table.get(pkey, "k")
            assert got is not None and got.value == pkey.encode()
            counter = table.get(pkey, "n")
            assert counter is not None and counter.number == 1
        assert len(client.layout("ns", "t").ranges) == 3
        table.put(pkeys[0], "k", "after")
        assert table.get(pkeys[0], "k").value == b"after"  # type: ignore[union-attr]


def test_the_split_policy_splits_a_range_that_outgrows_its_threshold(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(
        tmp_path / "data", extra_args=["--split-keys", "400", "--split-check-interval", "0.2"]
    )
    server_factory.append(server)
    server.start()
    with Client(server.service) as client:
        client.create_namespace("ns")
        client.create_table("ns", "t", ranges=2)
        table = client.table("ns", "t")
        pkeys = in_parent("p", 300)  # with their events, over 400 keys in range 1024
        for pkey in pkeys:
            table.put(pkey, "k", pkey)
        deadline = time.monotonic() + 60
        while len(client.layout("ns", "t").ranges) < 3:  # the policy looks every 0.2 s
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        assert "split policy: splitting range" in server.log_tail(200)
        for pkey in pkeys:
            got = table.get(pkey, "k")
            assert got is not None and got.value == pkey.encode()


async def test_a_scan_of_a_range_reads_on_through_its_split(server: ServerProcess) -> None:
    """A whole-range scan (what a Spark export runs per range) that began before the split
    goes on by the old range's id: its pages come from the children, each key once."""
    async with AsyncClient(server.service) as client:
        await client.create_namespace("ns")
        await client.create_table("ns", "t", ranges=2)
        table = await client.table("ns", "t")
        pkeys = in_parent("p", 200)
        for pkey in pkeys:
            await table.put(pkey, "k", pkey)
        layout = await client.layout("ns", "t")
        pages = scan_range(client, layout.table_id, PARENT, page_size=30)
        seen = [kv.pkey for kv in await anext(pages)]
        await client.split_range("ns", "t", PARENT)
        async for page in pages:
            seen.extend(kv.pkey for kv in page)
        assert sorted(seen) == sorted(p.encode() for p in pkeys)
        # And the retired range's id keeps reading all of it, from both children.
        again = [
            kv.pkey async for page in scan_range(client, layout.table_id, PARENT) for kv in page
        ]
        assert sorted(again) == sorted(p.encode() for p in pkeys)


async def test_sessions_and_their_ephemeral_keys_move_with_their_pkeys(
    server: ServerProcess,
) -> None:
    """A session lives on in the child holding its pkey: the SDK keeps it alive there, its
    ephemeral keys stay until it ends, and its end deletes them. A session whose keys the
    split would divide makes the split refuse (the range serves on)."""
    async with AsyncClient(server.service) as client:
        await client.create_namespace("ns")
        await client.create_table("ns", "t", ranges=2)
        table = await client.table("ns", "t")
        first = next(p for p in in_parent("a", 50) if routing_hash(p.encode()) < -(2**62))
        second = next(p for p in in_parent("b", 50) if routing_hash(p.encode()) >= -(2**62))
        divided = table.session(first, ttl_s=10.0)
        await divided.start()
        await table.put(second, "other-side", "x", session=divided)
        # In a thread: the loop goes on keeping the session alive while the command runs.
        refused = await asyncio.to_thread(
            cli, server, "table", "split", "ns/t", "--range", str(PARENT)
        )
        assert refused.returncode != 0 and "divides" in refused.stderr, refused.stderr
        await divided.close()

        kept = table.session(first, ttl_s=3.0)
        await kept.start()
        ended = table.session(second, ttl_s=3.0)
        await ended.start()
        await table.put(first, "member", "kept", session=kept)
        await table.put(second, "member", "ended", session=ended)
        outcome = await client.split_range("ns", "t", PARENT)
        layout = await client.layout("ns", "t")
        assert PARENT not in [r.range_id for r in layout.ranges]
        assert len(outcome.children) == 2
        # A keep-alive sent after the switch is answered (with the session's TTL) by the child
        # holding the session's pkey: it has the session ("no such session" otherwise).
        for session in (kept, ended):
            answers = session.keep_alive_answers()
            assert await anext(answers) == 3.0
            await answers.aclose()
        assert not kept.expired.is_set() and not ended.expired.is_set()
        got = await table.get(first, "member")
        assert got is not None and got.value == b"kept"
        assert await ended.close()
        assert await table.get(second, "member") is None
        assert (await table.get(first, "member")) is not None
        await kept.close()
        assert await table.get(first, "member") is None
