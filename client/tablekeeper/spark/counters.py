"""Counters job: events in, per-key and per-time-window counts out, applied as increments.

    python -m tablekeeper.spark.counters --service bk://127.0.0.1:4181 --table app/counters \\
        --input events/ --format json --key-col user --time-col ts --window 1h

Every event adds `amount` (1, or the value of `--value-col`) to two counters of pkey = its key:

- lkey `total`: the key's count over all time;
- lkey `<window>@<start>` (e.g. `1h@2024-05-01T10:00:00Z`): its count in that time window
  (tumbling windows, UTC).

Events without a key or a time are skipped and counted in the summary line. Counts are summed in
Spark (one increment per counter per job, not per event) and applied with marker-guarded txns, so
a retried task never counts twice.

Batch mode (default) counts every file under `--input` once per run: running it twice on the same
files counts them twice. `--stream --checkpoint DIR` runs it as a Structured Streaming query
(trigger availableNow): each run counts only files it has not seen, and a run that crashed is
replayed from the checkpoint without double counting (effectively-once per micro-batch).

The input is JSON lines (`--format json`) or Parquet (`--format parquet`); time values may be
timestamps, ISO-8601 strings, or numbers of seconds (or ms with `--time-unit ms`) since the epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.types import NumericType, StringType, TimestampNTZType, TimestampType

from tablekeeper.client import DEFAULT_SERVICE, Client
from tablekeeper.errors import NamespaceExistsError, TableExistsError
from tablekeeper.spark.source import NAME

TOTAL_LKEY = "total"
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def window_duration(spec: str) -> str:
    """`1h` / `15m` / `30s` / `1d` (or Spark's own `1 hour`) as a Spark interval string."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", spec)
    if match:
        return f"{int(match.group(1))} {_UNITS[match.group(2)]}"
    if re.fullmatch(r"\s*\d+\s+(second|minute|hour|day|week)s?\s*", spec):
        return spec.strip()
    raise ValueError(f"window {spec!r}: expected e.g. 30s, 15m, 1h or 1d")


def event_time(df: DataFrame, column: str, unit: str) -> Column:
    data_type = df.schema[column].dataType
    value = F.col(column)
    if isinstance(data_type, TimestampType | TimestampNTZType):
        return value.cast("timestamp")
    if isinstance(data_type, NumericType):
        if unit == "ms":
            return F.timestamp_millis(value.cast("long"))
        return F.timestamp_seconds(value)
    if isinstance(data_type, StringType):
        return F.to_timestamp(value)
    raise ValueError(f"time column {column} is {data_type.simpleString()}; expected a timestamp")


def increments(
    events: DataFrame,
    *,
    key_col: str,
    time_col: str,
    window: str,
    value_col: str | None = None,
    time_unit: str = "s",
) -> DataFrame:
    """Rows (pkey, lkey, amount): per event, its `total` counter and its window counter.

    Not aggregated (works on streams); `counts` sums them for a batch job.
    """
    for column in (key_col, time_col, *([value_col] if value_col else [])):
        if column not in events.columns:
            raise ValueError(
                f"the events have no column {column!r} (they have {', '.join(events.columns)})"
            )
    amount = F.lit(1).cast("long") if value_col is None else F.col(value_col).cast("long")
    start = F.window(event_time(events, time_col, time_unit), window_duration(window)).start
    label = F.concat(F.lit(f"{window.strip()}@"), F.date_format(start, "yyyy-MM-dd'T'HH:mm:ss'Z'"))
    rows = events.select(
        F.col(key_col).cast("string").alias("pkey"),
        label.alias("window_lkey"),
        amount.alias("amount"),
    ).where(F.col("pkey").isNotNull() & F.col("window_lkey").isNotNull())
    if value_col is not None:
        rows = rows.where(F.col("amount").isNotNull())
    return rows.select(
        "pkey",
        F.explode(F.array(F.lit(TOTAL_LKEY), F.col("window_lkey"))).alias("lkey"),
        "amount",
    )


def counts(rows: DataFrame) -> DataFrame:
    return rows.groupBy("pkey", "lkey").agg(F.sum("amount").cast("long").alias("amount"))


def read_events(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    if fmt not in ("json", "parquet"):
        raise ValueError(f"--format {fmt!r}: expected json or parquet")
    return spark.read.format(fmt).load(path)


def ensure_table(service: str, table: str, ranges: int) -> None:
    namespace, _, name = table.partition("/")
    with Client(service) as client:
        with contextlib.suppress(NamespaceExistsError):
            client.create_namespace(namespace)
        with contextlib.suppress(TableExistsError):
            client.create_table(namespace, name, ranges=ranges)


def run_batch(
    spark: SparkSession, args: argparse.Namespace, writer_options: dict[str, str]
) -> tuple[int, int, int]:
    """Count and apply; returns (events, skipped events, counters written)."""
    events = read_events(spark, args.input, args.format).cache()
    try:
        rows = increments(
            events,
            key_col=args.key_col,
            time_col=args.time_col,
            window=args.window,
            value_col=args.value_col,
            time_unit=args.time_unit,
        )
        totals = counts(rows).cache()
        n_events = events.count()
        n_counted = rows.where(F.col("lkey") == TOTAL_LKEY).count()
        n_counters = totals.count()
        totals.write.format(NAME).mode("append").options(**writer_options).save()
        totals.unpersist()
    finally:
        events.unpersist()
    return n_events, n_events - n_counted, n_counters


def run_stream(
    spark: SparkSession, args: argparse.Namespace, writer_options: dict[str, str]
) -> int:
    """Process the files not seen before (trigger availableNow); returns input rows."""
    if not args.checkpoint:
        raise ValueError("--stream needs --checkpoint DIR")
    schema = read_events(spark, args.input, args.format).schema
    events = spark.readStream.format(args.format).schema(schema).load(args.input)
    rows = increments(
        events,
        key_col=args.key_col,
        time_col=args.time_col,
        window=args.window,
        value_col=args.value_col,
        time_unit=args.time_unit,
    )
    query = (
        rows.writeStream.format(NAME)
        .options(**writer_options)
        .option("checkpointLocation", args.checkpoint)
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tablekeeper.spark.counters",
        description="Count events per key and per time window into TableKeeper counters.",
    )
    parser.add_argument("--service", default=DEFAULT_SERVICE, help="bk://HOST:PORT")
    parser.add_argument("--table", required=True, help="namespace/table of the counters")
    parser.add_argument("--input", required=True, help="a file or directory of events")
    parser.add_argument("--format", default="json", choices=["json", "parquet"])
    parser.add_argument("--key-col", default="key", help="the event's key column (the pkey)")
    parser.add_argument("--time-col", default="ts", help="the event's time column")
    parser.add_argument("--time-unit", default="s", choices=["s", "ms"], help="numeric times")
    parser.add_argument("--window", default="1h", help="tumbling window: 30s, 15m, 1h, 1d")
    parser.add_argument("--value-col", help="add this column's value instead of 1 per event")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--create-table", action="store_true", help="create it if missing")
    parser.add_argument("--ranges", type=int, default=4, help="ranges of a created table")
    parser.add_argument("--writer-id", default="counters", help="marker scope (batch mode)")
    parser.add_argument("--stream", action="store_true", help="incremental, with --checkpoint")
    parser.add_argument("--checkpoint", help="checkpoint directory of --stream")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        window_duration(args.window)
        if "/" not in args.table:
            raise ValueError(f'--table {args.table!r}: expected "namespace/table"')
        if args.create_table:
            ensure_table(args.service, args.table, args.ranges)
        from tablekeeper.spark.session import get_session

        spark = get_session(args.master, "tablekeeper-counters")
        writer_options = {
            "service": args.service,
            "table": args.table,
            "mode": "increment",
            "writerId": args.writer_id,
        }
        started = time.monotonic()
        if args.stream:
            n_rows = run_stream(spark, args, writer_options)
            print(
                f"counted {n_rows} new events into {args.table} "
                f"in {time.monotonic() - started:.1f}s (stream, checkpoint {args.checkpoint})"
            )
        else:
            n_events, n_skipped, n_counters = run_batch(spark, args, writer_options)
            print(
                f"counted {n_events - n_skipped} events ({n_skipped} skipped: no key or time) "
                f"into {n_counters} counters of {args.table} in {time.monotonic() - started:.1f}s"
            )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Spark wraps the connector's errors; show the message
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
