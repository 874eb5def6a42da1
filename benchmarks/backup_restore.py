#!/usr/bin/env python3
"""Backup and restore benchmark: `tablekeeper admin backup` and `admin restore` of N keys.

One fresh standalone server (data, WAL and checkpoints in one data directory), one table:

  load       N keys (default 1,000,000; pkey = lkey = k0000000..., incompressible values of
             --value-size bytes) with the SDK's AsyncClient, `batch_put`s of --batch keys,
             --concurrency in flight (benchmarks/checkpoint.py's loader).
  (a)        `tablekeeper admin backup DIR --table bench/t`: wall time (each range is
             checkpointed first: this first one uploads every SST), files and bytes.
  (b)        a second backup into another directory, nothing written in between: the ranges'
             checkpoints upload nothing new; what is left is streaming and checking the files.
  (c)        `tablekeeper admin restore DIR --data-dir NEW` (checks every SHA-256, then writes
             each range as its checkpoint): wall time.
  (d)        a server on NEW: time to SERVING, to a read in every range (ranges restore their
             checkpoint on first use), then --verify-sample random keys read back and compared.

With --write-during, (a) runs while one more client puts new keys one at a time, and the
report gives that client's puts/s before and during the backup (the backup is online).

Prints a table; writes JSON to benchmarks/out/backup-<UTC timestamp>.json (or --out).

    .venv/bin/python benchmarks/backup_restore.py                 # 1M keys
    .venv/bin/python benchmarks/backup_restore.py --keys 100000   # a quick one
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support and benchmarks.*

from benchmarks.checkpoint import (  # noqa: E402
    NS,
    TABLE,
    Values,
    first_reads,
    git_info,
    load,
    mib,
    one_key_per_range,
    tree_bytes,
    verify_sample,
)
from tablekeeper import Client  # noqa: E402
from tests.support.server import ServerProcess, stop_all  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
TABLEKEEPER = Path(sys.executable).parent / "tablekeeper"


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def tk(*args: str) -> dict[str, Any]:
    """Run the CLI with `-o json`; returns its summary and wall seconds (progress to stderr)."""
    started = time.monotonic()
    done = subprocess.run(
        [str(TABLEKEEPER), *args, "-o", "json"], stdout=subprocess.PIPE, text=True, timeout=7200
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"tablekeeper {' '.join(args)} failed ({done.returncode})")
    summary: dict[str, Any] = json.loads(done.stdout)
    return {**summary, "wall_s": wall}


class Writer:
    """One client putting new keys one at a time, timestamping each acknowledgement."""

    def __init__(self, service: str) -> None:
        self._client = Client(service)
        self._table = self._client.table(NS, TABLE)
        self._stop = threading.Event()
        self.acked: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self._table.put(f"w{n}", f"w{n}", b"x" * 100)
            self.acked.append(time.monotonic())
            n += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._client.close()

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.acked if start <= t < end) / max(end - start, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--ranges", type=int, default=4, help="table ranges (default 4)")
    parser.add_argument("--batch", type=int, default=1000, help="keys per batch_put")
    parser.add_argument("--concurrency", type=int, default=8, help="batch_puts in flight")
    parser.add_argument("--verify-sample", type=int, default=2000)
    parser.add_argument("--write-during", action="store_true", help="a writer during (a)")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tk-backup-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    values = Values(args.value_size)
    report: dict[str, Any] = {
        "config": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"
        },
        "environment": {
            "git": git_info(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": len(__import__("os").sched_getaffinity(0)),
        },
    }
    source = ServerProcess(work / "source", metrics_port=0)
    restored = ServerProcess(work / "restored", metrics_port=0)
    writer: Writer | None = None
    try:
        source.start(600)
        with Client(source.service) as client:
            client.create_namespace(NS)
            client.create_table(NS, TABLE, ranges=args.ranges)
        eprint(f"loading {args.keys:,} keys ...")
        seconds = asyncio.run(
            load(source.service, 0, args.keys, values, args.batch, args.concurrency)
        )
        report["load"] = {"keys": args.keys, "seconds": seconds}
        eprint(f"loaded in {seconds:.1f}s; backup (a) ...")

        table = ["--table", f"{NS}/{TABLE}", "--service", source.service]
        if args.write_during:
            writer = Writer(source.service)
            writer.start()
            time.sleep(5)
        began = time.monotonic()
        report["backup_first"] = tk("admin", "backup", str(work / "backup-a"), *table)
        ended = time.monotonic()
        if writer is not None:
            writer.stop()
            report["writes_during_backup"] = {
                "puts_per_s_before": writer.rate(began - 5, began),
                "puts_per_s_during": writer.rate(began, ended),
            }
            writer = None
        eprint("backup (b) ...")
        report["backup_second"] = tk("admin", "backup", str(work / "backup-b"), *table)
        report["backup_bytes_on_disk"] = tree_bytes(work / "backup-b")
        source.stop(300)

        eprint("restore (c) ...")
        report["restore"] = tk(
            "admin", "restore", str(work / "backup-b"), "--data-dir", str(restored.data_dir)
        )
        eprint("start the restored server (d) ...")
        started = time.monotonic()
        restored.start(600, poll_s=0.02)
        serving_s = time.monotonic() - started
        probe = one_key_per_range(0, args.keys, args.ranges)
        first_read_s, all_ranges_s = asyncio.run(
            first_reads(restored.service, probe, values, started)
        )
        sample = args.verify_sample
        checked = asyncio.run(verify_sample(restored.service, args.keys, values, sample))
        report["restored_server"] = {
            "serving_s": serving_s,
            "first_read_s": first_read_s,
            "all_ranges_read_s": all_ranges_s,
            "verified_keys": checked + len(probe),
        }
    finally:
        if writer is not None:
            writer.stop()
        stop_all([source, restored], 300)
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)

    a, b, r, s = (
        report["backup_first"],
        report["backup_second"],
        report["restore"],
        report["restored_server"],
    )
    lines = [
        ("keys", f"{args.keys:,} x {args.value_size} B, {args.ranges} ranges"),
        (
            "(a) backup, first",
            f"{a['wall_s']:.2f}s: {a['ranges']} ranges, {a['files']} files, {mib(a['bytes'])}",
        ),
        ("(b) backup, again", f"{b['wall_s']:.2f}s: {b['files']} files, {mib(b['bytes'])}"),
        ("(c) restore", f"{r['wall_s']:.2f}s ({r['files']} files, {mib(r['bytes'])} written)"),
        (
            "(d) restored server",
            f"serving {s['serving_s']:.2f}s, every range read {s['all_ranges_read_s']:.2f}s, "
            f"{s['verified_keys']} keys verified",
        ),
    ]
    if "writes_during_backup" in report:
        w = report["writes_during_backup"]
        lines.append(
            (
                "puts/s of one client",
                f"{w['puts_per_s_before']:.0f} before, {w['puts_per_s_during']:.0f} during (a)",
            )
        )
    for label, text in lines:
        print(f"{label:<22} {text}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or OUT_DIR / f"backup-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
