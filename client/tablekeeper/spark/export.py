"""Export job: a TableKeeper table to Parquet, read range by range in parallel.

    python -m tablekeeper.spark.export --service bk://127.0.0.1:4181 --table app/users \\
        --output /data/users.parquet [--binary] [--overwrite] [--master local[2]]

The Parquet files have the read schema: pkey, lkey, value (string, or binary with `--binary`),
is_number, number_value, version, create_revision, mod_revision. Marker keys of effectively-once
writes are not exported. Each range is scanned in pages, each page a consistent read; the export
as a whole is not a snapshot of the table if it is written to meanwhile.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from tablekeeper.client import DEFAULT_SERVICE
from tablekeeper.spark.source import NAME


def export(
    spark: SparkSession,
    service: str,
    table: str,
    output: str,
    *,
    binary: bool = False,
    overwrite: bool = False,
    page_size: int = 1000,
) -> int:
    """Write `table` to Parquet at `output`; returns the number of rows written."""
    df = (
        spark.read.format(NAME)
        .option("service", service)
        .option("table", table)
        .option("binary", str(binary).lower())
        .option("pageSize", str(page_size))
        .load()
    )
    df.write.mode("overwrite" if overwrite else "errorifexists").parquet(output)
    return int(spark.read.parquet(output).count())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tablekeeper.spark.export",
        description="Export a TableKeeper table to Parquet.",
    )
    parser.add_argument("--service", default=DEFAULT_SERVICE, help="bk://HOST:PORT")
    parser.add_argument("--table", required=True, help="namespace/table")
    parser.add_argument("--output", required=True, help="Parquet output directory")
    parser.add_argument("--binary", action="store_true", help="keys and values as binary")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    from tablekeeper.spark.session import get_session

    spark = get_session(args.master, "tablekeeper-export")
    started = time.monotonic()
    try:
        rows = export(
            spark,
            args.service,
            args.table,
            args.output,
            binary=args.binary,
            overwrite=args.overwrite,
            page_size=args.page_size,
        )
    except Exception as exc:  # Spark wraps the connector's errors; show the message, not a trace
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    print(f"exported {rows} rows of {args.table} to {args.output} in {elapsed:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
