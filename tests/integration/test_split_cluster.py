"""Online range split in a cluster (real ZooKeeper, Pulsar and server processes): children placed
on other servers' containers, a split of a child whose range lives on another server than the
table's meta range (sealed and deleted over the Admin service), writers and the BookKeeper
protocol's range-naming clients going on through the switch, and the splitting server killed
(-9) between the split's steps, after which the container's next owner finishes the split."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tablekeeper import AsyncClient, Client
from tablekeeper.bulk import scan_range
from tablekeeper_server.core.failpoints import ENV_VAR
from tablekeeper_server.core.routing import routing_hash
from tests.integration.test_split import PARENT, Load
from tests.support.cluster import TestCluster
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

WAIT_S = 90.0


async def test_splits_under_load_place_children_on_other_servers(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=4).start(3)
    async with AsyncClient(cluster.service_all()) as client:
        await client.create_namespace("ns")
        await client.create_table("ns", "t", ranges=2)
        table = await client.table("ns", "t")
        load = Load(table)
        writers = await load.start(4)
        await load.until(200)
        first = await client.split_range("ns", "t", PARENT)
        await load.until(200)
        parent_container = first.children[0].storage_container_id
        moved = first.children[1]
        assert moved.storage_container_id != parent_container
        # Split the child on the other container: its owner seals and drops it on request.
        second = await client.split_range("ns", "t", moved.range_id)
        await load.until(200)
        load.stopping = True
        await asyncio.gather(*writers)

        layout = await client.layout("ns", "t")
        assert [r.range_id for r in layout.ranges] == [
            first.children[0].range_id,
            *[c.range_id for c in second.children],
            PARENT + 1,
        ]
        assert len({r.container_id for r in layout.ranges}) >= 3  # spread over containers
        await load.verify()
        # Whole-range scans, of every current range and of the retired one (from its
        # descendants, on whichever servers they are), see every key once.
        written = {p.encode() for p in [*load.acked_puts, *load.acked_incr, load.hot]}
        scanned = [
            kv.pkey
            for r in layout.ranges
            async for page in scan_range(client, layout.table_id, r.range_id)
            for kv in page
        ]
        assert sorted(scanned) == sorted(written)
        retired = [
            kv.pkey async for page in scan_range(client, layout.table_id, PARENT) for kv in page
        ]
        assert sorted(retired) == sorted(p for p in written if routing_hash(p) < 0)
        await load.verify_watch()  # across both splits


def wait_for_line(server: ServerProcess, line: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while line not in server.log_path.read_text(errors="replace"):
        assert server.running, f"server exited before {line!r}:\n{server.log_tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {line!r}"
        time.sleep(0.05)


@pytest.mark.parametrize("failpoint", ["split.after_seal", "split.before_switch"])
def test_a_splitting_server_killed_mid_split_is_finished_by_the_next_owner(
    make_cluster: Callable[..., TestCluster], tmp_path: Path, failpoint: str
) -> None:
    # Every server stops at the failpoint until the file exists: the splitting one is killed
    # (-9) there, and the one that takes its containers over must reach it too, by itself.
    release = tmp_path / "release"
    armed = {ENV_VAR: f"{failpoint}=wait:{release}"}
    cluster = make_cluster(containers=2, env=armed).start(2)
    with Client(cluster.service_all()) as client:
        client.create_namespace("ns")
        client.create_table("ns", "t", ranges=2)
        table = client.table("ns", "t")
        pkeys = [f"p{i}" for i in range(300)]
        for pkey in pkeys:
            table.put(pkey, "k", pkey)
        home = client.layout("ns", "t").container_id

    owner = cluster.index(cluster.assigned_to(home) or "")
    survivor = 1 - owner
    waiting = f"failpoint {failpoint}: waiting until {release} exists"
    split = subprocess.Popen(
        [
            str(SERVER_COMMAND),
            "--service",
            cluster.servers[owner].service,
            "table",
            "split",
            "ns/t",
            "--range",
            str(PARENT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_line(cluster.servers[owner], waiting)
        cluster.kill(owner)
        wait_for_line(cluster.servers[survivor], waiting)  # it resumed the split
        release.touch()
    finally:
        split.kill()
        split.wait()

    with Client(cluster.service(survivor)) as client:
        table = client.table("ns", "t")
        for pkey in pkeys:  # answered once the survivor finished the split
            got = table.get(pkey, "k")
            assert got is not None and got.value == pkey.encode()
        assert len(client.layout("ns", "t").ranges) == 3
        table.put(pkeys[0], "k", "after")
        assert table.get(pkeys[0], "k").value == b"after"  # type: ignore[union-attr]
