"""`RangeCheckpointer` over a real RocksDB store, a directory checkpoint store and a local log.

Commands go through the log and the state machine as in a serving range, so the store records
the applied log position that checkpoints read back and restores resume from.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.checkpoint.manifest import FileEntry, Manifest, object_name
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.core.failpoints import FailpointError, Failpoints
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogWriter
from tablekeeper_server.log.local import LocalLogBackend
from tablekeeper_server.range import checkpoint as checkpoint_module
from tablekeeper_server.range.checkpoint import REVERIFY_S, RangeCheckpointer, sha256_of
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.rocksdb import RocksKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit
NAME = "00003-000000001024-000000001025"
SEGMENT_BYTES = 4096
GROUP = 32  # records per append; a segment rolls between appends
RANDOM = random.Random(1234)
VALUES = RANDOM.randbytes(1 << 20)


def value(i: int) -> bytes:
    offset = (i * 7919) % (len(VALUES) - 100)
    return VALUES[offset : offset + 100]


def put(i: int) -> wal_pb2.WalCommand:
    header = kv.RoutingHeader(r_key=b"p")
    return wal_pb2.WalCommand(put=kv.PutRequest(key=b"k%07d" % i, value=value(i), header=header))


class RecordingLog(LocalLogBackend):
    """The local log backend, remembering every truncation asked for."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, segment_bytes_max=SEGMENT_BYTES)
        self.truncations: list[int] = []
        self.recovery_starts: list[int] = []

    def truncate(self, log_name: str, before_sequence: int) -> None:
        self.truncations.append(before_sequence)
        super().truncate(log_name, before_sequence)

    def mark_recovery_start(self, log_name: str, from_sequence: int) -> None:
        self.recovery_starts.append(from_sequence)
        super().mark_recovery_start(log_name, from_sequence)


class Harness:
    """One range's pieces: log, store, state machine, checkpoint store and checkpointer."""

    def __init__(self, root: Path, *, keep: int = 2, failpoints: Failpoints | None = None) -> None:
        self.root = root
        self.clock = ManualClock()
        self.log = RecordingLog(root / "wal")
        self.writer: LogWriter = self.log.open_writer(NAME)
        self.store_path = root / "db" / "00003" / "1024-1025"
        self.store: RocksKvStore | None = RocksKvStore(self.store_path)
        self.sm = RangeStateMachine(self.store, APPLIERS)
        self.objects = DirectoryCheckpointStore(root / "checkpoints")
        self.checkpointer = self.new_checkpointer(keep=keep, failpoints=failpoints)
        self.written = 0

    def new_checkpointer(
        self, *, keep: int = 2, failpoints: Failpoints | None = None
    ) -> RangeCheckpointer:
        return RangeCheckpointer(
            NAME,
            self.store_path,
            RocksKvStore,
            self.objects,
            self.log,
            self.clock,
            keep=keep,
            failpoints=failpoints or Failpoints(),
        )

    async def write(self, count: int, *, first: int | None = None) -> None:
        """Put `count` keys (new ones, or overwrite from `first`) through the log."""
        start = self.written if first is None else first
        commands = [put(i) for i in range(start, start + count)]
        for lo in range(0, len(commands), GROUP):
            group = commands[lo : lo + GROUP]
            last = await self.writer.append([c.SerializeToString() for c in group])
            first_sequence = last - len(group) + 1
            self.sm.apply_batch([(first_sequence + j, c) for j, c in enumerate(group)])
        if first is None:
            self.written += count

    def checkpoint(self) -> Manifest:
        self.clock.advance(1)
        assert self.store is not None
        return self.checkpointer.checkpoint(self.store)

    def manifests(self) -> list[str]:
        """Manifest object names, oldest first."""
        return self.objects.list(f"{NAME}/manifests")

    def load(self, name: str) -> Manifest:
        return Manifest.decode(self.objects.get_bytes(name), name)

    def object_path(self, sha256: str) -> Path:
        return self.objects.root / object_name(NAME, sha256)

    def stored_objects(self) -> set[str]:
        return {Path(n).name for n in self.objects.list(f"{NAME}/objects")}

    def close_store(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def lose_local_store(self) -> None:
        self.close_store()
        shutil.rmtree(self.store_path)

    def open_restored(self) -> RangeStateMachine:
        self.store = RocksKvStore(self.store_path)
        return RangeStateMachine(self.store, APPLIERS)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close_store()


def read(sm: RangeStateMachine, i: int) -> bytes | None:
    request = kv.RangeRequest(key=b"k%07d" % i, header=kv.RoutingHeader(r_key=b"p"))
    response = sm.read(request, 0)
    return bytes(response.kvs[0].value) if response.kvs else None


def newest_only_sst(h: Harness, older: Manifest, newest: Manifest) -> FileEntry:
    shared = {f.sha256 for f in older.files}
    fresh = [f for f in newest.files if f.name.endswith(".sst") and f.sha256 not in shared]
    assert fresh
    return fresh[0]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- create


async def test_checkpoint_records_the_applied_position_and_every_file(harness: Harness) -> None:
    await harness.write(2000)
    manifest = harness.checkpoint()
    assert manifest.applied_sequence == harness.sm.applied_sequence == 2000
    assert harness.manifests() == [manifest.object_name]
    assert harness.load(manifest.object_name) == manifest
    names = {f.name for f in manifest.files}
    assert "CURRENT" in names and any(n.startswith("MANIFEST-") for n in names)
    assert any(n.endswith(".sst") for n in names)
    for entry in manifest.files:
        assert sha256_of(harness.object_path(entry.sha256)) == entry.sha256
        assert harness.object_path(entry.sha256).stat().st_size == entry.size
    stats = harness.checkpointer.stats
    assert stats.count == 1 and stats.applied_sequence == 2000
    assert stats.files_uploaded + stats.files_reused == len(manifest.files)
    assert stats.bytes_uploaded == sum(
        harness.object_path(sha).stat().st_size for sha in harness.stored_objects()
    )
    # No scratch directory is left next to the store.
    assert [p.name for p in harness.store_path.parent.iterdir()] == [harness.store_path.name]


async def test_second_checkpoint_uploads_only_new_files_and_rehashes_no_old_sst(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.write(5000)
    first = harness.checkpoint()
    first_bytes = harness.checkpointer.stats.bytes_uploaded
    first_ssts = {f.name for f in first.files if f.name.endswith(".sst")}
    assert first_ssts

    hashed: list[str] = []
    real_sha256_of = checkpoint_module.sha256_of

    def counting_sha256_of(path: Path) -> str:
        hashed.append(path.name)
        return real_sha256_of(path)

    monkeypatch.setattr(checkpoint_module, "sha256_of", counting_sha256_of)
    await harness.write(20)
    second = harness.checkpoint()
    stats = harness.checkpointer.stats

    assert second.applied_sequence == 5020
    assert stats.files_uploaded <= 4, second.files  # the new SST, MANIFEST, OPTIONS, ...
    assert stats.files_reused >= len(first_ssts)
    assert stats.bytes_uploaded < first_bytes / 10, (stats.bytes_uploaded, first_bytes)
    assert not first_ssts & set(hashed), f"old SSTs were read again: {hashed}"
    by_name = {f.name: f.sha256 for f in second.files}
    for entry in first.files:
        if entry.name in first_ssts:
            assert by_name[entry.name] == entry.sha256  # the same object, reused


@pytest.mark.parametrize("keep", [1, 2, 3])
async def test_gc_keeps_k_manifests_and_deletes_unreferenced_objects(
    tmp_path: Path, keep: int
) -> None:
    h = Harness(tmp_path, keep=keep)
    try:
        made: list[Manifest] = []
        for round_ in range(5):
            await h.write(1500)
            await h.write(300, first=round_ * 100)  # overwrites: compactions drop SSTs
            if round_ == 2:  # an object no manifest references (a crashed upload)
                h.objects.put_bytes(object_name(NAME, "0" * 64), b"orphan")
            made.append(h.checkpoint())
            kept = made[-keep:]
            assert h.manifests() == [m.object_name for m in kept]
            assert h.stored_objects() == {f.sha256 for m in kept for f in m.files}
    finally:
        h.close_store()


async def test_truncation_is_before_the_oldest_kept_checkpoint(harness: Harness) -> None:
    positions = []
    for _ in range(4):
        await harness.write(400)
        positions.append(harness.checkpoint().applied_sequence)
        oldest_kept = positions[-2:][0]
        assert harness.log.truncations[-1] == oldest_kept + 1
        first = next(iter(harness.log.read(NAME, 1))).sequence
        # Nothing a kept checkpoint needs was deleted; the whole segments before it were (a
        # segment holds at most about two appends' worth of these records).
        assert first <= oldest_kept + 1
        assert oldest_kept + 1 - first < 2 * GROUP + 40, (first, oldest_kept)
    assert harness.log.truncations == [positions[0] + 1] + [p + 1 for p in positions[:-1]]
    # A recovering writer may begin after the NEWEST checkpoint.
    assert harness.log.recovery_starts == [p + 1 for p in positions]


async def test_a_failed_checkpoint_publishes_nothing_and_the_next_one_works(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, failpoints=Failpoints({"checkpoint.before_manifest": "error"}))
    try:
        await h.write(1000)
        with pytest.raises(FailpointError):
            h.checkpoint()
        assert h.manifests() == []
        assert h.log.truncations == []
        assert [p.name for p in h.store_path.parent.iterdir()] == [h.store_path.name]
        h.checkpointer = h.new_checkpointer()
        manifest = h.checkpoint()
        assert h.manifests() == [manifest.object_name]
        # The objects the failed attempt uploaded were reused, not uploaded again.
        assert h.checkpointer.stats.files_uploaded == 0
    finally:
        h.close_store()


async def test_stale_scratch_directories_of_this_range_are_removed(harness: Harness) -> None:
    """A crash between creating a scratch directory and removing it (kill -9 mid checkpoint
    or restore) must not pin disk space forever: the next checkpoint / restore removes it."""
    parent = harness.store_path.parent
    uuid_hex = "0123456789abcdef0123456789abcdef"
    stale_checkpoint = parent / f".checkpoint-{harness.store_path.name}-{uuid_hex}"
    stale_restore = parent / f".restore-{harness.store_path.name}-{uuid_hex}"
    other_range = parent / f".checkpoint-1024-1026-{uuid_hex}"
    not_scratch = parent / f".checkpoint-{harness.store_path.name}-keep-me"
    for path in (stale_checkpoint, stale_restore, other_range, not_scratch):
        path.mkdir()
        (path / "000001.sst").write_bytes(b"x" * 100)
    await harness.write(100)
    harness.checkpoint()
    assert not stale_checkpoint.exists()
    assert stale_restore.exists() and other_range.exists() and not_scratch.exists()
    harness.lose_local_store()
    harness.checkpointer.restore()
    assert not stale_restore.exists()
    assert other_range.exists() and not_scratch.exists()


# --------------------------------------------------------------------------- restore


async def test_restore_rebuilds_the_store_at_the_checkpoint_position(harness: Harness) -> None:
    await harness.write(3000)
    manifest = harness.checkpoint()
    await harness.write(10)  # only in the log
    harness.lose_local_store()
    assert harness.checkpointer.needs_restore()

    assert harness.checkpointer.restore() == manifest.applied_sequence
    assert not harness.checkpointer.needs_restore()
    assert harness.checkpointer.stats.restored_from == manifest.object_name
    sm = harness.open_restored()
    assert sm.applied_sequence == 3000
    assert read(sm, 0) == value(0) and read(sm, 2999) == value(2999)
    assert read(sm, 3000) is None  # written after the checkpoint: the log replays it
    assert [r.sequence for r in harness.log.read(NAME, 3001)] == list(range(3001, 3011))


async def test_restore_without_any_checkpoint_returns_none(harness: Harness) -> None:
    harness.lose_local_store()
    assert not harness.checkpointer.has_checkpoints()
    assert harness.checkpointer.restore() is None
    assert not harness.store_path.exists()


@pytest.mark.parametrize("damage", ["flip-sst-byte", "delete-sst", "truncate-manifest"])
async def test_restore_verifies_sha256_and_falls_back_to_the_older_checkpoint(
    harness: Harness, damage: str
) -> None:
    await harness.write(2000)
    older = harness.checkpoint()
    await harness.write(500)
    newest = harness.checkpoint()
    sst = newest_only_sst(harness, older, newest)
    if damage == "flip-sst-byte":
        flip_byte(harness.object_path(sst.sha256))
    elif damage == "delete-sst":
        harness.object_path(sst.sha256).unlink()
    else:
        path = harness.objects.root / newest.object_name
        path.write_bytes(path.read_bytes()[:100])
    harness.lose_local_store()

    assert harness.checkpointer.restore() == older.applied_sequence == 2000
    assert harness.checkpointer.stats.restored_from == older.object_name
    sm = harness.open_restored()
    assert sm.applied_sequence == 2000
    assert read(sm, 1999) == value(1999) and read(sm, 2000) is None
    # The log still holds everything after the older checkpoint.
    assert next(iter(harness.log.read(NAME, 2001))).sequence == 2001
    assert [p.name for p in harness.store_path.parent.iterdir()] == [harness.store_path.name]


class OverlapStore(DirectoryCheckpointStore):
    """The first object fetch waits until a second one has started (at most `wait_s`): a
    restore that fetched its files one at a time would leave it waiting alone."""

    def __init__(self, root: Path, wait_s: float) -> None:
        super().__init__(root)
        self.wait_s = wait_s
        self.changed = threading.Condition()
        self.started = 0
        self.active = 0
        self.most_active = 0

    def get_file(self, name: str, dest: Path) -> None:
        with self.changed:
            self.started += 1
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.started >= 2, timeout=self.wait_s)
        try:
            super().get_file(name, dest)
        finally:
            with self.changed:
                self.active -= 1


async def test_restore_fetches_the_files_of_a_checkpoint_concurrently(harness: Harness) -> None:
    await harness.write(3000)
    manifest = harness.checkpoint()
    assert len(manifest.files) >= 2
    store = OverlapStore(
        harness.objects.root, wait_s=60.0
    )  # a bound; a second fetch starts at once
    harness.objects = store
    harness.checkpointer = harness.new_checkpointer()
    harness.lose_local_store()

    assert harness.checkpointer.restore() == manifest.applied_sequence
    assert store.started == len(manifest.files)
    assert store.most_active >= 2
    sm = harness.open_restored()
    assert read(sm, 0) == value(0) and read(sm, 2999) == value(2999)


class PhantomListingStore(DirectoryCheckpointStore):
    """Lists one more manifest than it holds: what the Pulsar store shows after a crash between
    creating a manifest's topic and publishing into it."""

    def __init__(self, root: Path, phantom: str) -> None:
        super().__init__(root)
        self.phantom = phantom

    def list(self, prefix: str) -> list[str]:
        names = super().list(prefix)
        return sorted([*names, self.phantom]) if self.phantom.startswith(prefix) else names


async def test_a_listed_but_never_published_manifest_is_no_checkpoint(harness: Harness) -> None:
    phantom = f"{NAME}/manifests/99999999999999999999-000000000000001.json"
    harness.objects = PhantomListingStore(harness.objects.root, phantom)
    harness.checkpointer = harness.new_checkpointer()
    harness.lose_local_store()
    # Only the phantom: the range starts empty (and replays its untruncated log).
    assert harness.checkpointer.restore() is None
    harness.sm = harness.open_restored()
    await harness.write(300)
    first = harness.checkpoint()  # GC deletes the phantom name (a no-op here) and keeps `first`
    harness.lose_local_store()
    # A real checkpoint beside the phantom: restored from, the phantom skipped as absent.
    assert harness.checkpointer.restore() == first.applied_sequence == 300


async def test_restore_refuses_when_no_checkpoint_is_valid(harness: Harness) -> None:
    await harness.write(2000)
    older = harness.checkpoint()
    await harness.write(500)
    newest = harness.checkpoint()
    flip_byte(harness.object_path(newest_only_sst(harness, older, newest).sha256))
    older_path = harness.objects.root / older.object_name
    older_path.write_bytes(older_path.read_bytes()[:-10])
    harness.lose_local_store()

    with pytest.raises(CorruptionError) as caught:
        harness.checkpointer.restore()
    message = caught.value.message
    assert f"range {NAME}: no valid checkpoint in directory" in message
    assert "fails its SHA-256 check" in message and "damaged" in message
    assert message.endswith("refusing to start it with incomplete data")
    assert not harness.store_path.exists()  # nothing partial is left to be opened
    assert [p.name for p in harness.store_path.parent.iterdir()] == []


async def test_an_unusable_local_store_is_set_aside_not_deleted(harness: Harness) -> None:
    await harness.write(100)
    harness.checkpoint()
    harness.close_store()
    (harness.store_path / "CURRENT").unlink()
    assert harness.checkpointer.needs_restore()
    harness.checkpointer.restore()
    aside = [p for p in harness.store_path.parent.iterdir() if ".unusable-" in p.name]
    assert len(aside) == 1 and any(aside[0].glob("*.sst")), aside
    assert harness.open_restored().applied_sequence == 100


async def test_a_damaged_object_is_not_reused_by_the_next_checkpoint(harness: Harness) -> None:
    await harness.write(2000)
    first = harness.checkpoint()
    sst = next(f for f in first.files if f.name.endswith(".sst"))
    flip_byte(harness.object_path(sst.sha256))  # bit rot in the checkpoint store
    await harness.write(100)
    harness.clock.advance(REVERIFY_S)  # the next checkpoint reads back what it reuses
    harness.checkpoint()
    await harness.write(100)
    newest = harness.checkpoint()  # the first checkpoint is garbage-collected now
    for entry in newest.files:
        assert sha256_of(harness.object_path(entry.sha256)) == entry.sha256, entry.name


def record_calls(monkeypatch: pytest.MonkeyPatch, store: object, method: str) -> list[str]:
    """Let `store.method(name)` run as it does, noting each name it is called with."""
    calls: list[str] = []
    real = getattr(store, method)

    def recording(name: str) -> object:
        calls.append(name)
        return real(name)

    monkeypatch.setattr(store, method, recording)
    return calls


async def test_a_reused_object_is_read_back_once_per_reverify_period(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range checkpointed every few seconds does not download its whole store each time: an
    object this checkpointer uploaded or checked less than REVERIFY_S ago is trusted."""
    reads = record_calls(monkeypatch, harness.objects, "sha256")
    await harness.write(2000)
    first = harness.checkpoint()
    ssts = {f.sha256 for f in first.files if f.name.endswith(".sst")}
    assert ssts
    await harness.write(100)
    second = harness.checkpoint()  # 1 s later: reuses the SSTs it uploaded, reads none back
    assert ssts <= {f.sha256 for f in second.files}
    assert reads == []

    harness.clock.advance(REVERIFY_S)
    await harness.write(100)
    harness.checkpoint()
    checked = {Path(name).name for name in reads}
    assert ssts <= checked, (ssts, reads)
    reads.clear()
    await harness.write(100)
    harness.checkpoint()  # checked a second ago: trusted again
    assert reads == []


async def test_manifests_this_checkpointer_wrote_are_not_read_back_but_a_restore_reads_them(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = record_calls(monkeypatch, harness.objects, "get_bytes")
    await harness.write(500)
    harness.checkpoint()
    await harness.write(100)
    harness.checkpoint()
    await harness.write(100)
    third = harness.checkpoint()  # reads neither the newest nor the kept manifests back
    assert reads == []

    harness.clock.advance(REVERIFY_S)
    await harness.write(100)
    harness.checkpoint()  # the newest was cached too long ago: read again, once
    assert reads == [third.object_name], reads

    reads.clear()
    harness.lose_local_store()
    harness.checkpointer.restore()
    assert reads and reads[0] == harness.manifests()[-1], reads


async def test_a_checkpoint_lists_the_store_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Pulsar a listing is a namespace-wide admin call: the previous manifest is this
    checkpointer's own, and garbage collection lists the range once."""
    listings = record_calls(monkeypatch, harness.objects, "list")
    await harness.write(500)
    harness.checkpoint()
    for _ in range(3):
        listings.clear()
        await harness.write(100)
        harness.checkpoint()
        assert listings == [NAME], listings
    assert len(harness.manifests()) == 2  # garbage collection still works from that listing


# --------------------------------------------------------------------------- manifests


def sample_manifest() -> Manifest:
    return Manifest(
        NAME,
        4242,
        1_700_000_000_000,
        (FileEntry("000008.sst", "a" * 64, 1234), FileEntry("CURRENT", "b" * 64, 16)),
    )


def test_manifest_round_trips_and_ignores_formatting() -> None:
    manifest = sample_manifest()
    assert Manifest.decode(manifest.encode(), "m") == manifest
    reformatted = json.dumps(json.loads(manifest.encode()), indent=7).encode()
    assert Manifest.decode(reformatted, "m") == manifest


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["body"].update(applied_sequence=4243), "checksum mismatch"),
        (lambda d: d["body"]["files"][0].update(size=1235), "checksum mismatch"),
        (lambda d: d["body"]["files"].pop(), "checksum mismatch"),
        (lambda d: d.update(sha256="0" * 64), "checksum mismatch"),
        (lambda d: d.pop("sha256"), "damaged"),
    ],
)
def test_manifest_checksum_catches_edits(
    edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    doc = json.loads(sample_manifest().encode())
    edit(doc)
    with pytest.raises(CorruptionError, match=message):
        Manifest.decode(json.dumps(doc).encode(), "m")


@pytest.mark.parametrize("cut", [0, 1, 50, -2])
def test_a_torn_manifest_is_damaged_not_trusted(cut: int) -> None:
    raw = sample_manifest().encode()
    with pytest.raises(CorruptionError, match="damaged"):
        Manifest.decode(raw[:cut], "m")


def test_a_manifest_of_an_unknown_format_is_rejected() -> None:
    doc = json.loads(sample_manifest().encode())
    doc["body"]["format"] = 99
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
    doc["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    with pytest.raises(CorruptionError, match="unknown format 99"):
        Manifest.decode(json.dumps(doc).encode(), "m")


async def test_an_edited_manifest_in_the_store_is_skipped_on_restore(harness: Harness) -> None:
    await harness.write(1000)
    older = harness.checkpoint()
    await harness.write(200)
    newest = harness.checkpoint()
    path = harness.objects.root / newest.object_name
    doc = json.loads(path.read_bytes())
    doc["body"]["applied_sequence"] += 1  # claims more than its files hold
    path.write_text(json.dumps(doc))
    harness.lose_local_store()
    assert harness.checkpointer.restore() == older.applied_sequence


# --------------------------------------------------------------------------- directory store


def test_directory_store_objects_are_immutable_and_listed_without_temporaries(
    tmp_path: Path,
) -> None:
    store = DirectoryCheckpointStore(tmp_path / "cp")
    source = tmp_path / "f"
    source.write_bytes(b"x" * 5000)
    assert store.put_file("r/objects/abc", source) == 5000
    source.write_bytes(b"y" * 10)
    assert store.put_file("r/objects/abc", source) == 0  # exists: not rewritten
    assert store.get_bytes("r/objects/abc") == b"x" * 5000
    (tmp_path / "cp" / "r" / "objects" / ".tmp-abc-123").write_bytes(b"partial")
    store.put_bytes("r/manifests/1.json", b"{}")
    assert store.list("r") == ["r/manifests/1.json", "r/objects/abc"]
    assert store.list("r/manifests") == ["r/manifests/1.json"]
    assert store.list("missing") == []
    store.delete("r/objects/abc")
    store.delete("r/objects/abc")  # a no-op the second time
    assert not store.exists("r/objects/abc")
    for bad in ("", "../x", "r//x", "r/./x"):
        with pytest.raises(ValueError):
            store.put_bytes(bad, b"")
