"""The `tablekeeper` PySpark data source: batch read, batch write, streaming write.

Read: one input partition per range of the table (`ScanRange`, in pages). A `pkey = x` or
`pkey IN (...)` filter is pushed down: only the ranges that hold those pkeys are planned, and
each reads just its pkeys (per-pkey `Range` scans).

Write (`mode` put | increment): each task first checks all its rows (null or empty keys, null
values or amounts fail the task before it sends anything; checked rows are held in memory up to
`SPOOL_MEMORY_BYTES` and spilled to a temporary Arrow file beyond), then sends them in `Batch`
RPCs of `batchSize` ops, `maxInFlight` at a time. Puts are resent when a call fails in an unknown
state (a put of the same value twice is harmless). Increments are, by default (`exactlyOnce`),
summed per (pkey, lkey) over the task (at most `maxKeysPerPartition` of them) and applied with
marker-guarded txns (see `tablekeeper.bulk.once_txns`): a retried task, a resent call or a
replayed streaming batch finds its markers and changes nothing. With `exactlyOnce=false` they
are plain increments, resent only when certainly not applied; a retried task applies them again.

Streaming write: the same, with the marker scope = the query id and the epoch = the batch id
(both from the task's local properties that Structured Streaming sets). So each
(query id, batch id, partition) applies its increments once.
"""

from __future__ import annotations

import tempfile
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    EqualNullSafe,
    EqualTo,
    Filter,
    In,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from tablekeeper.bulk import (
    BatchSender,
    Epoch,
    TableLayout,
    check_once_results,
    increment_op,
    is_marker,
    once_txns,
    put_op,
    scan_range,
)
from tablekeeper.routing import RangeRouter
from tablekeeper.spark._runtime import Connection, resolve_table
from tablekeeper.spark.options import OptionError, Options, parse_options
from tablekeeper.table import AsyncTable, KeyValue, TableInfo
from tablekeeper_proto.v1 import tablekeeper_pb2

NAME = "tablekeeper"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
_INT_TYPES = (ByteType, ShortType, IntegerType, LongType)
SPOOL_MEMORY_BYTES = 64 * 1024 * 1024
"""Rows a write task holds in memory while checking its input; more are spilled to disk."""
_READ_ONLY_COLUMNS = ("is_number", "number_value", "version", "create_revision", "mod_revision")


class InputError(ValueError):
    """Rows the connector will not write (null or empty keys, null values or amounts)."""


def read_schema(binary: bool = False) -> StructType:
    """The columns a read yields. `value` is null for a number key (see `number_value`)."""
    key: DataType = BinaryType() if binary else StringType()
    return StructType(
        [
            StructField("pkey", key, False),
            StructField("lkey", key, False),
            StructField("value", key, True),
            StructField("is_number", BooleanType(), False),
            StructField("number_value", LongType(), True),
            StructField("version", LongType(), False),
            StructField("create_revision", LongType(), False),
            StructField("mod_revision", LongType(), False),
        ]
    )


def _arrow_schema(binary: bool) -> pa.Schema:
    key = pa.binary() if binary else pa.string()
    return pa.schema(
        [
            pa.field("pkey", key, False),
            pa.field("lkey", key, False),
            pa.field("value", key, True),
            pa.field("is_number", pa.bool_(), False),
            pa.field("number_value", pa.int64(), True),
            pa.field("version", pa.int64(), False),
            pa.field("create_revision", pa.int64(), False),
            pa.field("mod_revision", pa.int64(), False),
        ]
    )


def check_write_schema(schema: StructType, mode: str) -> None:
    """Raise `OptionError` unless `schema` has the columns `mode` writes, with usable types."""
    fields = {f.name: f.dataType for f in schema.fields}
    third = "value" if mode == "put" else "amount"
    expected = f"pkey, lkey ({'string or binary'}) and {third} " + (
        "(string or binary)" if mode == "put" else "(an integer type)"
    )
    missing = [c for c in ("pkey", "lkey", third) if c not in fields]
    if missing:
        raise OptionError(
            f"mode={mode} needs columns {expected}; missing: {', '.join(missing)} "
            f"(the DataFrame has {', '.join(fields) or 'no columns'})"
        )
    allowed = {"pkey", "lkey", third, *_READ_ONLY_COLUMNS}
    if mode == "put":
        allowed.add("value")
    extra = [c for c in fields if c not in allowed]
    if extra:
        raise OptionError(f"mode={mode} writes {expected}; unexpected columns: {', '.join(extra)}")
    for column in ("pkey", "lkey") + (("value",) if mode == "put" else ()):
        if not isinstance(fields[column], StringType | BinaryType):
            raise OptionError(
                f"column {column} is {fields[column].simpleString()}; expected string or binary"
            )
    if mode == "increment" and not isinstance(fields["amount"], _INT_TYPES):
        raise OptionError(
            f"column amount is {fields['amount'].simpleString()}; expected an integer type "
            "(tinyint, smallint, int or bigint)"
        )


# ---------------------------------------------------------------------------------- reading


class RangePartition(InputPartition):
    """One range of the table; `pkeys` = only these pkeys (pushdown), None = the whole range."""

    def __init__(self, range_id: int, pkeys: tuple[bytes, ...] | None = None) -> None:
        super().__init__(range_id)
        self.range_id = range_id
        self.pkeys = pkeys


def plan_partitions(layout: TableLayout, pkeys: Iterable[bytes] | None) -> list[RangePartition]:
    """One partition per range, or, for a set of pkeys, one per range that holds any of them."""
    if pkeys is None:
        return [RangePartition(r.range_id) for r in layout.ranges]
    router = RangeRouter(layout.ranges)
    by_range: dict[int, list[bytes]] = {}
    for pkey in sorted(set(pkeys)):
        by_range.setdefault(router.route(pkey).range_id, []).append(pkey)
    return [
        RangePartition(r.range_id, tuple(by_range[r.range_id]))
        for r in layout.ranges
        if r.range_id in by_range
    ]


def _filter_pkeys(filter_: Filter) -> set[bytes] | None:
    """The pkeys an `=`, `<=>` or `IN` filter on `pkey` allows; None if it is another filter."""
    if getattr(filter_, "attribute", None) != ("pkey",):
        return None
    if isinstance(filter_, EqualTo | EqualNullSafe):
        values: Sequence[Any] = [filter_.value]
    elif isinstance(filter_, In):
        values = list(filter_.value)
    else:
        return None
    out = set()
    for value in values:
        if isinstance(value, str):
            out.add(value.encode())
        elif isinstance(value, bytes | bytearray):
            out.add(bytes(value))
        elif value is None:
            continue  # pkey is never null: matches nothing
        else:
            return None
    return out


class TableKeeperReader(DataSourceReader):
    """Reads a table range by range (no filter pushdown; see `TableKeeperPushdownReader`)."""

    def __init__(self, options: Options, layout: TableLayout) -> None:
        self.options = options
        self.layout = layout
        self.pkeys: set[bytes] | None = None

    def partitions(self) -> Sequence[InputPartition]:
        return plan_partitions(self.layout, self.pkeys)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        options = self.options
        schema = _arrow_schema(options.binary)
        with Connection(options.service) as connection:
            pages = connection.iterate(self._pages(connection, partition))
            for page in pages:
                if not options.include_markers:
                    page = [kv for kv in page if not is_marker(kv.lkey)]
                if page:
                    yield _to_batch(page, schema, options.binary)

    async def _range_pages(self, connection: Connection, range_id: int) -> Any:
        async for page in scan_range(
            connection.client,
            self.layout.table_id,
            range_id,
            page_size=self.options.page_size,
        ):
            yield page

    async def _pages(self, connection: Connection, partition: RangePartition) -> Any:
        if partition.pkeys is None:
            async for page in self._range_pages(connection, partition.range_id):
                yield page
            return
        layout = self.layout
        table = AsyncTable(
            connection.client,
            TableInfo(layout.namespace, layout.name, layout.table_id, len(layout.ranges), 0),
        )
        for pkey in partition.pkeys:
            rows: list[KeyValue] = []
            async for kv in table.scan(pkey, page_size=self.options.page_size):
                rows.append(kv)
                if len(rows) >= self.options.page_size:
                    yield rows
                    rows = []
            if rows:
                yield rows


class TableKeeperPushdownReader(TableKeeperReader):
    """`TableKeeperReader` plus pushdown of `pkey` =, <=> and IN filters."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 (Spark API)
        for filter_ in filters:
            pkeys = _filter_pkeys(filter_)
            if pkeys is None:
                yield filter_
                continue
            # Handled exactly: each planned partition returns only rows of its pkeys.
            self.pkeys = pkeys if self.pkeys is None else self.pkeys & pkeys


def _to_batch(page: list[KeyValue], schema: pa.Schema, binary: bool) -> pa.RecordBatch:
    pkeys = pa.array([kv.pkey for kv in page], pa.binary())
    lkeys = pa.array([kv.lkey for kv in page], pa.binary())
    values = pa.array([None if kv.number is not None else kv.value for kv in page], pa.binary())
    if not binary:
        columns = []
        for name, column in (("pkey", pkeys), ("lkey", lkeys), ("value", values)):
            try:
                columns.append(column.cast(pa.string()))
            except pa.ArrowInvalid:
                bad = next(kv for kv in page if not _utf8(getattr(kv, name) or b""))
                raise ValueError(
                    f"{name} of key (pkey={bad.pkey!r}, lkey={bad.lkey!r}) is not UTF-8; "
                    "read the table with option('binary', 'true')"
                ) from None
        pkeys, lkeys, values = columns
    return pa.RecordBatch.from_arrays(
        [
            pkeys,
            lkeys,
            values,
            pa.array([kv.number is not None for kv in page], pa.bool_()),
            pa.array([kv.number for kv in page], pa.int64()),
            pa.array([kv.version for kv in page], pa.int64()),
            pa.array([kv.create_revision for kv in page], pa.int64()),
            pa.array([kv.mod_revision for kv in page], pa.int64()),
        ],
        schema=schema,
    )


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


# ---------------------------------------------------------------------------------- writing


@dataclass
class WriteStats(WriterCommitMessage):
    """What one task wrote (its commit message)."""

    partition: int
    attempt: int
    rows: int = 0
    ops: int = 0
    applied_txns: int = 0
    skipped_txns: int = 0


def _first_index(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def check_batch(batch: pa.RecordBatch, mode: str, partition: int, first_row: int) -> None:
    """Raise `InputError` for a null key, value or amount, or an empty lkey, in `batch`."""
    for name in ("pkey", "lkey", "value" if mode == "put" else "amount"):
        column = batch.column(name)
        if column.null_count:
            row = first_row + _first_index(pc.is_null(column))
            raise InputError(
                f"column {name} is null in row {row} of partition {partition}: TableKeeper keys, "
                "values and amounts cannot be null (this partition wrote nothing)"
            )
    lengths = pc.binary_length(batch.column("lkey"))
    if len(lengths) and pc.any(pc.equal(lengths, 0)).as_py():
        row = first_row + _first_index(pc.equal(lengths, 0))
        raise InputError(
            f"column lkey is empty in row {row} of partition {partition}: an lkey cannot be "
            "empty (this partition wrote nothing)"
        )


class Spool:
    """A task's rows, all checked (`check_batch`) before any is written: held in memory up to
    `memory_bytes`, then spilled to a temporary Arrow file, so memory stays bounded."""

    def __init__(self, memory_bytes: int = SPOOL_MEMORY_BYTES) -> None:
        self.memory_bytes = memory_bytes
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        self._held = 0
        self._file: Any = None
        self._writer: Any = None

    def fill(self, batches: Iterable[pa.RecordBatch], mode: str, partition: int) -> Spool:
        for batch in batches:
            check_batch(batch, mode, partition, self.rows)
            self.rows += batch.num_rows
            self._add(batch)
        return self

    def _add(self, batch: pa.RecordBatch) -> None:
        if self._writer is None and self._held + batch.nbytes <= self.memory_bytes:
            self.batches.append(batch)
            self._held += batch.nbytes
            return
        if self._writer is None:
            self._file = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in close())
                prefix="tablekeeper-spool-", suffix=".arrow"
            )
            self._writer = pa.ipc.new_stream(self._file, batch.schema)
            for held in self.batches:
                self._writer.write_batch(held)
            self.batches, self._held = [], 0
        self._writer.write_batch(batch)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._writer is None:
            yield from self.batches
            return
        self._writer.close()
        self._file.flush()
        with pa.memory_map(self._file.name) as source:
            yield from pa.ipc.open_stream(source)

    def close(self) -> None:
        self.batches = []
        if self._file is not None:
            self._file.close()  # deletes it
            self._file = None


def _bytes_column(batch: pa.RecordBatch, name: str) -> list[bytes]:
    column = batch.column(name)
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()  # type: ignore[no-any-return]


def _amount_column(batch: pa.RecordBatch) -> list[int]:
    return batch.column("amount").to_pylist()  # type: ignore[no-any-return]


def _wrap_int64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


class _Window:
    """At most `size` calls in flight; `wait_all` re-raises the first failure."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.futures: deque[Future[Any]] = deque()

    def add(self, future: Future[Any]) -> list[Any]:
        self.futures.append(future)
        done = []
        while len(self.futures) >= self.size:
            done.append(self.futures.popleft().result())
        return done

    def wait_all(self) -> list[Any]:
        done = []
        while self.futures:
            done.append(self.futures.popleft().result())
        return done


def _task_context() -> tuple[int, int, TaskContext | None]:
    context = TaskContext.get()
    if context is None:
        return 0, 0, None
    return context.partitionId(), context.attemptNumber(), context


@dataclass(frozen=True)
class _Target:
    """Where and how a task writes."""

    options: Options
    table_id: int
    scope: bytes
    epoch: Epoch
    tag: str


def write_partition(target: _Target, batches: Iterator[pa.RecordBatch]) -> WriteStats:
    """Write one task's rows (the body of every writer's `write`)."""
    options = target.options
    partition, attempt, _ = _task_context()
    stats = WriteStats(partition, attempt)
    # Every row of the task is checked before the first is sent: bad input fails the task
    # before it writes anything.
    spool = Spool().fill(batches, options.mode, partition)
    try:
        with Connection(options.service) as connection:
            if options.mode == "put":
                _write_puts(connection, target, iter(spool), stats)
            elif options.exactly_once:
                _write_increments_once(connection, target, iter(spool), stats)
            else:
                _write_increments(connection, target, iter(spool), stats)
    finally:
        spool.close()
    if options.fail_after_write:
        _inject_failure(Path(options.fail_after_write), f"{target.tag}-p{partition}")
    return stats


def _write_puts(
    connection: Connection, target: _Target, batches: Iterator[pa.RecordBatch], stats: WriteStats
) -> None:
    sender = BatchSender(connection.client, idempotent=True)
    window = _Window(target.options.max_in_flight)
    size = target.options.batch_size
    for batch in batches:
        pkeys = _bytes_column(batch, "pkey")
        lkeys = _bytes_column(batch, "lkey")
        values = _bytes_column(batch, "value")
        stats.rows += len(pkeys)
        for start in range(0, len(pkeys), size):
            end = start + size
            ops = [
                put_op(target.table_id, p, k, v)
                for p, k, v in zip(
                    pkeys[start:end], lkeys[start:end], values[start:end], strict=True
                )
            ]
            stats.ops += len(ops)
            window.add(connection.submit(sender.send(ops)))
    window.wait_all()


def _write_increments(
    connection: Connection, target: _Target, batches: Iterator[pa.RecordBatch], stats: WriteStats
) -> None:
    """Plain increments (exactlyOnce=false): retried only when certainly not applied."""
    sender = BatchSender(connection.client, idempotent=False)
    window = _Window(target.options.max_in_flight)
    size = target.options.batch_size
    for batch in batches:
        pkeys = _bytes_column(batch, "pkey")
        lkeys = _bytes_column(batch, "lkey")
        amounts = _amount_column(batch)
        stats.rows += len(pkeys)
        for start in range(0, len(pkeys), size):
            end = start + size
            ops = [
                increment_op(target.table_id, p, k, a)
                for p, k, a in zip(
                    pkeys[start:end], lkeys[start:end], amounts[start:end], strict=True
                )
            ]
            stats.ops += len(ops)
            window.add(connection.submit(sender.send(ops)))
    window.wait_all()


def _write_increments_once(
    connection: Connection, target: _Target, batches: Iterator[pa.RecordBatch], stats: WriteStats
) -> None:
    """Aggregate the task's increments per (pkey, lkey), then apply them with marker txns."""
    options = target.options
    totals: dict[bytes, dict[bytes, int]] = {}
    distinct = 0
    for batch in batches:
        pkeys = _bytes_column(batch, "pkey")
        lkeys = _bytes_column(batch, "lkey")
        amounts = _amount_column(batch)
        stats.rows += len(pkeys)
        for pkey, lkey, amount in zip(pkeys, lkeys, amounts, strict=True):
            per_pkey = totals.get(pkey)
            if per_pkey is None:
                per_pkey = totals[pkey] = {}
            if lkey in per_pkey:
                per_pkey[lkey] += amount
            else:
                per_pkey[lkey] = amount
                distinct += 1
        if distinct > options.max_keys_per_partition:
            raise InputError(
                f"partition {stats.partition} has more than {options.max_keys_per_partition} "
                "distinct (pkey, lkey) to increment; repartition the DataFrame into more "
                "partitions or raise maxKeysPerPartition (nothing of this partition was written)"
            )
    wrapped = {p: {k: _wrap_int64(a) for k, a in lk.items()} for p, lk in totals.items()}
    ops = once_txns(
        target.table_id, wrapped, scope=target.scope, partition=stats.partition, epoch=target.epoch
    )
    sender = BatchSender(connection.client, idempotent=True)  # marker-guarded: safe to resend
    window = _Window(options.max_in_flight)
    size = options.batch_size

    async def send(chunk: list[tablekeeper_pb2.BatchOp]) -> tuple[int, int]:
        outcome = check_once_results(chunk, await sender.send(chunk))
        return outcome.applied_txns, outcome.skipped_txns

    # A Batch RPC carries txns until they hold about `batchSize` increments.
    results = []
    chunk: list[tablekeeper_pb2.BatchOp] = []
    weight = 0
    for op in ops:
        chunk.append(op)
        weight += len(op.txn.failure)
        if weight >= size:
            stats.ops += len(chunk)
            results += window.add(connection.submit(send(chunk)))
            chunk, weight = [], 0
    if chunk:
        stats.ops += len(chunk)
        results += window.add(connection.submit(send(chunk)))
    results += window.wait_all()
    stats.applied_txns = sum(a for a, _ in results)
    stats.skipped_txns = sum(s for _, s in results)


def _inject_failure(directory: Path, tag: str) -> None:
    """Testing hook (`failAfterWrite`): fail the first attempt of each task after it wrote."""
    directory.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in tag)
    try:
        (directory / safe).open("x").close()
    except FileExistsError:
        return
    raise RuntimeError(f"injected failure after writing ({safe}); testing hook failAfterWrite")


class TableKeeperWriter(DataSourceArrowWriter):
    """Batch writes (`df.write.format("tablekeeper")`)."""

    def __init__(self, options: Options, layout: TableLayout) -> None:
        token = uuid.uuid4().bytes
        self.target = _Target(
            options,
            layout.table_id,
            scope=b"w:" + options.writer_id.encode(),
            epoch=Epoch.token(token),
            tag=f"w-{options.writer_id}-{token.hex()}",
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteStats:
        return write_partition(self.target, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class TableKeeperStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: effectively-once per (query id, batch id, partition) for increments."""

    def __init__(self, options: Options, layout: TableLayout) -> None:
        self.options = options
        self.table_id = layout.table_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteStats:
        _, _, context = _task_context()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if not query_id or batch_id is None:
            raise RuntimeError(
                "the tablekeeper streaming sink found no streaming query id / batch id in the "
                f"task's local properties ({QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})"
            )
        target = _Target(
            self.options,
            self.table_id,
            scope=b"q:" + query_id.encode(),
            epoch=Epoch.sequence(int(batch_id)),
            tag=f"q-{query_id}-b{batch_id}",
        )
        return write_partition(target, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


# ---------------------------------------------------------------------------------- source


class TableKeeperDataSource(DataSource):
    """`spark.read.format("tablekeeper")` / `df.write.format("tablekeeper")` /
    `df.writeStream.format("tablekeeper")`. Options: see `tablekeeper.spark.options`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _options(self) -> Options:
        return parse_options(self.options)

    def schema(self) -> StructType:
        return read_schema(self._options().binary)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        expected = read_schema(options.binary)
        if [f.name for f in schema.fields] != [f.name for f in expected.fields] or [
            f.dataType for f in schema.fields
        ] != [f.dataType for f in expected.fields]:
            raise OptionError(
                f"a tablekeeper read yields {expected.simpleString()}; "
                f"a user schema {schema.simpleString()} is not supported"
            )
        layout = resolve_table(options.service, options.namespace, options.table)
        if options.pushdown:
            return TableKeeperPushdownReader(options, layout)
        return TableKeeperReader(options, layout)

    def writer(self, schema: StructType, overwrite: bool) -> TableKeeperWriter:
        options = self._check_write(schema, overwrite)
        return TableKeeperWriter(options, resolve_table(options.service, *_names(options)))

    def streamWriter(  # noqa: N802 (Spark API)
        self, schema: StructType, overwrite: bool
    ) -> TableKeeperStreamWriter:
        options = self._check_write(schema, overwrite)
        return TableKeeperStreamWriter(options, resolve_table(options.service, *_names(options)))

    def _check_write(self, schema: StructType, overwrite: bool) -> Options:
        options = self._options()
        if overwrite:
            raise OptionError(
                "save mode overwrite / complete is not supported: TableKeeper writes key by key "
                "(use mode('append'), or output mode append / update for streams)"
            )
        check_write_schema(schema, options.mode)
        return options


def _names(options: Options) -> tuple[str, str]:
    return options.namespace, options.table
