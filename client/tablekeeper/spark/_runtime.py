"""An `AsyncClient` on a private event-loop thread, for synchronous code in Spark tasks.

A task's thread pulls rows from Spark and builds requests while the loop thread keeps several
RPCs in flight (`submit` returns a `concurrent.futures.Future`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from tablekeeper.bulk import TableLayout, table_layout
from tablekeeper.client import AsyncClient
from tablekeeper.errors import NamespaceNotFoundError, TableNotFoundError

T = TypeVar("T")


class Connection:
    """One `AsyncClient` (its own channel) and the loop thread it runs on."""

    def __init__(self, service: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tablekeeper-spark", daemon=True
        )
        self._thread.start()
        # coalesce=False: this code already sends its ops in batches of its own.
        self.client = AsyncClient(service, coalesce=False)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result()

    def iterate(self, source: AsyncIterator[T]) -> Iterator[T]:
        """Iterate an async iterator from this thread, fetching the next item while the caller
        works on the current one."""
        iterator = source.__aiter__()

        async def next_item() -> tuple[bool, T | None]:
            try:
                return True, await iterator.__anext__()
            except StopAsyncIteration:
                return False, None

        pending = self.submit(next_item())
        while True:
            more, item = pending.result()
            if not more:
                return
            pending = self.submit(next_item())
            yield item  # type: ignore[misc]

    def close(self) -> None:
        try:
            self.run(self.client.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            self.loop.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def resolve_table(service: str, namespace: str, name: str) -> TableLayout:
    """The table's layout, or a clear error naming the table and the service."""
    with Connection(service) as connection:
        try:
            return connection.run(table_layout(connection.client, namespace, name))
        except (TableNotFoundError, NamespaceNotFoundError) as exc:
            raise ValueError(
                f"TableKeeper table '{namespace}/{name}' does not exist at {service} ({exc})"
            ) from exc
