"""Pulsar Functions state throughput: TableKeeper vs BookKeeper's own table service (issue 18).

The client is the unmodified BookKeeper Java table client in the shape Pulsar Functions' state
context uses it (server-side routing, unary `Table.increment`), run by
tests/compat/java's IncrementBench with a semaphore bounding the calls in flight.

Two services on this machine, measured alternately (A B A B ...) at each in-flight count:

* TableKeeper: a standalone server on 127.0.0.1, fresh data dir.
* BookKeeper's table service: Pulsar 4.0.7 standalone (deploy/pulsar.sh's cached classpath) in
  ZooKeeper mode (`PULSAR_STANDALONE_USE_ZOOKEEPER=1`) without `--no-stream-storage`, which
  starts the embedded ZooKeeper, one bookie and the stream storage (table service) gRPC server.
  That ZooKeeper (`new InetSocketAddress(port)`) and the table service (`ServerBuilder.forPort`)
  bind the wildcard address whatever the configuration says, so the whole JVM runs in a private
  network namespace (`unshare --net`, only its own loopback up) and the bench client joins that
  namespace with `nsenter --net`: nothing is reachable from outside the namespace.

Usage: .venv/bin/python benchmarks/functions_state.py [--rounds 3] [--seconds 20]
       [--in-flight 1,16,64] [--keys 100] [--only tablekeeper] [--envoy]

`--envoy` adds a third service, TableKeeper with `--runtime envoy`, in the same rounds; the
first TableKeeper then runs `--runtime grpc-aio` (without it, the server's default: Envoy
where pyvoy is installed).
Needs root (unshare/nsenter), java 17, mvn (builds tests/compat/java if stale).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.caches import pulsar_cache  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

JAVA_DIR = REPO / "tests" / "compat" / "java"
JAR = JAVA_DIR / "target" / "bookkeeper-java-client-compat-0.1.0.jar"
JAVA_CP = JAVA_DIR / "target" / "classpath.txt"
PULSAR_CP = pulsar_cache() / "classpath.txt"
STREAM_PORT = 4181  # inside the private network namespace: fixed ports cannot collide

JVM_OPENS = [
    "--add-opens",
    "java.base/java.io=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.net=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
]


def build_java() -> None:
    sources = [JAVA_DIR / "pom.xml", *JAVA_DIR.glob("src/**/*.java")]
    if JAR.exists() and JAVA_CP.exists():
        built = JAR.stat().st_mtime
        if all(s.stat().st_mtime <= built for s in sources):
            return
    cmd = ["mvn", "-q", "-B", "package", "dependency:build-classpath"]
    cmd.append("-Dmdep.outputFile=target/classpath.txt")
    if subprocess.run([*cmd, "-o"], cwd=JAVA_DIR, capture_output=True).returncode != 0:
        subprocess.run(cmd, cwd=JAVA_DIR, check=True)


@contextlib.contextmanager
def tablekeeper(work: Path, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    name = "-".join(("tk-data", *(a.strip("-") for a in extra_args)))
    server = ServerProcess(data_dir=work / name, extra_args=list(extra_args)).start(timeout_s=60)
    try:
        yield server.service
    finally:
        server.stop()


def write_pulsar_conf(conf: Path, tmp: Path) -> None:
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "standalone.conf").write_text(
        "\n".join(
            [
                "clusterName=standalone",
                "brokerServicePort=6650",
                "webServicePort=8080",
                "bindAddress=127.0.0.1",
                "advertisedAddress=127.0.0.1",
                "functionsWorkerEnabled=false",
                "webSocketServiceEnabled=false",
                "transactionCoordinatorEnabled=false",
                "managedLedgerDefaultEnsembleSize=1",
                "managedLedgerDefaultWriteQuorum=1",
                "managedLedgerDefaultAckQuorum=1",
                "managedLedgerCacheSizeMB=32",
                "bookkeeperClientRackawarePolicyEnabled=false",
                f"narExtractionDirectory={tmp}",
                "listeningInterface=lo",
                "allowLoopback=true",
                "httpServerEnabled=false",
                "dbStorage_writeCacheMaxSizeMb=32",
                "dbStorage_readAheadCacheMaxSizeMb=32",
                "dbStorage_rocksDB_blockCacheSize=16777216",
                "",
            ]
        )
    )
    (conf / "log4j2.properties").write_text(
        "\n".join(
            [
                "status = warn",
                "appender.console.type = Console",
                "appender.console.name = STDOUT",
                "appender.console.layout.type = PatternLayout",
                "appender.console.layout.pattern = %d{ISO8601} [%t] %-5level %c{1.} - %msg%n",
                "rootLogger.level = info",
                "rootLogger.appenderRef.stdout.ref = STDOUT",
                "",
            ]
        )
    )


@contextlib.contextmanager
def bookkeeper_table_service(work: Path) -> Iterator[int]:
    """Pulsar standalone with stream storage in a private network namespace; yields its pid."""
    if not PULSAR_CP.exists():
        subprocess.run([str(REPO / "deploy" / "pulsar.sh"), "fetch"], check=True)
    root = work / "pulsar"
    conf, tmp = root / "conf", root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    write_pulsar_conf(conf, tmp)
    java = [
        "java",
        "-Xms256m",
        "-Xmx512m",
        "-XX:MaxDirectMemorySize=512m",
        "-XX:+UseG1GC",
        "-Djava.net.preferIPv4Stack=true",
        f"-Djava.io.tmpdir={tmp}",
        "-Dio.netty.tryReflectionSetAccessible=true",
        *JVM_OPENS,
        f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
        "-Dlog4j2.is.webapp=false",
        "-cp",
        f"{conf}:{PULSAR_CP.read_text().strip()}",
        "org.apache.pulsar.PulsarStandaloneStarter",
        "--config",
        str(conf / "standalone.conf"),
        "--no-functions-worker",
        "--zookeeper-dir",
        str(root / "zk"),
        "--bookkeeper-dir",
        str(root / "bk"),
        "--stream-storage-port",
        str(STREAM_PORT),
        "--wipe-data",
    ]
    script = 'ip link set lo up && exec "$@"'
    log_path = root / "pulsar.log"
    log = open(log_path, "wb")  # noqa: SIM115 (owned by the child)
    env = {**os.environ, "PULSAR_STANDALONE_USE_ZOOKEEPER": "1"}
    process = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", script, "sh", *java],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while b"messaging service is ready" not in log_path.read_bytes():
            if process.poll() is not None:
                raise RuntimeError(f"Pulsar standalone exited {process.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Pulsar standalone not ready after 240 s; see {log_path}")
            time.sleep(1)
        yield process.pid
    except BaseException:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(["# pulsar.log (last lines):", *(t[:300] for t in tail)]), file=sys.stderr)
        raise
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()


def bench(
    service: str, netns_pid: int | None, table: str, args: argparse.Namespace, in_flight: int
) -> dict[str, object]:
    cmd = [
        "java",
        "-Xmx512m",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        f"{JAR}:{JAVA_CP.read_text().strip()}",
        "io.tablekeeper.compat.IncrementBench",
        service,
        "bench",
        table,
        str(args.keys),
        str(in_flight),
        str(args.seconds),
        str(args.warmup),
    ]
    if netns_pid is not None:
        cmd = ["nsenter", "-t", str(netns_pid), "--net", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds * 3 + 180)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"IncrementBench failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def median(rows: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(str(r[key])) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--in-flight", default="1,16,64")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--only", choices=["tablekeeper", "bookkeeper"])
    parser.add_argument(
        "--envoy",
        action="store_true",
        help="also a TableKeeper with `--runtime envoy` (column `TK envoy`), in the same rounds",
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.in_flight.split(",")]
    for tool in ("java", "unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found on PATH")
    build_java()
    print(
        f"# {datetime.now(UTC).isoformat(timespec='seconds')} load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cpus",
        flush=True,
    )
    names = ["tablekeeper", "tablekeeper-envoy", "bookkeeper"]
    results: dict[str, dict[int, list[dict[str, object]]]] = {
        name: {n: [] for n in levels} for name in names
    }
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tk-fstate-")))
        targets: dict[str, tuple[str, int | None]] = {}
        if args.only != "bookkeeper":
            # Beside the Envoy one, this TableKeeper runs grpcio's server.
            first = tablekeeper(work, ("--runtime", "grpc-aio") if args.envoy else ())
            targets["tablekeeper"] = (stack.enter_context(first), None)
            if args.envoy:
                envoy = tablekeeper(work, ("--runtime", "envoy"))
                targets["tablekeeper-envoy"] = (stack.enter_context(envoy), None)
        if args.only != "tablekeeper":
            pid = stack.enter_context(bookkeeper_table_service(work))
            targets["bookkeeper"] = (f"bk://127.0.0.1:{STREAM_PORT}", pid)
        for n in levels:
            for r in range(args.rounds):
                for name, (service, netns) in targets.items():
                    row = bench(service, netns, f"incr_{n}", args, n)
                    results[name][n].append(row)
                    rate = float(str(row["ops_per_s"]))
                    print(
                        f"# round {r + 1} in-flight {n} {name}: {rate:.0f} ops/s"
                        f" p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms errors {row['errors']}",
                        flush=True,
                    )
    print(
        f"# done, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
        f"| in flight | TableKeeper ops/s | p50 / p99 ms | TK envoy ops/s | p50 / p99 ms |"
        f" BookKeeper ops/s | p50 / p99 ms | TK/BK | TK envoy/BK |\n"
        f"|---|---|---|---|---|---|---|---|---|"
    )
    for n in levels:
        cells: list[str] = []
        ops: dict[str, float] = {}
        for name in names:
            rows = results[name][n]
            if not rows:
                cells += ["-", "-"]
                continue
            ops[name] = median(rows, "ops_per_s")
            errors = sum(int(str(r["errors"])) for r in rows)
            cells.append(f"{ops[name]:.0f}" + (f" ({errors} errors)" if errors else ""))
            cells.append(f"{median(rows, 'p50_ms'):.2f} / {median(rows, 'p99_ms'):.2f}")
        ratios = [
            f"{ops[name] / ops['bookkeeper']:.2f}" if name in ops and "bookkeeper" in ops else "-"
            for name in ("tablekeeper", "tablekeeper-envoy")
        ]
        print(f"| {n} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
