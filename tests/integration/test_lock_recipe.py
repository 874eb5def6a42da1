"""The lock recipe's handle (`acquire(timeout=)`, `async with` / `with`), `SessionExpiredError`
when the session behind a lock or an ephemeral key expires, and the blocking recipe twins
(`tablekeeper.recipes.sync`), against a real server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from tablekeeper import AsyncClient, AsyncSession, Client, SessionExpiredError
from tablekeeper.recipes import CoordinationService, MetadataStore, sync
from tablekeeper_proto.v1 import session_pb2, session_pb2_grpc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("locks") / "data").start()
    yield server
    server.stop()


@pytest.fixture()
def namespace(server: ServerProcess) -> str:
    ns = "l" + uuid.uuid4().hex[:8]
    with Client(server.service) as client:
        client.create_namespace(ns)
        client.create_table(ns, "meta", ranges=4)
    return ns


async def expire(client: AsyncClient, session: AsyncSession) -> None:
    """End `session` on the server (as its expiry would) and wait until its owner sees it (at
    its next keep-alive, within a third of its TTL)."""
    stub = client._stub("sessions", session_pb2_grpc.SessionsStub)
    await stub.Close(
        session_pb2.CloseSessionRequest(
            stream_id=session.table_id, pkey=session.pkey, session_id=session.id
        )
    )
    await asyncio.wait_for(session.expired.wait(), 60)


async def test_async_with_lock_and_acquire_timeout(server: ServerProcess, namespace: str) -> None:
    async with AsyncClient(server.service) as client:
        table = await client.table(namespace, "meta")
        async with MetadataStore(table) as store_a, MetadataStore(table) as store_b:
            a, b = CoordinationService(store_a), CoordinationService(store_b)
            lock_a, lock_b = a.lock("/locks/job", "a"), b.lock("/locks/job", "b")
            async with lock_a as held:
                assert lock_a.locked and held.fencing_token > 0
                with pytest.raises(TimeoutError):
                    await lock_b.acquire(timeout=0.3)
                assert not lock_b.locked
                with pytest.raises(RuntimeError):
                    await lock_a.acquire()  # not reentrant
            assert not lock_a.locked
            # B's timed-out attempt left no node: it gets the lock at once now.
            second = await asyncio.wait_for(lock_b.acquire(timeout=60), 90)
            assert second.fencing_token > held.fencing_token
            await lock_b.release()
            assert await store_a.get_children("/locks/job") == []


async def test_a_lost_session_is_session_expired(server: ServerProcess, namespace: str) -> None:
    async with AsyncClient(server.service) as client:
        table = await client.table(namespace, "meta")
        async with (
            MetadataStore(table, session_ttl_s=3) as holder_store,
            MetadataStore(table, session_ttl_s=3) as waiter_store,
        ):
            holder = CoordinationService(holder_store).lock("/locks/x")
            held = await holder.acquire(timeout=60)
            # A waiter whose own session expires gives up at once with SessionExpiredError.
            waiter = asyncio.create_task(CoordinationService(waiter_store).acquire_lock("/locks/x"))
            async with asyncio.timeout(30):
                while len(await holder_store.get_children("/locks/x")) < 2:
                    await asyncio.sleep(0.02)
            await expire(client, await waiter_store.session_for("/locks/x"))
            with pytest.raises(SessionExpiredError):
                await asyncio.wait_for(waiter, 60)

            # The holder's session expires while it holds the lock: the lock says so.
            assert held.session is not None
            held.ensure_held()
            await expire(client, held.session)
            assert held.expired and not holder.locked
            with pytest.raises(SessionExpiredError):
                held.ensure_held()
            with pytest.raises(SessionExpiredError):
                await holder.release()
            # An ephemeral put with a session known to be gone.
            with pytest.raises(SessionExpiredError):
                await table.put("/locks/x", "late", "v", session=held.session)
            # The store makes a new session: the lock can be taken again.
            again = await CoordinationService(holder_store).acquire_lock("/locks/x", timeout_s=60)
            assert again.fencing_token > held.fencing_token and not again.expired


def test_sync_recipes(server: ServerProcess, namespace: str) -> None:
    with Client(server.service) as client:
        table = client.table(namespace, "meta")
        with sync.MetadataStore(table) as store, sync.MetadataStore(table) as other:
            coordination = sync.CoordinationService(store)
            rival = sync.CoordinationService(other).lock("/locks/s")
            with coordination.lock("/locks/s", "me") as held:
                assert held.fencing_token > 0
                assert store.get_children("/locks/s") == [held.node.rsplit("/", 1)[1]]
                with pytest.raises(TimeoutError):
                    rival.acquire(timeout=0.3)
            assert rival.acquire(timeout=60).fencing_token > held.fencing_token
            rival.release()
            assert coordination.next_counter_value("/counters/c") == 1
            assert coordination.next_counter_value("/counters/c") == 2

            created = store.create("/conf/a", "1")
            assert store.get("/conf/a") is not None and store.exists("/conf/a")
            notes = store.notifications("/conf/a", start_revision=created.mod_revision + 1)
            store.put("/conf/a", "2")
            assert next(notes).type == "modified"
            notes.close()

            election = sync.LeaderElection(store, "/elections/e")
            assert election.leader() is None
            election.campaign("me", timeout_s=60)
            leader = election.leader()
            assert leader is not None and leader[1] == b"me"
            election.resign()
            assert election.leader() is None

            group = sync.GroupMembership(store, "/groups/g")
            group.join("m1")
            sync.GroupMembership(other, "/groups/g").join("m2")
            assert group.members() == ["m1", "m2"]
            group.leave("m1")
            assert group.members() == ["m2"]

            shared = sync.SharedMap(table, "map")
            assert shared.put_if_absent("k", "v") is None
            assert shared.put_if_absent("k", "w") == b"v"
            assert shared.replace("k", "v", "w")
            assert shared.update("k", lambda old: (old or b"") + b"!") == b"w!"
            assert [kv.value for kv in shared.scan()] == [b"w!"]

            counter = sync.DistributedCounter(table, "counters", "n", batch_size=3)
            for _ in range(5):
                counter.add()
            counter.close()
            assert counter.value() == 5
