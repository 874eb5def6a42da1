"""Follower reads in a cluster (real ZooKeeper, Pulsar and server processes): a server that does
not own a range answers `read_from="follower"` reads from its own follower of the range, under a
write load; the answers hold only written data, never go backwards for a client, respect their
staleness bound, and linearizable ones see every write acknowledged before them. When the owner
is killed (-9), the follower's server takes the range over from the follower's store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tablekeeper import AsyncClient, AsyncTable, Client
from tablekeeper._cli_context import EXIT_USAGE
from tablekeeper.types import RangeInfo, TableLayout
from tablekeeper_server.catalog.meta import CONTAINER_META_RANGE_ID, CONTAINER_META_STREAM_ID
from tablekeeper_server.core.routing import routing_hash
from tablekeeper_server.range.replica import RangeName
from tests.integration.test_cli import tk
from tests.integration.test_split_cluster import wait_for_line
from tests.support.cluster import TestCluster

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

WAIT_S = 90.0


def pkeys_on(ranges: list[RangeInfo], container: int, count: int) -> list[str]:
    """`count` pkeys whose range lives on `container`."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        pkey = f"p{i}"
        hash_ = routing_hash(pkey.encode())
        if any(r.start_hash <= hash_ < r.end_hash and r.container_id == container for r in ranges):
            found.append(pkey)
        i += 1
    return found


class Writers:
    """One writer per pkey putting "1", "2", ... in order: what was acknowledged and attempted."""

    def __init__(self, table: AsyncTable, pkeys: list[str]) -> None:
        self.table = table
        self.acked = dict.fromkeys(pkeys, 0)
        self.attempted = dict.fromkeys(pkeys, 0)
        self.stopping = False

    async def run(self, pkey: str) -> None:
        n = 0
        while not self.stopping:
            n += 1
            self.attempted[pkey] = n
            await self.table.put(pkey, "k", str(n))
            self.acked[pkey] = n


async def test_follower_reads_under_load(make_cluster: Callable[..., TestCluster]) -> None:
    cluster = make_cluster(containers=2).start(2)
    cluster.wait_ready(WAIT_S, balanced=True)
    async with AsyncClient(cluster.service_all()) as client:
        await client.create_namespace("ns")
        await client.create_table("ns", "t", ranges=2)
        layout = await client.layout("ns", "t")
        # Readers talk to server 1; the keys live on the container server 0 owns.
        owned_by_0 = next(c for c in (0, 1) if cluster.assigned_to(c) == cluster.endpoint(0))
        pkeys = pkeys_on(list(layout.ranges), owned_by_0, 4)
        writers = Writers(await client.table("ns", "t"), pkeys)
        tasks = [asyncio.create_task(writers.run(p)) for p in pkeys]
        async with (
            AsyncClient(cluster.service(1)) as follower_side,
            AsyncClient(cluster.service(0)) as owner_side,
        ):
            far = await follower_side.table("ns", "t")
            near = await owner_side.table("ns", "t")
            seen = dict.fromkeys(pkeys, 0)
            replicas: set[str] = set()
            deadline = time.monotonic() + 6.0  # reads for a while, whatever they find
            reads = linearizable = 0
            while time.monotonic() < deadline or reads < 200:
                for pkey in pkeys:
                    bound = 0.0 if reads % 3 == 0 else 2.0
                    acked_before = writers.acked[pkey]
                    began = time.monotonic()
                    kv, info = await far.get_with_info(pkey, "k", max_staleness_s=bound)
                    took = time.monotonic() - began
                    reads += 1
                    replicas.add(info.replica)
                    n = int(kv.value) if kv is not None else 0
                    # Only written data: nothing past what was attempted.
                    assert n <= writers.attempted[pkey]
                    # Never backwards for this client.
                    assert n >= seen[pkey], f"{pkey}: read {n} after {seen[pkey]}"
                    seen[pkey] = n
                    # Within its bound when the read began (reported in whole ms, rounded).
                    assert info.staleness_s <= bound + took + 0.001
                    if bound == 0.0:
                        linearizable += 1
                        assert n >= acked_before, f"{pkey}: {n} < acknowledged {acked_before}"
            assert replicas == {"follower"}, replicas
            assert linearizable > 50
            # The owner's server answers such reads itself, and says so.
            _, info = await near.get_with_info(pkeys[0], "k")
            assert info.replica == "leader" and info.staleness_s == 0
            # A client moving between servers still never goes backwards: it sends what it saw.
            kv, info = await near.get_with_info(pkeys[0], "k")
            assert kv is not None and int(kv.value) >= seen[pkeys[0]]
            # Bad input: a clear error, nothing sent.
            with pytest.raises(ValueError):
                await far.get(pkeys[0], "k", read_from="nearest")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await far.get(pkeys[0], "k", max_staleness_s=-1, read_from="follower")
        writers.stopping = True
        await asyncio.gather(*tasks)


def keys_on_server_0(cluster: TestCluster, count: int) -> tuple[TableLayout, int, list[str]]:
    """Table ns/t (2 ranges) with `count` keys (value: the pkey) on the container server 0
    owns: its layout, that container, the pkeys."""
    cluster.wait_ready(WAIT_S, balanced=True)
    with Client(cluster.service_all()) as client:
        client.create_namespace("ns")
        client.create_table("ns", "t", ranges=2)
        layout = client.layout("ns", "t")
        owned_by_0 = next(c for c in (0, 1) if cluster.assigned_to(c) == cluster.endpoint(0))
        pkeys = pkeys_on(list(layout.ranges), owned_by_0, count)
        table = client.table("ns", "t")
        for pkey in pkeys:
            table.put(pkey, "k", pkey)
    return layout, owned_by_0, pkeys


def test_a_follower_store_is_taken_over_when_the_owner_dies(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=2).start(2)
    _, _, pkeys = keys_on_server_0(cluster, 50)
    with Client(cluster.service(1)) as reader:
        far = reader.table("ns", "t")
        for pkey in pkeys:  # server 1 now follows the range(s) these keys live in
            kv, info = far.get_with_info(pkey, "k", max_staleness_s=0)
            assert info.replica == "follower" and kv is not None and kv.value == pkey.encode()
        # The CLI says who answered.
        far_service = cluster.service(1)
        cli = tk(
            "get", "ns/t", "k", "--pkey", pkeys[0], "--read-from", "follower", service=far_service
        )
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.strip() == pkeys[0]
        assert "read from the follower (range " in cli.stderr
        cli = tk(
            "get", "ns/t", "k", "--pkey", pkeys[0], "--max-staleness", "1", service=far_service
        )
        assert cli.returncode == EXIT_USAGE and "--read-from follower" in cli.stderr
        with Client(cluster.service_all()) as client:
            table = client.table("ns", "t")
            for pkey in pkeys:
                table.put(pkey, "k", pkey + "-2")  # acknowledged after the follower opened
        cluster.kill(0)
        cluster.wait_ready(WAIT_S)
        wait_for_line(cluster.servers[1], "taking over its follower's store")
        for pkey in pkeys:
            kv = far.get(pkey, "k")
            assert kv is not None and kv.value == (pkey + "-2").encode()
            _, info = far.get_with_info(pkey, "k", max_staleness_s=0)
            assert info.replica == "leader"  # server 1 owns the range now


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value} (unlabelled samples only)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def test_standby_servers_follow_every_range_and_take_over_from_them(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=2, extra_args=["--standby"]).start(2)
    layout, owned_by_0, pkeys = keys_on_server_0(cluster, 50)
    with Client(cluster.service_all()) as client:
        table = client.table("ns", "t")
        # Nobody reads through server 1: it follows server 0's ranges by itself.
        names = [
            RangeName(owned_by_0, layout.table_id, r.range_id).log_name
            for r in layout.ranges
            if r.container_id == owned_by_0
        ]
        meta = RangeName(owned_by_0, CONTAINER_META_STREAM_ID, CONTAINER_META_RANGE_ID).log_name
        for name in [meta, *names]:
            wait_for_line(cluster.servers[1], f"following range {name}")
        gauges = metric_values(cluster.servers[1].metrics())
        assert gauges["tablekeeper_followers"] >= 1 + len(names)
        assert gauges["tablekeeper_follower_staleness_seconds"] >= 0
        for pkey in pkeys:
            table.put(pkey, "k", pkey + "-2")
    cluster.kill(0)
    cluster.wait_ready(WAIT_S)
    for name in [meta, *names]:
        wait_for_line(cluster.servers[1], f"range {name}: taking over its follower's store")
    handed_over = metric_values(cluster.servers[1].metrics())[
        "tablekeeper_follower_handovers_total"
    ]
    assert handed_over >= 1 + len(names)
    with Client(cluster.service(1)) as client:
        table = client.table("ns", "t")
        for pkey in pkeys:
            kv = table.get(pkey, "k")
            assert kv is not None and kv.value == (pkey + "-2").encode()
