"""The lock recipe when its caller is cancelled while the contender node is being made: the
server may have made the node (others see it) before the client has its name. The recipe must
wait for the answer and remove the node before the cancellation goes on (a node left behind
blocks every later contender until the session ends). A fake store holds the answer back, so
the cancellation lands exactly there."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tablekeeper.recipes.coordination import CoordinationService
from tablekeeper.recipes.metadata_store import MetadataStore, Stat

pytestmark = pytest.mark.unit


class SlowAnswerStore:
    """Makes a node at once, answers the put only when `answer` is set."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.made = asyncio.Event()
        self.answer = asyncio.Event()

    async def put(self, path: str, value: Any, **options: Any) -> Stat:
        node = f"{path}0000000007"
        self.nodes.add(node)  # made on the server: visible to everyone
        self.made.set()
        await self.answer.wait()  # the answer is on its way
        return Stat(node, 0, 7, 7)

    async def delete(self, path: str) -> None:
        self.nodes.remove(path)


async def test_a_caller_cancelled_while_its_node_is_made_leaves_no_node() -> None:
    store = SlowAnswerStore()
    service = CoordinationService(cast(MetadataStore, store))
    contender = asyncio.create_task(service.acquire_lock("/locks/l", "c"))
    await store.made.wait()
    assert store.nodes == {"/locks/l/lock-0000000007"}
    contender.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the recipe while the put is unanswered
    assert not contender.done() and store.nodes  # it waits for the answer ...
    store.answer.set()
    with pytest.raises(asyncio.CancelledError):
        await contender
    assert store.nodes == set()  # ... and then removes the node, before the caller hears
