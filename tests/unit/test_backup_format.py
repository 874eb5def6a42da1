"""The backup format on its own: the manifest's checksum, directory and archive backups written
by their sinks and read back, and every kind of damage refused with the file named."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from tablekeeper_server.backup.format import (
    MANIFEST,
    TRAILER_BYTES,
    ArchiveSink,
    BackupError,
    BackupManifest,
    DirectorySink,
    FileEntry,
    RangeEntry,
    TableEntry,
    open_backup,
)
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.checkpoint.pinning import PinningCheckpointStore

pytestmark = pytest.mark.unit

FILES = {"000012.sst": os.urandom(5000), "CURRENT": b"MANIFEST-000005\n", "EMPTY": b""}


def _manifest() -> BackupManifest:
    files = tuple(
        FileEntry(name, hashlib.sha256(data).hexdigest(), len(data)) for name, data in FILES.items()
    )
    return BackupManifest(
        created_at_ms=1,
        num_containers=8,
        ranges=(RangeEntry("data", 2, 1024, 1025, 77, 5, files, table="app/t"),),
        tables=(TableEntry("app", "t", 1024, 2),),
        namespaces=("app",),
        scope="app",
    )


def _write(sink: DirectorySink | ArchiveSink, manifest: BackupManifest) -> None:
    entry = manifest.ranges[0]
    for file in entry.files:
        sink.begin_file(entry.path(file), file.size)
        data = FILES[file.name]
        sink.write(data[:100])
        sink.write(data[100:])
        sink.end_file()
    sink.finish(manifest)


def test_the_manifest_round_trips_and_refuses_an_edit() -> None:
    manifest = _manifest()
    assert BackupManifest.decode(manifest.encode(), "m") == manifest
    doc = json.loads(manifest.encode())
    doc["body"]["ranges"][0]["applied_sequence"] = 78
    with pytest.raises(BackupError, match="fails its SHA-256 check"):
        BackupManifest.decode(json.dumps(doc).encode(), "m")
    with pytest.raises(BackupError, match="damaged"):
        BackupManifest.decode(b"{not json", "m")


def test_a_file_name_that_leaves_its_directory_is_refused() -> None:
    doc = json.loads(_manifest().encode())
    doc["body"]["ranges"][0]["files"][0]["name"] = "../../etc/passwd"
    body = doc["body"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    doc["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    with pytest.raises(BackupError, match="bad file name"):
        BackupManifest.decode(json.dumps(doc).encode(), "m")


def test_a_directory_backup_reads_back_and_names_a_damaged_file(tmp_path: Path) -> None:
    manifest = _manifest()
    _write(DirectorySink(tmp_path / "b"), manifest)
    backup = open_backup(tmp_path / "b")
    backup.verify()
    entry = manifest.ranges[0]
    backup.copy_file(entry, entry.files[0], tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == FILES["000012.sst"]

    sst = tmp_path / "b" / entry.path(entry.files[0])
    data = bytearray(sst.read_bytes())
    data[10] ^= 1
    sst.write_bytes(bytes(data))
    with pytest.raises(BackupError, match="fails its SHA-256 check") as refused:
        open_backup(tmp_path / "b").verify()
    assert refused.value.path == str(sst)


def test_a_directory_sink_never_writes_into_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    with pytest.raises(BackupError, match="not an empty directory"):
        DirectorySink(tmp_path / "taken")


def test_an_archive_is_tar_blocks_plus_the_sha256_of_them(tmp_path: Path) -> None:
    manifest = _manifest()
    out = io.BytesIO()
    _write(ArchiveSink(out), manifest)
    raw = out.getvalue()
    assert len(raw) % 512 == TRAILER_BYTES  # etcd's snapshot layout
    assert hashlib.sha256(raw[:-TRAILER_BYTES]).digest() == raw[-TRAILER_BYTES:]
    path = tmp_path / "a.tar"
    path.write_bytes(raw)
    backup = open_backup(path)
    try:
        assert backup.manifest == manifest
        backup.verify()
    finally:
        backup.close()

    path.write_bytes(raw[:-512])
    with pytest.raises(BackupError, match="trailer does not match"):
        open_backup(path)
    path.write_bytes(raw[:-3])
    with pytest.raises(BackupError, match="not an archive's length"):
        open_backup(path)


def test_a_missing_manifest_is_an_unfinished_backup(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    with pytest.raises(BackupError, match="cut short") as refused:
        open_backup(tmp_path / "b")
    assert refused.value.path.endswith(MANIFEST)


def test_pinned_objects_outlive_deletes_until_unpinned(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_bytes(b"x")
    store = PinningCheckpointStore(DirectoryCheckpointStore(tmp_path / "store"))
    store.put_file("r/objects/a", source)
    store.put_file("r/objects/b", source)
    with store.pinned(["r/objects/a"]), store.pinned(["r/objects/a"]):
        store.delete("r/objects/a")
        store.delete("r/objects/b")
        assert store.exists("r/objects/a") and not store.exists("r/objects/b")
    assert store.deletes_held == 1
    assert not store.is_pinned("r/objects/a")
    store.delete("r/objects/a")  # the next garbage collection
    assert not store.exists("r/objects/a")
