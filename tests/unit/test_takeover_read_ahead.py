"""A takeover applies the log's tail while the log's open is still reading it.

The Pulsar backend hands each record its open reads to `on_record`; here a local log that does
the same (it reads its own records while opening) stands in for it, so that the order of
events can be checked without a broker: restore, then apply what the open handed over, then the
replay after the open takes only what is left.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.log.api import LogRecord
from tablekeeper_server.log.local import LocalLogBackend, LocalLogWriter
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.rocksdb import RocksKvStore
from tests.support.appliers import APPLIERS
from tests.unit.test_checkpointer import put, read, value

pytestmark = pytest.mark.unit
NAME = RangeName(3, 1024, 1025)


class HandingOverLog(LocalLogBackend):
    """A local log whose open hands every record from `hand_over_from` on to `on_record`, as
    the Pulsar backend's recovery scan does; it notes where each later read began."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hand_over_from: int | None = None
        self.handed_over: list[int] = []
        self.reads: list[int] = []

    def open_writer(
        self,
        log_name: str,
        *,
        min_last_sequence: int = 0,
        on_record: Callable[[LogRecord], object] | None = None,
    ) -> LocalLogWriter:
        writer = super().open_writer(log_name, min_last_sequence=min_last_sequence)
        if on_record is not None and self.hand_over_from is not None:
            for record in super().read(log_name, self.hand_over_from):
                self.handed_over.append(record.sequence)
                on_record(record)
        return writer

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        self.reads.append(from_sequence)
        return super().read(log_name, from_sequence)


class Setup:
    def __init__(self, root: Path) -> None:
        self.log = HandingOverLog(root / "wal")
        self.store_path = root / "db" / "range"
        self.objects = DirectoryCheckpointStore(root / "checkpoints")
        self.clock = ManualClock()

    def checkpointer(self) -> RangeCheckpointer:
        return RangeCheckpointer(
            NAME.log_name,
            self.store_path,
            RocksKvStore,
            self.objects,
            self.log,
            self.clock,
        )

    async def write(self, commands: list[wal_pb2.WalCommand], *, checkpoint_after: int) -> int:
        """Append and apply `commands`, checkpointing after the first `checkpoint_after`;
        returns the checkpoint's position. The store is lost afterwards (a new owner)."""
        writer = self.log.open_writer(NAME.log_name)
        store = RocksKvStore(self.store_path)
        sm = RangeStateMachine(store, APPLIERS)
        position = 0
        for lo in range(0, len(commands), 50):
            group = commands[lo : lo + 50]
            last = await writer.append([c.SerializeToString() for c in group])
            sm.apply_batch([(last - len(group) + 1 + i, c) for i, c in enumerate(group)])
            if last == checkpoint_after:
                position = self.checkpointer().checkpoint(store).applied_sequence
        await writer.close()
        store.close()
        shutil.rmtree(self.store_path)
        return position

    def range(self) -> Range:
        return Range(
            NAME,
            self.log,
            lambda: RocksKvStore(self.store_path),
            self.clock,
            checkpointer=self.checkpointer(),
            appliers=APPLIERS,
        )


async def test_the_tail_is_applied_while_the_log_opens_and_not_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(tmp_path)
    position = await setup.write([put(i) for i in range(1500)], checkpoint_after=1000)
    assert position == 1000
    setup.log.hand_over_from = 1  # the open reads from before the checkpoint, as on Pulsar
    caplog.set_level("INFO", logger="tablekeeper_server.range.replica")

    range_ = setup.range()
    await range_.open()
    assert range_.applied_sequence == 1500
    assert setup.log.handed_over == list(range(1, 1501))
    # What the open handed over was applied before it returned: the replay asked only for
    # what comes after the log's last record.
    assert setup.log.reads == [1501]
    assert "500 records applied meanwhile" in caplog.text
    sm = range_.applied_state()
    assert read(sm, 0) == value(0) and read(sm, 1499) == value(1499)
    await range_.close()


async def test_a_tail_handed_over_in_part_is_finished_by_the_replay(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    await setup.write([put(i) for i in range(1500)], checkpoint_after=1000)
    setup.log.hand_over_from = 1201  # records 1001-1200 never handed over: a gap
    range_ = setup.range()
    await range_.open()
    assert range_.applied_sequence == 1500
    assert setup.log.reads == [1001]  # nothing applied ahead: the replay reads it all
    assert read(range_.applied_state(), 1100) == value(1100)
    await range_.close()


async def test_a_record_that_is_no_command_still_stops_the_range(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    await setup.write([put(i) for i in range(1200)], checkpoint_after=1000)
    writer = setup.log.open_writer(NAME.log_name)
    assert await writer.append([b"\xff not a command"]) == 1201
    await writer.close()
    setup.log.hand_over_from = 1
    range_ = setup.range()
    with pytest.raises(CorruptionError, match="record 1201 is not a command"):
        await range_.open()
