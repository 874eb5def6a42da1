"""Resource exhaustion against real server processes: a full disk (a small tmpfs under the data
directory) answers a retryable status, not UNEXPECTED, and the range serves again by itself
once space is freed, with every acknowledged write, without a restart."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablekeeper import Client, RetryPolicy, TableKeeperError, UnavailableError
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

NS = "res"
TABLE = "t"
NO_RETRY = RetryPolicy(deadline_s=0.0, call_timeout_s=10.0)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs mounted as the data directory (the server's own log stays outside)."""
    path = tmp_path / "data"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """Write a ballast file until the filesystem is full; return it."""
    ballast = directory / "ballast"
    with open(ballast, "wb", buffering=0) as file:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    file.write(block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return ballast


def _unusable_stores(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("db/*/*.unusable-*"))


def test_disk_full_is_retryable_and_the_range_recovers_once_space_is_freed(
    small_disk: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(
        small_disk, extra_args=["--containers", "2", "--checkpoint-interval", "0"]
    )
    server_factory.append(server)
    server.start(timeout_s=90)
    assert server.process is not None
    pid = server.process.pid
    acked: dict[str, bytes] = {}
    with Client(server.service) as client:
        client.create_namespace(NS)
        client.create_table(NS, TABLE, ranges=2)
        table = client.table(NS, TABLE)
        for i in range(50):
            table.put(b"p", f"before-{i:03d}", b"v%d" % i)
            acked[f"before-{i:03d}"] = b"v%d" % i

    ballast = _fill(small_disk)
    refused: TableKeeperError | None = None
    with Client(server.service, retry=NO_RETRY) as client:
        table = client.table(NS, TABLE)
        # The segment's last page may still take a few records; the next page cannot come.
        for i in range(100_000):
            key, value = f"full-{i:06d}", b"x" * 200
            try:
                table.put(b"p", key, value)
            except TableKeeperError as exc:
                refused = exc
                refused_key = key
                break
            acked[key] = value
        assert refused is not None, "the disk never filled up"
        assert isinstance(refused, UnavailableError) and refused.retryable, repr(refused)
        assert refused.code != 600, repr(refused)
        assert "No space left on device" in str(refused), refused

        # Still full: the range tries to reopen on each request and says why, retryably; its
        # store is not set aside (it is not damaged) and nothing is restored.
        for _ in range(2):
            with pytest.raises(UnavailableError, match="No space left on device"):
                table.get(b"p", "before-000")
        assert _unusable_stores(small_disk) == []

    ballast.unlink()
    with Client(server.service) as client:  # retries NOT_FOUND: the range reopens by itself
        table = client.table(NS, TABLE)
        table.put(b"p", "after", b"ok")
        acked["after"] = b"ok"
        missing = []
        for key, value in acked.items():
            kv = table.get(b"p", key)
            if kv is None or kv.value != value:
                missing.append(key)
        assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:10]}"
        assert table.get(b"p", refused_key) is None  # refused, and cut back out of the log
    assert server.process.poll() is None and server.process.pid == pid  # never restarted
    assert _unusable_stores(small_disk) == []
    assert "Traceback" not in server.log_tail(400), server.log_tail(400)
