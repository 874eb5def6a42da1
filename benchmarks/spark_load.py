#!/usr/bin/env python3
"""Bulk load and export with Spark (`tablekeeper.spark`) versus one SDK client.

    .venv/bin/python benchmarks/spark_load.py [--rows 1000000] [--master local[2]]
                                              [--service bk://HOST:PORT] [--json out.json]

Without --service it starts a standalone server of its own (temporary data directory). The
same rows go to fresh 8-range tables three ways:

1. `sdk-batch`: one synchronous `Client`, `table.batch_put` of 1,000 rows at a time, one call
   after the other (the SDK's bulk API).
2. `sdk-batch-x4`: one `AsyncClient` with 4 `batch_put` calls of 1,000 rows in flight.
3. `spark`: `df.write.format("tablekeeper")` from `spark.range(rows)` on `--master` with the
   default batchSize 1000 and maxInFlight 2 per task; timed from `save()` to its return (the
   session is already up; its start-up time is printed separately).

Then the Spark table is read back (`count()`: a full scan, one partition per range) and exported
to Parquet with `tablekeeper.spark.export`. Rows: pkey `p{i % 10000}`, lkey `k{i}`, a 32-byte
value. Every load is checked by reading back the row count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tablekeeper import AsyncClient, Client, NamespaceExistsError  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

NS = "bench"
BATCH = 1000


def row(i: int) -> tuple[str, str, str]:
    return f"p{i % 10000}", f"k{i}", f"{i:032d}"


def chunks(rows: int) -> Iterator[list[tuple[str, str, str]]]:
    for start in range(0, rows, BATCH):
        yield [row(i) for i in range(start, min(rows, start + BATCH))]


def sdk_batch(service: str, table: str, rows: int) -> float:
    with Client(service) as client:
        handle = client.table(NS, table)
        started = time.perf_counter()
        for items in chunks(rows):
            errors = handle.batch_put(items)
            if any(errors):
                raise RuntimeError(f"batch_put failed: {next(e for e in errors if e)}")
        return time.perf_counter() - started


def sdk_batch_concurrent(service: str, table: str, rows: int, in_flight: int = 4) -> float:
    async def run() -> float:
        async with AsyncClient(service, coalesce=False) as client:
            handle = await client.table(NS, table)
            semaphore = asyncio.Semaphore(in_flight)

            async def one(items: list[tuple[str, str, str]]) -> None:
                try:
                    errors = await handle.batch_put(items)
                finally:
                    semaphore.release()
                if any(errors):
                    raise RuntimeError(f"batch_put failed: {next(e for e in errors if e)}")

            started = time.perf_counter()
            tasks = []
            for items in chunks(rows):
                await semaphore.acquire()
                tasks.append(asyncio.create_task(one(items)))
            await asyncio.gather(*tasks)
            return time.perf_counter() - started

    return asyncio.run(run())


def count_keys(service: str, table: str) -> int:
    from tablekeeper.bulk import scan_range, table_layout

    async def run() -> int:
        async with AsyncClient(service) as client:
            layout = await table_layout(client, NS, table)
            total = 0
            for r in layout.ranges:
                async for page in scan_range(
                    client, layout.table_id, r.range_id, page_size=5000, keys_only=True
                ):
                    total += len(page)
            return total

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--service", help="an existing server (default: start one)")
    parser.add_argument("--skip-sdk", action="store_true", help="only the Spark load and export")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="tk-spark-bench-"))
    server: ServerProcess | None = None
    results: dict[str, object] = {"rows": args.rows, "master": args.master, "cpus": os.cpu_count()}
    try:
        service = args.service
        if service is None:
            server = ServerProcess(workdir / "data").start()
            service = server.service
        run_id = time.strftime("%H%M%S")
        tables = {name: f"{name}_{run_id}" for name in ("sdk", "sdkx4", "spark")}
        with Client(service) as client:
            with contextlib.suppress(NamespaceExistsError):
                client.create_namespace(NS)
            for table in tables.values():
                client.create_table(NS, table, ranges=8)

        def report(name: str, seconds: float, rows: int) -> None:
            results[name] = {"seconds": round(seconds, 2), "rows_per_s": round(rows / seconds)}
            print(f"{name:<14} {rows:>9} rows  {seconds:7.1f} s  {rows / seconds:>9,.0f} rows/s")

        print(f"{args.rows} rows, master {args.master}, {os.cpu_count()} CPUs, server {service}")
        if not args.skip_sdk:
            report("sdk-batch", sdk_batch(service, tables["sdk"], args.rows), args.rows)
            assert count_keys(service, tables["sdk"]) == args.rows
            report(
                "sdk-batch-x4",
                sdk_batch_concurrent(service, tables["sdkx4"], args.rows),
                args.rows,
            )
            assert count_keys(service, tables["sdkx4"]) == args.rows

        from pyspark.sql import functions as F  # noqa: N812

        from tablekeeper.spark.export import export
        from tablekeeper.spark.session import get_session

        started = time.perf_counter()
        spark = get_session(args.master, "tablekeeper-bench", **{"spark.driver.memory": "1g"})
        spark.range(1).count()
        print(f"(Spark session up in {time.perf_counter() - started:.1f} s)")
        df = spark.range(args.rows).select(
            F.concat(F.lit("p"), (F.col("id") % 10000).cast("string")).alias("pkey"),
            F.concat(F.lit("k"), F.col("id").cast("string")).alias("lkey"),
            F.lpad(F.col("id").cast("string"), 32, "0").alias("value"),
        )
        table = f"{NS}/{tables['spark']}"
        partitions = df.rdd.getNumPartitions()
        started = time.perf_counter()
        (
            df.write.format("tablekeeper")
            .mode("append")
            .option("service", service)
            .option("table", table)
            .save()
        )
        report(f"spark-load/{partitions}p", time.perf_counter() - started, args.rows)

        reader = spark.read.format("tablekeeper").option("service", service).option("table", table)
        started = time.perf_counter()
        read_rows = reader.load().count()
        report("spark-scan", time.perf_counter() - started, read_rows)
        assert read_rows == args.rows, read_rows

        output = str(workdir / "export.parquet")
        started = time.perf_counter()
        exported = export(spark, service, table, output)
        report("parquet-export", time.perf_counter() - started, exported)
        assert exported == args.rows, exported
        size = sum(p.stat().st_size for p in Path(output).rglob("*.parquet"))
        print(f"(Parquet: {size / 1e6:.1f} MB)")
        spark.stop()
        results["load_average"] = os.getloadavg()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
