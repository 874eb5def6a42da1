"""Pulsar's metadata-heavy admin work on ZooKeeper, on real Oxia and etcd servers, and on
TableKeeper through its Oxia and etcd front-ends: create, reload and delete topics, partitioned
topics and subscriptions through the broker's admin REST API, timing every call.

For each metadata store (`--stores`, in order; the first is the anchor of the ratios):

* `zk`: a real ZooKeeper (deploy/zookeeper.sh, Debian's 3.8, fsync on) and a Pulsar 4.0.7
  standalone with `--metadata zk:127.0.0.1:PORT` (deploy/pulsar.sh), the incumbent;
* `oxia`: a real Oxia, `oxia standalone --shards 4` (WAL fsync on, its default), from `--oxia-bin`
  (default $OXIA_BIN, else .deploy/bin/oxia; built from an Oxia source checkout, see
  tests/support/oxia_server.py), Pulsar on `--metadata oxia://127.0.0.1:PORT` (Pulsar's own Oxia
  client); skipped with a note when the binary is missing;
* `tk-zk`: a TableKeeper standalone server with `--zookeeper-port`, Pulsar on `zk:…` (the same
  driver as `zk`, Pulsar's own ZooKeeper driver, the one it is cheapest with);
* `tk-oxia`: a TableKeeper standalone server with `--oxia-port`, Pulsar on `oxia://…` (the same
  driver as `oxia`);
* `etcd`: a real etcd (deploy/etcd.sh, Debian's etcd-server, fsync on), Pulsar on
  `--metadata etcd:http://127.0.0.1:PORT` (Pulsar's jetcd metadata store);
* `tk-etcd`: the TableKeeper server with `--etcd-port`, Pulsar on `etcd:http://…` (the same
  driver as `etcd`);

a fresh Pulsar (broker + bookie, one JVM) is started on that store only: the broker's and the
bookie's metadata (tenants, namespaces, topic policies, managed-ledger and cursor metadata, ledger
metadata, bundle ownership) all go there. The phases, each timed, with C (`--concurrency`) calls
in flight, in a fresh namespace `bench/cC` per C whose inactive-topic policy keeps idle topics
(see `KEEP`):

1. `create-topic`: N (`--topics`) non-partitioned persistent topics `t00000`…, one
   `PUT /admin/v2/persistent/bench/cC/tNNNNN` each (the broker creates the topic's managed
   ledger, i.e. its first BookKeeper ledger, and loads it);
2. `create-subscription`: one subscription `sub` per topic, `PUT …/tNNNNN/subscription/sub`
   with the body `pulsar-admin` sends (MessageId.latest): a durable cursor;
3. `create-partitioned`: M (`--partitioned`) partitioned topics `p00000`… of P (`--partitions`)
   partitions, `PUT …/pNNNNN/partitions` with body P (the partitioned-topic metadata and each
   partition's managed-ledger node);
4. `subscribe-partitioned`: `PUT …/pNNNNN/subscription/sub`: the broker loads every partition
   and makes the cursor on each;
   then, untimed, every topic, partition and partitioned topic is listed, each with exactly its
   subscription;
5. `broker restart` (once, after 1-4 for every C): the Pulsar JVM is stopped and started again on
   the same store and data, until it serves (deploy/pulsar.sh's produce/consume round trip); it
   then has no topic loaded;
6. `reload-topic`: `GET …/tNNNNN/stats` for every topic, which makes the broker load it (its
   managed ledger, cursor and ledger metadata; a new ledger) before answering; the answer must
   list `sub`;
7. `reload-partitioned`: `GET …/pNNNNN/partitioned-stats`, which loads every partition;
8. `delete-topic`: `DELETE …/tNNNNN` (its cursor, managed ledger and ledgers go);
9. `delete-partitioned`: `DELETE …/pNNNNN/partitions`;
   then, untimed, the namespace must list no topic.

`--skip partitioned,restart,delete` leaves groups out. C worker threads each keep one HTTP/1.1
keep-alive connection to the broker and take the next call as soon as their previous one has
answered (closed loop). Every call is timed from just before the request to the end of the reply.

Per store and phase: ops/s (calls / wall time of the phase), p50/p99/max latency, errors, the CPU
the store process and the Pulsar JVM used during the phase per call (`/proc`), and what one call
cost in metadata requests, counted twice:

* by the broker: Pulsar's own `pulsar_metadata_store_ops_latency_ms_count{type=get|put|del}`
  (its /metrics), the metadata operations its store driver completed, the same count whatever
  the store (it does not see the BookKeeper client's ledger-metadata calls, which go through
  another store instance in the same JVM);
* by the store: ZooKeeper's `mntr` (reads and writes: `zk_cnt_readlatency`,
  `zk_cnt_updatelatency`; a multi is one write), Oxia's Prometheus endpoint
  (`grpc_server_msg_received_total` per method, and its database's puts, gets, deletes, lists,
  range scans as `db:…`), etcd's `grpc_server_msg_received_total` per method (unary calls,
  and messages received on streams: Watch, LeaseKeepAlive), TableKeeper's metrics endpoint:
  `tablekeeper_requests_total` counts the BookKeeper-protocol port's calls and the ZooKeeper
  port's requests (`zk:<op>`), not the Oxia and etcd ports' calls, so for those front-ends it
  shows the commands the server appended to its write-ahead log
  (`wal-commands`, `tablekeeper_wal_append_records_sum`) and the group commits (`wal-appends`);
  its Oxia or etcd calls per method are the broker's count above.

Then each store's ratio to the anchor, and each TableKeeper front-end's ratio to the real server
of its protocol (tk-zk / zk, tk-oxia / oxia, tk-etcd / etcd): ops/s ratio > 1 is faster,
latency and CPU ratios < 1 are better. `--profile` records the TableKeeper server with py-spy
during each timed phase (collapsed stacks in benchmarks/out/, one file per store and phase; the
profiled run's figures are not comparable with an unprofiled one). The JSON goes to benchmarks/out/
(gitignored).

    .venv/bin/python benchmarks/pulsar_metadata.py                # 1,000 topics, C=1,16, zk,tk-oxia
    .venv/bin/python benchmarks/pulsar_metadata.py --topics 200 \\
        --stores zk,oxia,tk-oxia,etcd,tk-etcd --keep-going

Exit status: 0 ok, 1 a store or Pulsar did not start (or restart), 2 some call failed or a check
found topics or subscriptions missing or left, 130 interrupted. Everything started here (stores,
Pulsar, py-spy) is stopped on every exit path, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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
    counter_by,
    counter_delta,
    fmt,
    git_info,
    parse_mntr,
    parse_prometheus,
    percentile,
    positive_int,
    proc_cpu_s,
    sigterm_as_interrupt,
    src_env,
    write_report,
)
from tests.support.etcd import EtcdProcess  # noqa: E402
from tests.support.oxia_server import OxiaServer, default_binary  # noqa: E402
from tests.support.pulsar import PulsarService  # noqa: E402
from tests.support.server import ServerProcess, free_port  # noqa: E402
from tests.support.zookeeper import ZooKeeperProcess  # noqa: E402

OUT_DIR = REPO / "benchmarks" / "out"
STORES = ("zk", "tk-zk", "oxia", "tk-oxia", "etcd", "tk-etcd")
PROTOCOL_ANCHORS = {"tk-zk": "zk", "tk-oxia": "oxia", "tk-etcd": "etcd"}
"""Each TableKeeper front-end and the real server of its protocol."""
SKIPPABLE = ("partitioned", "restart", "delete")
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
SCRAPE_TIMEOUT_S = 30.0
PY_SPY = Path(sys.executable).parent / "py-spy"


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


# --------------------------------------------------------------------------- counters


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as reply:
        return str(reply.read().decode("utf-8", errors="replace"))


def four_letter(port: int, command: str) -> str:
    """ZooKeeper's answer to a four-letter command (deploy/zookeeper.sh allows mntr)."""
    with socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_TIMEOUT_S) as conn:
        conn.sendall(command.encode())
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def zk_counters(mntr: dict[str, float]) -> dict[str, float]:
    """Requests ZooKeeper served: reads, writes (a multi is one) and packets received (pings
    included), from its `mntr` answer."""
    names = {"reads": "zk_cnt_readlatency", "writes": "zk_cnt_updatelatency"}
    names["packets"] = "zk_packets_received"
    return {kind: mntr[name] for kind, name in names.items() if name in mntr}


def oxia_counters(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Messages a real Oxia received per gRPC method (its server has the same gRPC interceptor
    as etcd's: one per unary call, one per message on a stream), and its database's operations
    (`oxia_server_db_<op>_count_total`, summed over shards) as `db:<op>`."""
    found = counter_by(samples, "grpc_server_msg_received_total", "grpc_method")
    prefix, suffix = "oxia_server_db_", "_count_total"
    for name in sorted({s[0] for s in samples}):
        if name.startswith(prefix) and name.endswith(suffix):
            found[f"db:{name[len(prefix) : -len(suffix)]}"] = sum(
                counter_by(samples, name).values()
            )
    return found


def etcd_counters(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Messages etcd received per gRPC method: one per unary call, one per message on a stream
    (Watch, LeaseKeepAlive)."""
    return counter_by(samples, "grpc_server_msg_received_total", "grpc_method")


def tk_counters(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """TableKeeper's own counts: BookKeeper-protocol calls and ZooKeeper-port requests per
    method (its Oxia and etcd ports' calls are not counted there), and the commands appended to
    its write-ahead log and the group commits that appended them."""
    found = {
        (f"zk:{method[10:]}" if method.startswith("ZooKeeper/") else f"bk:{method}"): n
        for method, n in counter_by(samples, "tablekeeper_requests_total", "method").items()
    }
    for kind, name in (
        ("wal-commands", "tablekeeper_wal_append_records_sum"),
        ("wal-appends", "tablekeeper_wal_append_records_count"),
    ):
        if name in {sample[0] for sample in samples}:
            found[kind] = sum(counter_by(samples, name).values())
    return found


def broker_counters(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Metadata operations the broker's store driver completed, per type (get, put, del; a
    failed one as `type-fail`), whatever the store."""
    found: dict[str, float] = {}
    name = "pulsar_metadata_store_ops_latency_ms_count"
    for status, suffix in (("success", ""), ("fail", "-fail")):
        for kind, n in counter_by(samples, name, "type", status=status).items():
            found[kind + suffix] = n
    return found


def scrape(read: Callable[[], dict[str, float]], what: str) -> dict[str, float] | None:
    """`read()`, or None (with a warning) when the endpoint does not answer or parse."""
    try:
        return read()
    except (OSError, ValueError, http.client.HTTPException) as e:
        eprint(f"warning: {what} counters not read: {type(e).__name__}: {e}")
        return None


def delta(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    return None if before is None or after is None else counter_delta(before, after)


# --------------------------------------------------------------------------- stores


@dataclass
class Store:
    """A metadata store started for one Pulsar: its URL for `--metadata`, its pid and its own
    request counters."""

    name: str
    url: str
    pid: Callable[[], int | None]
    description: str
    counters: Callable[[], dict[str, float]]
    """The store's own cumulative request counters, by kind."""
    tk_pid: int | None = None
    """TableKeeper's server process (what `--profile` records)."""


def script_env() -> dict[str, str]:
    """Environment of the deploy scripts: they use this Python (kazoo, pulsar-client)."""
    return {"TK_PYTHON": os.environ.get("TK_PYTHON", sys.executable)}


@contextmanager
def start_store(name: str, workdir: Path, args: argparse.Namespace) -> Iterator[Store]:
    if name == "zk":
        with zookeeper_store(workdir) as store:
            yield store
    elif name == "oxia":
        with oxia_store(workdir, args.oxia_bin) as store:
            yield store
    elif name == "etcd":
        with etcd_store(workdir) as store:
            yield store
    else:
        with tablekeeper_store(name, workdir) as store:
            yield store


@contextmanager
def zookeeper_store(workdir: Path) -> Iterator[Store]:
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
            "zk",
            f"zk:{zk.hosts}",
            zk_pid,
            f"ZooKeeper (deploy/zookeeper.sh) on {zk.hosts}",
            lambda: zk_counters(parse_mntr(four_letter(zk.port, "mntr"))),
        )
    finally:
        try:
            zk.stop()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            eprint(f"warning: stopping ZooKeeper: {e}")


@contextmanager
def oxia_store(workdir: Path, binary: Path) -> Iterator[Store]:
    server = OxiaServer(binary, workdir / "oxia")
    try:
        try:
            server.start(120)
        except RuntimeError as e:
            raise BenchError(f"Oxia did not start: {e}") from e
        yield Store(
            "oxia",
            f"oxia://{server.address}",
            lambda: server.pid,
            f"Oxia standalone ({binary}, --shards {server.shards}, log {server.log_path})",
            lambda: oxia_counters(parse_prometheus(http_text(server.metrics_url))),
        )
    finally:
        server.stop()


@contextmanager
def etcd_store(workdir: Path) -> Iterator[Store]:
    etcd = EtcdProcess(workdir / "etcd")
    try:
        try:
            etcd.start(wait_s=120)
        except RuntimeError as e:
            raise BenchError(f"etcd did not start: {e}") from e
        yield Store(
            "etcd",
            f"etcd:http://{etcd.endpoint}",
            lambda: etcd.pid,
            f"etcd (deploy/etcd.sh) on {etcd.endpoint}",
            lambda: etcd_counters(parse_prometheus(http_text(f"http://{etcd.endpoint}/metrics"))),
        )
    finally:
        etcd.stop()


@contextmanager
def tablekeeper_store(name: str, workdir: Path) -> Iterator[Store]:
    port = free_port()
    api = {"tk-zk": "--zookeeper-port", "tk-oxia": "--oxia-port", "tk-etcd": "--etcd-port"}[name]
    url = {
        "tk-zk": f"zk:127.0.0.1:{port}",
        "tk-oxia": f"oxia://127.0.0.1:{port}",
        "tk-etcd": f"etcd:http://127.0.0.1:{port}",
    }[name]
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
        metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        yield Store(
            name,
            url,
            lambda: server.process.pid if server.process is not None else None,
            f"TableKeeper standalone server ({api} {port}, log {server.log_path})",
            lambda: tk_counters(parse_prometheus(http_text(metrics_url))),
            tk_pid=server.process.pid if server.process is not None else None,
        )
    finally:
        if server.process is not None:
            try:
                server.stop()
            except Exception as e:  # noqa: BLE001 (never mask the run's own error)
                eprint(f"warning: stopping TableKeeper: {e}")


# --------------------------------------------------------------------------- profiles


@contextmanager
def profiled(pid: int | None, path: Path | None, native: bool) -> Iterator[str | None]:
    """py-spy records process `pid` (and its children) into `path` meanwhile (collapsed stacks,
    100 samples/s, without pausing it); yields the path, or None when not profiling or py-spy
    could not attach (with a warning)."""
    if pid is None or path is None:
        yield None
        return
    command = [str(PY_SPY), "record", "--pid", str(pid), "--rate", "100", "--format", "raw"]
    command += ["--output", str(path), "--nonblocking", "--subprocesses"]
    if native:
        command.append("--native")
    log_path = path.with_suffix(".log")
    with open(log_path, "wb") as log:
        spy = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # py-spy attaches
        if spy.poll() is not None:
            eprint(f"warning: py-spy exited {spy.returncode}: {log_path.read_text()[-500:]}")
            yield None
        else:
            yield str(path)
    finally:
        if spy.poll() is None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()


# --------------------------------------------------------------------------- phases

Call = tuple[str, str, bytes | None]
Validate = Callable[[bytes], str | None]
"""Checks a successful call's body: None when it is right, else what is wrong."""


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
    broker_ops: dict[str, float] | None = None
    """Metadata operations the broker's driver completed during the phase, by type."""
    store_requests: dict[str, float] | None = None
    """The store's own request counters' increase during the phase, by kind."""
    profile: str | None = None
    first_error: str | None = None


@dataclass
class Run:
    store: str
    metadata_url: str
    pulsar_start_s: float
    phases: list[Phase] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    restart: dict[str, Any] | None = None
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
    calls: list[Call],
    stop: threading.Event,
    validate: Validate | None = None,
) -> tuple[list[float], list[str], float]:
    """Run `calls` with `concurrency` closed-loop workers; (latencies of the successful calls in
    seconds, error messages, wall seconds). A 2xx answer that `validate` rejects is an error."""
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
                if err is None and validate is not None:
                    err = validate(data)
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


def has_subscription(data: bytes) -> str | None:
    """A topic's (or partitioned topic's) stats must list the benchmark's subscription."""
    try:
        subscriptions = json.loads(data).get("subscriptions", {})
    except (ValueError, AttributeError):
        return f"stats not a JSON object: {data[:200]!r}"
    return (
        None if SUBSCRIPTION in subscriptions else f"no {SUBSCRIPTION!r} in {list(subscriptions)}"
    )


@dataclass
class Bench:
    """What one store's phases share."""

    store: Store
    pulsar: PulsarService
    stop: threading.Event
    profile_dir: Path | None
    """Where --profile's files go (None: no profiling)."""
    profile_native: bool = False

    def broker_counters(self) -> dict[str, float] | None:
        url = f"{self.pulsar.admin_url}/metrics/"
        return scrape(lambda: broker_counters(parse_prometheus(http_text(url))), "broker")

    def store_counters(self) -> dict[str, float] | None:
        return scrape(self.store.counters, self.store.name)

    def phase(
        self, concurrency: int, phase: str, calls: list[Call], validate: Validate | None = None
    ) -> Phase:
        store, pulsar = self.store, self.pulsar
        profile = (
            self.profile_dir / f"{store.name}-c{concurrency}-{phase}.txt"
            if self.profile_dir is not None and store.tk_pid is not None
            else None
        )
        broker0, store0 = self.broker_counters(), self.store_counters()
        with profiled(store.tk_pid, profile, self.profile_native) as recorded:
            store_pid, pulsar_pid = store.pid(), pulsar.pid
            cpu0 = proc_cpu_s(store_pid), proc_cpu_s(pulsar_pid)
            latencies, errors, seconds = run_calls(
                pulsar.admin_url, concurrency, calls, self.stop, validate
            )
            cpu1 = proc_cpu_s(store_pid), proc_cpu_s(pulsar_pid)
        broker1, store1 = self.broker_counters(), self.store_counters()
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
            broker_ops=delta(broker0, broker1),
            store_requests=delta(store0, store1),
            profile=recorded,
            first_error=errors[0] if errors else None,
        )

    def restart(self, timeout_s: int) -> dict[str, Any]:
        """Stop the Pulsar JVM and start it again on the same store and data, until it serves:
        how long each took, and what the store did meanwhile."""
        store0, cpu0 = self.store_counters(), proc_cpu_s(self.store.pid())
        t0 = time.monotonic()
        try:
            self.pulsar.stop()
            t1 = time.monotonic()
            self.pulsar.start(timeout_s=timeout_s)
        except (RuntimeError, subprocess.SubprocessError) as e:
            raise BenchError(f"broker restart failed: {e}") from e
        t2 = time.monotonic()
        cpu1, store1 = proc_cpu_s(self.store.pid()), self.store_counters()
        return {
            "stop_s": round(t1 - t0, 1),
            "start_s": round(t2 - t1, 1),
            "store_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2),
            "store_requests": delta(store0, store1),
            "broker_ops_at_start": self.broker_counters(),
        }


def check_subscriptions(
    admin_url: str, paths: list[str], concurrency: int, stop: threading.Event
) -> list[str]:
    """GET each `…/subscriptions` path: those whose answer is not exactly [SUBSCRIPTION]."""
    bad: list[str] = []
    lock = threading.Lock()
    cursor = iter(paths)

    def worker() -> None:
        client = Admin(admin_url)
        try:
            while not stop.is_set():
                with lock:
                    path = next(cursor, None)
                if path is None:
                    return
                try:
                    status, data = client.call("GET", path)
                    subs = json.loads(data) if status == 200 else f"HTTP {status}"
                except (OSError, http.client.HTTPException, ValueError) as e:
                    client.close()
                    subs = f"{type(e).__name__}: {e}"
                if subs != [SUBSCRIPTION]:
                    with lock:
                        bad.append(f"{path}: {subs}")
        finally:
            client.close()

    run_workers(worker, concurrency, stop)
    return bad


def listing(admin_url: str, namespace: str) -> tuple[set[str], set[str]]:
    """(the namespace's persistent topics, partitions included; its partitioned topics)."""
    admin = Admin(admin_url)
    try:
        topics = set(json.loads(admin.ok("GET", f"/admin/v2/persistent/{namespace}")))
        parts = set(json.loads(admin.ok("GET", f"/admin/v2/persistent/{namespace}/partitioned")))
    finally:
        admin.close()
    return topics, parts


def check_namespace(
    admin_url: str,
    namespace: str,
    topics: list[str],
    partitioned: list[str],
    partitions: int,
    concurrency: int,
    stop: threading.Event,
) -> dict[str, Any]:
    """The namespace lists exactly `topics`, the partitions of `partitioned` and `partitioned`
    as its partitioned topics; each topic and partitioned topic has exactly the one
    subscription. With no topics given: the namespace lists none."""
    listed, listed_partitioned = listing(admin_url, namespace)
    prefix = f"persistent://{namespace}/"
    expected = {prefix + t for t in topics}
    expected |= {f"{prefix}{p}-partition-{i}" for p in partitioned for i in range(partitions)}
    expected_partitioned = {prefix + p for p in partitioned}
    base = f"/admin/v2/persistent/{namespace}"
    paths = [f"{base}/{t}/subscriptions" for t in [*topics, *partitioned]]
    bad_subs = check_subscriptions(admin_url, paths, concurrency, stop)
    missing = sorted((expected - listed) | (expected_partitioned - listed_partitioned))
    extra = sorted((listed - expected) | (listed_partitioned - expected_partitioned))
    return {
        "namespace": namespace,
        "expected": len(expected) + len(expected_partitioned),
        "listed": len(listed) + len(listed_partitioned),
        "missing": missing[:20],
        "missing_count": len(missing),
        "unexpected": extra[:20],
        "unexpected_count": len(extra),
        "bad_subscriptions": bad_subs[:20],
        "bad_subscription_count": len(bad_subs),
        "ok": not missing and not extra and not bad_subs and not stop.is_set(),
    }


def report_check(name: str, check: dict[str, Any]) -> None:
    eprint(
        f"[{name}] check {check['namespace']}: {check['listed']}/{check['expected']} listed, "
        f"{check['missing_count']} missing, {check['unexpected_count']} unexpected, "
        f"{check['bad_subscription_count']} without exactly ['{SUBSCRIPTION}']"
        + ("" if check["ok"] else f": FAILED {check}")
    )


def setup_namespaces(admin_url: str, concurrency: list[int]) -> None:
    admin = Admin(admin_url)
    try:
        admin.ok(
            "PUT",
            f"/admin/v2/tenants/{TENANT}",
            json.dumps({"adminRoles": [], "allowedClusters": ["standalone"]}).encode(),
        )
        for c in concurrency:
            admin.ok("PUT", f"/admin/v2/namespaces/{TENANT}/c{c}")
            admin.ok("POST", f"/admin/v2/namespaces/{TENANT}/c{c}/inactiveTopicPolicies", KEEP)
    finally:
        admin.close()


def run_store(name: str, args: argparse.Namespace, workdir: Path, stop: threading.Event) -> Run:
    with start_store(name, workdir, args) as store:
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
        bench = Bench(store, pulsar, stop, args.profile_dir, args.profile_native)
        try:
            eprint(
                f"[{name}] Pulsar ready in {run.pulsar_start_s:.0f} s: {pulsar.admin_url} "
                f"(pid {pulsar.pid})"
            )
            try:
                run_phases(bench, run, args)
            except BenchError as e:  # the phases measured so far are kept
                run.error = str(e)
                eprint(f"[{name}] error: {e}")
            run.idle_deletions = idle_deletions(pulsar_dir / "pulsar.log")
            if run.idle_deletions:
                eprint(f"[{name}] FAILED: {run.idle_deletions} topics deleted for inactivity")
        finally:
            eprint(f"[{name}] stopping Pulsar ...")
            pulsar.close()
        return run


def run_phases(bench: Bench, run: Run, args: argparse.Namespace) -> None:
    name, stop = run.store, bench.stop
    setup_namespaces(bench.pulsar.admin_url, args.concurrency)
    topics = [f"t{i:05d}" for i in range(args.topics)]
    partitioned = (
        [] if "partitioned" in args.skip else [f"p{i:05d}" for i in range(args.partitioned)]
    )
    partitions_body = str(args.partitions).encode()

    def timed(c: int, phase: str, calls: list[Call], validate: Validate | None = None) -> None:
        if not calls:
            return
        cell = bench.phase(c, phase, calls, validate)
        run.phases.append(cell)
        print_phase(cell)
        if cell.first_error:
            eprint(f"[{name}] {cell.errors} errors, first: {cell.first_error}")
        if stop.is_set():
            raise KeyboardInterrupt

    def check(c: int, created: bool) -> None:
        ns = f"{TENANT}/c{c}"
        result = check_namespace(
            bench.pulsar.admin_url,
            ns,
            topics if created else [],
            partitioned if created else [],
            args.partitions,
            c,
            stop,
        )
        result["after"] = "create" if created else "delete"
        run.checks.append(result)
        report_check(name, result)

    for c in args.concurrency:
        base = f"/admin/v2/persistent/{TENANT}/c{c}"
        timed(c, "create-topic", [("PUT", f"{base}/{t}", None) for t in topics])
        timed(
            c,
            "create-subscription",
            [("PUT", f"{base}/{t}/subscription/{SUBSCRIPTION}", LATEST) for t in topics],
        )
        timed(
            c,
            "create-partitioned",
            [("PUT", f"{base}/{p}/partitions", partitions_body) for p in partitioned],
        )
        timed(
            c,
            "subscribe-partitioned",
            [("PUT", f"{base}/{p}/subscription/{SUBSCRIPTION}", LATEST) for p in partitioned],
        )
        check(c, created=True)
    if "restart" not in args.skip:
        eprint(f"[{name}] restarting the broker ...")
        run.restart = bench.restart(args.pulsar_timeout)
        print_restart(name, run.restart)
        for c in args.concurrency:
            base = f"/admin/v2/persistent/{TENANT}/c{c}"
            timed(
                c,
                "reload-topic",
                [("GET", f"{base}/{t}/stats", None) for t in topics],
                has_subscription,
            )
            timed(
                c,
                "reload-partitioned",
                [("GET", f"{base}/{p}/partitioned-stats", None) for p in partitioned],
                has_subscription,
            )
    if "delete" not in args.skip:
        for c in args.concurrency:
            base = f"/admin/v2/persistent/{TENANT}/c{c}"
            timed(c, "delete-topic", [("DELETE", f"{base}/{t}", None) for t in topics])
            timed(
                c,
                "delete-partitioned",
                [("DELETE", f"{base}/{p}/partitions", None) for p in partitioned],
            )
            check(c, created=False)


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
    f"{'store':<8} {'conc':>4} {'phase':<21} {'ops':>5} {'err':>4} {'ops/s':>8} "
    f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'store cpu ms/op':>15} {'pulsar cpu ms/op':>16}"
)


def per_op(cpu_s: float | None, ops: int) -> float | None:
    """CPU milliseconds per successful call."""
    return None if cpu_s is None or not ops else cpu_s * 1e3 / ops


def print_phase(p: Phase) -> None:
    print(
        f"{p.store:<8} {p.concurrency:>4} {p.phase:<21} {p.ops:>5} {p.errors:>4} "
        f"{fmt(p.ops_per_s, 1):>8} {fmt(p.p50_ms):>8} {fmt(p.p99_ms):>8} {fmt(p.max_ms, 1):>8} "
        f"{fmt(per_op(p.store_cpu_s, p.ops), 1):>15} {fmt(per_op(p.pulsar_cpu_s, p.ops), 1):>16}",
        flush=True,
    )


def print_restart(store: str, restart: dict[str, Any]) -> None:
    print(
        f"{store:<8} broker restart: stopped in {restart['stop_s']:.1f} s, serving again in "
        f"{restart['start_s']:.1f} s (store CPU meanwhile {fmt(restart['store_cpu_s'])} s; "
        f"store requests {per_call(restart['store_requests'], 1)})",
        flush=True,
    )


def per_call(counts: dict[str, float] | None, calls: int, limit: int = 6) -> str:
    """`counts` divided by `calls`, largest first, as "kind=n.n ..." (the first `limit` kinds);
    "-" when unknown."""
    if counts is None or not calls:
        return "-"
    if not counts:
        return "none"
    ranked = sorted(counts.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    shown = " ".join(f"{kind}={n / calls:.1f}" for kind, n in ranked[:limit])
    return shown + (f" (+{len(ranked) - limit} more)" if len(ranked) > limit else "")


def print_requests(runs: list[Run]) -> None:
    """Per store and phase: the metadata requests one call cost, as the broker and as the store
    count them."""
    print(
        "\nmetadata requests per call (broker: its driver's completed get/put/del; store: its "
        "own counters, see --help)"
    )
    print(f"{'store':<8} {'conc':>4} {'phase':<21} {'broker per call':<28} store per call")
    for run in runs:
        for p in run.phases:
            print(
                f"{p.store:<8} {p.concurrency:>4} {p.phase:<21} "
                f"{per_call(p.broker_ops, p.ops):<28} {per_call(p.store_requests, p.ops)}"
            )


def ratio_pairs(stores: list[str]) -> list[tuple[str, str]]:
    """(store, anchor) pairs to compare: every store with the first, and each TableKeeper
    front-end with the real server of its protocol when both ran."""
    if not stores:
        return []
    pairs = [(s, stores[0]) for s in stores[1:]]
    for tk, real in PROTOCOL_ANCHORS.items():
        if tk in stores and real in stores and (tk, real) not in pairs:
            pairs.append((tk, real))
    return pairs


def ratios(runs: list[Run]) -> list[dict[str, Any]]:
    """Each pair of `ratio_pairs`, phase by phase: ops/s, p50, p99, store and broker CPU per
    call of the store over the anchor (None where the anchor's figure is 0 or unknown)."""
    by_store = {run.store: {(p.concurrency, p.phase): p for p in run.phases} for run in runs}

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or not b or a != a or b != b else round(a / b, 2)

    out = []
    for store, anchor in ratio_pairs([run.store for run in runs]):
        for key, p in by_store[store].items():
            a = by_store[anchor].get(key)
            if a is None:
                continue
            out.append(
                {
                    "store": store,
                    "anchor": anchor,
                    "concurrency": p.concurrency,
                    "phase": p.phase,
                    "ops_per_s": ratio(p.ops_per_s, a.ops_per_s),
                    "p50": ratio(p.p50_ms, a.p50_ms),
                    "p99": ratio(p.p99_ms, a.p99_ms),
                    "store_cpu_per_op": ratio(
                        per_op(p.store_cpu_s, p.ops), per_op(a.store_cpu_s, a.ops)
                    ),
                    "pulsar_cpu_per_op": ratio(
                        per_op(p.pulsar_cpu_s, p.ops), per_op(a.pulsar_cpu_s, a.ops)
                    ),
                }
            )
    return out


def print_ratios(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print(
        "\nratios (ops/s > 1: faster than the anchor; latency and CPU per call < 1: better)\n"
        f"{'store/anchor':<14} {'conc':>4} {'phase':<21} {'ops/s':>6} {'p50':>6} {'p99':>6} "
        f"{'store cpu':>9} {'broker cpu':>10}"
    )
    for r in rows:
        print(
            f"{r['store'] + '/' + r['anchor']:<14} {r['concurrency']:>4} {r['phase']:<21} "
            f"{fmt(r['ops_per_s']):>6} {fmt(r['p50']):>6} {fmt(r['p99']):>6} "
            f"{fmt(r['store_cpu_per_op']):>9} {fmt(r['pulsar_cpu_per_op']):>10}"
        )


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--topics", type=positive_int, default=1000, help="topics per namespace (default 1000)"
    )
    parser.add_argument(
        "--partitioned",
        type=int,
        default=None,
        help="partitioned topics per namespace (default: topics / 10, at least 1)",
    )
    parser.add_argument(
        "--partitions", type=positive_int, default=4, help="partitions of each (default 4)"
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
        "--skip",
        default="",
        help=f"comma-separated groups of phases to leave out: {','.join(SKIPPABLE)}",
    )
    parser.add_argument(
        "--oxia-bin",
        type=Path,
        default=default_binary(),
        help="the real Oxia's binary (default $OXIA_BIN, else .deploy/bin/oxia); "
        "without it the oxia store is skipped with a note",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record the TableKeeper server with py-spy during each timed phase "
        "(collapsed stacks under benchmarks/out/)",
    )
    parser.add_argument(
        "--profile-native", action="store_true", help="with --profile: native frames too"
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
    if len(set(args.stores)) != len(args.stores):
        parser.error("--stores: a store named twice")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    unknown = [s for s in args.skip if s not in SKIPPABLE]
    if unknown:
        parser.error(f"--skip: unknown {unknown}; choose from {','.join(SKIPPABLE)}")
    if args.partitioned is None:
        args.partitioned = max(1, args.topics // 10)
    elif args.partitioned < 0:
        parser.error("--partitioned must be >= 0")
    if args.profile_native and not args.profile:
        parser.error("--profile-native needs --profile")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    notes: list[str] = []
    if "oxia" in args.stores and not args.oxia_bin.is_file():
        notes.append(f"no Oxia binary at {args.oxia_bin} (--oxia-bin): the oxia store is skipped")
        args.stores.remove("oxia")
    args.profile_dir = None
    if args.profile:
        if not PY_SPY.is_file():
            notes.append(f"--profile: no py-spy at {PY_SPY} (make install): not profiling")
        elif any(s.startswith("tk-") for s in args.stores):
            args.profile_dir = OUT_DIR / f"pulsar-metadata-{stamp}-profile"
            args.profile_dir.mkdir(parents=True, exist_ok=True)
    for note in notes:
        eprint(f"note: {note}")
    if not args.stores:
        return 1
    load_start = os.getloadavg()
    if load_start[0] > 1.0:
        eprint(f"warning: load average {load_start[0]:.1f} before start; expect noise")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-pulsar-metadata-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    runs: list[Run] = []
    status = 0
    groups = [g for g in ("create", *SKIPPABLE) if g not in args.skip]
    print(
        f"Pulsar 4.0.7 admin API: {args.topics} topics + 1 subscription each, "
        f"{args.partitioned if 'partitioned' not in args.skip else 0} partitioned topics of "
        f"{args.partitions}; phases {','.join(groups)}; concurrency "
        f"{','.join(map(str, args.concurrency))}; stores {','.join(args.stores)}"
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
                if run.error is not None:
                    status = max(status, 1)
                    if not args.keep_going:
                        break
                    continue
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
    if measured:
        print_requests(measured)
    rows = ratios(measured)
    print_ratios(rows)
    profiles = [p.profile for r in measured for p in r.phases if p.profile]
    if profiles:
        print(
            f"\npy-spy profiles (collapsed stacks), one per TableKeeper phase: {args.profile_dir}"
        )
    for note in notes:
        print(f"note: {note}")
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
        "notes": notes,
        "runs": [asdict(r) for r in runs],
        "ratios": rows,
        "exit_status": status,
    }
    write_report(report, args.out or OUT_DIR / f"pulsar-metadata-{stamp}.json", load_start)
    return status


if __name__ == "__main__":
    sys.exit(main())
