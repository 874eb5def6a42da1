"""Checkpoints, WAL truncation and restore against real server processes (issue 3).

Every test runs a server over three separate directories (`--data-dir`, `--wal-dir`,
`--checkpoint-dir`) with small WAL segments, so checkpoints truncate real segment files.

The contract under test:
* a crash at any step of a checkpoint or of a restore (a named failpoint armed through
  `TABLEKEEPER_FAILPOINTS`, which makes the server exit 137 there) loses nothing: after a restart
  without the failpoint, and without manual repair, every acknowledged write is there, nothing
  is applied twice (counters and versions exact), and later checkpoints and restores work;
* a damaged newest checkpoint (corrupt SST object, truncated manifest) is skipped for the older
  one, and the log still holds what the older one needs; with no valid checkpoint, or with the
  checkpoints gone while the log was truncated, the range refuses to serve, with a clear
  message, instead of serving incomplete data;
* under a steady write load with periodic checkpoints the WAL directory stays bounded;
* an empty `--data-dir` with the same WAL and checkpoint directories rebuilds every range.

All writes of a test are acknowledged before the next crash or restart, so the expected state
is exact: a ledger of acknowledged puts, deletes and increments, checked key by key (value and
version) and counter by counter (total and version).
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tablekeeper import Client, RetryPolicy, TableKeeperError
from tablekeeper_server.checkpoint.manifest import Manifest
from tablekeeper_server.core.failpoints import CRASH_EXIT_CODE, ENV_VAR
from tablekeeper_server.core.routing import routing_hash, split_hash_space
from tests.support.cli import run_cli
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

NS = "ckpt"
TABLE = "t"
RANGES = 4
CONTAINERS = 8  # the server's default
MIN_DATA_RANGE_ID = 1024
SEGMENT_BYTES = 8192
PKEYS = [f"p{i:02d}" for i in range(32)]
COUNTERS = [f"c{i}" for i in range(8)]
COUNTER_LKEY = "n"
ROOT_LOG = "00000-000000000000-000000000000"
# The SDK retries a range that refuses to open (INTERNAL_SERVER_ERROR is retryable) until its
# deadline: keep that short where a test expects the refusal.
SHORT_RETRY = RetryPolicy(deadline_s=1.0, call_timeout_s=20.0)
START_TIMEOUT_S = 180.0

CHECKPOINT_FAILPOINTS = [
    "checkpoint.during_upload",
    "checkpoint.before_manifest",
    "checkpoint.before_truncate",
    "wal.truncate.after_segment_delete",
]
RESTORE_FAILPOINTS = ["restore.during_download", "restore.before_open"]


# --------------------------------------------------------------------------- servers


@dataclass
class Node:
    """A server and its three directories under `base`. The server log (next to the data
    directory) survives deleting the data directory."""

    base: Path
    server: ServerProcess

    @property
    def data(self) -> Path:
        return self.server.data_dir

    @property
    def wal(self) -> Path:
        return self.base / "wal"

    @property
    def checkpoints(self) -> Path:
        return self.base / "checkpoints"

    def start(self, failpoint: str | None = None) -> int:
        """Start (or restart) the server; return the offset in its log where this run begins."""
        offset = self.log_size()
        self.server.env = {ENV_VAR: f"{failpoint}=crash"} if failpoint else None
        self.server.start(timeout_s=START_TIMEOUT_S)
        return offset

    def start_expecting_crash(self, failpoint: str) -> int:
        """Start with `failpoint` armed where recovery at startup hits it: the process must die
        with the failpoint's exit code before it serves."""
        offset = self.log_size()
        self.server.env = {ENV_VAR: f"{failpoint}=crash"}
        with pytest.raises(RuntimeError, match=f"server exited with {CRASH_EXIT_CODE}"):
            self.server.start(timeout_s=START_TIMEOUT_S)
        return offset

    def wait_crashed(self, timeout_s: float = 60.0) -> None:
        process = self.server.process
        assert process is not None
        try:
            code = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.server.kill()
            raise AssertionError(f"server still running:\n{self.server.log_tail()}") from None
        assert code == CRASH_EXIT_CODE, f"exit {code}:\n{self.server.log_tail()}"

    def log_size(self) -> int:
        path = self.server.log_path
        return path.stat().st_size if path.exists() else 0

    def log_since(self, offset: int) -> str:
        with open(self.server.log_path, "rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`tablekeeper --service (this server) ARGS`, in this process (tests/support/cli.py)."""
        return run_cli(["--service", self.server.service, *args])

    def checkpoint(self, *, table_only: bool = False) -> str:
        """`tablekeeper admin checkpoint [--table NS/T]`, which must succeed."""
        args = ["admin", "checkpoint"] + (["--table", f"{NS}/{TABLE}"] if table_only else [])
        result = self.cli(*args)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        assert re.search(r"checkpointed \d+ ranges", result.stdout), result.stdout
        return result.stdout

    def wal_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.wal.glob("*/*.wal") if p.exists())

    def scratch_dirs(self) -> list[Path]:
        """Scratch directories of checkpoints and restores left in the data directory."""
        db = self.data / "db"
        return sorted([*db.glob("*/.checkpoint-*"), *db.glob("*/.restore-*")])


@pytest.fixture
def make_node(tmp_path: Path, server_factory: list[ServerProcess]) -> Iterator[_NodeFactory]:
    yield _NodeFactory(tmp_path, server_factory)


class _NodeFactory:
    def __init__(self, tmp_path: Path, servers: list[ServerProcess]) -> None:
        self._tmp = tmp_path
        self._servers = servers

    def __call__(
        self,
        name: str = "node",
        *,
        data_dir: str = "data",
        interval_s: float = 0,
        records: int = 0,
        kept: int = 2,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> Node:
        base = self._tmp / name
        server = ServerProcess(
            base / data_dir,
            extra_args=[
                "--wal-dir",
                str(base / "wal"),
                "--checkpoint-dir",
                str(base / "checkpoints"),
                "--wal-segment-bytes",
                str(segment_bytes),
                "--checkpoint-interval",
                str(interval_s),
                "--checkpoint-records",
                str(records),
                "--checkpoints-kept",
                str(kept),
            ],
        )
        self._servers.append(server)
        return Node(base, server)


# --------------------------------------------------------------------------- routing


def range_log_name(table_id: int, pkey: str, ranges: int = RANGES) -> str:
    """The log (and checkpoint) name of the range that holds `pkey`, as the server routes it."""
    split = split_hash_space(ranges)
    h = routing_hash(pkey.encode())
    index = max(i for i, r in enumerate(split) if r.start <= h)
    container = (table_id + index) % CONTAINERS
    return f"{container:05d}-{table_id:012d}-{MIN_DATA_RANGE_ID + index:012d}"


def table_log_names(table_id: int, ranges: int = RANGES) -> list[str]:
    return sorted(
        f"{(table_id + i) % CONTAINERS:05d}-{table_id:012d}-{MIN_DATA_RANGE_ID + i:012d}"
        for i in range(ranges)
    )


# --------------------------------------------------------------------------- the ledger


@dataclass
class Expected:
    value: bytes
    version: int


@dataclass
class Ledger:
    """What the server acknowledged: the exact state it must hold."""

    keys: dict[tuple[str, str], Expected] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    counter_ops: dict[str, int] = field(default_factory=dict)
    acked: int = 0

    def put(self, pkey: str, lkey: str, value: bytes) -> None:
        previous = self.keys.get((pkey, lkey))
        self.keys[(pkey, lkey)] = Expected(value, 0 if previous is None else previous.version + 1)
        self.acked += 1

    def delete(self, pkey: str, lkey: str) -> None:
        del self.keys[(pkey, lkey)]
        self.acked += 1

    def increment(self, counter: str, amount: int) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + amount
        self.counter_ops[counter] = self.counter_ops.get(counter, 0) + 1
        self.acked += 1


def value_of(phase: int, pkey: str, lkey: str) -> bytes:
    return f"{phase}:{pkey}:{lkey}:".encode().ljust(100, b"v")


def create_table(node: Node, name: str = TABLE, ranges: int = RANGES) -> int:
    with Client(node.server.service) as client:
        try:
            client.create_namespace(NS)
        except TableKeeperError:
            client.get_namespace(NS)  # exists already
        return client.create_table(NS, name, ranges=ranges).table_id


def load(node: Node, ledger: Ledger, phase: int, table: str = TABLE) -> None:
    """One phase of writes, all acknowledged: 640 puts (half of them overwrite the previous
    phase's keys), 8 deletes of existing keys, and 208 increments of the counters."""
    with Client(node.server.service) as client:
        t = client.table(NS, table)
        lkeys = [f"k{j:03d}" for j in range(10 * phase, 10 * phase + 20)]
        items = [(p, lkey, value_of(phase, p, lkey)) for p in PKEYS for lkey in lkeys]
        for start in range(0, len(items), 128):
            chunk = items[start : start + 128]
            results = t.batch_put([(p, k, v) for p, k, v in chunk])
            assert results == [None] * len(chunk), results
            for p, k, v in chunk:
                ledger.put(p, k, v)
        for p in PKEYS[::4]:
            lkey = f"k{10 * phase + 3:03d}"
            assert t.delete(p, lkey) == 1
            ledger.delete(p, lkey)
        increments = [(c, COUNTER_LKEY, 1 + (i % 3)) for i in range(25) for c in COUNTERS]
        results = t.batch_put(increments, mode="increment")
        assert results == [None] * len(increments), results
        for c, _, amount in increments:
            ledger.increment(c, amount)
        for c in COUNTERS:  # single ops too: they go through the SDK's coalescer
            t.increment(c, COUNTER_LKEY, 5)
            ledger.increment(c, 5)


def verify(node: Node, ledger: Ledger, table: str = TABLE) -> None:
    """The server's state equals the ledger exactly. Collects every difference."""
    problems: list[str] = []
    with Client(node.server.service) as client:
        t = client.table(NS, table)
        for p in PKEYS:
            got = {kv.lkey.decode(): kv for kv in t.scan(p)}
            want = {lkey: e for (pkey, lkey), e in ledger.keys.items() if pkey == p}
            for lkey in sorted(set(want) - set(got)):
                problems.append(f"acknowledged key {p}/{lkey} lost")
            for lkey in sorted(set(got) - set(want)):
                problems.append(f"key {p}/{lkey} present but deleted or never written")
            for lkey in sorted(set(want) & set(got)):
                kv, e = got[lkey], want[lkey]
                if kv.value != e.value:
                    problems.append(f"{p}/{lkey}: value {kv.value[:20]!r}, want {e.value[:20]!r}")
                if kv.version != e.version:
                    problems.append(f"{p}/{lkey}: version {kv.version}, want {e.version}")
        for c in COUNTERS:
            counter = t.get(c, COUNTER_LKEY)
            want_total = ledger.counters.get(c)
            if counter is None or want_total is None:
                if not (counter is None and want_total is None):
                    problems.append(f"counter {c}: {counter}, want {want_total}")
                continue
            if counter.number != want_total:
                problems.append(f"counter {c} = {counter.number}, want exactly {want_total}")
            if counter.version != ledger.counter_ops[c] - 1:
                problems.append(
                    f"counter {c} at version {counter.version}, want {ledger.counter_ops[c] - 1}"
                )
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# --------------------------------------------------------------------------- checkpoint files


def manifests_of(node: Node, log_name: str) -> list[Path]:
    """The range's manifest files, oldest first."""
    return sorted((node.checkpoints / log_name / "manifests").glob("*.json"))


def decode(path: Path) -> Manifest:
    return Manifest.decode(path.read_bytes(), str(path))


def object_path(node: Node, log_name: str, sha256: str) -> Path:
    return node.checkpoints / log_name / "objects" / sha256


def newest_only_sst(node: Node, log_name: str) -> Path:
    """An SST object the newest checkpoint of the range references and the older one does not."""
    older, newest = (decode(p) for p in manifests_of(node, log_name)[-2:])
    shared = {f.sha256 for f in older.files}
    fresh = [f for f in newest.files if f.name.endswith(".sst") and f.sha256 not in shared]
    assert fresh, f"{log_name}: the newest checkpoint has no SST of its own"
    return object_path(node, log_name, fresh[0].sha256)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def truncate_file(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size // 2)


def first_segment(node: Node, log_name: str) -> int:
    return min(int(p.stem) for p in (node.wal / log_name).glob("*.wal"))


def two_checkpoints(node: Node, ledger: Ledger) -> int:
    """Create the table; phase 0, checkpoint, phase 1, checkpoint, phase 2 (in the WAL only).
    Every table range then has two checkpoints and a truncated log. Returns the table id."""
    node.start()
    table_id = create_table(node)
    load(node, ledger, 0)
    node.checkpoint()
    load(node, ledger, 1)
    node.checkpoint()
    load(node, ledger, 2)
    for log_name in table_log_names(table_id):
        assert len(manifests_of(node, log_name)) == 2, log_name
        assert first_segment(node, log_name) > 1, f"{log_name}: log not truncated"
    return table_id


@dataclass(frozen=True)
class TwoCheckpoints:
    """The directories of a stopped node after `two_checkpoints`, made once per module (a dozen
    tests start from that state, and building it is most of what each would otherwise cost)."""

    base: Path
    ledger: Ledger
    table_id: int

    def copy_to(self, node: Node) -> tuple[Ledger, int]:
        """Give `node` (not started) copies of the directories; its ledger and table id."""
        for name in ("data", "wal", "checkpoints"):
            shutil.copytree(self.base / name, node.base / name)
        return copy.deepcopy(self.ledger), self.table_id


@pytest.fixture(scope="module")
def two_checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoCheckpoints]:
    servers: list[ServerProcess] = []
    node = _NodeFactory(tmp_path_factory.mktemp("two-checkpoints"), servers)()
    ledger = Ledger()
    try:
        table_id = two_checkpoints(node, ledger)
        node.server.stop()
    finally:
        if node.server.running:
            node.server.kill()
    yield TwoCheckpoints(node.base, ledger, table_id)


def from_two_checkpoints(node: Node, prepared: TwoCheckpoints) -> tuple[Ledger, int]:
    """`node` (not started) in the state `two_checkpoints` leaves, the server stopped: every
    table range with two checkpoints and a truncated log, the last phase in the log only."""
    ledger, table_id = prepared.copy_to(node)
    for log_name in table_log_names(table_id):
        assert len(manifests_of(node, log_name)) == 2, log_name
    return ledger, table_id


# --------------------------------------------------------------------------- crash points


@pytest.mark.parametrize("failpoint", CHECKPOINT_FAILPOINTS)
def test_crash_during_checkpoint_loses_nothing(
    make_node: _NodeFactory, two_checkpointed: TwoCheckpoints, failpoint: str
) -> None:
    node = make_node()
    ledger, table_id = from_two_checkpoints(node, two_checkpointed)

    # Restart with the failpoint armed, write more, and checkpoint: the server dies there.
    node.start(failpoint)
    load(node, ledger, 3)
    offset = node.log_size()
    result = node.cli("admin", "checkpoint", "--table", f"{NS}/{TABLE}")
    node.wait_crashed()
    assert result.returncode != 0, result.stdout
    assert f"failpoint {failpoint}: crashing the process" in node.log_since(offset)

    # Restart without it: no repair needed, the exact acknowledged state.
    offset = node.start()
    verify(node, ledger)
    assert "refusing" not in node.log_since(offset)

    # Checkpoints work again; leftovers of the crashed one are cleaned up; the log is truncated.
    load(node, ledger, 4)
    node.checkpoint()
    assert node.scratch_dirs() == []
    verify(node, ledger)
    for log_name in table_log_names(table_id):
        assert len(manifests_of(node, log_name)) == 2, log_name
        referenced = {f.sha256 for m in manifests_of(node, log_name) for f in decode(m).files}
        stored = {p.name for p in (node.checkpoints / log_name / "objects").iterdir()}
        assert stored == referenced, f"{log_name}: unreferenced objects were not collected"

    # And a restore from an empty data directory, with writes after the checkpoint to replay.
    load(node, ledger, 5)
    node.server.kill()
    shutil.rmtree(node.data)
    offset = node.start()
    verify(node, ledger)
    restored = node.log_since(offset)
    for log_name in table_log_names(table_id):
        assert re.search(rf"range {log_name}: restored checkpoint at \d+", restored), restored


@pytest.mark.parametrize("scope", ["startup", "lazy"])
@pytest.mark.parametrize("failpoint", RESTORE_FAILPOINTS)
def test_crash_during_restore_loses_nothing(
    make_node: _NodeFactory, two_checkpointed: TwoCheckpoints, failpoint: str, scope: str
) -> None:
    """`startup`: the whole data directory is gone, so the root and meta ranges restore while
    the server starts, and it dies there. `lazy`: only the table's stores are gone; the server
    starts, and dies restoring a table range on its first read."""
    node = make_node()
    ledger, table_id = from_two_checkpoints(node, two_checkpointed)
    if scope == "startup":
        shutil.rmtree(node.data)
        offset = node.start_expecting_crash(failpoint)
    else:
        for log_name in table_log_names(table_id):
            container, stream, range_id = (int(x) for x in log_name.split("-"))
            shutil.rmtree(node.data / "db" / f"{container:05d}" / f"{stream}-{range_id}")
        offset = node.start(failpoint)
        with (
            Client(node.server.service, retry=SHORT_RETRY) as client,
            pytest.raises(TableKeeperError),
        ):
            client.table(NS, TABLE).get(PKEYS[0], "k000")
        node.wait_crashed()
    assert f"failpoint {failpoint}: crashing the process" in node.log_since(offset)

    offset = node.start()
    verify(node, ledger)
    log = node.log_since(offset)
    assert "refusing" not in log
    assert re.search(r"restored checkpoint at \d+", log), log
    assert node.scratch_dirs() == [], "a crashed restore's scratch directory was left behind"

    load(node, ledger, 3)
    node.checkpoint()
    load(node, ledger, 4)
    node.server.kill()
    shutil.rmtree(node.data)
    node.start()
    verify(node, ledger)


# --------------------------------------------------------------------------- damaged checkpoints


def test_corrupt_sst_in_newest_checkpoint_falls_back_to_older(
    make_node: _NodeFactory, two_checkpointed: TwoCheckpoints
) -> None:
    node = make_node()
    ledger, table_id = from_two_checkpoints(node, two_checkpointed)
    older = {}
    for log_name in table_log_names(table_id):
        flip_byte(newest_only_sst(node, log_name))
        older[log_name] = decode(manifests_of(node, log_name)[0]).applied_sequence
    shutil.rmtree(node.data)

    offset = node.start()
    verify(node, ledger)
    log = node.log_since(offset)
    for log_name, position in older.items():
        assert re.search(rf"range {log_name}: checkpoint \S+ unusable: .*SHA-256", log), log
        assert f"range {log_name}: restored checkpoint at {position} " in log, log
    with Client(node.server.service) as client:
        status = {
            f"{r.container_id:05d}-{r.stream_id:012d}-{r.range_id:012d}": r
            for r in client.status().ranges
        }
    for log_name in older:
        assert (
            status[log_name].restored_from
            == manifests_of(node, log_name)[0].relative_to(node.checkpoints).as_posix()
        )


def test_truncated_newest_manifest_falls_back_to_older(
    make_node: _NodeFactory, two_checkpointed: TwoCheckpoints
) -> None:
    node = make_node()
    ledger, table_id = from_two_checkpoints(node, two_checkpointed)
    older = {}
    for log_name in table_log_names(table_id):
        older_manifest, newest_manifest = manifests_of(node, log_name)
        truncate_file(newest_manifest)
        older[log_name] = decode(older_manifest).applied_sequence
    shutil.rmtree(node.data)

    offset = node.start()
    verify(node, ledger)
    log = node.log_since(offset)
    for log_name, position in older.items():
        assert re.search(rf"range {log_name}: checkpoint \S+ unusable: manifest .*damaged", log)
        assert f"range {log_name}: restored checkpoint at {position} " in log, log

    # The damaged manifest does not block later checkpoints (it is garbage-collected).
    load(node, ledger, 3)
    node.checkpoint()
    for log_name in older:
        for path in manifests_of(node, log_name):
            decode(path)  # every manifest left is valid
    verify(node, ledger)


def test_no_valid_checkpoint_refuses_to_serve(
    make_node: _NodeFactory, two_checkpointed: TwoCheckpoints
) -> None:
    node = make_node()
    ledger, table_id = from_two_checkpoints(node, two_checkpointed)
    victim = range_log_name(table_id, PKEYS[0])
    older_manifest, _ = manifests_of(node, victim)
    flip_byte(newest_only_sst(node, victim))
    truncate_file(older_manifest)
    shutil.rmtree(node.data)

    offset = node.start()
    victim_pkeys = [p for p in PKEYS if range_log_name(table_id, p) == victim]
    other_pkeys = [p for p in PKEYS if p not in victim_pkeys]
    assert victim_pkeys and other_pkeys
    with Client(node.server.service) as client:  # the SDK's patient policy for what must work
        t = client.table(NS, TABLE)
        for p in other_pkeys:  # the other ranges serve everything
            got = {kv.lkey.decode(): kv.value for kv in t.scan(p)}
            assert got == {lkey: e.value for (pk, lkey), e in ledger.keys.items() if pk == p}
    with Client(node.server.service, retry=SHORT_RETRY) as client:  # for what must be refused
        t = client.table(NS, TABLE)
        for _ in range(2):  # each attempt to open the range refuses again
            with pytest.raises(TableKeeperError, match="no valid checkpoint"):
                list(t.scan(victim_pkeys[0]))
        with pytest.raises(TableKeeperError):
            t.put(victim_pkeys[0], "new", b"must not be accepted")
    log = node.log_since(offset)
    assert re.search(
        rf"range {victim}: refusing to serve: range {victim}: no valid checkpoint in directory "
        rf"{re.escape(str(node.checkpoints))} \(.*\); refusing to start it with incomplete data",
        log,
    ), log
    container, stream, range_id = (int(x) for x in victim.split("-"))
    assert not (node.data / "db" / f"{container:05d}" / f"{stream}-{range_id}").exists()


def test_checkpoints_gone_after_truncation_refuses_with_a_clear_message(
    make_node: _NodeFactory,
    two_checkpointed: TwoCheckpoints,
) -> None:
    node = make_node()
    ledger, table_id = from_two_checkpoints(node, two_checkpointed)
    first = {log_name: first_segment(node, log_name) for log_name in table_log_names(table_id)}
    shutil.rmtree(node.checkpoints)
    shutil.rmtree(node.data)

    # The root and meta logs were never truncated: they replay in full and the server starts.
    offset = node.start()
    with Client(node.server.service) as client:  # the SDK's patient policy for the catalog
        assert client.get_table(NS, TABLE).table_id == table_id
    with Client(node.server.service, retry=SHORT_RETRY) as client:  # for what must be refused
        t = client.table(NS, TABLE)
        one_pkey_per_range = {range_log_name(table_id, p): p for p in PKEYS}
        assert sorted(one_pkey_per_range) == sorted(first)
        for p in one_pkey_per_range.values():
            with pytest.raises(TableKeeperError, match="were truncated"):
                list(t.scan(p))
    log = node.log_since(offset)
    for log_name, segment in first.items():
        assert (
            f"range {log_name}: refusing to serve: log {log_name} starts at {segment} but the "
            f"store needs 1 next (records 1..{segment - 1} were truncated after a checkpoint "
            "that this store does not include)"
        ) in log, log


def test_stale_data_dir_is_set_aside_and_restored(make_node: _NodeFactory) -> None:
    """A data directory older than what the log still holds (e.g. put back from a backup) is
    moved aside, and the range is rebuilt from a checkpoint plus the log."""
    node = make_node()
    ledger = Ledger()
    node.start()
    table_id = create_table(node)
    load(node, ledger, 0)
    node.server.stop()
    stale = node.base / "stale-data"
    shutil.copytree(node.data, stale)
    node.start()
    for phase in (1, 2, 3):
        load(node, ledger, phase)
        node.checkpoint()
    node.server.stop()
    shutil.rmtree(node.data)
    shutil.copytree(stale, node.data)

    offset = node.start()
    verify(node, ledger)
    log = node.log_since(offset)
    for log_name in table_log_names(table_id):
        assert re.search(rf"range {log_name}: moving local store to \S+\.unusable-\d+: log", log)
        assert f"range {log_name}: restored checkpoint at" in log, log


# --------------------------------------------------------------------------- bounded WAL


def test_wal_stays_bounded_under_periodic_checkpoints(make_node: _NodeFactory) -> None:
    """A steady, throttled write load for 15 s with a checkpoint every second. The WAL then
    holds only what the older of the 2 kept checkpoints lacks (a few seconds of writes) instead
    of everything. Checked as a ratio of retained to appended WAL bytes, which does not depend
    on how fast this machine is: without truncation it is 1, with it about (seconds retained) /
    (seconds elapsed)."""
    node = make_node(interval_s=1, segment_bytes=16384)
    node.start()
    table_id = create_table(node)
    ledger = Ledger()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with Client(node.server.service) as client:
                t = client.table(NS, TABLE)
                tick = 0
                while not stop.is_set():
                    started = time.monotonic()
                    lkeys = [f"k{(tick * 2 + j) % 100:03d}" for j in range(2)]
                    items = [(p, k, value_of(tick, p, k)) for p in PKEYS for k in lkeys]
                    results = t.batch_put(items)
                    for (p, k, v), error in zip(items, results, strict=True):
                        assert error is None, error
                        ledger.put(p, k, v)
                    t.increment(COUNTERS[tick % len(COUNTERS)], COUNTER_LKEY, 1)
                    ledger.increment(COUNTERS[tick % len(COUNTERS)], 1)
                    tick += 1
                    time.sleep(max(0.0, 0.05 - (time.monotonic() - started)))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=writer, name="load")
    thread.start()
    load_s = 15.0
    segment_max: dict[Path, int] = {}  # every segment seen, at the largest size seen
    samples: list[tuple[float, int, int]] = []  # (seconds, WAL bytes now, bytes appended)
    try:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < load_s and thread.is_alive():
            now = 0
            for segment in node.wal.glob("*/*.wal"):
                try:
                    size = segment.stat().st_size
                except FileNotFoundError:
                    continue  # truncated since the listing
                now += size
                segment_max[segment] = max(size, segment_max.get(segment, 0))
            samples.append((elapsed, now, sum(segment_max.values())))
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert not thread.is_alive()

    # Segments missed between two samples make `appended` an underestimate: the ratio is, if
    # anything, overstated.
    late = [(t, now, appended) for t, now, appended in samples if t >= 10]
    assert late, samples
    worst = max(now / appended for _, now, appended in late)
    assert worst < 0.6, f"the WAL keeps {worst:.0%} of what was appended: {late}"
    shrinks = sum(1 for a, b in zip(samples, samples[1:], strict=False) if b[1] < a[1])
    assert shrinks >= 5, f"the WAL shrank only {shrinks} times: {samples}"
    deleted = [p for p in segment_max if not p.exists()]
    assert len(deleted) >= 10, f"only {len(deleted)} of {len(segment_max)} segments deleted"

    # Once the load stops, the periodic checkpoints catch up with every table range, and
    # `admin status` shows each range's checkpoint position and age.
    table_logs = table_log_names(table_id)
    deadline = time.monotonic() + 60
    while True:
        with Client(node.server.service) as client:
            ranges = [r for r in client.status().ranges if r.stream_id == table_id]
        if len(ranges) == RANGES and all(
            r.checkpoint_sequence == r.applied_sequence and r.checkpoint_age_ms >= 0 for r in ranges
        ):
            break
        assert time.monotonic() < deadline, ranges
        time.sleep(0.5)
    result = node.cli("admin", "status")
    assert result.returncode == 0, result.stderr
    assert "ckpt at" in result.stdout and "ckpt age" in result.stdout, result.stdout
    rows = [line.split() for line in result.stdout.splitlines()]
    table_rows = [r for r in rows if len(r) > 7 and r[1] == str(table_id)]
    assert len(table_rows) == RANGES, result.stdout
    for row, r in zip(
        sorted(table_rows, key=lambda row: int(row[2])),
        sorted(ranges, key=lambda r: r.range_id),
        strict=True,
    ):
        assert int(row[6]) == r.checkpoint_sequence > 0, result.stdout  # ckpt at
        assert re.fullmatch(r"\d+s", row[7]), result.stdout  # ckpt age, not "never"
    for log_name in table_logs:
        assert len(list((node.wal / log_name).glob("*.wal"))) < 40, log_name

    # Nothing acknowledged was lost, nothing applied twice, across a kill -9.
    node.server.kill()
    node.start()
    verify(node, ledger)


def wait_checkpointed_within(node: Node, table_id: int, records: int) -> dict[str, int]:
    """Wait until every range of the table has a checkpoint less than `records` commands
    behind it; return each range's applied position then."""
    deadline = time.monotonic() + 60
    while True:
        with Client(node.server.service) as client:
            ranges = [r for r in client.status().ranges if r.stream_id == table_id]
        if len(ranges) == RANGES and all(
            r.checkpoint_age_ms >= 0 and r.applied_sequence - r.checkpoint_sequence < records
            for r in ranges
        ):
            return {
                f"{r.container_id:05d}-{r.stream_id:012d}-{r.range_id:012d}": r.applied_sequence
                for r in ranges
            }
        assert time.monotonic() < deadline, ranges
        time.sleep(0.2)


def test_a_range_is_checkpointed_after_its_records_without_anyone_asking(
    make_node: _NodeFactory,
) -> None:
    """`--checkpoint-records 50` with periodic checkpoints off: every range is checkpointed
    once it applied 50 commands since its last checkpoint, with nobody asking, so what a new
    server replays from an empty data directory stays under 50 commands per range."""
    records = 50
    node = make_node(records=records)
    node.start()
    table_id = create_table(node)
    ledger = Ledger()
    positions = []
    for phase in (1, 2, 3):  # 120-300 commands in each of the 4 ranges per phase
        load(node, ledger, phase)
        positions.append(wait_checkpointed_within(node, table_id, records))
    status = node.cli("admin", "status")
    assert status.returncode == 0, status.stderr
    assert f"checkpoints: directory {node.checkpoints}, after {records} commands" in status.stdout
    applied = positions[-1]
    for before, after in zip(positions, positions[1:], strict=False):
        assert all(after[name] > before[name] + records for name in after), (before, after)
    assert sorted(applied) == table_log_names(table_id)
    assert all(seq > 4 * records for seq in applied.values()), applied
    for log_name, seq in applied.items():
        manifests = manifests_of(node, log_name)
        assert len(manifests) == 2, manifests  # --checkpoints-kept 2: older ones collected
        assert seq - decode(manifests[-1]).applied_sequence < records, (log_name, seq)

    # A server on an empty data directory restores each range's newest checkpoint: what it
    # then replays from the log is the few commands after it.
    node.server.stop()
    shutil.rmtree(node.data)
    offset = node.start()
    verify(node, ledger)
    log = node.log_since(offset)
    for log_name, seq in applied.items():
        restored = re.search(rf"range {log_name}: restored checkpoint at (\d+)", log)
        assert restored is not None, log
        assert seq - int(restored.group(1)) < records, (log_name, seq, restored.group(0))


# --------------------------------------------------------------------------- rebuild


def test_empty_data_dir_rebuilds_every_range(make_node: _NodeFactory) -> None:
    node = make_node()
    ledger = Ledger()
    table_id = two_checkpoints(node, ledger)
    # A second table created after the last checkpoint: the root and meta ranges have records
    # in the log only, and its ranges were never checkpointed (they replay their whole log).
    other_id = create_table(node, "u", ranges=2)
    other = Ledger()
    load(node, other, 0, table="u")
    node.server.stop()

    fresh = Node(
        node.base,
        ServerProcess(
            node.base / "data-rebuilt",
            extra_args=node.server.extra_args,
            port=node.server.port,
            metrics_port=node.server.metrics_port,
        ),
    )
    fresh_server = fresh.server
    offset = fresh.start()
    try:
        with Client(fresh_server.service) as client:
            client.get_namespace(NS)  # raises if it was lost
            assert client.get_table(NS, TABLE).table_id == table_id
            assert client.get_table(NS, "u").table_id == other_id
        verify(fresh, ledger)
        verify(fresh, other, table="u")
        log = fresh.log_since(offset)
        assert f"range {ROOT_LOG}: restored checkpoint at" in log, log
        for container in range(CONTAINERS):
            meta = f"{container:05d}-000000000001-000000000000"
            assert f"range {meta}: restored checkpoint at" in log, log
        for log_name in table_log_names(table_id):
            assert f"range {log_name}: restored checkpoint at" in log, log
        with Client(fresh_server.service) as client:
            restored = {
                f"{r.container_id:05d}-{r.stream_id:012d}-{r.range_id:012d}": r.restored_from
                for r in client.status().ranges
            }
        assert restored[ROOT_LOG].startswith(f"{ROOT_LOG}/manifests/")
        for log_name in table_log_names(other_id, 2):
            assert restored[log_name] == "", "never checkpointed: rebuilt from its log alone"
        # The rebuilt server keeps working: writes, a checkpoint, a restart.
        load(fresh, ledger, 3)
        fresh.checkpoint()
        fresh_server.stop()
        fresh.start()
        verify(fresh, ledger)
        verify(fresh, other, table="u")
    finally:
        if fresh_server.process is not None and fresh_server.process.poll() is None:
            fresh_server.kill()
