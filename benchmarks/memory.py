#!/usr/bin/env python3
"""Memory at scale (issue 12): a standalone server's resident memory while it is loaded with
many keys, and after.

One fresh standalone server (defaults, or --server-args), one table of --ranges ranges; N keys
(default 10,000,000; pkey = lkey = k0000000..., random incompressible values of --value-size
bytes) put with the SDK's AsyncClient (`batch_put` of --batch keys, --concurrency in flight).
Every tenth of the load, and at the end, the server's resident set (VmRSS from /proc) and its
peak (VmHWM) are read; the end also reports the data directory's size and reads --verify keys
back (random ones, compared). Prints a table; JSON to benchmarks/out/memory-<UTC>.json.

The issue's goal: 10 M keys in one server with RSS under 1 GiB (RocksDB's block cache and
memtables bounded: `--rocksdb-memory`, one budget for every range of the process).

    .venv/bin/python benchmarks/memory.py                      # the 10M-key run (~20 min here)
    .venv/bin/python benchmarks/memory.py --keys 200000        # a quick one
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tablekeeper import AsyncClient, Client, RetryPolicy

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support and benchmarks._common

from benchmarks._common import git_info, positive_int  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

NS, TABLE = "bench", "mem"


def key(i: int) -> str:
    return f"k{i:09d}"


def proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of process `pid`, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(rest.split()[0]) * 1024
    return found["VmRSS"], found["VmHWM"]


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def load(
    service: str,
    count: int,
    value: bytes,
    batch: int,
    concurrency: int,
    on_progress: Any,
) -> float:
    """Put keys [0, count); returns seconds. Fails on any per-key error."""
    started = time.monotonic()
    retry = RetryPolicy(deadline_s=120.0, call_timeout_s=120.0)
    step = max(count // 10, 1)
    async with AsyncClient(service, retry=retry) as client:
        table = await client.table(NS, TABLE)
        next_start = 0
        done = 0
        next_report = step

        async def worker() -> None:
            nonlocal next_start, done, next_report
            while next_start < count:
                lo = next_start
                hi = min(count, lo + batch)
                next_start = hi
                # Each key its own value (a rotation of one random block): incompressible, cheap.
                items = [(key(i), key(i), value[i % 97 :] + value[: i % 97]) for i in range(lo, hi)]
                results = await table.batch_put(items)
                failed = [r for r in results if r is not None]
                if failed:
                    raise RuntimeError(f"{len(failed)} puts failed, first: {failed[0]!r}")
                done += hi - lo
                if done >= next_report:
                    next_report += step
                    on_progress(done, time.monotonic() - started)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=positive_int, default=10_000_000)
    parser.add_argument("--value-size", type=positive_int, default=100)
    parser.add_argument("--ranges", type=positive_int, default=8)
    parser.add_argument("--batch", type=positive_int, default=1000, help="keys per batch_put")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="batch_puts in flight")
    parser.add_argument("--verify", type=positive_int, default=2000, help="keys read back")
    parser.add_argument(
        "--server-args", default="", help="extra server flags, e.g. '--rocksdb-memory 512MiB'"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    code = git_info()  # the code the server runs (a long run outlasts later commits)
    base = Path(tempfile.mkdtemp(prefix="tk-memory-"))
    server = ServerProcess(
        base / "data", extra_args=["--checkpoint-interval", "0", *shlex.split(args.server_args)]
    ).start()
    assert server.process is not None
    pid = server.process.pid
    rows: list[dict[str, Any]] = []

    def sample(done: int, elapsed_s: float) -> None:
        rss, peak = proc_memory(pid)
        rows.append({"keys": done, "seconds": elapsed_s, "rss": rss, "peak_rss": peak})
        print(
            f"  {done:>12,} keys  {elapsed_s:7.0f} s  {done / elapsed_s:8,.0f} keys/s  "
            f"RSS {rss / 2**20:7.0f} MiB (peak {peak / 2**20:.0f})",
            flush=True,
        )

    try:
        with Client(server.service) as client:
            client.create_namespace(NS)
            client.create_table(NS, TABLE, ranges=args.ranges)
        sample(0, 1e-9)
        value = os.urandom(args.value_size)
        seconds = asyncio.run(
            load(server.service, args.keys, value, args.batch, args.concurrency, sample)
        )
        rss, peak = proc_memory(pid)
        verified = 0
        with Client(server.service) as client:
            table = client.table(NS, TABLE)
            for i in random.sample(range(args.keys), min(args.verify, args.keys)):
                got = table.get(key(i), key(i))
                assert got is not None and got.value == value[i % 97 :] + value[: i % 97], i
                verified += 1
        data_bytes = dir_bytes(base / "data")
        after_rss, after_peak = proc_memory(pid)
    finally:
        server.stop()
    summary = {
        "keys": args.keys,
        "value_size": args.value_size,
        "ranges": args.ranges,
        "server_args": args.server_args,
        "load_s": seconds,
        "keys_per_s": args.keys / seconds,
        "rss_after_load": rss,
        "rss_after_reads": after_rss,
        "peak_rss": max(peak, after_peak),
        "data_dir_bytes": data_bytes,
        "verified": verified,
        "samples": rows,
        "git": code,
        "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_average": os.getloadavg(),
    }
    print()
    print("| keys | load | RSS after load | after reads | peak RSS | data dir | verified |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {args.keys:,} | {seconds:,.0f} s ({args.keys / seconds:,.0f}/s) "
        f"| {rss / 2**20:,.0f} MiB | {after_rss / 2**20:,.0f} MiB | "
        f"{summary['peak_rss'] / 2**20:,.0f} MiB | {data_bytes / 2**30:.2f} GiB | {verified:,} |"
    )
    out = args.out or BENCH_DIR / "out" / (
        "memory-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + ".json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
