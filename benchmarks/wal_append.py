"""Micro-benchmark of the local write-ahead log.

For append groups of 1, 16 and 128 records of 100-byte payloads, prints appends/s, records/s and
the p50/p99 latency of `LocalLogWriter.append` (each call = one write + one fdatasync), then the
rate at which the log is read back and recovered on open. Runs in well under 30 s.

    .venv/bin/python benchmarks/wal_append.py [--dir PATH] [--seconds 4]

Use --dir to measure a particular disk; the default temporary directory may be on tmpfs on some
machines, where syncs cost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from tablekeeper_server.log.local import LocalLogBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import percentile  # noqa: E402

PAYLOAD = b"v" * 100
GROUP_SIZES = (1, 16, 128)


async def bench_group(root: Path, group: int, seconds: float) -> tuple[int, list[float]]:
    backend = LocalLogBackend(root)
    writer = backend.open_writer(f"bench-{group}")
    batch = [PAYLOAD] * group
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        await writer.append(batch)
        latencies.append(time.perf_counter() - started)
    await writer.close()
    return writer.last_sequence, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=None, help="where to create the logs")
    parser.add_argument("--seconds", type=float, default=4.0, help="time per group size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="wal-bench-") as tmp:
        root = Path(tmp)
        print(f"local WAL append, 100-byte payloads, dir {root}")
        print(f"{'group':>6} {'appends/s':>10} {'records/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
        totals: dict[int, int] = {}
        for group in GROUP_SIZES:
            records, latencies = asyncio.run(bench_group(root, group, args.seconds))
            totals[group] = records
            elapsed = sum(latencies)
            latencies.sort()
            p50, p99 = percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3
            print(
                f"{group:>6} {len(latencies) / elapsed:>10.0f} {records / elapsed:>10.0f} "
                f"{p50:>8.3f} {p99:>8.3f}"
            )
        group = max(totals, key=lambda g: totals[g])
        backend = LocalLogBackend(root)
        started = time.perf_counter()
        count = sum(1 for _ in backend.read(f"bench-{group}", 1))
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        writer = backend.open_writer(f"bench-{group}")
        open_s = time.perf_counter() - started
        writer.close_sync()
        print(
            f"read back {count} records in {read_s:.2f} s ({count / read_s:.0f} records/s); "
            f"open_writer (full recovery scan) {open_s:.2f} s"
        )


if __name__ == "__main__":
    main()
