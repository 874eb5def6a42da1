"""The real Oxia Java client's puts and gets against TableKeeper's Oxia front-end, and against a
real Oxia server as the anchor.

For each target (`--targets`, in order; `oxia` is the anchor of the ratios when it runs):

* `tk`: a TableKeeper standalone server with `--oxia-port` (namespace `default`, 4 shards);
* `oxia`: a real Oxia server, `oxia standalone --shards 4` (WAL fsync on, its default), from
  `--oxia-bin` (default `$OXIA_BIN`, else .deploy/bin/oxia). The Go module proxy refuses
  Oxia's modules (403), so there is no `go install` for it: build `cmd/` of an Oxia source
  checkout (`cd cmd && go build -o …/.deploy/bin/oxia .`). Without the binary the target is
  skipped with a note and TableKeeper's figures print alone.

A fresh server in a temporary directory per target; then one JVM runs
tests/compat/oxia/OxiaDriver.java's `bench-json` mode (io.github.oxia-db:oxia-client 0.6.2, the
one Pulsar 4.0.7 ships, with its default batching: 5 ms linger, up to 1,000 requests a batch),
which does, over distinct keys `/bench-…/{sync,async}/kNNNNNNNNN` with `--value-bytes` values,
after 200 untimed warm-up puts and gets:

1. `sync-put`: N puts through the sync client, one after another;
2. `sync-get`: N gets of those keys, one after another (each must find its value);
3. `async-put`: N puts through the async client, K (`--in-flight`) at a time, the next started
   as soon as one completes; the client groups what is pending into batches as it does;
4. `async-get`: N gets of those keys, K at a time.

Every call is timed from its start to its completion. Per phase: ops/s (calls / wall time of
the phase), mean/p50/p99/max latency, errors (failed calls, or gets that did not find the
value), the server's CPU per call over the phase (its process and children, from /proc, between
the driver's phase-start and phase-end lines), then TableKeeper's ratio to Oxia (ops/s ratio
> 1: TableKeeper faster; latency and CPU ratio < 1: TableKeeper faster). The JSON goes to
benchmarks/out/ (gitignored).

    .venv/bin/python benchmarks/oxia_client.py                       # N=5,000, K=64, tk,oxia
    .venv/bin/python benchmarks/oxia_client.py --ops 500 --in-flight 16 --targets tk

Needs `java`/`javac` and Pulsar's jars (`deploy/pulsar.sh fetch`, the first run only). Exit
status: 0 ok, 1 a server or the driver failed, 2 some call failed, 130 interrupted. Everything
started here is stopped on every exit path, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._common import (  # noqa: E402
    fmt,
    git_info,
    positive_int,
    sigterm_as_interrupt,
    src_env,
)
from tests.support.caches import pulsar_classpath  # noqa: E402
from tests.support.oxia_server import SHARDS, OxiaServer, default_binary  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "out"
DRIVER_SOURCE = REPO / "tests" / "compat" / "oxia" / "OxiaDriver.java"
TARGETS = ("tk", "oxia")
DRIVER_TIMEOUT_S = 1800.0


class BenchError(Exception):
    pass


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def wait_port(port: int, process: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    """Until 127.0.0.1:`port` accepts a connection; fails if `process` exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise BenchError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise BenchError(f"{what} not listening on {port} after {timeout_s:.0f}s") from None
            time.sleep(0.1)


@contextmanager
def tk_target(workdir: Path) -> Iterator[tuple[str, str, int]]:
    port = free_port()
    server = ServerProcess(
        workdir / "tk" / "data",
        extra_args=["--oxia-port", str(port)],
        env={"PYTHONPATH": src_env()["PYTHONPATH"]},
    )
    try:
        try:
            server.start(timeout_s=120)
            assert server.process is not None
            wait_port(port, server.process, "TableKeeper's Oxia port", 60)
        except (RuntimeError, TimeoutError) as e:
            raise BenchError(f"TableKeeper did not start: {e} (log {server.log_path})") from e
        yield (
            f"127.0.0.1:{port}",
            f"TableKeeper standalone server (--oxia-port {port}, log {server.log_path})",
            server.process.pid,
        )
    finally:
        if server.process is not None:
            try:
                server.stop()
            except Exception as e:  # noqa: BLE001 (never mask the run's own error)
                eprint(f"warning: stopping TableKeeper: {e}")


@contextmanager
def oxia_target(workdir: Path, binary: Path) -> Iterator[tuple[str, str, int]]:
    server = OxiaServer(binary, workdir / "oxia", shards=SHARDS)
    try:
        try:
            server.start(60)
        except RuntimeError as e:
            raise BenchError(str(e)) from e
        yield (
            server.address,
            f"Oxia standalone ({binary}, --shards {SHARDS}, log {server.log_path})",
            server.pid or 0,
        )
    finally:
        server.stop()


def compile_driver(workdir: Path) -> str:
    """javac the driver against Pulsar's jars; the classpath to run it with."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise BenchError("java and javac are needed (the Oxia Java client)")
    classpath = pulsar_classpath()
    classes = workdir / "classes"
    classes.mkdir()
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", classpath, str(DRIVER_SOURCE)],
        check=True,
        timeout=600,
    )
    return f"{classpath}:{classes}"


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` (all its threads) and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total = 0.0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        todo += children.get(current, [])
    return total


def run_driver(
    classpath: str, address: str, ops: int, in_flight: int, value_bytes: int, server_pid: int
) -> Any:
    """The driver's BENCH figures, each phase with `server_cpu_ms_per_op`: the server's CPU
    between the driver's "PHASE start" and "PHASE end" lines over the phase's calls."""
    command = ["java", "-Xmx512m", "-cp", classpath, "OxiaDriver", address, "bench-json"]
    command += [str(ops), str(in_flight), str(value_bytes)]
    with tempfile.TemporaryFile(mode="w+") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        timer = threading.Timer(DRIVER_TIMEOUT_S, process.kill)
        timer.start()
        cpu: dict[str, float] = {}
        lines: list[str] = []
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if line.startswith("PHASE "):
                    _, what, name = line.split()
                    now = process_cpu_s(server_pid)
                    eprint(f"  {name}: {what}")
                    cpu[name] = now - cpu[name] if what == "end" else now
            process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
        err.seek(0)
        errors = err.read()
    out = "".join(lines)
    bench = [line for line in lines if line.startswith("BENCH ")]
    if process.returncode != 0 or not bench:
        raise BenchError(f"driver exited {process.returncode}:\n{out[-3000:]}\n{errors[-3000:]}")
    run = json.loads(bench[-1][len("BENCH ") :])
    for phase in run["phases"]:
        used = cpu.get(phase["phase"])
        phase["server_cpu_ms_per_op"] = used * 1000 / phase["ops"] if used is not None else None
    return run


def print_table(results: dict[str, Any]) -> None:
    print(
        f"{'target':<6} {'phase':<10} {'K':>4} {'ops':>7} {'err':>4} {'ops/s':>9} "
        f"{'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'srv cpu ms/op':>13}"
    )
    for target, run in results.items():
        for p in run["phases"]:
            print(
                f"{target:<6} {p['phase']:<10} {p['in_flight']:>4} {p['ops']:>7} "
                f"{p['errors']:>4} {fmt(p['ops_per_s'], 0):>9} {fmt(p['mean_ms'], 3):>8} "
                f"{fmt(p['p50_ms'], 3):>8} {fmt(p['p99_ms'], 3):>8} {fmt(p['max_ms'], 2):>8} "
                f"{fmt(p.get('server_cpu_ms_per_op'), 3):>13}"
            )


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    if "tk" not in results or "oxia" not in results:
        return []
    anchor = {p["phase"]: p for p in results["oxia"]["phases"]}
    out = []
    for p in results["tk"]["phases"]:
        a = anchor.get(p["phase"])
        if a is None:
            continue

        def r(key: str, p: Any = p, a: Any = a) -> float | None:
            return p[key] / a[key] if p.get(key) is not None and a.get(key) else None

        out.append(
            {
                "phase": p["phase"],
                "ops_per_s": r("ops_per_s"),
                "p50": r("p50_ms"),
                "p99": r("p99_ms"),
                "server_cpu_per_op": r("server_cpu_ms_per_op"),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            "Oxia Java client (0.6.2) put/get latency (sync, one at a time) and throughput "
            "(async, K in flight) against TableKeeper's --oxia-port, with a real Oxia "
            "standalone as the anchor."
        ),
        epilog="Writes the JSON to benchmarks/out/oxia_client-<time>.json.",
    )
    parser.add_argument(
        "--ops", type=positive_int, default=5000, help="calls per phase, distinct keys (5000)"
    )
    parser.add_argument(
        "--in-flight", type=positive_int, default=64, help="K: async calls in flight (64)"
    )
    parser.add_argument("--value-bytes", type=positive_int, default=100, help="value size (100)")
    parser.add_argument(
        "--targets",
        default="tk,oxia",
        help="comma-separated, in order: tk, oxia (default tk,oxia; oxia is the anchor)",
    )
    parser.add_argument(
        "--oxia-bin",
        type=Path,
        default=default_binary(),
        help="the oxia binary (default $OXIA_BIN, else .deploy/bin/oxia)",
    )
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}")

    notes: list[str] = []
    if "oxia" in targets and not args.oxia_bin.is_file():
        note = f"no Oxia binary at {args.oxia_bin}: the oxia target is skipped (no anchor)"
        eprint(f"note: {note}")
        notes.append(note)
        targets.remove("oxia")
    if not targets:
        return 1

    started = datetime.now(UTC)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    status = 0
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="tk-oxia-bench-") as tmp:
        workdir = Path(tmp)
        try:
            classpath = compile_driver(workdir)
            for target in targets:
                manager = (
                    tk_target(workdir) if target == "tk" else oxia_target(workdir, args.oxia_bin)
                )
                with manager as (address, description, pid):
                    eprint(f"{target}: {description} (pid {pid})")
                    run = run_driver(
                        classpath, address, args.ops, args.in_flight, args.value_bytes, pid
                    )
                    run["description"] = description
                    results[target] = run
                    if any(p["errors"] for p in run["phases"]):
                        status = 2
        except KeyboardInterrupt:
            eprint("interrupted")
            return 130
        except (BenchError, subprocess.SubprocessError, OSError) as e:
            eprint(f"error: {e}")
            return 1
    load_after = os.getloadavg()

    print(
        f"Oxia client 0.6.2: N={args.ops} per phase, K={args.in_flight} in flight (async), "
        f"{args.value_bytes}-byte values, {SHARDS} shards"
    )
    print_table(results)
    rs = ratios(results)
    if rs:
        print("\nTableKeeper / Oxia (ops/s > 1: TableKeeper faster; latency < 1: faster)")
        print(f"{'phase':<10} {'ops/s':>7} {'p50':>7} {'p99':>7} {'srv cpu/op':>10}")
        for r in rs:
            print(
                f"{r['phase']:<10} {fmt(r['ops_per_s']):>7} {fmt(r['p50']):>7} {fmt(r['p99']):>7} "
                f"{fmt(r['server_cpu_per_op']):>10}"
            )
    print(
        f"\nload average (1m) before/after: {load_before[0]:.2f} / {load_after[0]:.2f}; "
        f"{os.cpu_count()} CPUs"
    )

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out_path = OUT_DIR / f"oxia_client-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    report = {
        "benchmark": "oxia_client",
        "started": started.isoformat(),
        "git": git_info(),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "args": {
            "ops": args.ops,
            "in_flight": args.in_flight,
            "value_bytes": args.value_bytes,
            "targets": targets,
        },
        "notes": notes,
        "results": results,
        "ratios_tk_over_oxia": rs,
    }
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON: {out_path.relative_to(REPO)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
