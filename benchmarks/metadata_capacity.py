"""How much Pulsar metadata a store holds: ZooKeeper (bounded by its JVM heap) against TableKeeper
through its Oxia port, loaded with Pulsar-shaped keys until the load is done or the store fails.

For each store (`--stores`, in order):

* `zk`: Debian's ZooKeeper (deploy/zookeeper.sh, fsync on) with the heap an operator would give
  it, `-Xmx2g` (`--zk-heap`), and the JIT's full optimisation (the script's default C1-only
  start-up flag is dropped: this is a throughput test);
* `tk`: a TableKeeper standalone server (defaults) with `--oxia-port`, namespace `default` of 4
  shards;

one JVM (benchmarks/java/MetadataLoad.java) writes T topics' metadata with the store's real Java
client, K (`--in-flight`) writes outstanding: ZooKeeper's client (one session, asynchronous
creates) or Oxia's (the one Pulsar 4.0.7 ships, asynchronous puts, its default batching). Each
topic is three keys of `--value-bytes` (200) incompressible bytes, as Pulsar lays them out: its
managed ledger `/managed-ledgers/bench/nsN/persistent/tNNNNNNNNN`, its cursor `…/sub` and its
ledger `/ledgers/DD/DDDD/LDDDD`, plus their parents (once each, empty).

Every `--sample` seconds: keys written, the store's resident memory (VmRSS, and its peak VmHWM,
from /proc) and, for ZooKeeper, its znode count (`mntr`) and the JVM heap in use (`jstat`). A
store's load ends when

* every key is written (`done`; then the keys of 1,000 topics spread over the load are read back
  and compared),
* a write failed (`failed`: ZooKeeper out of heap drops sessions or refuses writes),
* the write rate over the last `--stall` seconds (60) fell to `--stall-fraction` (5 %) of the
  best rate over any such window, or to nothing (`stalled`: a JVM in back-to-back collections
  crawls rather than stops),
* the store process exited (`exited`), or `--max-seconds` passed (`time limit`).

The N at which ZooKeeper failed or stalled is what it holds; TableKeeper is then loaded with 10
times that (`--tk-factor`; or `--tk-topics`) unless the machine's limits come first, which the
output says. Prints the samples as they come and a summary (outcome, keys, keys/s over the
whole load and in the best window, peak RSS, RSS and store CPU per key, data on disk); JSON to
benchmarks/out/.

    .venv/bin/python benchmarks/metadata_capacity.py       # zk until it fails, tk x10
    .venv/bin/python benchmarks/metadata_capacity.py --zk-heap 256m --max-seconds 900

Needs java/javac and Pulsar's jars (`deploy/pulsar.sh fetch`, the first run only). Exit status:
0 ok, 1 a store or the loader did not start, 2 TableKeeper's load did not finish or read back
wrong, 130 interrupted. Everything started here is stopped on every exit path, Ctrl-C and
SIGTERM included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._common import (  # noqa: E402
    fmt,
    git_info,
    parse_mntr,
    positive_int,
    proc_cpu_s,
    sigterm_as_interrupt,
    src_env,
    write_report,
)
from benchmarks.pulsar_metadata import four_letter  # noqa: E402
from tests.support.caches import pulsar_classpath  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402
from tests.support.zookeeper import ZooKeeperProcess  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "out"
LOADER_SOURCE = REPO / "benchmarks" / "java" / "MetadataLoad.java"
STORES = ("zk", "tk")
KEYS_PER_TOPIC = 3


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------- pure helpers


def proc_memory(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of process `pid` in bytes; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return parse_status_memory(text)


def parse_status_memory(text: str) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes from a /proc/PID/status text; None without them (a zombie)."""
    found = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(rest.split()[0]) * 1024
    if len(found) != 2:
        return None
    return found["VmRSS"], found["VmHWM"]


def jstat_heap_used(text: str) -> int | None:
    """Bytes of heap in use from `jstat -gc PID`'s two lines (the survivor, eden and old
    spaces' used columns, in KiB); None if they are not there."""
    lines = [line.split() for line in text.strip().splitlines()]
    if len(lines) < 2 or len(lines[0]) != len(lines[-1]):
        return None
    row = dict(zip(lines[0], lines[-1], strict=True))
    try:
        return int(sum(float(row[c]) for c in ("S0U", "S1U", "EU", "OU")) * 1024)
    except (KeyError, ValueError):
        return None


def window_rate(history: list[tuple[float, int]], window_s: float) -> float | None:
    """Keys per second over the last `window_s` seconds of `history` ((seconds, keys written),
    oldest first); None until the history spans that long."""
    if not history or history[-1][0] - history[0][0] < window_s:
        return None
    end_s, end_keys = history[-1]
    start_s, start_keys = next((t, k) for t, k in reversed(history) if end_s - t >= window_s)
    return (end_keys - start_keys) / (end_s - start_s)


def outcome(
    written: int,
    target: int,
    failed: int,
    alive: bool,
    recent_rate: float | None,
    peak_rate: float,
    stall_fraction: float,
    elapsed: float,
    max_seconds: float,
) -> str | None:
    """Why a store's load ends now, or None while it goes on (see the module's doc):
    `recent_rate` is the write rate over the last stall window, `peak_rate` the best one seen
    over any such window."""
    if written >= target:
        return "done"
    if failed:
        return "failed"
    if not alive:
        return "exited"
    if recent_rate is not None and recent_rate <= stall_fraction * peak_rate:
        return "stalled"
    if elapsed >= max_seconds:
        return "time limit"
    return None


def total_keys(topics: int) -> int:
    """Keys MetadataLoad writes for `topics` topics: 3 per topic and each parent once."""
    namespaces = (topics + 9999) // 10000
    # /managed-ledgers, /managed-ledgers/bench, then per namespace nsN and nsN/persistent
    managed = 2 + 2 * namespaces
    # /ledgers, one /ledgers/DD per 10^8 ids, one /ledgers/DD/DDDD per 10^4
    ledgers = 1 + (topics + 10**8 - 1) // 10**8 + (topics + 9999) // 10000
    return KEYS_PER_TOPIC * topics + managed + ledgers


# --------------------------------------------------------------------------- stores


@dataclass
class Target:
    name: str
    kind: str
    """MetadataLoad's store kind: zk or oxia."""
    address: str
    pid: int
    description: str
    data_dir: Path
    extra: Callable[[], dict[str, Any]]
    """Store-specific figures for a sample (ZooKeeper: znodes, heap in use)."""


@contextmanager
def zookeeper_target(workdir: Path, heap: str) -> Iterator[Target]:
    env = {
        "TK_PYTHON": os.environ.get("TK_PYTHON", sys.executable),
        "ZK_HEAP": f"-Xmx{heap}",
        "ZK_EXTRA_OPTS": "",
    }
    zk = ZooKeeperProcess(workdir / "zk", env=env)
    try:
        try:
            zk.start(120)
            pid = int((zk.state_dir / "zookeeper.pid").read_text().strip())
        except (RuntimeError, TimeoutError, OSError, ValueError) as e:
            raise BenchError(f"ZooKeeper did not start: {e}") from e

        def extra() -> dict[str, Any]:
            found: dict[str, Any] = {}
            try:
                mntr = parse_mntr(four_letter(zk.port, "mntr"))
                found["znodes"] = int(mntr.get("zk_znode_count", 0))
            except OSError:
                found["znodes"] = None
            try:
                done = subprocess.run(
                    ["jstat", "-gc", str(pid)], capture_output=True, text=True, timeout=30
                )
                found["heap_used"] = jstat_heap_used(done.stdout)
            except (OSError, subprocess.SubprocessError):
                found["heap_used"] = None
            return found

        yield Target(
            "zk",
            "zk",
            zk.hosts,
            pid,
            f"ZooKeeper (deploy/zookeeper.sh, -Xmx{heap}) on {zk.hosts}",
            zk.state_dir / "data",
            extra,
        )
    finally:
        try:
            zk.stop()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            eprint(f"warning: stopping ZooKeeper: {e}")


@contextmanager
def tablekeeper_target(workdir: Path) -> Iterator[Target]:
    port = free_port()
    server = ServerProcess(
        workdir / "tk" / "data",
        extra_args=["--oxia-port", str(port)],
        env={"PYTHONPATH": src_env()["PYTHONPATH"]},
    )
    try:
        try:
            server.start(timeout_s=120)
        except (RuntimeError, TimeoutError) as e:
            raise BenchError(f"TableKeeper did not start: {e}") from e
        assert server.process is not None
        yield Target(
            "tk",
            "oxia",
            f"127.0.0.1:{port}",
            server.process.pid,
            f"TableKeeper standalone server (--oxia-port {port}, log {server.log_path})",
            workdir / "tk" / "data",
            dict,
        )
    finally:
        if server.process is not None:
            try:
                server.stop()
            except Exception as e:  # noqa: BLE001 (never mask the run's own error)
                eprint(f"warning: stopping TableKeeper: {e}")


# --------------------------------------------------------------------------- the load


@dataclass
class Load:
    store: str
    description: str
    topics: int
    keys_target: int
    outcome: str = ""
    keys_written: int = 0
    failed_writes: int = 0
    last_error: str = ""
    seconds: float = 0.0
    keys_per_s: float = 0.0
    best_keys_per_s: float = 0.0
    """The best write rate over any `--stall` window."""
    store_cpu_s: float | None = None
    peak_rss: int | None = None
    data_dir_bytes: int | None = None
    verify: dict[str, Any] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)


def compile_loader(workdir: Path) -> str:
    """javac MetadataLoad against Pulsar's jars; the classpath to run it with."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise BenchError("java and javac are needed (the stores' Java clients)")
    classpath = pulsar_classpath()
    classes = workdir / "classes"
    classes.mkdir(exist_ok=True)
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", classpath, str(LOADER_SOURCE)],
        check=True,
        timeout=600,
    )
    return f"{classpath}:{classes}"


def dir_bytes(path: Path) -> int | None:
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return None


def load(
    target: Target,
    classpath: str,
    topics: int,
    args: argparse.Namespace,
    stop: threading.Event,
) -> Load:
    result = Load(target.name, target.description, topics, total_keys(topics))
    command = ["java", "-Xmx1g", "-cp", classpath, "MetadataLoad", target.kind, target.address]
    command += [str(topics), str(args.in_flight), str(args.value_bytes)]
    lines: queue.Queue[str | None] = queue.Queue()
    loader = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )

    def pump() -> None:
        assert loader.stdout is not None
        for line in loader.stdout:
            lines.put(line.strip())
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    cpu0 = proc_cpu_s(target.pid)
    started = time.monotonic()
    last_written = 0
    history: list[tuple[float, int]] = []
    peak_rate = 0.0
    next_sample = started
    finished = False
    progress: dict[str, Any] = {}
    try:
        while result.outcome == "":
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            now = time.monotonic()
            if line is None:
                finished = True
            elif line.startswith(("PROGRESS ", "DONE ")):
                progress = json.loads(line.split(" ", 1)[1])
                if line.startswith("DONE "):
                    finished = True
            last_written = int(progress.get("written", 0))
            if last_written:  # the window starts with the first write (after the connection)
                history.append((now - started, last_written))
            recent = window_rate(history, args.stall)
            peak_rate = max(peak_rate, recent or 0.0)
            if now >= next_sample or finished:
                next_sample = now + args.sample
                sample = take_sample(target, now - started, progress)
                result.samples.append(sample)
                print_sample(target.name, sample)
            alive = proc_memory(target.pid) is not None
            if finished and last_written < result.keys_target and not progress.get("failed"):
                result.outcome = "loader exited"
                break
            result.outcome = (
                outcome(
                    last_written,
                    result.keys_target,
                    int(progress.get("failed", 0)),
                    alive,
                    recent,
                    peak_rate,
                    args.stall_fraction,
                    now - started,
                    args.max_seconds,
                )
                or ""
            )
            if stop.is_set():
                raise KeyboardInterrupt
        if result.outcome == "done":
            result.verify = read_verify(lines, loader)
    finally:
        result.seconds = round(time.monotonic() - started, 1)
        cpu1 = proc_cpu_s(target.pid)
        if loader.poll() is None:
            loader.terminate()
            try:
                loader.wait(20)
            except subprocess.TimeoutExpired:
                loader.kill()
                loader.wait()
        if loader.returncode not in (0, None) and result.outcome == "loader exited":
            assert loader.stderr is not None
            result.last_error = loader.stderr.read()[-2000:]
    result.keys_written = int(progress.get("written", 0))
    result.failed_writes = int(progress.get("failed", 0))
    result.last_error = result.last_error or str(progress.get("last_error", ""))
    result.keys_per_s = round(result.keys_written / max(progress.get("seconds", 0.0), 1e-9), 1)
    result.best_keys_per_s = round(peak_rate, 1)
    result.store_cpu_s = None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 1)
    peaks = [s["peak_rss"] for s in result.samples if s.get("peak_rss") is not None]
    result.peak_rss = max(peaks) if peaks else None
    result.data_dir_bytes = dir_bytes(target.data_dir)
    return result


def read_verify(lines: queue.Queue[str | None], loader: subprocess.Popen[str]) -> dict[str, Any]:
    """The loader's VERIFY line (it reads back the keys of 1,000 topics after DONE)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=5.0)
        except queue.Empty:
            continue
        if line is None:
            break
        if line.startswith("VERIFY "):
            return dict(json.loads(line.split(" ", 1)[1]))
    return {"checked": 0, "wrong": None, "first_wrong": f"no VERIFY (exit {loader.poll()})"}


def take_sample(target: Target, elapsed: float, progress: dict[str, Any]) -> dict[str, Any]:
    memory = proc_memory(target.pid)
    sample: dict[str, Any] = {
        "seconds": round(elapsed, 1),
        "written": int(progress.get("written", 0)),
        "failed": int(progress.get("failed", 0)),
        "rss": memory[0] if memory else None,
        "peak_rss": memory[1] if memory else None,
    }
    if memory is not None:
        sample.update(target.extra())
    return sample


MIB = 1024 * 1024


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.0f}"


def print_sample(store: str, s: dict[str, Any]) -> None:
    heap = f" heap used {mib(s['heap_used'])} MiB" if s.get("heap_used") is not None else ""
    znodes = f" znodes {s['znodes']:,}" if s.get("znodes") is not None else ""
    print(
        f"{store:<4} {s['seconds']:>8.0f} s {s['written']:>12,} keys  RSS {mib(s['rss']):>6} MiB "
        f"(peak {mib(s['peak_rss'])}){heap}{znodes}"
        + (f"  {s['failed']} failed" if s["failed"] else ""),
        flush=True,
    )


def print_summary(loads: list[Load]) -> None:
    print(
        f"\n{'store':<5} {'outcome':<12} {'keys':>12} {'of':>12} {'keys/s':>9} {'best':>7} "
        f"{'peak RSS MiB':>12} {'RSS B/key':>9} {'cpu ms/1k keys':>14} {'disk MiB':>8}"
    )
    for r in loads:
        per_key = r.peak_rss / r.keys_written if r.peak_rss and r.keys_written else None
        cpu = r.store_cpu_s * 1e6 / r.keys_written if r.store_cpu_s and r.keys_written else None
        print(
            f"{r.store:<5} {r.outcome:<12} {r.keys_written:>12,} {r.keys_target:>12,} "
            f"{fmt(r.keys_per_s, 0):>9} {fmt(r.best_keys_per_s, 0):>7} {mib(r.peak_rss):>12} "
            f"{fmt(per_key, 0):>9} {fmt(cpu, 1):>14} {mib(r.data_dir_bytes):>8}"
        )
        if r.verify is not None:
            print(f"      read back: {r.verify}")
        if r.last_error:
            print(f"      last error: {r.last_error[:300]}")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="zk,tk", help="comma-separated: zk, tk (default both)")
    parser.add_argument(
        "--zk-topics",
        type=positive_int,
        default=10_000_000,
        help="topics (3 keys each) to offer ZooKeeper: it fails or stalls first (default 10 M)",
    )
    parser.add_argument("--zk-heap", default="2g", help="ZooKeeper's -Xmx (default 2g)")
    parser.add_argument(
        "--tk-factor",
        type=positive_int,
        default=10,
        help="TableKeeper gets this many times the topics ZooKeeper held (default 10)",
    )
    parser.add_argument(
        "--tk-topics", type=positive_int, default=None, help="topics for TableKeeper instead"
    )
    parser.add_argument(
        "--in-flight", type=positive_int, default=1000, help="writes outstanding (default 1000)"
    )
    parser.add_argument("--value-bytes", type=positive_int, default=200, help="default 200")
    parser.add_argument(
        "--sample", type=float, default=10.0, help="seconds between samples (default 10)"
    )
    parser.add_argument(
        "--stall",
        type=float,
        default=60.0,
        help="the window of the stall rule, seconds (default 60)",
    )
    parser.add_argument(
        "--stall-fraction",
        type=float,
        default=0.05,
        help="the store stalled when its write rate over the last window is at most this "
        "fraction of its best window's (default 0.05)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=3600.0,
        help="a store's load stops after this long (default 3600)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="state (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/out/)")
    args = parser.parse_args(argv)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [s for s in args.stores if s not in STORES]
    if unknown or not args.stores or len(set(args.stores)) != len(args.stores):
        parser.error(f"--stores: {args.stores}; choose from {','.join(STORES)}, each once")
    if "zk" not in args.stores and args.tk_topics is None:
        parser.error("without zk, --tk-topics is needed")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(UTC)
    load_start = os.getloadavg()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-metadata-capacity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    loads: list[Load] = []
    notes: list[str] = []
    status = 0
    print(
        f"Pulsar-shaped metadata: {KEYS_PER_TOPIC} keys per topic of {args.value_bytes} bytes "
        f"(+ parents), {args.in_flight} writes in flight; stores {','.join(args.stores)}"
    )
    with sigterm_as_interrupt():
        try:
            classpath = compile_loader(workdir)
            for name in args.stores:
                if name == "zk":
                    topics = args.zk_topics
                    manager = zookeeper_target(workdir, args.zk_heap)
                else:
                    held = next((r.keys_written for r in loads if r.store == "zk"), None)
                    if args.tk_topics is not None:
                        topics = args.tk_topics
                    else:
                        assert held is not None
                        topics = max(1, held * args.tk_factor // KEYS_PER_TOPIC)
                    manager = tablekeeper_target(workdir)
                with manager as target:
                    eprint(f"[{name}] {target.description}: {topics:,} topics")
                    result = load(target, classpath, topics, args, stop)
                loads.append(result)
                if name == "tk" and (
                    result.outcome != "done" or not result.verify or result.verify.get("wrong")
                ):
                    status = 2
        except KeyboardInterrupt:
            stop.set()
            eprint("interrupted")
            status = 130
        except (BenchError, subprocess.SubprocessError, OSError) as e:
            eprint(f"error: {e}")
            status = 1
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    print_summary(loads)
    zk = next((r for r in loads if r.store == "zk"), None)
    tk = next((r for r in loads if r.store == "tk"), None)
    if zk and tk and zk.keys_written:
        ratio = tk.keys_written / zk.keys_written
        rate = tk.keys_per_s / zk.keys_per_s if zk.keys_per_s else None
        notes.append(
            f"TableKeeper held {ratio:.1f}x the keys ZooKeeper held ({zk.outcome} at "
            f"{zk.keys_written:,}), at {fmt(rate)}x its write rate"
        )
    if zk and zk.outcome in ("done", "time limit"):
        notes.append(
            f"ZooKeeper did not fail or stall ({zk.outcome} at {zk.keys_written:,} keys): what it "
            f"holds is more than this run shows"
        )
    for note in notes:
        print(f"note: {note}")
    report = {
        "benchmark": "benchmarks/metadata_capacity.py",
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
        "loads": [asdict(r) for r in loads],
        "notes": notes,
        "exit_status": status,
    }
    write_report(
        report,
        args.out or OUT_DIR / f"metadata-capacity-{started.strftime('%Y%m%dT%H%M%SZ')}.json",
        load_start,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
