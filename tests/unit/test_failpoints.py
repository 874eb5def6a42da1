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


def test_delay_parses_and_refuses_bad_values() -> None:
    Failpoints.from_env("wal.sync=delay:0.25,wal.append=delay:1:/tmp/x")
    for bad in ("delay:", "delay:x", "delay:-1", "delay:99999"):
        with pytest.raises(ValueError, match="bad delay"):
            Failpoints.from_env(f"p={bad}")


def test_delay_sleeps_only_while_its_file_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("tablekeeper_server.core.failpoints.time.sleep", slept.append)
    switch = tmp_path / "slow"
    points = Failpoints.from_env(f"always=delay:0.5,switched=delay:0.25:{switch}")
    points.hit("always")
    points.hit("switched")  # no file: no delay
    switch.touch()
    points.hit("switched")
    points.hit("unarmed")
    assert slept == [0.5, 0.25]


async def test_delay_async_suspends_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("tablekeeper_server.core.failpoints.asyncio.sleep", sleep)
    switch = tmp_path / "slow"
    points = Failpoints.from_env(f"p=delay:0.125:{switch}")
    await points.hit_async("p")
    switch.touch()
    await points.hit_async("p")
    assert slept == [0.125]


async def test_the_local_wal_hits_wal_sync_on_every_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tablekeeper_server.log.local import LocalLogBackend

    slept: list[float] = []
    monkeypatch.setattr("tablekeeper_server.core.failpoints.time.sleep", slept.append)
    backend = LocalLogBackend(tmp_path, failpoints=Failpoints.from_env("wal.sync=delay:0.5"))
    writer = backend.open_writer("r1")
    assert await writer.append([b"a", b"b"]) == 2
    assert await writer.append([b"c"]) == 3
    await writer.close()
    assert slept == [0.5, 0.5]  # one sync per group
