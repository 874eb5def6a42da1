"""What the watch tests share: a fresh table to watch, and taking events from a watch."""

from __future__ import annotations

import asyncio
import uuid

from tablekeeper import AsyncClient, AsyncTable, AsyncWatch, WatchEvent


async def fresh_table(client: AsyncClient, prefix: str = "w") -> AsyncTable:
    """A new table of two ranges in a new namespace (`prefix` + random)."""
    ns = prefix + uuid.uuid4().hex[:8]
    await client.create_namespace(ns)
    await client.create_table(ns, "t", ranges=2)
    return await client.table(ns, "t")


async def take(watch: AsyncWatch, n: int, timeout_s: float = 30.0) -> list[WatchEvent]:
    """The watch's next `n` events (fewer if it ends first); fails after `timeout_s`."""

    async def collect() -> list[WatchEvent]:
        out: list[WatchEvent] = []
        async for event in watch:
            out.append(event)
            if len(out) == n:
                break
        return out

    return await asyncio.wait_for(collect(), timeout_s)
