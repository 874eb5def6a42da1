"""The server's log output: `--log-format text` (one readable line per record) or `json` (one
JSON object per line, for log shippers), on stderr.

A JSON line has `time` (ISO 8601, UTC, milliseconds), `level`, `logger`, `message`, `worker`
(the worker index, in `--workers` mode only) and `exception` (the formatted traceback, when the
record has one). Text lines are `time LEVEL [worker N] logger: message`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._worker is not None:
            entry["worker"] = self._worker
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str = "text", worker: int | None = None) -> None:
    """Send the root logger's records at `level` and above to stderr in `log_format`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS} (got {log_format!r})")
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(worker))
    else:
        prefix = f"[worker {worker}] " if worker is not None else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
        )
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler])


__all__ = ["LOG_FORMATS", "JsonFormatter", "LogFormat", "configure_logging"]
