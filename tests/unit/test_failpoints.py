"""Failpoint actions: `error`, `wait:PATH` (sync and async); `crash` is covered by crash tests."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tablekeeper_server.core.failpoints import FailpointError, Failpoints


def test_parse_rejects_unknown_actions() -> None:
    with pytest.raises(ValueError, match="unknown action"):
        Failpoints.from_env("a=explode")
    with pytest.raises(ValueError, match="unknown action"):
        Failpoints.from_env("a=wait:")


def test_unarmed_and_error() -> None:
    points = Failpoints.from_env("a=error")
    points.hit("b")
    with pytest.raises(FailpointError):
        points.hit("a")


def test_wait_blocks_the_thread_until_the_file_exists(tmp_path: Path) -> None:
    release = tmp_path / "go"
    points = Failpoints.from_env(f"p=wait:{release}")
    passed = threading.Event()

    def held() -> None:
        points.hit("p")
        passed.set()

    thread = threading.Thread(target=held)
    thread.start()
    assert not passed.wait(0.1)  # still held: the file does not exist
    release.touch()
    assert passed.wait(30)
    thread.join()


async def test_wait_async_suspends_only_the_task(tmp_path: Path) -> None:
    release = tmp_path / "go"
    points = Failpoints.from_env(f"p=wait:{release}")
    held = asyncio.create_task(points.hit_async("p"))
    await asyncio.sleep(0.1)
    assert not held.done()  # the loop runs on while the task waits
    release.touch()
    await asyncio.wait_for(held, 30)
