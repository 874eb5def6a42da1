"""Replay is deterministic: with RocksDB deleted, a restart rebuilds exactly the same state
(every key, value, version and revision; namespaces and tables with their ids) from the WALs."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from tablekeeper import AsyncClient, Client, KeyValue, TableKeeperError
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

TABLES = {("app", "users"): 4, ("app", "counters"): 2, ("other", "t"): 2}
PKEYS = [f"u{i}" for i in range(10)] + ["burst", "txn", "c0", "c1", "c2"]

Row = tuple[bytes, bytes, int | None, int, int, int]
Snapshot = dict[tuple[str, str, str], list[Row]]


def _row(kv: KeyValue) -> Row:
    return (kv.lkey, kv.value, kv.number, kv.version, kv.create_revision, kv.mod_revision)


def _snapshot(client: Client) -> tuple[Snapshot, dict[str, object]]:
    data: Snapshot = {}
    catalog: dict[str, object] = {}
    for (namespace, name), _ in TABLES.items():
        catalog[f"ns:{namespace}"] = client.get_namespace(namespace)
        catalog[f"table:{namespace}/{name}"] = client.get_table(namespace, name)
        table = client.table(namespace, name)
        for pkey in PKEYS:
            data[(namespace, name, pkey)] = [_row(kv) for kv in table.scan(pkey)]
    return data, catalog


def _sync_workload(client: Client) -> None:
    users = client.table("app", "users")
    counters = client.table("app", "counters")
    other = client.table("other", "t")
    for i in range(200):
        users.put(f"u{i % 10}", f"k{i:03d}", f"v{i}" * (1 + i % 7))
    for i in range(0, 200, 4):  # overwrites: versions move on
        users.put(f"u{i % 10}", f"k{i:03d}", f"w{i}")
        users.put(f"u{i % 10}", f"k{i:03d}", f"x{i}", expected_version=1)
    with pytest.raises(TableKeeperError):  # logged and replayed as a no-op
        users.put("u0", "k000", "nope", expected_version=7)
    for i in range(1, 200, 9):
        users.delete(f"u{i % 10}", f"k{i:03d}")
    assert users.delete_range("u3", "k050", "k120") > 0
    for i in range(60):
        counters.increment(f"c{i % 3}", "hits", 1 + i % 5)
        counters.increment(f"c{i % 3}", "balance", -(i % 4))
    assert other.txn("txn").if_absent("a").then_put("a", "1").then_put("b", "2").commit().succeeded
    failing = other.txn("txn").if_version("a", "==", 5).then_put("a", "no").otherwise_put("c", "3")
    assert not failing.commit().succeeded
    scanning = other.txn("txn").if_exists("b").then_get("a", "z").then_delete("a", "b")
    assert scanning.then_put("d", "").commit().succeeded
    for i in range(30):
        other.put(f"u{i % 10}", f"o{i}", bytes(range(i % 256)) * 3)


async def _concurrent_workload(service: str) -> None:
    """Many commands in flight at once, so they share append groups and apply batches; range
    deletes and scanning txns in the same groups take the mid-batch commit path."""
    async with AsyncClient(service) as client:
        users = await client.table("app", "users")
        counters = await client.table("app", "counters")

        async def writer(n: int) -> None:
            for i in range(40):
                await users.put("burst", f"b{n:02d}-{i:03d}", f"{n}/{i}")
                await counters.increment("c0", f"n{n % 4}", i)
                if i % 10 == 9:
                    await users.delete_range("burst", f"b{n:02d}-{i - 5:03d}", f"b{n:02d}-{i:03d}")
                    await (
                        users.txn("burst")
                        .if_exists(f"b{n:02d}-000")
                        .then_get("b", "c")
                        .then_put(f"t{n:02d}-{i}", "x")
                        .commit()
                    )

        await asyncio.gather(*(writer(n) for n in range(24)))


def test_replay_from_the_wal_alone_rebuilds_identical_state(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    server.start(timeout_s=180)
    with Client(server.service) as client:
        for namespace in {ns for ns, _ in TABLES}:
            client.create_namespace(namespace)
        for (namespace, name), ranges in TABLES.items():
            client.create_table(namespace, name, ranges=ranges)
        _sync_workload(client)
        asyncio.run(_concurrent_workload(server.service))
        last = client.table("app", "users").put("u0", "last", "1", prev_kv=True)
        assert last is None
        last_revision = client.table("app", "users").get("u0", "last")
        assert last_revision is not None
        before, catalog_before = _snapshot(client)
    assert sum(len(rows) for rows in before.values()) > 500

    assert server.stop(timeout_s=60) == 0
    shutil.rmtree(server.data_dir / "db")
    offset = server.log_path.stat().st_size
    server.start(timeout_s=180)
    with Client(server.service) as client:
        after, catalog_after = _snapshot(client)
        assert catalog_after == catalog_before
        for key in before:
            assert after[key] == before[key], key
        # Numbering goes on where the log ended: the next command in that range takes the
        # next revision, and new namespaces / tables get fresh ids.
        users = client.table("app", "users")
        users.put("u0", "next", "1")
        next_kv = users.get("u0", "next")
        assert next_kv is not None
        assert next_kv.mod_revision == last_revision.mod_revision + 1
        namespace_ids = {v for k, v in catalog_before.items() if k.startswith("ns:")}
        assert client.create_namespace("fresh") not in namespace_ids
        table_ids = {getattr(v, "table_id", None) for v in catalog_before.values()}
        assert client.create_table("fresh", "t", ranges=2).table_id not in table_ids
    log = server.log_path.read_bytes()[offset:].decode(errors="replace")
    assert "replayed" in log and "Traceback" not in log, log
