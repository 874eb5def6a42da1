"""Sending: a group of messages acknowledged as a whole, and the errors a send reports."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pulsar

from tablekeeper_server.errors import UnavailableError

_log = logging.getLogger(__name__)


class PulsarSendError(Exception):
    """A message was not acknowledged; `result` is the `pulsar.Result` the client reported."""

    def __init__(self, result: Any) -> None:
        super().__init__(f"Pulsar send failed: {result}")
        self.result = result


def is_fenced(exc: BaseException) -> bool:
    """Whether `exc` says that a newer exclusive producer fenced ours."""
    if isinstance(exc, PulsarSendError):
        return bool(exc.result == pulsar.Result.ProducerFenced)
    return isinstance(exc, pulsar.ProducerFenced)


def send_and_wait(producer: Any, messages: Sequence[bytes], timeout_s: float) -> list[Any]:
    """Send `messages` asynchronously, flush, and block until all are acknowledged; return
    their message ids. Raises `PulsarSendError` for the first failure, `UnavailableError` if no
    answer comes within `timeout_s` (plus a margin: the client's own send timeout fires first).
    """
    if not messages:
        return []
    done = threading.Event()
    ids: list[Any] = [None] * len(messages)
    failures: list[PulsarSendError] = []
    remaining = [len(messages)]
    lock = threading.Lock()

    def callback(index: int, result: Any, message_id: Any) -> None:  # on a client thread
        with lock:
            if result == pulsar.Result.Ok:
                ids[index] = message_id
            else:
                failures.append(PulsarSendError(result))
            remaining[0] -= 1
            if remaining[0] == 0 or failures:
                done.set()

    for index, data in enumerate(messages):
        producer.send_async(data, functools.partial(callback, index))
    flush(producer)
    if not done.wait(timeout_s + 10):
        raise UnavailableError(f"no acknowledgement from Pulsar within {timeout_s + 10:.0f}s")
    if failures:
        raise failures[0]
    return ids


def flush(producer: Any) -> None:
    """Send the producer's open batch now rather than after the batching delay, and wait until
    everything sent is acknowledged or failed (failures are reported to the send callbacks).

    Blocking; it releases the GIL while it waits. (The client's `flush_async` does not, and
    deadlocks against a send callback waiting for the GIL on the client's I/O thread.)"""
    try:
        producer.flush()
    except Exception:  # noqa: BLE001 - the send callbacks report what failed
        _log.debug("flush failed", exc_info=True)
