"""A private event loop on a daemon thread: what the synchronous API (`Client`, `Table`,
`Watch`, `Session`) runs its `AsyncClient` on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_WAKE_S = 0.25
"""How often a caller blocked in `run` wakes. A signal (Ctrl-C) may be delivered to any of the
process's threads — this loop's, gRPC's — and Python runs its handler only when the main
thread next runs bytecode: a wait without a timeout would sleep through it."""


class LoopThread:
    """An event loop running on its own daemon thread; `run` blocks until a coroutine is done."""

    def __init__(self, name: str = "tablekeeper-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            while not future.done():
                concurrent.futures.wait([future], timeout=_WAKE_S)
        except BaseException:  # KeyboardInterrupt: the coroutine stops too
            future.cancel()
            raise
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


__all__ = ["LoopThread"]
