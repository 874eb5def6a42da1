"""Server primitives of issue 7 through the SDK against a real server: CAS delete, per-key TTL,
sequential keys (unique from 8 concurrent client processes)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tablekeeper import BadVersionError, Client, KeyNotFoundError, Table
from tests.support.server import REPO, ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("primitives") / "data").start()
    yield server
    server.stop()


@pytest.fixture()
def table(server: ServerProcess) -> Iterator[Table]:
    with Client(server.service) as client:
        ns = "ns" + uuid.uuid4().hex[:8]
        client.create_namespace(ns)
        client.create_table(ns, "t", ranges=2)
        yield client.table(ns, "t")


def test_cas_delete(table: Table) -> None:
    table.put("p", "k", "v")
    table.put("p", "k", "v2")
    with pytest.raises(BadVersionError):
        table.delete("p", "k", expected_version=0)
    with pytest.raises(KeyNotFoundError):
        table.delete("p", "missing", expected_version=0)
    assert table.delete("p", "k", expected_version=1) == 1
    assert table.get("p", "k") is None


def test_per_key_ttl(table: Table) -> None:
    table.put("p", "short", "v", ttl_s=0.5)
    table.put("p", "long", "v", ttl_s=3600)  # a key with a TTL reads like any other until then
    table.put("p", "forever", "v")
    deadline = time.monotonic() + 60  # a hang guard: how soon is not this test's business
    while table.get("p", "short") is not None:
        assert time.monotonic() < deadline, "the key never expired"
        time.sleep(0.1)
    assert table.get("p", "long") is not None
    assert table.get("p", "forever") is not None


_WORKER = """
import sys
from tablekeeper import Client
service, ns, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Client(service) as client:
    table = client.table(ns, "t")
    for _ in range(n):
        print(table.put_sequential("queue", "item-", "x").decode(), flush=True)
"""


def test_sequential_keys_unique_from_8_processes(server: ServerProcess, table: Table) -> None:
    per_process = 25
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, server.service, table.info.namespace, str(per_process)],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        for _ in range(8)
    ]
    keys: list[str] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        keys += out.decode().split()
    assert len(keys) == 8 * per_process
    assert len(set(keys)) == len(keys)
    assert sorted(keys) == [f"item-{i:020d}" for i in range(len(keys))]
    assert [kv.lkey.decode() for kv in table.scan("queue")] == sorted(keys)
