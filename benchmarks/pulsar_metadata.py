"""Pulsar's metadata-heavy admin work on ZooKeeper vs on TableKeeper: create N topics and a
subscription on each, through the broker's admin REST API, timing every call.

For each metadata store (`--stores`, in order; the first is the anchor of the ratios):

* `zk`: a real ZooKeeper (deploy/zookeeper.sh, Debian's 3.8, fsync on) and a Pulsar 4.0.7
  standalone with `--metadata zk:127.0.0.1:PORT` (deploy/pulsar.sh);
* `tk-oxia`: a TableKeeper standalone server with `--oxia-port` and Pulsar on
  `--metadata oxia://127.0.0.1:PORT` (Pulsar's own Oxia client);
* `tk-etcd`: the same server with `--etcd-port` and Pulsar on `--metadata etcd:http://…`
  (Pulsar's jetcd metadata store);

a fresh Pulsar (broker + bookie, one JVM) is started on that store only: the broker's and the
bookie's metadata (tenants, namespaces, topic policies, managed-ledger and cursor metadata, ledger
metadata, bundle ownership) all go there. Then, for each `--concurrency` C, in a fresh namespace
`bench/cC` whose inactive-topic policy keeps idle topics (see `KEEP`):

1. `create-topic`: N non-partitioned persistent topics `t00000`…, one
   `PUT /admin/v2/persistent/bench/cC/tNNNNN` each (the broker creates the topic's managed
   ledger, i.e. its first BookKeeper ledger, and loads it);
2. `create-subscription`: one subscription `sub` per topic,
   `PUT …/tNNNNN/subscription/sub` with the body `pulsar-admin` sends (MessageId.latest), which
   creates a durable cursor (its metadata is written to the store);
3. check, untimed: `GET /admin/v2/persistent/bench/cC` must list exactly the N topics, and
   `GET …/tNNNNN/subscriptions` must be `["sub"]` for each, and the broker's log must show no
   topic of the tenant deleted for inactivity; anything else fails the run.

C worker threads each keep one HTTP/1.1 keep-alive connection to the broker and take the next
topic as soon as their previous call has answered (closed loop). Every call is timed from just
before the request to the end of the reply. Per phase: ops/s (calls / wall time of the phase),
p50/p99/max latency, errors, and the CPU the store process and the Pulsar JVM used during the
phase, per call (`/proc`; the JSON has the totals); then the ratio of each store to the anchor
(ops/s ratio > 1: faster than the anchor; latency ratio < 1: faster). The JSON goes to
benchmarks/out/ (gitignored).

    .venv/bin/python benchmarks/pulsar_metadata.py                      # 1,000 topics, C=1,16
    .venv/bin/python benchmarks/pulsar_metadata.py --topics 50 --stores zk,tk-oxia,tk-etcd

Exit status: 0 ok, 1 a store or Pulsar did not start, 2 some call failed or the check found
topics or subscriptions missing, 130 interrupted. Everything started here is stopped on every
exit path, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._common import (  # noqa: E402
    fmt,
    git_info,
    no_nan,
    percentile,
    positive_int,
    proc_cpu_s,
    sigterm_as_interrupt,
    src_env,
)
from tests.support.pulsar import PulsarService  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402
from tests.support.zookeeper import ZooKeeperProcess  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "out"
STORES = ("zk", "tk-oxia", "tk-etcd")
TENANT = "bench"
SUBSCRIPTION = "sub"
# What pulsar-admin's createSubscription sends by default (MessageId.latest).
LATEST = json.dumps({"ledgerId": 2**63 - 1, "entryId": 2**63 - 1, "partitionIndex": -1}).encode()
# The namespaces' inactive-topic policy: never delete an idle topic. By default the broker
# deletes a topic without producers and subscriptions after 60 s idle (checked every 60 s), so
# on a slow store it would delete early topics (a burst of metadata deletes in the middle of the
# measurement) before their subscription is made.
KEEP = json.dumps(
    {
        "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
        "maxInactiveDurationSeconds": 3600,
        "deleteWhileInactive": False,
    }
).encode()
CALL_TIMEOUT_S = 60.0


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


class BenchError(Exception):
    """A store or Pulsar did not start, or the admin API refused the setup."""


# --------------------------------------------------------------------------- admin client


class Admin:
    """Pulsar's admin REST API over one keep-alive HTTP connection (one per thread)."""

    def __init__(self, admin_url: str) -> None:
        parts = urlsplit(admin_url)
        assert parts.hostname and parts.port
        self.host, self.port = parts.hostname, parts.port
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """(status, body) of one request; reconnects once if the kept-alive connection was
        closed by the broker before this request."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=CALL_TIMEOUT_S)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                reply = self.conn.getresponse()
                data = reply.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
                continue
            if reply.getheader("Connection", "").lower() == "close":
                self.close()
            return reply.status, data
        raise AssertionError("unreachable")

    def ok(self, method: str, path: str, body: bytes | None = None) -> bytes:
        status, data = self.call(method, path, body)
        if not 200 <= status < 300:
            raise BenchError(f"{method} {path}: HTTP {status} {data[:300]!r}")
        return data

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# --------------------------------------------------------------------------- stores


@dataclass
class Store:
    """A metadata store started for one Pulsar: its URL for `--metadata` and its pid."""

    name: str
    url: str
    pid: Callable[[], int | None]
    description: str


def script_env() -> dict[str, str]:
    """Environment of the deploy scripts: they use this Python (kazoo, pulsar-client)."""
    return {"TK_PYTHON": os.environ.get("TK_PYTHON", sys.executable)}


@contextmanager
def start_store(name: str, workdir: Path) -> Iterator[Store]:
    if name == "zk":
        zk = ZooKeeperProcess(workdir / "zk", env=script_env())
        try:
            try:
                zk.start(120)
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"ZooKeeper did not start: {e}") from e

            def zk_pid() -> int | None:
                try:
                    return int((zk.state_dir / "zookeeper.pid").read_text().strip())
                except (OSError, ValueError):
                    return None

            yield Store(
                name, f"zk:{zk.hosts}", zk_pid, f"ZooKeeper (deploy/zookeeper.sh) on {zk.hosts}"
            )
        finally:
            try:
                zk.stop()
            except (RuntimeError, OSError) as e:
                eprint(f"warning: stopping ZooKeeper: {e}")
        return
    port = free_port()
    api = {"tk-oxia": "--oxia-port", "tk-etcd": "--etcd-port"}[name]
    url = {"tk-oxia": f"oxia://127.0.0.1:{port}", "tk-etcd": f"etcd:http://127.0.0.1:{port}"}[name]
    server = ServerProcess(
        workdir / name / "data",
        extra_args=[api, str(port)],
        env={"PYTHONPATH": src_env()["PYTHONPATH"]},
    )
    try:
        try:
            server.start(timeout_s=120)
        except (RuntimeError, TimeoutError) as e:
            raise BenchError(f"TableKeeper did not start: {e}") from e
        yield Store(
            name,
            url,
            lambda: server.process.pid if server.process is not None else None,
            f"TableKeeper standalone server ({api} {port}, log {server.log_path})",
        )
    finally:
        if server.process is not None:
            try:
                server.stop()
            except Exception as e:  # noqa: BLE001 (never mask the run's own error)
                eprint(f"warning: stopping TableKeeper: {e}")


# --------------------------------------------------------------------------- phases


@dataclass
class Phase:
    store: str
    concurrency: int
    phase: str
    ops: int
    errors: int
    seconds: float
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    store_cpu_s: float | None
    pulsar_cpu_s: float | None
    first_error: str | None = None


@dataclass
class Run:
    store: str
    metadata_url: str
    pulsar_start_s: float
    phases: list[Phase] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    idle_deletions: int | None = None
    """Topics of the tenant the broker logged as deleted for inactivity (must be 0)."""
    error: str | None = None


def run_workers(worker: Callable[[], None], concurrency: int, stop: threading.Event) -> None:
    """`concurrency` threads running `worker` until it returns; on Ctrl-C/SIGTERM (raised in
    this, the main thread) `stop` tells them to finish their current call and return."""
    with ThreadPoolExecutor(concurrency) as pool:
        try:
            for f in [pool.submit(worker) for _ in range(concurrency)]:
                f.result()
        except BaseException:
            stop.set()
            raise


def run_calls(
    admin_url: str,
    concurrency: int,
    calls: list[tuple[str, str, bytes | None]],
    stop: threading.Event,
) -> tuple[list[float], list[str], float]:
    """Run `calls` with `concurrency` closed-loop workers; (latencies of the successful calls in
    seconds, error messages, wall seconds)."""
    lock = threading.Lock()
    cursor = iter(range(len(calls)))
    latencies: list[float] = []
    errors: list[str] = []

    def worker() -> None:
        admin = Admin(admin_url)
        try:
            while not stop.is_set():
                with lock:
                    i = next(cursor, None)
                if i is None:
                    return
                method, path, body = calls[i]
                t0 = time.perf_counter()
                try:
                    status, data = admin.call(method, path, body)
                    err = None if 200 <= status < 300 else f"HTTP {status} {data[:200]!r}"
                except (OSError, http.client.HTTPException) as e:
                    admin.close()
                    err = f"{type(e).__name__}: {e}"
                elapsed = time.perf_counter() - t0
                with lock:
                    if err is None:
                        latencies.append(elapsed)
                    else:
                        errors.append(f"{method} {path}: {err}")
        finally:
            admin.close()

    started = time.perf_counter()
    run_workers(worker, concurrency, stop)
    return latencies, errors, time.perf_counter() - started


def timed_phase(
    store: Store,
    pulsar: PulsarService,
    concurrency: int,
    phase: str,
    calls: list[tuple[str, str, bytes | None]],
    stop: threading.Event,
) -> Phase:
    store_pid, pulsar_pid = store.pid(), pulsar.pid
    cpu0 = proc_cpu_s(store_pid), proc_cpu_s(pulsar_pid)
    latencies, errors, seconds = run_calls(pulsar.admin_url, concurrency, calls, stop)
    cpu1 = proc_cpu_s(store_pid), proc_cpu_s(pulsar_pid)
    lat = sorted(latencies)

    def cpu(i: int) -> float | None:
        a, b = cpu0[i], cpu1[i]
        return None if a is None or b is None else round(b - a, 2)

    return Phase(
        store=store.name,
        concurrency=concurrency,
        phase=phase,
        ops=len(lat),
        errors=len(errors),
        seconds=round(seconds, 3),
        ops_per_s=round(len(lat) / seconds, 1) if seconds > 0 else float("nan"),
        p50_ms=round(percentile(lat, 50) * 1e3, 2),
        p99_ms=round(percentile(lat, 99) * 1e3, 2),
        max_ms=round(lat[-1] * 1e3, 2) if lat else float("nan"),
        mean_ms=round(sum(lat) / len(lat) * 1e3, 2) if lat else float("nan"),
        store_cpu_s=cpu(0),
        pulsar_cpu_s=cpu(1),
        first_error=errors[0] if errors else None,
    )


def check_namespace(
    admin_url: str, namespace: str, topics: list[str], concurrency: int, stop: threading.Event
) -> dict[str, Any]:
    """Every topic listed, nothing else; every topic has exactly the one subscription."""
    admin = Admin(admin_url)
    try:
        listed = set(json.loads(admin.ok("GET", f"/admin/v2/persistent/{namespace}")))
    finally:
        admin.close()
    expected = {f"persistent://{namespace}/{t}" for t in topics}
    bad_subs: list[str] = []
    lock = threading.Lock()
    cursor = iter(topics)

    def worker() -> None:
        client = Admin(admin_url)
        try:
            while not stop.is_set():
                with lock:
                    topic = next(cursor, None)
                if topic is None:
                    return
                path = f"/admin/v2/persistent/{namespace}/{topic}/subscriptions"
                try:
                    status, data = client.call("GET", path)
                    subs = json.loads(data) if status == 200 else f"HTTP {status}"
                except (OSError, http.client.HTTPException, ValueError) as e:
                    client.close()
                    subs = f"{type(e).__name__}: {e}"
                if subs != [SUBSCRIPTION]:
                    with lock:
                        bad_subs.append(f"{topic}: {subs}")
        finally:
            client.close()

    run_workers(worker, concurrency, stop)
    missing, extra = sorted(expected - listed), sorted(listed - expected)
    return {
        "namespace": namespace,
        "expected": len(expected),
        "listed": len(listed),
        "missing": missing[:20],
        "missing_count": len(missing),
        "unexpected": extra[:20],
        "bad_subscriptions": bad_subs[:20],
        "bad_subscription_count": len(bad_subs),
        "ok": not missing and not extra and not bad_subs and not stop.is_set(),
    }


def run_store(name: str, args: argparse.Namespace, workdir: Path, stop: threading.Event) -> Run:
    with start_store(name, workdir) as store:
        eprint(f"[{name}] {store.description}; starting Pulsar on --metadata {store.url} ...")
        t0 = time.monotonic()
        pulsar_dir = workdir / f"pulsar-{name}"
        pulsar_env = {**script_env(), "PULSAR_METADATA_URL": store.url}
        try:
            pulsar = PulsarService.launch(pulsar_dir, timeout_s=args.pulsar_timeout, env=pulsar_env)
        except RuntimeError as e:
            raise BenchError(f"Pulsar on {store.url} did not start: {e}") from e
        except BaseException:  # interrupted while it starts: stop what the script launched
            PulsarService("", "", pulsar_dir, pulsar_env).close()
            raise
        run = Run(name, store.url, round(time.monotonic() - t0, 1))
        try:
            eprint(
                f"[{name}] Pulsar ready in {run.pulsar_start_s:.0f} s: {pulsar.admin_url} "
                f"(pid {pulsar.pid})"
            )
            admin = Admin(pulsar.admin_url)
            try:
                admin.ok(
                    "PUT",
                    f"/admin/v2/tenants/{TENANT}",
                    json.dumps({"adminRoles": [], "allowedClusters": ["standalone"]}).encode(),
                )
                for c in args.concurrency:
                    admin.ok("PUT", f"/admin/v2/namespaces/{TENANT}/c{c}")
                    admin.ok(
                        "POST", f"/admin/v2/namespaces/{TENANT}/c{c}/inactiveTopicPolicies", KEEP
                    )
            finally:
                admin.close()
            topics = [f"t{i:05d}" for i in range(args.topics)]
            for c in args.concurrency:
                ns = f"{TENANT}/c{c}"
                base = f"/admin/v2/persistent/{ns}"
                phases: dict[str, list[tuple[str, str, bytes | None]]] = {
                    "create-topic": [("PUT", f"{base}/{t}", None) for t in topics],
                    "create-subscription": [
                        ("PUT", f"{base}/{t}/subscription/{SUBSCRIPTION}", LATEST) for t in topics
                    ],
                }
                for phase, calls in phases.items():
                    cell = timed_phase(store, pulsar, c, phase, calls, stop)
                    run.phases.append(cell)
                    print_phase(cell)
                    if cell.first_error:
                        eprint(f"[{name}] {cell.errors} errors, first: {cell.first_error}")
                    if stop.is_set():
                        raise KeyboardInterrupt
                check = check_namespace(pulsar.admin_url, ns, topics, c, stop)
                run.checks.append(check)
                eprint(
                    f"[{name}] check {ns}: {check['listed']}/{check['expected']} topics listed, "
                    f"{check['missing_count']} missing, {len(check['unexpected'])} unexpected, "
                    f"{check['bad_subscription_count']} without exactly ['{SUBSCRIPTION}']"
                    + ("" if check["ok"] else f": FAILED {check}")
                )
            run.idle_deletions = idle_deletions(pulsar_dir / "pulsar.log")
            if run.idle_deletions:
                eprint(f"[{name}] FAILED: {run.idle_deletions} topics deleted for inactivity")
        finally:
            eprint(f"[{name}] stopping Pulsar ...")
            pulsar.close()
        return run


def idle_deletions(log: Path) -> int:
    """How many topics of the tenant the broker's log says it deleted for inactivity."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return -1
    return sum(
        1
        for line in text.splitlines()
        if "deleted successfully due to inactivity" in line and f"persistent://{TENANT}/" in line
    )


# --------------------------------------------------------------------------- output


HEADER = (
    f"{'store':<8} {'conc':>4} {'phase':<20} {'ops':>5} {'err':>4} {'ops/s':>8} "
    f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'store cpu ms/op':>15} {'pulsar cpu ms/op':>16}"
)


def per_op(cpu_s: float | None, ops: int) -> float | None:
    """CPU milliseconds per successful call."""
    return None if cpu_s is None or not ops else cpu_s * 1e3 / ops


def print_phase(p: Phase) -> None:
    print(
        f"{p.store:<8} {p.concurrency:>4} {p.phase:<20} {p.ops:>5} {p.errors:>4} "
        f"{fmt(p.ops_per_s, 1):>8} {fmt(p.p50_ms):>8} {fmt(p.p99_ms):>8} {fmt(p.max_ms, 1):>8} "
        f"{fmt(per_op(p.store_cpu_s, p.ops), 1):>15} {fmt(per_op(p.pulsar_cpu_s, p.ops), 1):>16}",
        flush=True,
    )


def ratios(runs: list[Run]) -> list[dict[str, Any]]:
    """Each store's phases against the anchor's (the first store that ran)."""
    if not runs:
        return []
    anchor = {(p.concurrency, p.phase): p for p in runs[0].phases}
    out = []
    for run in runs[1:]:
        for p in run.phases:
            a = anchor.get((p.concurrency, p.phase))
            if a is None or not a.ops_per_s or not a.p50_ms or not a.p99_ms:
                continue
            out.append(
                {
                    "store": p.store,
                    "anchor": a.store,
                    "concurrency": p.concurrency,
                    "phase": p.phase,
                    "ops_per_s": round(p.ops_per_s / a.ops_per_s, 2),
                    "p50": round(p.p50_ms / a.p50_ms, 2),
                    "p99": round(p.p99_ms / a.p99_ms, 2),
                }
            )
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--topics", type=positive_int, default=1000, help="topics per namespace (default 1000)"
    )
    parser.add_argument(
        "--concurrency",
        default="1,16",
        help="comma-separated admin calls in flight; one namespace each (default 1,16)",
    )
    parser.add_argument(
        "--stores",
        default="zk,tk-oxia",
        help=f"comma-separated, in order, the first is the anchor of the ratios; "
        f"any of {','.join(STORES)} (default zk,tk-oxia)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="when a store fails (does not start, calls fail, check fails), go on with the next",
    )
    parser.add_argument(
        "--pulsar-timeout", type=positive_int, default=300, help="Pulsar start timeout, s"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="state (default: a temp dir)")
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the work directory (logs, data)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/out/)")
    args = parser.parse_args(argv)
    try:
        args.concurrency = [positive_int(c) for c in args.concurrency.split(",") if c.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        parser.error(f"bad --concurrency {args.concurrency!r}")
    if not args.concurrency:
        parser.error("--concurrency is empty")
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [s for s in args.stores if s not in STORES]
    if unknown or not args.stores:
        parser.error(f"--stores: unknown {unknown}; choose from {','.join(STORES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(UTC)
    load_start = os.getloadavg()
    if load_start[0] > 1.0:
        eprint(f"warning: load average {load_start[0]:.1f} before start; expect noise")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-pulsar-metadata-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    runs: list[Run] = []
    status = 0
    print(
        f"Pulsar 4.0.7 admin API, {args.topics} non-partitioned topics + 1 subscription each, "
        f"concurrency {','.join(map(str, args.concurrency))}, stores {','.join(args.stores)}"
    )
    print(HEADER)
    with sigterm_as_interrupt():
        try:
            for name in args.stores:
                try:
                    run = run_store(name, args, workdir, stop)
                except BenchError as e:
                    eprint(f"[{name}] error: {e}")
                    runs.append(Run(name, "", 0.0, error=str(e)))
                    status = max(status, 1)
                    if not args.keep_going:
                        break
                    continue
                runs.append(run)
                bad = (
                    any(p.errors for p in run.phases)
                    or not all(c["ok"] for c in run.checks)
                    or run.idle_deletions != 0
                )
                if bad:
                    run.error = "failed calls or check"
                    status = 2
                    if not args.keep_going:
                        break
        except KeyboardInterrupt:
            stop.set()
            eprint("interrupted")
            status = 130
        finally:
            if args.keep_data or status:
                eprint(f"kept the work directory (logs) {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    measured = [r for r in runs if r.phases]
    rows = ratios(measured)
    if rows:
        print()
    for r in rows:
        print(
            f"ratio {r['store']}/{r['anchor']}  {r['phase']:<20} conc={r['concurrency']:<3} "
            f"ops/s x{r['ops_per_s']:.2f}  p50 x{r['p50']:.2f}  p99 x{r['p99']:.2f}"
        )
    report = {
        "benchmark": "benchmarks/pulsar_metadata.py",
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
        "runs": [asdict(r) for r in runs],
        "ratios": rows,
        "exit_status": status,
    }
    out = args.out
    if out is None:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        out = OUT_DIR / f"pulsar-metadata-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(no_nan(report), indent=2, default=str) + "\n")
    print(f"\nload average {load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"JSON: {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
