"""The history a workload writes: one JSON object per line, one line per operation.

Every workload (the SDK's here, etcd's in etcdload/, Oxia's in oxia/) writes the same record;
`checker/history.go` reads it and says what each field means. Times are CLOCK_MONOTONIC in
nanoseconds, the one clock all the workload processes of this machine share.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any


def now_ns() -> int:
    """CLOCK_MONOTONIC in nanoseconds (Go's and Java's workloads read the same clock)."""
    return time.monotonic_ns()


class HistoryWriter:
    """Appends records to a history file. Not thread-safe: one asyncio loop writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.count = 0

    def add(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.count += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every record of a history file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
