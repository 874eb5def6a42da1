"""The registry of a server's open streams, one for every front-end: etcd's Watch and
LeaseKeepAlive, Oxia's GetNotifications and GetSequenceUpdates, BookKeeper's Watch and
WatchMany. Such streams never end on their own, so a graceful shutdown must end them before it
waits for in-flight calls: each front-end's `stop` calls `close(front_end)`, which refuses new
streams of that front-end and calls every open one's `close` callback (the stream then ends
in its protocol's way: etcd's "server stopped", an UNAVAILABLE to resume elsewhere, ...).
The count of open streams by front-end and method is a gauge (`tablekeeper_open_streams`).

Everything runs on the server's event loop; `counts` may be read from the metrics thread.

The streams share this registry but no base class: what they have in common, a watcher of a
range's hub read until it fails, is `range.watch` already; the rest is each protocol's own
(etcd multiplexes watches on one stream with progress ticks and catches a slow watcher up from
the history, BookKeeper's `WatchMany` batches encoded updates of many watchers through one pump,
Oxia's feed is one watcher per shard whose batches are revisions).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from tablekeeper_server.errors import UnavailableError

Closer = Callable[[], None]


class StreamsClosedError(UnavailableError):
    """A stream was opened on a front-end whose streams are closed (the server is stopping)."""


class OpenStreams:
    """The open streams of every front-end of one server."""

    def __init__(self) -> None:
        self._closers: dict[str, dict[object, Closer]] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._closed: set[str] = set()

    def closed(self, front_end: str) -> bool:
        """Whether `front_end`'s streams were closed (it refuses new ones)."""
        return front_end in self._closed

    def opened(self, front_end: str, method: str, close: Closer) -> Registration:
        """A context manager registering one stream of `front_end` (its gRPC `method`) while its
        block runs. `close()` is called once if the front-end's streams are closed meanwhile; it
        must make the stream end soon, without waiting. Entering raises `StreamsClosedError` once
        they are closed (a front-end with an answer of its own checks `closed` first)."""
        return Registration(self, front_end, method, close)

    def close(self, front_end: str) -> None:
        """Refuse new streams of `front_end` and end every open one (graceful shutdown); once."""
        if front_end in self._closed:
            return
        self._closed.add(front_end)
        for close in list(self._closers.get(front_end, {}).values()):
            close()

    def count(self, front_end: str | None = None) -> int:
        """Open streams of `front_end` (of every front-end if None)."""
        return sum(n for (end, _), n in self.counts().items() if front_end in (None, end))

    def counts(self) -> dict[tuple[str, str], int]:
        """Open streams by (front-end, method), those with none left out."""
        return {key: n for key, n in dict(self._counts).items() if n}

    def _add(self, registration: Registration) -> None:
        if registration.front_end in self._closed:
            raise StreamsClosedError("server shutting down")
        self._closers.setdefault(registration.front_end, {})[registration] = registration.close
        key = (registration.front_end, registration.method)
        self._counts[key] = self._counts.get(key, 0) + 1

    def _remove(self, registration: Registration) -> None:
        if self._closers.get(registration.front_end, {}).pop(registration, None) is not None:
            self._counts[registration.front_end, registration.method] -= 1


class Registration:
    """One open stream while its `with` block runs. A class, not a generator-based context
    manager: streaming handlers are async generators, and when the loop finalizes abandoned
    ones it may close them in any order."""

    def __init__(self, streams: OpenStreams, front_end: str, method: str, close: Closer) -> None:
        self.streams = streams
        self.front_end = front_end
        self.method = method
        self.close = close

    def __enter__(self) -> None:
        self.streams._add(self)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.streams._remove(self)
