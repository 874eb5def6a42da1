"""Each shard's leader, as `GetShardAssignments` tells Oxia's clients: the Oxia address of the
server that serves the shard's range. Standalone that is this server for every shard; in cluster
mode it is the server the assignment gives the range's container (its address published in its
ZooKeeper membership, `rpc.frontends.FrontEndPeers`), and every change of the assignment wakes
the open assignment streams so they tell their clients the new leaders (after a failover, say).
"""

from __future__ import annotations

import asyncio

from tablekeeper_server.rpc.frontends import FrontEndPeers


class ShardLeaders:
    def __init__(self, own_address: str, peers: FrontEndPeers | None = None) -> None:
        """`own_address`: this server's Oxia host:port. `peers`: cluster mode."""
        self.own_address = own_address
        self._peers = peers
        self._changed = asyncio.Event()

    def assignment_changed(self) -> None:
        """The cluster's assignment changed (called on the event loop): wake the streams."""
        self._changed.set()
        self._changed = asyncio.Event()

    def next_change(self) -> asyncio.Event:
        """Set at the next change of the assignment (take it before reading the leaders, so a
        change in between is not missed)."""
        return self._changed

    def leads(self, container_id: int) -> bool:
        """Whether this server leads the container's shards: always standalone; in a cluster,
        unless the assignment gives the container to another server (while it has no owner, a
        failover in progress, nobody else leads it either)."""
        if self._peers is None:
            return True
        owner = self._peers.owner_of(container_id)
        return owner is None or owner == self._peers.self_endpoint

    @property
    def clustered(self) -> bool:
        return self._peers is not None

    async def leader(self, container_id: int) -> str:
        """The Oxia address of the server that owns the container; this server's own while the
        container has no owner, or its owner has no Oxia port (calls there are answered "not
        leader" or "unavailable", and the client hears the real leader at the next change)."""
        if self._peers is None:
            return self.own_address
        owner = self._peers.owner_of(container_id)
        if owner is None or owner == self._peers.self_endpoint:
            return self.own_address
        return await self._peers.address(owner) or self.own_address
