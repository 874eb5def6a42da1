"""Who leads a shard in cluster mode, and the write stream's watch that ends it once this server
no longer does (the client then opens its next stream to the new leader)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.oxia.errors import OxiaError
from tablekeeper_server.oxia.leaders import ShardLeaders
from tablekeeper_server.oxia.namespaces import Namespaces, Shard
from tablekeeper_server.oxia.servicer import OxiaServicer
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.rpc.frontends import FrontEndPeers

SHARD = Shard(shard_id=7 << 32, stream_id=7, range_id=0, container_id=3, ttl_seconds=0,
              hash_min=0, hash_max=2**32 - 1)  # fmt: skip


class FakeNamespaces:
    async def shard(self, shard_id: int) -> Shard:
        if shard_id != SHARD.shard_id:
            raise OxiaError.shard_not_found(shard_id)
        return SHARD


def _peers(owners: dict[int, str]) -> FrontEndPeers:
    return FrontEndPeers("oxia", "me:1", owners.get, lambda _: None, lambda: [])


def _servicer(leaders: ShardLeaders) -> OxiaServicer:
    namespaces = cast(Namespaces, cast(Any, FakeNamespaces()))
    return OxiaServicer(namespaces, leaders, Limits(key_bytes_max=1024), SystemClock())


def test_a_server_leads_its_own_and_unowned_containers() -> None:
    owners = {1: "me:1", 2: "other:1"}
    leaders = ShardLeaders("127.0.0.1:6648", _peers(owners))
    assert leaders.clustered
    assert leaders.leads(1) and not leaders.leads(2)
    assert leaders.leads(3)  # no owner right now (a failover): nobody else leads it either
    standalone = ShardLeaders("127.0.0.1:6648")
    assert not standalone.clustered and standalone.leads(2)


async def test_the_watch_ends_when_the_container_moves_away() -> None:
    owners = {3: "me:1"}
    leaders = ShardLeaders("127.0.0.1:6648", _peers(owners))
    watch = asyncio.ensure_future(_servicer(leaders)._until_not_leader(SHARD.shard_id))
    # Assignment changes that keep the container here do not end it.
    for _ in range(3):
        await asyncio.sleep(0)
        leaders.assignment_changed()
    await asyncio.sleep(0)
    assert not watch.done()
    owners[3] = "other:1"
    leaders.assignment_changed()
    await asyncio.wait_for(watch, timeout=10)


async def test_the_watch_of_an_unknown_shard_never_ends() -> None:
    leaders = ShardLeaders("127.0.0.1:6648", _peers({}))
    watch = asyncio.ensure_future(_servicer(leaders)._until_not_leader(12345))
    leaders.assignment_changed()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not watch.done()
    watch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watch
