"""Prometheus metrics of one server, registered in a registry passed in (no global state).

Labels: per storage container (bounded by the cluster's fixed container count), and per table,
`namespace` and `table`, for the figures of the open ranges (`tablekeeper_range_*`, summed or
maxed over the table's ranges open on this server; per range figures are in `tablekeeper admin
status`). Table labels are bounded: at most `--metrics-max-tables` (namespace, table) pairs at
once (`TableLabels`); the ranges of further tables are counted under `<other>`. The root and
meta ranges are labelled `<system>`/`<root>` and `<system>`/`<meta>`. These values cannot
collide with real names: namespace and table names cannot contain `<` or `>`.

Names are learned when a table range opens (`TableNames`, off the request path: a catalog read,
local or from the root range's owner), so a scrape never reads the catalog. A table whose
ranges all closed (deleted, idle and evicted, moved away) has no series and gives its label up.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import importlib.metadata
import logging
import platform
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

log = logging.getLogger(__name__)


class _GcPauses:
    """A `gc.callbacks` hook: times each collection into the histogram of its generation.
    (No collection starts while one, with its callbacks, is running, so it never reenters.)"""

    def __init__(self, histogram: Histogram) -> None:
        self._generations = [histogram.labels(str(generation)) for generation in range(3)]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._generations[info["generation"]].observe(time.perf_counter() - self._started)


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._gc_pauses: _GcPauses | None = None
        self.requests = Counter(
            "tablekeeper_requests",
            "gRPC requests served, by method and application status code",
            ["method", "code"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "tablekeeper_request_seconds",
            "gRPC request latency in the server, by method",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.wal_append_seconds = Histogram(
            "tablekeeper_wal_append_seconds",
            "Latency of one durable WAL append (one group commit)",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.wal_append_records = Histogram(
            "tablekeeper_wal_append_records",
            "Commands per WAL append (group commit batch size)",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.forwarded = Counter(
            "tablekeeper_forwarded_requests",
            "Requests (and watch streams) forwarded to the server that owns their container",
            ["method"],
            registry=registry,
        )
        self.wal_append_bytes = Counter(
            "tablekeeper_wal_append_bytes", "Payload bytes appended to WALs", registry=registry
        )
        self.auth_failures = Counter(
            "tablekeeper_auth_failures",
            "Calls refused as unauthenticated, by reason (anonymous, expired, invalid_token, ...)",
            ["reason"],
            registry=registry,
        )
        self._request_series: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        """The labelled series of `requests` and `request_seconds` by (method, code)."""

    def wal_appended(self, seconds: float, records: int, payload_bytes: int) -> None:
        self.wal_append_seconds.observe(seconds)
        self.wal_append_records.observe(records)
        self.wal_append_bytes.inc(payload_bytes)

    def auth_failed(self, reason: str) -> None:
        self.auth_failures.labels(reason).inc()

    def observe_forward(self, method: str) -> None:
        self.forwarded.labels(method).inc()

    def observe_request(self, method: str, code: int, seconds: float) -> None:
        series = self._request_series.get((method, code))
        if series is None:  # methods and codes are few: each pair's series is looked up once
            series = (self.requests.labels(method, str(code)), self.request_seconds.labels(method))
            self._request_series[(method, code)] = series
        series[0].inc()
        series[1].observe(seconds)

    def observe_requests(self, method: str, code: int, seconds: float, count: int) -> None:
        """`observe_request` for `count` requests that took the same `seconds` (answered
        together): the same series and the same counts, one update each instead of `count`."""
        series = self._request_series.get((method, code))
        if series is None:
            series = (self.requests.labels(method, str(code)), self.request_seconds.labels(method))
            self._request_series[(method, code)] = series
        series[0].inc(count)
        _observe_many(series[1], seconds, count)

    def register_range_stats(
        self, stats: Callable[[], list[RangeStats]], labels: TableLabels
    ) -> None:
        """`stats()` returns one `RangeStats` per open range at scrape time; `labels` bounds
        the (namespace, table) label pairs of their series."""
        self.registry.register(_RangeCollector(stats, labels))

    def register_container_stats(self, stats: Callable[[], dict[int, tuple[int, int]]]) -> None:
        """`stats()` returns {container id: (open ranges, estimated keys)} at scrape time."""
        self.registry.register(_ContainerCollector(stats))

    def register_open_files(self, stats: Callable[[], OpenFilesStats]) -> None:
        """`stats()` returns the open table ranges and file descriptors at scrape time."""
        self.registry.register(_OpenFilesCollector(stats))

    def register_process(self, version: str | None = None) -> None:
        """The process's CPU, memory, file descriptors and start time (`process_*`), the Python
        platform (`python_info`), `tablekeeper_build_info{version=...}`, and the cyclic garbage
        collector: its collections and what they freed (`python_gc_*`) and how long each one
        held the process (`tablekeeper_gc_pause_seconds{generation}`: the event loop stands
        still for that long). `close` stops the timing."""
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Info("tablekeeper_build", "The server's build", registry=self.registry).info(
            {"version": version or package_version(), "python": platform.python_version()}
        )
        pauses = Histogram(
            "tablekeeper_gc_pause_seconds",
            "How long each collection of Python's cyclic garbage collector held the process, "
            "by generation (2: a full collection)",
            ["generation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._gc_pauses = _GcPauses(pauses)
        gc.callbacks.append(self._gc_pauses)

    def close(self) -> None:
        """Stop timing collections (the server stopped; its registry is no longer scraped)."""
        if self._gc_pauses is not None:
            gc.callbacks.remove(self._gc_pauses)
            self._gc_pauses = None

    def register_followers(self, stats: Callable[[], FollowerStats]) -> None:
        """`stats()` returns the followers' counts and staleness at scrape time."""
        self.registry.register(_FollowersCollector(stats))

    def register_rocksdb_memory(self, used: Callable[[], int], budget: int) -> None:
        """`used()`: bytes of the shared RocksDB memory in use at scrape time (`budget`:
        --rocksdb-memory)."""
        self.registry.register(_RocksMemoryCollector(used, budget))

    def register_live_counts(self, stats: Callable[[], LiveCounts]) -> None:
        """`stats()` returns the open watches and live sessions at scrape time."""
        self.registry.register(_LiveCountsCollector(stats))


def package_version() -> str:
    """The installed tablekeeper package's version ("unknown" if it is not installed)."""
    try:
        return importlib.metadata.version("tablekeeper")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class LiveCounts:
    """Watches and sessions on the ranges this server hosts now."""

    watches: int
    """Live watchers of this server's ranges (a watch forwarded to another server counts
    there)."""
    sessions: int
    """Sessions alive on this server's ranges."""
    streams: dict[tuple[str, str], int] = field(default_factory=dict)
    """Open streams of the front-ends by (front-end, method): watches, change feeds and
    keep-alives (`edge.streams`)."""


class _LiveCountsCollector(Collector):
    def __init__(self, stats: Callable[[], LiveCounts]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self._stats()
        yield GaugeMetricFamily(
            "tablekeeper_open_watches",
            "Watches open on the ranges this server hosts",
            value=counts.watches,
        )
        yield GaugeMetricFamily(
            "tablekeeper_live_sessions",
            "Sessions alive on the ranges this server hosts",
            value=counts.sessions,
        )
        streams = GaugeMetricFamily(
            "tablekeeper_open_streams",
            "Open streams of the front-ends (watches, change feeds, keep-alives), by method",
            labels=["front_end", "method"],
        )
        for (front_end, method), n in sorted(counts.streams.items()):
            streams.add_metric([front_end, method], n)
        yield streams


@dataclass(frozen=True, slots=True)
class FollowerStats:
    """The followers this server keeps (read replicas of ranges other servers own)."""

    open: int
    handed_over: int
    """Followers whose store a range of this server took over (since start)."""
    staleness_max_s: float
    """The stalest open follower's staleness (0 with none): see `range.follower`."""


class _FollowersCollector(Collector):
    def __init__(self, stats: Callable[[], FollowerStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        yield GaugeMetricFamily(
            "tablekeeper_followers",
            "Followers (read-only copies of ranges other servers own) open on this server",
            value=stats.open,
        )
        yield CounterMetricFamily(
            "tablekeeper_follower_handovers",
            "Ranges this server took over that opened on their follower's store",
            value=stats.handed_over,
        )
        yield GaugeMetricFamily(
            "tablekeeper_follower_staleness_seconds",
            "The stalest follower here: time since it last found nothing unapplied in its log",
            value=stats.staleness_max_s,
        )


class _RocksMemoryCollector(Collector):
    def __init__(self, used: Callable[[], int], budget: int) -> None:
        self._used = used
        self._budget = budget

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "tablekeeper_rocksdb_memory_bytes",
            "RocksDB memory in use (block cache and memtables of every range)",
            value=self._used(),
        )
        yield GaugeMetricFamily(
            "tablekeeper_rocksdb_memory_budget_bytes", "--rocksdb-memory", value=self._budget
        )


@dataclass(frozen=True, slots=True)
class OpenFilesStats:
    """The pressure on file descriptors: open table ranges (bounded) and the process's files."""

    open_table_ranges: int
    max_open_ranges: int
    evictions: int
    open_files: int
    """-1 where the platform cannot count them."""
    open_files_limit: int


class _OpenFilesCollector(Collector):
    def __init__(self, stats: Callable[[], OpenFilesStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._stats()
        yield GaugeMetricFamily(
            "tablekeeper_open_table_ranges",
            "Table ranges open now (bounded by --max-open-ranges; root and meta ranges excluded)",
            value=s.open_table_ranges,
        )
        yield GaugeMetricFamily(
            "tablekeeper_max_open_ranges", "--max-open-ranges", value=s.max_open_ranges
        )
        yield CounterMetricFamily(
            "tablekeeper_range_evictions",
            "Idle table ranges closed to stay within --max-open-ranges",
            value=s.evictions,
        )
        if s.open_files >= 0:
            yield GaugeMetricFamily(
                "tablekeeper_open_files", "File descriptors the process holds", value=s.open_files
            )
        yield GaugeMetricFamily(
            "tablekeeper_open_files_limit",
            "The process's soft limit on file descriptors (RLIMIT_NOFILE)",
            value=s.open_files_limit,
        )


SYSTEM_NAMESPACE = "<system>"
"""The `namespace` label of the root and meta ranges."""
ROOT_TABLE = "<root>"
META_TABLE = "<meta>"
OTHER = "<other>"
"""`namespace` and `table` of the ranges of tables over the `TableLabels` bound."""
UNKNOWN = "<unknown>"
"""`namespace` and `table` of a range whose table's name is not known (yet)."""
TableKey = tuple[str, str]
"""(namespace, table name)."""
_OTHER_KEY = (OTHER, OTHER)
_NOT_COUNTED = frozenset(
    {(SYSTEM_NAMESPACE, ROOT_TABLE), (SYSTEM_NAMESPACE, META_TABLE), (UNKNOWN, UNKNOWN)}
)


class TableLabels:
    """Which tables get their own `namespace`/`table` labels: at most `max_tables` at once.

    `assign` is called at every scrape with the tables that have open ranges. A table keeps its
    labels for as long as it has open ranges here; one that has none at a scrape (deleted,
    evicted as idle, moved to another server) gives them up. Tables beyond the bound are
    labelled `<other>`; when labels are free again the next ones, in name order, take them. The
    root and meta ranges and `<unknown>` are not counted. Thread-safe (scrapes may overlap)."""

    def __init__(self, max_tables: int) -> None:
        self.max_tables = max_tables
        self._labelled: set[TableKey] = set()
        self._lock = threading.Lock()

    def assign(self, tables: Iterable[TableKey]) -> dict[TableKey, TableKey]:
        """The labels of each of `tables` (the tables with open ranges now)."""
        present = set(tables)
        with self._lock:
            self._labelled &= present
            for key in sorted(present - self._labelled - _NOT_COUNTED):
                if len(self._labelled) >= self.max_tables:
                    break
                self._labelled.add(key)
            return {
                key: key if key in self._labelled or key in _NOT_COUNTED else _OTHER_KEY
                for key in present
            }


class TableNames:
    """The (namespace, table) of tables whose ranges this server opened, by table (stream) id.

    `opened` (on the event loop, when a table range opens) starts learning a name it does not
    know, through `resolve` (a catalog read, None if the table is gone; retried a few times if
    it fails), so the request
    that opened the range never waits for it. `get` may be called from any thread (the scrape
    thread). At most `entries_max` names are kept beyond those of tables with open ranges
    (`open_tables()`); a name dropped is learned again when its table opens again."""

    RETRIES = 4
    RETRY_DELAY_S = 1.0

    def __init__(
        self,
        resolve: Callable[[int], Awaitable[TableKey | None]],
        open_tables: Callable[[], set[int]],
        entries_max: int = 10_000,
    ) -> None:
        self._resolve = resolve
        self._open_tables = open_tables
        self._entries_max = entries_max
        self._names: dict[int, TableKey] = {}
        self._learning: dict[int, asyncio.Task[None]] = {}

    def get(self, stream_id: int) -> TableKey | None:
        return self._names.get(stream_id)

    def opened(self, stream_id: int) -> None:
        if stream_id in self._names or stream_id in self._learning:
            return
        task = asyncio.get_running_loop().create_task(self._learn(stream_id))
        self._learning[stream_id] = task
        task.add_done_callback(lambda _: self._learning.pop(stream_id, None))

    def forget(self, stream_id: int) -> None:
        self._names.pop(stream_id, None)

    async def learned(self) -> None:
        """Until the names being learned now are known (or given up)."""
        await asyncio.gather(*list(self._learning.values()), return_exceptions=True)

    async def _learn(self, stream_id: int) -> None:
        for attempt in range(self.RETRIES + 1):
            try:
                name = await self._resolve(stream_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == self.RETRIES:
                    log.info("table %d: no name for its metrics (%s)", stream_id, exc)
                    return
                await asyncio.sleep(self.RETRY_DELAY_S * 2**attempt)
                continue
            if name is None:
                return
            if len(self._names) >= self._entries_max:
                keep = self._open_tables()
                self._names = {k: v for k, v in self._names.items() if k in keep}
            self._names[stream_id] = name
            return

    def close(self) -> None:
        for task in list(self._learning.values()):
            task.cancel()


@dataclass(frozen=True, slots=True)
class RangeStats:
    """One open range, as the metrics endpoint reports it."""

    namespace: str
    """Its table's namespace, or `SYSTEM_NAMESPACE` (root and meta ranges), or `UNKNOWN`."""
    table: str
    """Its table's name, or `ROOT_TABLE`, `META_TABLE`, `UNKNOWN`."""
    wal_bytes: int
    applied_sequence: int
    checkpoint_age_s: float | None
    """None if this process has not checkpointed the range yet."""
    checkpoint_duration_s: float
    checkpoint_bytes_uploaded: int
    checkpoint_files_uploaded: int
    checkpoint_files_reused: int
    commands_since_checkpoint: int = 0
    """Commands applied since the range's newest checkpoint (what a takeover would replay)."""
    failed: bool = False
    """The range refuses requests (damaged store, fenced, out of disk: `Range.failure`)."""


@dataclass(slots=True)
class _TableTotals:
    ranges: int = 0
    wal_bytes: int = 0
    applied_sequence: int = 0
    checkpointed: int = 0
    checkpoint_age_s: float = 0.0
    checkpoint_duration_s: float = 0.0
    checkpoint_bytes_uploaded: int = 0
    checkpoint_files_uploaded: int = 0
    checkpoint_files_reused: int = 0
    commands_since_checkpoint: int = 0
    failed: int = 0

    def add(self, r: RangeStats) -> None:
        self.ranges += 1
        self.wal_bytes += r.wal_bytes
        self.applied_sequence += r.applied_sequence
        self.commands_since_checkpoint += r.commands_since_checkpoint
        self.failed += r.failed
        if r.checkpoint_age_s is None:
            return
        self.checkpointed += 1
        self.checkpoint_age_s = max(self.checkpoint_age_s, r.checkpoint_age_s)
        self.checkpoint_duration_s = max(self.checkpoint_duration_s, r.checkpoint_duration_s)
        self.checkpoint_bytes_uploaded += r.checkpoint_bytes_uploaded
        self.checkpoint_files_uploaded += r.checkpoint_files_uploaded
        self.checkpoint_files_reused += r.checkpoint_files_reused


class _RangeCollector(Collector):
    """The open ranges' figures, one series per table (see the module doc)."""

    def __init__(self, stats: Callable[[], list[RangeStats]], labels: TableLabels) -> None:
        self._stats = stats
        self._labels = labels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ranges = self._stats()
        assigned = self._labels.assign((r.namespace, r.table) for r in ranges)
        totals: dict[TableKey, _TableTotals] = {}
        for r in ranges:
            totals.setdefault(assigned[(r.namespace, r.table)], _TableTotals()).add(r)
        folded = sum(1 for key, label in assigned.items() if label != key)

        def family(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=["namespace", "table"])

        open_ranges = family("tablekeeper_table_open_ranges", "Ranges of the table open here")
        wal = family(
            "tablekeeper_range_wal_bytes",
            "Bytes in the write-ahead logs of the table's open ranges",
        )
        applied = family(
            "tablekeeper_range_applied_sequence",
            "Sum over the table's open ranges of the last log sequence applied to its store",
        )
        age = family(
            "tablekeeper_range_checkpoint_age_seconds",
            "Seconds since the oldest last checkpoint of the table's open ranges (of those "
            "checkpointed by this process)",
        )
        duration = family(
            "tablekeeper_range_checkpoint_duration_seconds",
            "Longest duration of the last checkpoints of the table's open ranges",
        )
        uploaded = family(
            "tablekeeper_range_checkpoint_bytes_uploaded",
            "Bytes the last checkpoints of the table's open ranges uploaded",
        )
        files_up = family(
            "tablekeeper_range_checkpoint_files_uploaded",
            "Files the last checkpoints of the table's open ranges uploaded",
        )
        files_reused = family(
            "tablekeeper_range_checkpoint_files_reused",
            "Stored files the last checkpoints of the table's open ranges reused",
        )
        behind = family(
            "tablekeeper_range_commands_since_checkpoint",
            "Sum over the table's open ranges of the commands applied since each one's newest "
            "checkpoint (what a restart or takeover replays from the log)",
        )
        failed = family(
            "tablekeeper_ranges_failed",
            "Open ranges of the table that refuse requests (a damaged store, fenced, out of a "
            "resource); they reopen on their next request",
        )
        for key, t in sorted(totals.items()):
            labels = list(key)
            open_ranges.add_metric(labels, t.ranges)
            wal.add_metric(labels, t.wal_bytes)
            applied.add_metric(labels, t.applied_sequence)
            behind.add_metric(labels, t.commands_since_checkpoint)
            failed.add_metric(labels, t.failed)
            if t.checkpointed:
                age.add_metric(labels, t.checkpoint_age_s)
                duration.add_metric(labels, t.checkpoint_duration_s)
                uploaded.add_metric(labels, t.checkpoint_bytes_uploaded)
                files_up.add_metric(labels, t.checkpoint_files_uploaded)
                files_reused.add_metric(labels, t.checkpoint_files_reused)
        yield from (open_ranges, wal, applied, age, duration, uploaded, files_up, files_reused)
        yield from (behind, failed)
        yield GaugeMetricFamily(
            "tablekeeper_metrics_folded_tables",
            "Tables with open ranges counted under <other> (over --metrics-max-tables)",
            value=folded,
        )


class _ContainerCollector(Collector):
    def __init__(self, stats: Callable[[], dict[int, tuple[int, int]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ranges = GaugeMetricFamily(
            "tablekeeper_container_ranges",
            "Open ranges per storage container",
            labels=["container"],
        )
        keys = GaugeMetricFamily(
            "tablekeeper_container_keys",
            "Estimated keys per storage container (RocksDB estimate, includes metadata)",
            labels=["container"],
        )
        for container_id, (n_ranges, n_keys) in sorted(self._stats().items()):
            ranges.add_metric([str(container_id)], n_ranges)
            keys.add_metric([str(container_id)], n_keys)
        yield ranges
        yield keys


def _observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """`count` observations of `amount` in a labelled histogram, with one update of its sum
    and of one bucket (prometheus_client has no weighted observe; without the fields this
    relies on, it observes `count` times)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if count == 1 or bounds is None or buckets is None or total is None:
        for _ in range(count):
            histogram.observe(amount)
        return
    total.inc(amount * count)
    buckets[bisect.bisect_left(bounds, amount)].inc(count)
