"""TableKeeper for PySpark (Spark 4 Python Data Source API). Needs the `spark` extra.

    from tablekeeper.spark import register
    register(spark)        # the "tablekeeper" format, and filter pushdown for Python sources
    df = (spark.read.format("tablekeeper")
          .option("service", "bk://127.0.0.1:4181").option("table", "app/users").load())
    (df.write.format("tablekeeper").mode("append")
       .option("service", ...).option("table", "app/copy").save())

`save()` is `df.write...save()` plus a check of the whole DataFrame for null or empty keys first,
so bad rows fail the job before anything is written. See README.md in this directory.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from tablekeeper.spark.options import OptionError, Options, parse_options
from tablekeeper.spark.source import (
    NAME,
    InputError,
    RangePartition,
    TableKeeperDataSource,
    WriteStats,
    check_write_schema,
    plan_partitions,
    read_schema,
)

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Register the `tablekeeper` format in this session and enable Python filter pushdown."""
    spark.dataSource.register(TableKeeperDataSource)
    spark.conf.set(PUSHDOWN_CONF, "true")


def check_rows(df: DataFrame, mode: str = "put") -> None:
    """Raise `InputError` if any row has a null pkey / lkey / value (amount), or an empty lkey.
    Runs one Spark job over `df`."""
    third = "value" if mode == "put" else "amount"
    counts = df.select(
        *[F.count(F.when(F.col(c).isNull(), 1)).alias(c) for c in ("pkey", "lkey", third)],
        F.count(F.when(F.length(F.col("lkey")) == 0, 1)).alias("empty_lkey"),
    ).first()
    assert counts is not None
    problems = [f"{counts[c]} rows with a null {c}" for c in ("pkey", "lkey", third) if counts[c]]
    if counts["empty_lkey"]:
        problems.append(f"{counts['empty_lkey']} rows with an empty lkey")
    if problems:
        raise InputError("nothing was written: " + "; ".join(problems))


def save(
    df: DataFrame,
    table: str,
    *,
    service: str | None = None,
    mode: str = "put",
    **options: Any,
) -> None:
    """Write `df` to `table` ("namespace/table") after checking every row (see `check_rows`):
    unlike `df.write...save()`, whose tasks check only their own rows, bad input anywhere in the
    DataFrame fails before any task writes."""
    settings = {"table": table, "mode": mode, **{k: str(v) for k, v in options.items()}}
    if service is not None:
        settings["service"] = service
    parsed = parse_options(settings)
    check_write_schema(df.schema, parsed.mode)
    check_rows(df, parsed.mode)
    df.write.format(NAME).mode("append").options(**settings).save()


__all__ = [
    "NAME",
    "PUSHDOWN_CONF",
    "InputError",
    "OptionError",
    "Options",
    "RangePartition",
    "TableKeeperDataSource",
    "WriteStats",
    "check_rows",
    "check_write_schema",
    "parse_options",
    "plan_partitions",
    "read_schema",
    "register",
    "save",
]
