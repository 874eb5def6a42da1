"""`tablekeeper admin backup` and `admin restore`, and etcd's Snapshot, against real servers.

One source server for the module (with an etcd port); each test backs up its own namespace (or
the etcd keyspace) and restores into fresh data directories of its own, started as servers and
read back key by key:
* a backup taken while writes go on holds, per range, exactly the writes up to its cut (the
  position the manifest records), and at least every write acknowledged before it started;
  the restored server serves those keys with the same values, versions and revisions and
  numbers its next writes on from the cut;
* a damaged, truncated or incomplete backup (directory or archive) is refused naming the file
  and what is wrong, and nothing is written to the target;
* a target that holds data is refused without --force, and replaced with it;
* `etcdctl snapshot save` (Debian's etcdctl) against the etcd port writes a file that
  `admin restore` restores: the same keys at the same revision.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tablekeeper import Client
from tablekeeper.bulk import scan_range, table_layout
from tests.support.cli import run_cli
from tests.support.cluster import TestCluster
from tests.support.server import ServerProcess, free_port

pytestmark = pytest.mark.integration

ETCDCTL = shutil.which("etcdctl")
TIMEOUT_S = 120.0
Row = tuple[bytes, int, int, int]
"""(value, version, create revision, mod revision)"""
Dump = dict[int, dict[tuple[bytes, bytes], Row]]
"""Range id -> (pkey, lkey) -> row."""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("backup-source") / "data",
        extra_args=["--etcd-port", str(free_port())],
    )
    server.start(TIMEOUT_S)
    try:
        yield server
    finally:
        server.stop()


def tk(*args: str) -> subprocess.CompletedProcess[str]:
    """`tablekeeper ARGS`, in this process (tests/support/cli.py)."""
    return run_cli(list(args))


def backup(server: ServerProcess, dest: Path, *scope: str) -> dict[str, Any]:
    done = tk("admin", "backup", str(dest), "--service", server.service, "-o", "json", *scope)
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def restore(backup_path: Path, data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return tk("admin", "restore", str(backup_path), "--data-dir", str(data_dir), *extra)


def dump(service: str, namespace: str, table: str) -> Dump:
    """Every key of the table, by range."""

    async def read(client: Any) -> Dump:
        layout = await table_layout(client, namespace, table)
        out: Dump = {}
        for info in layout.ranges:
            rows = out.setdefault(info.range_id, {})
            async for page in scan_range(client, layout.table_id, info.range_id):
                for kv in page:
                    rows[(kv.pkey, kv.lkey)] = (
                        kv.value,
                        kv.version,
                        kv.create_revision,
                        kv.mod_revision,
                    )
        return out

    with Client(service) as client:
        return client.run_async(read(client.async_client))


def cuts(backup_dir: Path) -> dict[int, int]:
    """Data range id -> the position the backup cut it at (from its manifest)."""
    body = json.loads((backup_dir / "backup.json").read_text())["body"]
    return {r["range_id"]: r["applied_sequence"] for r in body["ranges"] if r["kind"] == "data"}


def started(data_dir: Path, *extra: str) -> ServerProcess:
    return ServerProcess(data_dir, extra_args=list(extra)).start(TIMEOUT_S)


# ---------------------------------------------------------------------------------- tests


def test_backup_while_writing_restores_each_range_at_its_cut(
    source: ServerProcess, tmp_path: Path
) -> None:
    with Client(source.service) as client:
        client.create_namespace("live")
        client.create_table("live", "t", ranges=4)
        table = client.table("live", "t")
        preload = [(f"p{i % 23}", f"k{i}", f"v{i}") for i in range(400)]
        assert table.batch_put(preload) == [None] * len(preload)
        table.increment("counters", "n", 5)
        acked: list[tuple[float, str, str]] = []
        stop = threading.Event()

        def write() -> None:
            n = 0
            while not stop.is_set():
                pkey, lkey = f"p{n % 23}", f"w{n}"
                table.put(pkey, lkey, f"x{n}")
                acked.append((time.monotonic(), pkey, lkey))
                n += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:
            while len(acked) < 50:
                time.sleep(0.01)
            began = time.monotonic()
            dest = tmp_path / "backup"
            summary = backup(source, dest, "--namespace", "live")
            ended = time.monotonic()
            while not any(t > ended for t, _, _ in acked):  # writes went on after it
                time.sleep(0.01)
        finally:
            stop.set()
            writer.join(TIMEOUT_S)
    during = [a for a in acked if began < a[0] < ended]
    assert during, "no write was acknowledged while the backup ran"
    assert summary["tables"] == 1 and summary["scope"] == "live"

    live = dump(source.service, "live", "t")
    cut = cuts(dest)
    assert sorted(cut) == sorted(live)
    expected = {
        range_id: {key: row for key, row in rows.items() if row[3] <= cut[range_id]}
        for range_id, rows in live.items()
    }
    before = {(p.encode(), k.encode()) for t, p, k in acked if t < began}
    held = {key for rows in expected.values() for key in rows}
    assert before <= held, "a write acknowledged before the backup began is not in it"
    assert len(held) < sum(len(rows) for rows in live.values()), "nothing after the cut?"

    restored_dir = tmp_path / "restored"
    done = restore(dest, restored_dir)
    assert done.returncode == 0, done.stderr
    server = started(restored_dir)
    try:
        assert dump(server.service, "live", "t") == expected
        with Client(server.service) as client:
            assert [n.name for n in client.list_namespaces()] == ["live"]
            table = client.table("live", "t")
            assert table.get("counters", "n").number == 5  # type: ignore[union-attr]
            table.put("p1", "after", "restore")
            after = table.get("p1", "after")
            assert after is not None
            (range_id,) = [r for r, rows in live.items() if any(k[0] == b"p1" for k in rows)]
            assert after.mod_revision > cut[range_id]
    finally:
        server.stop()


@dataclass(frozen=True)
class SmallBackup:
    base: Path
    """`dir`: a directory backup of a small table; `archive.tar`: its archive twin."""
    table: Dump
    """The table as the source served it when the backups were taken."""


@pytest.fixture(scope="module")
def small_backup(source: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> SmallBackup:
    with Client(source.service) as client:
        client.create_namespace("small")
        client.create_table("small", "t", ranges=2)
        rows = [(f"p{i % 7}", f"k{i}", f"v{i}" * 20) for i in range(300)]
        assert client.table("small", "t").batch_put(rows) == [None] * len(rows)
    base = tmp_path_factory.mktemp("small-backup")
    backup(source, base / "dir", "--table", "small/t")
    backup(source, base / "archive.tar", "--table", "small/t", "--archive")
    return SmallBackup(base, dump(source.service, "small", "t"))  # nothing writes it after


def _copy(path: Path, dest: Path) -> Path:
    if path.is_dir():
        shutil.copytree(path, dest)
    else:
        shutil.copyfile(path, dest)
    return dest


def _largest_sst(backup_dir: Path) -> Path:
    return max(backup_dir.glob("ranges/*/*.sst"), key=lambda p: p.stat().st_size)


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _refused(backup_path: Path, target: Path, *expected: str) -> None:
    done = restore(backup_path, target)
    assert done.returncode == 3, (done.stdout, done.stderr)
    for text in expected:
        assert text in done.stderr, done.stderr
    written = [p for p in target.rglob("*") if p.is_file() and p.name != "LOCK"]
    assert written == [], f"a refused restore wrote {written}"


def test_damaged_or_truncated_backup_is_refused_naming_the_file(
    small_backup: SmallBackup, tmp_path: Path
) -> None:
    # A byte of an SST flipped: found by its SHA-256, the file named.
    damaged = _copy(small_backup.base / "dir", tmp_path / "damaged")
    sst = _largest_sst(damaged)
    _flip_byte(sst, sst.stat().st_size // 2)
    _refused(damaged, tmp_path / "t1", str(sst), "fails its SHA-256 check")

    # An SST cut short.
    truncated = _copy(small_backup.base / "dir", tmp_path / "truncated")
    sst = _largest_sst(truncated)
    size = sst.stat().st_size
    os.truncate(sst, size - 100)
    _refused(truncated, tmp_path / "t2", str(sst), f"{size - 100} bytes", "truncated")

    # A file missing, and a backup cut short before its manifest.
    missing = _copy(small_backup.base / "dir", tmp_path / "missing")
    sst = _largest_sst(missing)
    sst.unlink()
    _refused(missing, tmp_path / "t3", str(sst), "missing")
    unfinished = _copy(small_backup.base / "dir", tmp_path / "unfinished")
    (unfinished / "backup.json").unlink()
    _refused(unfinished, tmp_path / "t4", "backup.json", "cut short")

    # The manifest edited (a size changed without its checksum).
    edited = _copy(small_backup.base / "dir", tmp_path / "edited")
    manifest = json.loads((edited / "backup.json").read_text())
    manifest["body"]["ranges"][-1]["files"][0]["size"] += 1
    (edited / "backup.json").write_text(json.dumps(manifest))
    _refused(edited, tmp_path / "t5", "backup.json", "fails its SHA-256 check")

    # The archive: truncated, or a byte flipped inside.
    archive = small_backup.base / "archive.tar"
    cut = _copy(archive, tmp_path / "cut.tar")
    os.truncate(cut, cut.stat().st_size - 1024)
    _refused(cut, tmp_path / "t6", str(cut), "trailer does not match")
    flipped = _copy(archive, tmp_path / "flipped.tar")
    _flip_byte(flipped, flipped.stat().st_size // 2)
    _refused(flipped, tmp_path / "t7", str(flipped), "truncated or damaged")
    odd = _copy(archive, tmp_path / "odd.tar")
    os.truncate(odd, odd.stat().st_size - 7)
    _refused(odd, tmp_path / "t8", str(odd), "is not an archive's length")

    # The untouched ones pass the same checks (the refusals above were the damage).
    for name in ("dir", "archive.tar"):
        done = restore(small_backup.base / name, tmp_path / f"ok-{name}", "--check-only")
        assert done.returncode == 0, done.stderr
        assert "every SHA-256 matches" in done.stderr


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`: (size, modification time in ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_restore_refuses_a_target_with_data_unless_forced(
    small_backup: SmallBackup, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    done = restore(small_backup.base / "dir", target)
    assert done.returncode == 0, done.stderr
    server = started(target)
    try:
        with Client(server.service) as client:
            client.table("small", "t").put("p0", "written-after-restore", "x")
    finally:
        server.stop()

    files_before = _files(target)
    again = restore(small_backup.base / "dir", target)
    assert again.returncode == 3
    assert "already holds data" in again.stderr and "--force" in again.stderr, again.stderr
    assert _files(target) == files_before, "a refused restore changed the target"

    forced = restore(small_backup.base / "dir", target, "--force")
    assert forced.returncode == 0, forced.stderr
    server = started(target)
    try:
        with Client(server.service) as client:
            table = client.table("small", "t")
            assert table.get("p0", "written-after-restore") is None
            assert table.get("p3", "k3") is not None
    finally:
        server.stop()


@pytest.mark.pulsar
def test_a_standalone_backup_restores_into_a_cluster(
    small_backup: SmallBackup, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """The cluster path: restore into the stores the cluster's servers share (a Pulsar log and
    checkpoint store in a fresh Pulsar namespace), then start the cluster on them: each
    container's owner restores its ranges from the shared checkpoints."""
    cluster = make_cluster(containers=8)
    shared = cluster.pulsar.server_args(cluster.pulsar_namespace)
    done = restore(small_backup.base / "dir", tmp_path / "restore-scratch", *shared)
    assert done.returncode == 0, done.stderr
    cluster.start(2)
    with Client(cluster.service_all()) as client:
        assert [n.name for n in client.list_namespaces()] == ["small"]
    rows = dump(cluster.service_all(), "small", "t")
    assert sum(len(r) for r in rows.values()) == 300
    assert rows == small_backup.table


def test_restore_refuses_while_a_server_runs_on_the_target(
    small_backup: SmallBackup, tmp_path: Path
) -> None:
    server = started(tmp_path / "busy")
    try:
        done = restore(small_backup.base / "dir", tmp_path / "busy", "--force")
        assert done.returncode == 3
        assert "in use by a running TableKeeper server" in done.stderr, done.stderr
    finally:
        server.stop()


# ---------------------------------------------------------------------------------- etcd


def etcdctl(port: int, *args: str) -> str:
    assert ETCDCTL is not None
    done = subprocess.run(
        [ETCDCTL, f"--endpoints=127.0.0.1:{port}", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    assert done.returncode == 0, f"etcdctl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _etcd_port(server: ServerProcess) -> int:
    return int(server.extra_args[server.extra_args.index("--etcd-port") + 1])


@pytest.mark.skipif(ETCDCTL is None, reason="etcdctl missing: make etcd-client")
def test_etcdctl_snapshot_save_then_tablekeeper_restore(
    source: ServerProcess, tmp_path: Path
) -> None:
    port = _etcd_port(source)
    for i in range(40):
        etcdctl(port, "put", f"/snap/{i:02d}", f"value-{i}")
    etcdctl(port, "del", "/snap/07")
    lease = etcdctl(port, "lease", "grant", "600").split()[1]
    etcdctl(port, "put", "/snap/leased", "x", "--lease", lease)
    before = json.loads(etcdctl(port, "get", "--prefix", "/snap/", "-w", "json"))
    revision = before["header"]["revision"]
    hashed = json.loads(etcdctl(port, "endpoint", "hashkv", "-w", "json"))[0]["HashKV"]["hash"]

    snapshot = tmp_path / "snapshot.db"
    out = etcdctl(port, "snapshot", "save", str(snapshot))
    assert "Snapshot saved" in out
    size = snapshot.stat().st_size
    assert size % 512 == 32, "etcd's layout: data in 512-byte blocks, then a SHA-256"

    target = tmp_path / "restored"
    done = restore(snapshot, target)
    assert done.returncode == 0, done.stderr
    restored_port = free_port()
    server = started(target, "--etcd-port", str(restored_port))
    try:
        after = json.loads(etcdctl(restored_port, "get", "--prefix", "/snap/", "-w", "json"))
        assert after["kvs"] == before["kvs"]
        assert after["header"]["revision"] == revision
        rehashed = json.loads(etcdctl(restored_port, "endpoint", "hashkv", "-w", "json"))
        assert rehashed[0]["HashKV"]["hash"] == hashed
        assert lease in etcdctl(restored_port, "lease", "list")
        etcdctl(restored_port, "put", "/snap/next", "y")
        nxt = json.loads(etcdctl(restored_port, "get", "/snap/next", "-w", "json"))
        assert nxt["kvs"][0]["mod_revision"] == revision + 1
    finally:
        server.stop()
