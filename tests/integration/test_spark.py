"""The PySpark connector (`tablekeeper.spark`) with a real local Spark session and a real server.

One server and one Spark session (`local[2,2]`: 2 cores, a failed task is retried once)
are shared by the module; every test uses its own tables.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402, N812
from pyspark.sql.datasource import EqualTo, In  # noqa: E402

from tablekeeper import Client  # noqa: E402
from tablekeeper.bulk import MARKER_PREFIX, table_layout  # noqa: E402
from tablekeeper.routing import RangeRouter  # noqa: E402
from tablekeeper.spark import (  # noqa: E402
    InputError,
    RangePartition,
    TableKeeperDataSource,
    read_schema,
    save,
)
from tablekeeper.spark import counters as counters_job  # noqa: E402
from tablekeeper.spark import export as export_job  # noqa: E402
from tablekeeper.spark.session import get_session  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

pytestmark = pytest.mark.integration

NS = "spark"
ROWS = 20_000
PKEYS = 1_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("spark-server") / "data").start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.service) as c:
        c.create_namespace(NS)
        yield c


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = get_session(
        "local[2,2]",
        "tablekeeper-tests",
        **{
            "spark.driver.memory": "1g",
            "spark.sql.shuffle.partitions": "4",
            # No whole-stage code generation: compiling a class per query cost this module's
            # small queries more CPU than it saved (the JVM's CPU 73 -> 59 s over the module).
            "spark.sql.codegen.wholeStage": "false",
            # Spark's JVM with the client compiler only, as the tests' other JVMs (Pulsar,
            # ZooKeeper, the Java clients): a short run does not repay the optimising one's CPU.
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        },
    )
    yield session
    session.stop()


def _table(client: Client, name: str, ranges: int = 4) -> str:
    client.create_table(NS, name, ranges=ranges)
    return f"{NS}/{name}"


def _reader(spark: SparkSession, server: ServerProcess, table: str, **options: str) -> DataFrame:
    return (
        spark.read.format("tablekeeper")
        .option("service", server.service)
        .option("table", table)
        .options(**options)
        .load()
    )


def _write(df: DataFrame, server: ServerProcess, table: str, **options: str) -> None:
    (
        df.write.format("tablekeeper")
        .mode("append")
        .option("service", server.service)
        .option("table", table)
        .options(**options)
        .save()
    )


def _numbers(spark: SparkSession, server: ServerProcess, table: str) -> dict[tuple[str, str], int]:
    rows = _reader(spark, server, table).collect()
    assert all(r.is_number and r.value is None for r in rows)
    return {(r.pkey, r.lkey): r.number_value for r in rows}


def _all_keys(client: Client, table: str) -> int:
    """Keys in the table, markers included (a direct check that nothing was written)."""
    from tablekeeper.bulk import scan_range

    namespace, name = table.split("/")
    layout = client._runner.run(table_layout(client._async, namespace, name))

    async def count() -> int:
        total = 0
        for r in layout.ranges:
            async for page in scan_range(client._async, layout.table_id, r.range_id):
                total += len(page)
        return total

    return client._runner.run(count())


# ------------------------------------------------------------------------------ round trip


@pytest.fixture(scope="module")
def loaded(spark: SparkSession, server: ServerProcess, client: Client) -> tuple[str, DataFrame]:
    """20k rows written with the connector into an 8-range table."""
    table = _table(client, "rows", ranges=8)
    df = spark.range(ROWS, numPartitions=4).select(
        F.concat(F.lit("p"), (F.col("id") % PKEYS).cast("string")).alias("pkey"),
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("lkey"),
        F.concat(F.lit("välue-"), F.sha1(F.col("id").cast("string"))).alias("value"),
    )
    _write(df, server, table)
    return table, df


def test_round_trip_of_20k_rows(
    spark: SparkSession, server: ServerProcess, loaded: tuple[str, DataFrame]
) -> None:
    table, written = loaded
    read = _reader(spark, server, table).cache()
    try:
        assert read.rdd.getNumPartitions() == 8  # one input partition per range
        assert read.count() == ROWS
        columns = read.select("pkey", "lkey", "value")
        assert written.exceptAll(columns).count() == 0
        assert columns.exceptAll(written).count() == 0
        meta = read.agg(
            F.max(F.col("is_number").cast("int")).alias("numbers"),
            F.max("version").alias("max_version"),
            F.min("create_revision").alias("min_create"),
        ).first()
        assert meta is not None
        assert (meta.numbers, meta.max_version) == (0, 0) and meta.min_create > 0
    finally:
        read.unpersist()


def test_pkey_pushdown_plans_only_the_ranges_of_the_pkeys(
    spark: SparkSession, server: ServerProcess, client: Client, loaded: tuple[str, DataFrame]
) -> None:
    table, _ = loaded
    layout = client._runner.run(table_layout(client._async, NS, "rows"))
    router = RangeRouter(layout.ranges)
    # Three existing pkeys in three different ranges, plus one that does not exist.
    chosen: dict[int, str] = {}
    for i in range(PKEYS):
        chosen.setdefault(router.route(f"p{i}".encode()).range_id, f"p{i}")
        if len(chosen) == 3:
            break
    pkeys = sorted(chosen.values())
    expected_ranges = set(chosen)

    # The planned partitions, straight from the reader Spark uses.
    source = TableKeeperDataSource({"service": server.service, "table": table})
    reader = source.reader(read_schema())
    remaining = list(reader.pushFilters([In(("pkey",), tuple(pkeys)), EqualTo(("lkey",), "x")]))
    assert [type(f).__name__ for f in remaining] == ["EqualTo"]  # lkey is left to Spark
    planned = reader.partitions()
    assert all(isinstance(p, RangePartition) for p in planned)
    assert {p.range_id for p in planned} == expected_ranges  # type: ignore[attr-defined]
    assert sorted(k for p in planned for k in p.pkeys) == [k.encode() for k in pkeys]  # type: ignore[attr-defined]

    # And in Spark: as many input partitions, each reading exactly one of those ranges.
    df = _reader(spark, server, table).where(F.col("pkey").isin(*pkeys))
    assert df.rdd.getNumPartitions() == 3
    rows = df.select("pkey", F.spark_partition_id().alias("part")).collect()
    assert Counter(r.pkey for r in rows) == {p: ROWS // PKEYS for p in pkeys}
    ranges_by_partition: dict[int, set[int]] = {}
    for r in rows:
        ranges_by_partition.setdefault(r.part, set()).add(router.route(r.pkey.encode()).range_id)
    assert all(len(v) == 1 for v in ranges_by_partition.values())
    assert set().union(*ranges_by_partition.values()) == expected_ranges

    one = _reader(spark, server, table).where(F.col("pkey") == pkeys[0])
    assert one.rdd.getNumPartitions() == 1 and one.count() == ROWS // PKEYS
    missing = _reader(spark, server, table).where(F.col("pkey").isin("no-such-pkey"))
    assert missing.rdd.getNumPartitions() == 1 and missing.count() == 0
    no_pushdown = _reader(spark, server, table).where(F.col("lkey") == "k7")
    assert no_pushdown.rdd.getNumPartitions() == 8 and no_pushdown.count() == 1


def test_binary_keys_round_trip_and_a_string_read_names_the_bad_key(
    spark: SparkSession, server: ServerProcess, client: Client
) -> None:
    table = _table(client, "binary")
    rows = [(bytes([0xFF, i]), b"\x00lk" + bytes([i]), bytes(range(i, i + 8))) for i in range(50)]
    df = spark.createDataFrame(rows, "pkey binary, lkey binary, value binary")
    _write(df, server, table)
    read = _reader(spark, server, table, binary="true")
    assert read.schema == read_schema(binary=True)
    assert sorted((bytes(r.pkey), bytes(r.lkey), bytes(r.value)) for r in read.collect()) == rows
    assert len(_reader(spark, server, table, binary="true").limit(5).collect()) == 5
    with pytest.raises(Exception, match=r"pkey of key .* is not UTF-8; read the table with"):
        _reader(spark, server, table).collect()


# ------------------------------------------------------------------------------ increments


def test_increments_from_4_partitions_on_the_same_keys_sum_exactly(
    spark: SparkSession, server: ServerProcess, client: Client
) -> None:
    n = 40_000
    df = spark.range(n, numPartitions=4).select(
        F.concat(F.lit("c"), (F.col("id") % 10).cast("string")).alias("pkey"),
        F.concat(F.lit("n"), (F.col("id") % 3).cast("string")).alias("lkey"),
        (F.col("id") % 7).alias("amount"),
    )
    expected: Counter[tuple[str, str]] = Counter()
    for i in range(n):
        expected[(f"c{i % 10}", f"n{i % 3}")] += i % 7
    for exactly_once in ("true", "false"):
        table = _table(client, f"incr_{exactly_once}")
        _write(df, server, table, mode="increment", exactlyOnce=exactly_once)
        assert _numbers(spark, server, table) == expected
    # A second job adds again (a new job is not a retry).
    table = f"{NS}/incr_true"
    _write(df, server, table, mode="increment")
    assert _numbers(spark, server, table) == {k: 2 * v for k, v in expected.items()}
    lkeys = _reader(spark, server, table, binary="true", includeMarkers="true").select("lkey")
    markers = [r.lkey for r in lkeys.collect() if bytes(r.lkey).startswith(MARKER_PREFIX)]
    assert len(markers) >= 10  # one per pkey (and partition), hidden from ordinary reads


# ------------------------------------------------------------------------------ streaming


def _events(directory: Path, name: str, events: list[tuple[str, str, int]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"pkey": p, "lkey": k, "amount": a}) for p, k, a in events]
    tmp = directory / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(directory / name)


def _run_stream(
    spark: SparkSession,
    server: ServerProcess,
    table: str,
    source: Path,
    checkpoint: Path,
    **options: str,
) -> list[dict[str, Any]]:
    stream = (
        spark.readStream.schema("pkey string, lkey string, amount long")
        .option("maxFilesPerTrigger", "1")
        .json(str(source))
    )
    query = (
        stream.writeStream.format("tablekeeper")
        .option("service", server.service)
        .option("table", table)
        .option("mode", "increment")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return list(query.recentProgress)


def _batch_events(seed: int) -> list[tuple[str, str, int]]:
    return [(f"u{(i * seed) % 7}", f"k{i % 3}", i % 5 + 1) for i in range(300)]


def _sums(*batches: list[tuple[str, str, int]]) -> Counter[tuple[str, str]]:
    total: Counter[tuple[str, str]] = Counter()
    for batch in batches:
        for p, k, a in batch:
            total[(p, k)] += a
    return total


def test_streaming_task_failure_after_write_is_retried_without_double_counting(
    spark: SparkSession, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    source = tmp_path / "events"
    a, b = _batch_events(3), _batch_events(5)
    _events(source, "a.json", a)
    _events(source, "b.json", b)

    table = _table(client, "stream_fail")
    failures = tmp_path / "failures"
    progress = _run_stream(
        spark, server, table, source, tmp_path / "ck", failAfterWrite=str(failures)
    )
    assert sorted(p["batchId"] for p in progress) == [0, 1]
    assert len(list(failures.iterdir())) >= 2  # every batch's tasks failed once after writing
    assert _numbers(spark, server, table) == _sums(a, b)

    # Control: the same failures without the markers really count twice.
    control = _table(client, "stream_fail_control")
    _run_stream(
        spark,
        server,
        control,
        source,
        tmp_path / "ck-control",
        failAfterWrite=str(tmp_path / "failures-control"),
        exactlyOnce="false",
    )
    assert _numbers(spark, server, control) == {k: 2 * v for k, v in _sums(a, b).items()}


def test_streaming_restart_from_checkpoint_replays_the_last_batch_once(
    spark: SparkSession, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "events", tmp_path / "ck"
    a, b = _batch_events(3), _batch_events(5)
    table = _table(client, "stream_replay")
    _events(source, "a.json", a)
    first = _run_stream(spark, server, table, source, checkpoint)
    assert [p["batchId"] for p in first] == [0]
    assert _numbers(spark, server, table) == _sums(a)

    # A crash after the sink wrote batch 0 but before Spark recorded its commit: on restart
    # the query replays batch 0 (same offsets, same query id).
    commit = checkpoint / "commits" / "0"
    assert commit.exists()
    commit.unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    replay = _run_stream(spark, server, table, source, checkpoint)
    assert [(p["batchId"], p["numInputRows"]) for p in replay] == [(0, len(a))]
    assert _numbers(spark, server, table) == _sums(a)

    _events(source, "b.json", b)
    after = _run_stream(spark, server, table, source, checkpoint)
    assert [p["batchId"] for p in after] == [1]
    assert _numbers(spark, server, table) == _sums(a, b)


# ------------------------------------------------------------------------------ bad input


def test_bad_input_is_a_clear_error_before_any_write(
    spark: SparkSession, server: ServerProcess, client: Client
) -> None:
    table = _table(client, "bad_input")
    good = spark.createDataFrame([("p", "k", "v")], "pkey string, lkey string, value string")

    with pytest.raises(Exception, match=r"'spark/no_such_table' does not exist"):
        _write(good, server, f"{NS}/no_such_table")
    with pytest.raises(Exception, match=r"'nope/t' does not exist"):
        _reader(spark, server, "nope/t").count()

    wrong_type = spark.createDataFrame([("p", "k", 1)], "pkey string, lkey string, value int")
    with pytest.raises(Exception, match="column value is int; expected string or binary"):
        _write(wrong_type, server, table)
    amount_text = spark.createDataFrame(
        [("p", "k", "1")], "pkey string, lkey string, amount string"
    )
    with pytest.raises(Exception, match="column amount is string; expected an integer type"):
        _write(amount_text, server, table, mode="increment")
    with pytest.raises(Exception, match="missing: value"):
        _write(good.drop("value"), server, table)
    with pytest.raises(Exception, match="unexpected columns: extra"):
        _write(good.withColumn("extra", F.lit(1)), server, table)
    with pytest.raises(Exception, match="option mode='upsert'"):
        _write(good, server, table, mode="upsert")
    with pytest.raises(Exception, match="overwrite"):
        good.write.format("tablekeeper").mode("overwrite").option("service", server.service).option(
            "table", table
        ).save()

    # Null keys anywhere in a 4-partition DataFrame: `save` checks every row first.
    rows = [(f"p{i}", f"k{i}", f"v{i}") for i in range(400)]
    rows[399] = (None, "k", "v")  # type: ignore[assignment]
    with_null = spark.createDataFrame(rows, "pkey string, lkey string, value string").repartition(4)
    with pytest.raises(InputError, match="1 rows with a null pkey"):
        save(with_null, table, service=server.service)
    rows[399] = ("p", "", "v")
    empty_lkey = spark.createDataFrame(rows, "pkey string, lkey string, value string")
    with pytest.raises(InputError, match="1 rows with an empty lkey"):
        save(empty_lkey, table, service=server.service)
    # The plain format path: each task checks all its rows before sending any (other tasks of
    # a multi-partition DataFrame may have written: `save` is the whole-DataFrame check).
    rows[399] = ("p", None, "v")  # type: ignore[assignment]
    one_partition = spark.createDataFrame(rows, "pkey string, lkey string, value string")
    with pytest.raises(Exception, match="column lkey is null in row 399 of partition 0"):
        _write(one_partition.coalesce(1), server, table)
    increments = spark.createDataFrame(
        [("p", "k", 1)] * 5000 + [("p", "k", None)], "pkey string, lkey string, amount long"
    ).coalesce(1)
    for exactly_once in ("true", "false"):
        with pytest.raises(Exception, match="column amount is null in row 5000"):
            _write(increments, server, table, mode="increment", exactlyOnce=exactly_once)
    assert _all_keys(client, table) == 0  # nothing at all was written

    save(good, table, service=server.service)
    assert [
        tuple(r) for r in _reader(spark, server, table).select("pkey", "lkey", "value").collect()
    ] == [("p", "k", "v")]


# ------------------------------------------------------------------------------ jobs


def test_counters_job_counts_per_key_and_window_from_json_and_parquet(
    spark: SparkSession, server: ServerProcess, tmp_path: Path
) -> None:
    base = int(datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp())
    events = [{"user": f"user-{i % 4}", "ts": base + i * 97, "bytes": i} for i in range(200)] + [
        {"user": None, "ts": base, "bytes": 1}
    ]
    expected: Counter[tuple[str, str]] = Counter()
    for e in events[:-1]:
        hour = datetime.fromtimestamp(e["ts"] - e["ts"] % 3600, UTC)  # type: ignore[operator]
        expected[(str(e["user"]), "total")] += 1
        expected[(str(e["user"]), f"1h@{hour:%Y-%m-%dT%H:%M:%SZ}")] += 1
    json_dir = tmp_path / "json"
    json_dir.mkdir()
    (json_dir / "events.json").write_text("\n".join(json.dumps(e) for e in events))
    parquet_dir = str(tmp_path / "parquet")
    spark.read.json(str(json_dir)).write.parquet(parquet_dir)

    common = ["--service", server.service, "--key-col", "user", "--time-col", "ts",
              "--master", "local[2,2]", "--create-table"]  # fmt: skip
    assert counters_job.main([*common, "--table", f"{NS}/cnt_json", "--input", str(json_dir)]) == 0
    assert _numbers(spark, server, f"{NS}/cnt_json") == expected
    args = [*common, "--table", f"{NS}/cnt_pq", "--input", parquet_dir, "--format", "parquet"]
    assert counters_job.main(args) == 0
    assert _numbers(spark, server, f"{NS}/cnt_pq") == expected

    # Streaming mode: a second run sees no new file and counts nothing twice.
    stream = [*common, "--table", f"{NS}/cnt_stream", "--input", str(json_dir), "--stream",
              "--checkpoint", str(tmp_path / "ck")]  # fmt: skip
    assert counters_job.main(stream) == 0
    assert counters_job.main(stream) == 0
    assert _numbers(spark, server, f"{NS}/cnt_stream") == expected
    assert counters_job.main([*common, "--table", "bad", "--input", str(json_dir)]) == 2


def test_export_job_writes_the_table_to_parquet(
    spark: SparkSession, server: ServerProcess, loaded: tuple[str, DataFrame], tmp_path: Path
) -> None:
    table, written = loaded
    output = str(tmp_path / "export.parquet")
    assert export_job.main(["--service", server.service, "--table", table, "--output", output,
                            "--master", "local[2,2]"]) == 0  # fmt: skip
    exported = spark.read.parquet(output)
    assert [(f.name, f.dataType) for f in exported.schema] == [
        (f.name, f.dataType) for f in read_schema()
    ]
    assert exported.count() == ROWS
    assert written.exceptAll(exported.select("pkey", "lkey", "value")).count() == 0
    shutil.rmtree(output)
