"""Recipes against a real server: PIP-45 MetadataStore semantics, next_counter_value unique from
8 processes, and a lock taken over after its holder is killed -9 (fencing tokens grow)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from tablekeeper import AsyncClient, BadVersionError, Client, KeyExistsError, KeyNotFoundError
from tablekeeper.recipes import (
    CoordinationService,
    DistributedCounter,
    GroupMembership,
    LeaderElection,
    MetadataStore,
    Notification,
    SharedMap,
    split_path,
)
from tablekeeper_proto.v1 import session_pb2, session_pb2_grpc
from tests.support.server import REPO, ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("recipes") / "data").start()
    yield server
    server.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for `condition` (the timeout only guards against a hang)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def until_async(
    read: Callable[[], Awaitable[int]], want: int, timeout_s: float = 60.0
) -> None:
    async with asyncio.timeout(timeout_s):
        while await read() != want:
            await asyncio.sleep(0.05)


async def count(children: Awaitable[list[str]]) -> int:
    return len(await children)


@pytest.fixture()
def namespace(server: ServerProcess) -> str:
    ns = "r" + uuid.uuid4().hex[:8]
    with Client(server.service) as client:
        client.create_namespace(ns)
        client.create_table(ns, "meta", ranges=4)
    return ns


def test_split_path() -> None:
    assert split_path("/admin/clusters/c1/brokers/b1") == ("/admin/clusters/c1/brokers", "b1")
    assert split_path("/a") == ("/", "a")
    for bad in ("/", "a", "/a/", "//a"):
        with pytest.raises(ValueError):
            split_path(bad)


async def test_pip45_semantics(server: ServerProcess, namespace: str) -> None:
    async with AsyncClient(server.service) as client:
        store = MetadataStore(await client.table(namespace, "meta"), session_ttl_s=5)
        async with store:
            notes: list[Notification] = []

            async def listen() -> None:
                async for note in store.notifications("/brokers", start_revision=1):
                    notes.append(note)

            # From revision 1 of the fresh table: nothing is missed, however late the watches
            # register.
            listener = asyncio.create_task(listen())
            s0 = await store.create("/brokers", "root")
            assert (s0.path, s0.version) == ("/brokers", 0)
            with pytest.raises(KeyExistsError):
                await store.create("/brokers", "again")
            s1 = await store.put("/brokers", "v1", 0)
            assert s1.version == 1
            with pytest.raises(BadVersionError):
                await store.put("/brokers", "v2", 0)
            with pytest.raises(KeyNotFoundError):
                await store.put("/missing", "v", 3)
            for name in ("b2", "b1", "b3"):
                await store.put(f"/brokers/{name}", name, ephemeral=True)
            seq = await store.put("/brokers/n-", "x", sequential=True)
            assert seq.path == "/brokers/n-" + "0" * 20
            assert await store.get_children("/brokers") == ["b1", "b2", "b3", seq.path[9:]]
            assert await store.exists("/brokers/b1")
            got = await store.get("/brokers")
            assert got is not None and got[0] == b"v1" and got[1].version == 1
            with pytest.raises(BadVersionError):
                await store.delete("/brokers/b1", expected_version=5)
            await store.delete("/brokers/b1", expected_version=0)
            with pytest.raises(KeyNotFoundError):
                await store.delete("/brokers/b1")
            assert not await store.exists("/brokers/b1")
            await store.delete("/brokers")
            await until(lambda: len(notes) >= 8)  # created, modified, deleted, 5 children
            listener.cancel()
            kinds = [n.type for n in notes]
            assert [k for k in kinds if k != "children-changed"] == [
                "created",
                "modified",
                "deleted",
            ]
            assert kinds.count("children-changed") == 5  # b2, b1, b3, n-…, b1 deleted
        # Closing the store closed its sessions: the ephemeral children are gone.
        store2 = MetadataStore(await client.table(namespace, "meta"))
        assert await store2.get_children("/brokers") == [seq.path[9:]]


_COUNTER = """
import asyncio, sys
from tablekeeper import AsyncClient
from tablekeeper.recipes import CoordinationService, MetadataStore
async def main():
    async with AsyncClient(sys.argv[1]) as client:
        coord = CoordinationService(MetadataStore(await client.table(sys.argv[2], "meta")))
        for _ in range(25):
            print(await coord.next_counter_value("/counters/ids"), flush=True)
asyncio.run(main())
"""


def test_next_counter_value_unique_from_8_processes(server: ServerProcess, namespace: str) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _COUNTER, server.service, namespace],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        for _ in range(8)
    ]
    values: list[int] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        values += [int(v) for v in out.split()]
    assert sorted(values) == list(range(1, 201))


_HOLDER = """
import asyncio, sys
from tablekeeper import AsyncClient
from tablekeeper.recipes import CoordinationService, MetadataStore
async def main():
    async with AsyncClient(sys.argv[1]) as client:
        store = MetadataStore(await client.table(sys.argv[2], "meta"), session_ttl_s=3)
        lock = await CoordinationService(store).acquire_lock("/locks/leader", "holder")
        print(lock.fencing_token, flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_lock_taken_over_after_holder_kill_9(server: ServerProcess, namespace: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, server.service, namespace], stdout=subprocess.PIPE, cwd=REPO
    )
    try:
        assert holder.stdout is not None
        first_token = int(await asyncio.to_thread(holder.stdout.readline))
        async with AsyncClient(server.service) as client:
            store = MetadataStore(await client.table(namespace, "meta"), session_ttl_s=2)
            async with store:
                coord = CoordinationService(store)
                contender = asyncio.create_task(coord.acquire_lock("/locks/leader", "second"))
                await asyncio.sleep(4)  # the holder keeps its session alive: no takeover
                assert not contender.done()
                holder.kill()
                # Taken once the holder's session expires (the wait only guards against a hang).
                lock = await asyncio.wait_for(contender, 60)
                assert lock.fencing_token > first_token
                await coord.release_lock(lock)
                again = await coord.acquire_lock("/locks/leader")
                assert again.fencing_token > lock.fencing_token
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


async def test_a_contender_that_gives_up_leaves_no_node(
    server: ServerProcess, namespace: str
) -> None:
    """B times out and C is cancelled while A holds the lock: neither leaves its contender node,
    so D gets the lock as soon as A releases it (their stores' sessions are still alive)."""
    path = "/locks/l"
    async with AsyncClient(server.service) as client:
        table = await client.table(namespace, "meta")
        stores = [MetadataStore(table, session_ttl_s=60) for _ in range(4)]
        a, b, c, d = (CoordinationService(store) for store in stores)
        lock_a = await a.acquire_lock(path, "a")
        holder = [lock_a.node.rsplit("/", 1)[1]]
        with pytest.raises(TimeoutError):
            await b.acquire_lock(path, "b", timeout_s=0.5)
        assert await stores[0].get_children(path) == holder

        waiting = asyncio.create_task(c.acquire_lock(path, "c"))
        async with asyncio.timeout(60):
            while len(await stores[0].get_children(path)) < 2:  # C's node is there
                await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await stores[0].get_children(path) == holder

        await a.release_lock(lock_a)
        lock_d = await asyncio.wait_for(d.acquire_lock(path, "d"), 60)
        assert lock_d.fencing_token > lock_a.fencing_token
        await d.release_lock(lock_d)
        for store in stores:
            await store.close()


async def test_groups_election_counter_and_shared_map(
    server: ServerProcess, namespace: str
) -> None:
    async with AsyncClient(server.service) as client:
        table = await client.table(namespace, "meta")
        async with MetadataStore(table, session_ttl_s=5) as store_a:
            store_b = MetadataStore(table, session_ttl_s=5)
            group = GroupMembership(store_a, "/groups/g1")
            other = GroupMembership(store_b, "/groups/g1")
            views: list[list[str]] = []

            async def listen() -> None:
                async for members in group.listen():
                    views.append(members)

            listener = asyncio.create_task(listen())
            await until(lambda: bool(views))  # the first view comes once the watch is open
            await group.join("m1", "host1")
            await other.join("m2", "host2")
            with pytest.raises(KeyExistsError):
                await other.join("m1")
            assert await group.members() == ["m1", "m2"]
            await store_b.close()  # m2's session ends: it leaves the group
            await group.leave("m1")
            await until(lambda: ["m1", "m2"] in views and views[-1] == [])
            listener.cancel()
            assert views[0] == [] and views[-1] == []
            assert ["m1", "m2"] in views

            election_a = LeaderElection(store_a, "/elections/e1")
            election_b = LeaderElection(MetadataStore(table, session_ttl_s=5), "/elections/e1")
            lead_a = await election_a.campaign("a")
            assert await election_a.leader() == (lead_a.node, b"a")
            waiting = asyncio.create_task(election_b.campaign("b"))
            await until_async(lambda: count(store_a.get_children("/elections/e1")), 2)
            assert not waiting.done()  # B's candidacy is queued behind the leader's
            await election_a.resign()
            lead_b = await asyncio.wait_for(waiting, 60)
            assert lead_b.fencing_token > lead_a.fencing_token
            assert await election_b.leader() == (lead_b.node, b"b")
            await election_b.store.close()

        counter = DistributedCounter(table, "counters", "c", batch_size=10, flush_interval_s=0.5)
        for _ in range(25):
            await counter.add()
        assert await counter.value() == 20  # two full batches flushed
        await until_async(lambda: counter.value(), 25)  # the rest flushed by the timer
        await counter.close()

        shared = SharedMap(table, "map")
        assert await shared.put_if_absent("k", "v1") is None
        assert await shared.put_if_absent("k", "v2") == b"v1"
        assert not await shared.replace("k", "nope", "v3")
        assert await shared.replace("k", "v1", "v3")
        assert await shared.update("n", lambda old: b"1" if old is None else old + b"1") == b"1"
        results = await asyncio.gather(
            *(shared.update("n", lambda old: str(int(old or b"0") + 1).encode()) for _ in range(10))
        )
        assert len(results) == 10
        assert await shared.get("n") == b"11"
        assert [kv.lkey async for kv in shared.scan()] == [b"k", b"n"]
        assert await shared.update("k", lambda old: None) is None
        assert await shared.get("k") is None


async def test_typed_cache_and_session_events(server: ServerProcess, namespace: str) -> None:
    async with AsyncClient(server.service) as client:
        table = await client.table(namespace, "meta")
        async with MetadataStore(table, session_ttl_s=1) as store, MetadataStore(table) as other:
            caches = [s.cache(lambda v: json.dumps(v).encode(), json.loads) for s in (store, other)]
            await caches[0].create("/conf/c1", {"n": 0})
            assert await caches[1].get("/conf/c1") == {"n": 0}

            def bump(value: Any) -> Any:
                return {"n": (value or {"n": 0})["n"] + 1}

            # Both caches hold version 0; concurrent updates conflict and retry, none is lost.
            await asyncio.gather(
                *(caches[i % 2].read_modify_update("/conf/c1", bump) for i in range(20))
            )
            assert await caches[0].get("/conf/c1") == {"n": 20}
            assert await caches[1].read_modify_update("/conf/new", bump) == {"n": 1}

            events: list[tuple[str, str]] = []
            store.register_session_listener(lambda event, parent: events.append((event, parent)))
            await store.put("/eph/a", "x", ephemeral=True)
            session = await store.session_for("/eph")
            stub = client._stub("sessions", session_pb2_grpc.SessionsStub)
            await stub.Close(
                session_pb2.CloseSessionRequest(
                    stream_id=table.info.table_id, pkey=b"/eph", session_id=session.id
                )
            )
            await asyncio.wait_for(session.expired.wait(), 60)
            assert events == [("session-lost", "/eph")]
            assert not await store.exists("/eph/a")
            await store.put("/eph/a", "x", ephemeral=True)
            assert events[-1] == ("session-reestablished", "/eph")
            assert await store.exists("/eph/a")
