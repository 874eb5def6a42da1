"""The SDK's direct routing against a real standalone server.

The client bootstraps through a TCP proxy in front of the server; the server advertises its own
address for every container. With direct routing the client resolves the routes once, then
sends every kind of table op to the owner's address: they all still work after the proxy is
gone. Without it, everything goes through the proxy. A wrong cached endpoint is forgotten and
found again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tablekeeper import AsyncClient, Client, UnavailableError
from tablekeeper.bulk import BatchSender, put_op, scan_range, table_layout
from tests.support.server import ServerProcess, free_port

pytestmark = pytest.mark.integration

PKEYS = [f"user-{i}" for i in range(16)]


class Proxy:
    """A TCP proxy on 127.0.0.1 that forwards to `port`, and can be shut (connections too)."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"bk://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def proxied_client(
    server: ServerProcess, *, direct_routing: bool, coalesce: bool = True
) -> AsyncIterator[tuple[AsyncClient, Proxy]]:
    """A client entering through a proxy, with the SDK's default retry policy (the set-up steps
    get all of it; a test gives a short `timeout=` to the one call it expects to fail)."""
    proxy = Proxy(server.port)
    async with AsyncClient(
        await proxy.start(), coalesce=coalesce, direct_routing=direct_routing
    ) as client:
        try:
            yield client, proxy
        finally:
            await proxy.stop()


@pytest.mark.parametrize("coalesce", [True, False])
async def test_every_op_goes_to_the_owner_it_resolved(
    server: ServerProcess, coalesce: bool
) -> None:
    async with proxied_client(server, direct_routing=True, coalesce=coalesce) as (client, proxy):
        await client.create_namespace("app")
        info = await client.create_table("app", "users", ranges=4)
        table = await client.table("app", "users")
        layout = await table_layout(client, "app", "users")
        assert await asyncio.gather(*(table.put(p, "name", p) for p in PKEYS))
        for pkey in PKEYS:  # the server's own address, not the proxy's
            assert await client._routes.endpoint_for(info.table_id, pkey.encode()) == server.target
        stats = client.route_stats()
        assert stats.range_fetches == 1 and stats.endpoint_fetches == 1
        assert stats.invalidations == 0

        await proxy.stop()  # from here on, only the owner's address works

        values = await asyncio.gather(*(table.get(p, "name") for p in PKEYS))
        assert [kv.value.decode() for kv in values if kv is not None] == PKEYS
        assert await table.increment(PKEYS[0], "n", 2, get_total=True) == 2
        assert await table.delete(PKEYS[1], "name") == 1
        result = await table.txn(PKEYS[2]).if_exists("name").then_put("x", "1").commit()
        assert result.succeeded
        assert [kv.lkey async for kv in table.scan(PKEYS[2])] == [b"name", b"x"]
        assert await table.batch_put([(p, "b", "v") for p in PKEYS]) == [None] * len(PKEYS)
        ops = [put_op(info.table_id, p.encode(), b"c", b"v") for p in PKEYS]
        assert len(await BatchSender(client, idempotent=True).send(ops)) == len(PKEYS)
        rows = [
            kv
            for r in layout.ranges
            async for page in scan_range(client, info.table_id, r.range_id)
            for kv in page
        ]
        assert len(rows) == 3 * len(PKEYS) - 1 + 2  # name, b, c per pkey; one deleted; n, x

        async with table.watch(PKEYS[3], "w") as watch:
            await table.put(PKEYS[3], "w", "1")
            event = await asyncio.wait_for(watch.__anext__(), 30)
            assert event.kv is not None and event.kv.value == b"1"
        async with table.session(PKEYS[4], ttl_s=2) as session:
            await table.put(PKEYS[4], "eph", "1", session=session)
            await asyncio.sleep(2.5)  # kept alive through the owner's address
            assert not session.expired.is_set()
            assert await table.get(PKEYS[4], "eph") is not None
        assert await table.get(PKEYS[4], "eph") is None

        assert client.route_stats() == stats  # nothing was looked up again
        assert proxy.connections == 1


async def test_without_direct_routing_everything_goes_through_the_service(
    server: ServerProcess,
) -> None:
    async with proxied_client(server, direct_routing=False) as (client, proxy):
        await client.create_namespace("app")
        info = await client.create_table("app", "users", ranges=4)
        table = await client.table("app", "users")
        await asyncio.gather(*(table.put(p, "name", p) for p in PKEYS))
        async with table.watch(PKEYS[0], "name") as watch, table.session(PKEYS[0], 2):
            assert watch.revision > 0
        assert await client._routes.endpoint_for(info.table_id, b"user-1") is None
        assert client.route_stats().range_fetches == 0

        await proxy.stop()
        with pytest.raises(UnavailableError):  # only this call gets a short bound
            await table.get(PKEYS[0], "name", timeout=1.0)

    with Client(server.service, direct_routing=False) as sync_client:
        assert not sync_client._async._routes.enabled
        assert sync_client.table("app", "users").get(PKEYS[0], "name") is not None


async def test_a_wrong_cached_endpoint_is_forgotten_and_found_again(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        await client.create_namespace("app")
        info = await client.create_table("app", "users", ranges=4)
        table = await client.table("app", "users")
        await table.put("p", "k", "v1")
        target = await client._routes.locate(info.table_id, b"p")
        # As if the container had lived on a server that is gone now.
        dead = f"127.0.0.1:{free_port()}"
        client._routes._endpoints[target.container_id] = (dead, float("inf"))
        assert await client._routes.endpoint_for(info.table_id, b"p") == dead

        await table.put("p", "k", "v2")  # a write: retried only because the connect failed
        kv = await table.get("p", "k")
        assert kv is not None and kv.value == b"v2" and kv.version == 1
        assert client.route_stats().invalidations == 1
        assert await client._routes.endpoint_for(info.table_id, b"p") == server.target


async def test_a_deleted_table_is_dropped_from_the_cache(server: ServerProcess) -> None:
    async with AsyncClient(server.service) as client:
        await client.create_namespace("app")
        info = await client.create_table("app", "t")
        await (await client.table("app", "t")).put("p", "k", "v")
        assert info.table_id in client._routes._tables
        await client.delete_table("app", "t")
        assert info.table_id not in client._routes._tables
