"""ZooKeeper's client protocol: TableKeeper's `--zookeeper-port` against a real ZooKeeper, in one
run on this machine.

Targets (each started here, on free loopback ports, and stopped at the end):

* `zookeeper`: a real ZooKeeper (deploy/zookeeper.sh: Debian's 3.8, standalone, fsync on), its
  JVM with full JIT and a 1 GiB heap (the script's defaults favour start-up, not throughput);
* `tablekeeper`: a standalone `tablekeeper server --zookeeper-port` (local WAL, fsync per group
  commit), on its default runtime unless `--runtime` says otherwise.

The load generator is the real ZooKeeper Java client (3.9, benchmarks/zookeeper_load, built with
Maven on first use): one session keeping `--inflight` requests in flight (ZooKeeper's clients
pipeline on one connection), per op a warm-up then `--seconds` measured: `create` (new nodes
of `--value-size` bytes), `set` (setData on one of `--keys` nodes), `get` (getData of one),
`children` (getChildren of a node with 10 children), `delete` (the nodes created). For each
cell: ops/s, p50/p99 latency, and the server process's CPU per op (user + system, /proc,
between the measured phase's first request and its last reply; the load generator runs on the
same two cores, so it is not what limits either server more than the other). Then the ratio
TableKeeper/ZooKeeper (ops/s > 1: TableKeeper faster; CPU < 1: TableKeeper cheaper). The
targets take turns per in-flight level, so a slow minute of this shared machine hits both. The
JSON goes to benchmarks/out/ (gitignored).

    .venv/bin/python benchmarks/zookeeper.py                       # 1 and 16 in flight, 5 s each
    .venv/bin/python benchmarks/zookeeper.py --ops get,set --inflight 16 --seconds 10

Exit status: 0 ok, 1 a target or the load generator did not start, 2 some requests failed,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    REPO,
    fmt,
    git_info,
    positive_int,
    proc_cpu_s,
    sigterm_as_interrupt,
    src_env,
    write_report,
)
from tests.support.server import ServerProcess, free_port  # noqa: E402
from tests.support.zookeeper import ZooKeeperProcess  # noqa: E402

LOAD_DIR = REPO / "benchmarks" / "zookeeper_load"
OUT_DIR = REPO / "benchmarks" / "out"
OPS = ("create", "set", "get", "children", "delete")
TARGETS = ("zookeeper", "tablekeeper")


class BenchError(Exception):
    pass


@dataclass
class Cell:
    target: str
    op: str
    inflight: int
    ops: int = 0
    seconds: float = 0.0
    ops_per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    errors: int = 0
    server_cpu_s: float | None = None
    cpu_us_per_op: float | None = None


@dataclass
class Target:
    name: str
    hosts: str
    pid: int | None
    stop: Any = field(repr=False)


def build_load() -> list[str]:
    """The load generator's java command line (building it with Maven if needed)."""
    jar = LOAD_DIR / "target" / "zookeeper-load-0.1.0.jar"
    classpath = LOAD_DIR / "target" / "classpath.txt"
    sources = list((LOAD_DIR / "src").rglob("*.java")) + [LOAD_DIR / "pom.xml"]
    stale = not jar.exists() or not classpath.exists()
    if not stale:
        stale = max(p.stat().st_mtime for p in sources) > jar.stat().st_mtime
    if stale:
        command = [
            "mvn",
            "-q",
            "-B",
            "package",
            "dependency:build-classpath",
            "-Dmdep.outputFile=target/classpath.txt",
        ]
        offline = subprocess.run([*command, "-o"], cwd=LOAD_DIR, capture_output=True, text=True)
        if offline.returncode != 0:
            online = subprocess.run(command, cwd=LOAD_DIR, capture_output=True, text=True)
            if online.returncode != 0:
                raise BenchError(f"mvn package failed:\n{online.stdout}\n{online.stderr}")
    return [
        "java",
        "-Xmx512m",
        "-cp",
        f"{jar}:{classpath.read_text().strip()}",
        "io.tablekeeper.bench.ZkLoad",
    ]


def start_zookeeper(workdir: Path) -> Target:
    zk = ZooKeeperProcess(
        workdir / "zookeeper", env={"ZK_EXTRA_OPTS": "-XX:+UseG1GC", "ZK_HEAP": "-Xmx1g"}
    )
    zk.start(timeout_s=120)
    pid_file = workdir / "zookeeper" / "zookeeper.pid"
    pid = int(pid_file.read_text().strip()) if pid_file.exists() else None
    return Target("zookeeper", zk.hosts, pid, zk.stop)


def start_tablekeeper(workdir: Path, runtime: str | None) -> Target:
    port = free_port()
    extra = ["--zookeeper-port", str(port)]
    if runtime:
        extra += ["--runtime", runtime]
    server = ServerProcess(workdir / "tablekeeper" / "data", extra_args=extra, env=src_env())
    server.start(timeout_s=180)
    assert server.process is not None
    return Target("tablekeeper", f"127.0.0.1:{port}", server.process.pid, server.stop)


def run_load(
    java: list[str], target: Target, inflight: int, args: argparse.Namespace
) -> list[Cell]:
    """One JVM, every op at `inflight` against `target`; the server's CPU read at each op's
    BEGIN and END lines."""
    command = [
        *java,
        "--hosts",
        target.hosts,
        "--ops",
        ",".join(args.ops),
        "--inflight",
        str(inflight),
        "--seconds",
        str(args.seconds),
        "--warmup",
        str(args.warmup),
        "--keys",
        str(args.keys),
        "--value-size",
        str(args.value_size),
    ]
    cells: list[Cell] = []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    cpu_at_begin: float | None = None
    for line in process.stdout:
        if line.startswith("BEGIN "):
            cpu_at_begin = proc_cpu_s(target.pid)
        elif line.startswith("END "):
            cpu_at_end = proc_cpu_s(target.pid)
            result = json.loads(line[4:].replace("NaN", "null"))
            cell = Cell(
                target.name,
                result["op"],
                inflight,
                ops=result["ops"],
                seconds=result["seconds"],
                ops_per_s=result["ops_per_s"],
                p50_ms=result["p50_ms"] if result["p50_ms"] is not None else float("nan"),
                p99_ms=result["p99_ms"] if result["p99_ms"] is not None else float("nan"),
                errors=result["errors"],
            )
            if cpu_at_begin is not None and cpu_at_end is not None:
                cell.server_cpu_s = cpu_at_end - cpu_at_begin
                if cell.ops:
                    cell.cpu_us_per_op = cell.server_cpu_s / cell.ops * 1e6
            cells.append(cell)
            print(row(cell), flush=True)
    stderr = process.stderr.read() if process.stderr is not None else ""
    if process.wait() != 0:
        raise BenchError(f"the load generator failed against {target.name}:\n{stderr[-2000:]}")
    return cells


HEADER = (
    f"{'target':<12} {'op':<9} {'inflight':>8} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
    f"{'cpu us/op':>10} {'errors':>6}"
)


def row(cell: Cell) -> str:
    return (
        f"{cell.target:<12} {cell.op:<9} {cell.inflight:>8} {fmt(cell.ops_per_s, 0):>9} "
        f"{fmt(cell.p50_ms, 3):>8} {fmt(cell.p99_ms, 3):>8} {fmt(cell.cpu_us_per_op, 0):>10} "
        f"{cell.errors:>6}"
    )


def ratios(cells: list[Cell]) -> list[dict[str, Any]]:
    by_key = {(c.target, c.op, c.inflight): c for c in cells}
    out = []
    for (target, op, inflight), cell in by_key.items():
        if target != "tablekeeper":
            continue
        anchor = by_key.get(("zookeeper", op, inflight))
        if anchor is None or not anchor.ops_per_s:
            continue
        cpu = (
            cell.cpu_us_per_op / anchor.cpu_us_per_op
            if cell.cpu_us_per_op and anchor.cpu_us_per_op
            else None
        )
        out.append(
            {
                "op": op,
                "inflight": inflight,
                "ops_per_s": cell.ops_per_s / anchor.ops_per_s,
                "p50": cell.p50_ms / anchor.p50_ms if anchor.p50_ms else None,
                "cpu_per_op": cpu,
            }
        )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, of " + ",".join(OPS))
    parser.add_argument("--inflight", default="1,16", help="comma-separated in-flight levels")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up time per cell")
    parser.add_argument("--keys", type=positive_int, default=1000)
    parser.add_argument("--value-size", type=positive_int, default=100)
    parser.add_argument(
        "--runtime", choices=("envoy", "grpc-aio"), default=None, help="TableKeeper's --runtime"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/out/)")
    args = parser.parse_args(argv)
    args.ops = [op for op in args.ops.split(",") if op]
    args.inflight = [int(n) for n in args.inflight.split(",") if n]
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = [op for op in args.ops if op not in OPS] + [
        t for t in args.targets if t not in TARGETS
    ]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(UTC)
    load_start = os.getloadavg()
    if load_start[0] > 1.0:
        print(f"warning: load average {load_start[0]:.1f} before start; expect noise")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-zookeeper-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    targets: dict[str, Target] = {}
    status = 0
    with sigterm_as_interrupt():
        try:
            java = build_load()
            if "zookeeper" in args.targets:
                targets["zookeeper"] = start_zookeeper(workdir)
            if "tablekeeper" in args.targets:
                targets["tablekeeper"] = start_tablekeeper(workdir, args.runtime)
            print(HEADER)
            for turn, inflight in enumerate(args.inflight):
                order = args.targets if turn % 2 == 0 else list(reversed(args.targets))
                for name in order:
                    cells += run_load(java, targets[name], inflight, args)
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            status = 130
        finally:
            for target in targets.values():
                try:
                    target.stop()
                except Exception as exc:  # noqa: BLE001 (report, stop the others)
                    print(f"stopping {target.name}: {exc}", file=sys.stderr)
            if args.keep_data or status:
                print(f"kept the work directory {workdir}", file=sys.stderr)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if status == 0 and any(c.errors for c in cells):
        status = 2
    rows = ratios(cells)
    if rows:
        print()
    for r in rows:
        print(
            f"ratio tablekeeper/zookeeper  {r['op']:<9} inflight={r['inflight']:<3} "
            f"ops/s x{fmt(r['ops_per_s'])}  p50 x{fmt(r['p50'])}  cpu/op x{fmt(r['cpu_per_op'])}"
        )
    report = {
        "benchmark": "benchmarks/zookeeper.py",
        "started_utc": started.isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "git": git_info(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "cells": [asdict(c) for c in cells],
        "ratios": rows,
        "exit_status": status,
    }
    write_report(
        report,
        args.out or OUT_DIR / f"zookeeper-{started.strftime('%Y%m%dT%H%M%SZ')}.json",
        load_start,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
