"""The Pulsar client of a backend: created on first use, shared by its threads, closed once."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pulsar

_log = logging.getLogger(__name__)


def new_client(service_url: str, timeout_s: float) -> pulsar.Client:
    """A Pulsar client that logs its warnings and errors to stderr itself.

    (Not through Python `logging`: the client's threads then call into Python, and a warning
    logged while the interpreter shuts down can abort the process.)"""
    return pulsar.Client(
        service_url,
        operation_timeout_seconds=max(1, round(timeout_s)),
        connection_timeout_ms=max(1000, round(timeout_s * 1000)),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )


class SharedClient:
    """One lazily created client for `service_url`; thread-safe. `close` closes it (and with it
    every producer and reader); a later `get` creates a new one."""

    def __init__(self, service_url: str, timeout_s: float) -> None:
        self.service_url = service_url
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._client: Any = None

    def get(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = new_client(self.service_url, self._timeout_s)
            return self._client

    def close(self) -> None:
        """Close the client if there is one; errors while closing are ignored."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - nothing to do about it
                _log.debug("closing the Pulsar client failed", exc_info=True)
