"""`--log-format`: JSON lines carry the worker index; text lines keep the `[worker N]` prefix."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from tablekeeper_server.logging_setup import JsonFormatter, configure_logging

pytestmark = pytest.mark.unit


def _record(message: str = "hello %s", *args: object) -> logging.LogRecord:
    return logging.LogRecord(
        "tablekeeper_server.main", logging.WARNING, __file__, 1, message, args, None
    )


def test_json_has_time_level_logger_message_and_worker() -> None:
    entry = json.loads(JsonFormatter(worker=2).format(_record("hello %s", "there")))
    assert entry["level"] == "WARNING" and entry["logger"] == "tablekeeper_server.main"
    assert entry["message"] == "hello there" and entry["worker"] == 2
    assert entry["time"].endswith("+00:00")
    assert "worker" not in json.loads(JsonFormatter().format(_record()))


def test_json_carries_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exception"]


def test_text_keeps_the_worker_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        configure_logging("INFO", "text", worker=1)
        logging.getLogger("tablekeeper_server.main").info("up")
    finally:
        root.handlers[:] = saved
    assert "INFO [worker 1] tablekeeper_server.main: up" in capsys.readouterr().err
    with pytest.raises(ValueError):
        configure_logging("INFO", "xml")
