"""Prometheus metrics of one server, registered in a registry passed in (no global state).

Labels: per range (`range`, its log name) and per storage container, never per namespace or
table name: a name would need a catalog lookup at every scrape (from the scrape thread), and the
number of tables is up to the users, so neither is cheap or bounded. Counts of ranges are
bounded by `--max-open-ranges`; containers by the cluster's fixed container count.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
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


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
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

    def wal_appended(self, seconds: float, records: int, payload_bytes: int) -> None:
        self.wal_append_seconds.observe(seconds)
        self.wal_append_records.observe(records)
        self.wal_append_bytes.inc(payload_bytes)

    def auth_failed(self, reason: str) -> None:
        self.auth_failures.labels(reason).inc()

    def observe_forward(self, method: str) -> None:
        self.forwarded.labels(method).inc()

    def observe_request(self, method: str, code: int, seconds: float) -> None:
        self.requests.labels(method, str(code)).inc()
        self.request_seconds.labels(method).observe(seconds)

    def register_range_stats(self, stats: Callable[[], list[RangeStats]]) -> None:
        """`stats()` returns one `RangeStats` per open range at scrape time."""
        self.registry.register(_RangeCollector(stats))

    def register_container_stats(self, stats: Callable[[], dict[int, tuple[int, int]]]) -> None:
        """`stats()` returns {container id: (open ranges, estimated keys)} at scrape time."""
        self.registry.register(_ContainerCollector(stats))

    def register_open_files(self, stats: Callable[[], OpenFilesStats]) -> None:
        """`stats()` returns the open table ranges and file descriptors at scrape time."""
        self.registry.register(_OpenFilesCollector(stats))

    def register_process(self, version: str | None = None) -> None:
        """The process's CPU, memory, file descriptors and start time (`process_*`), the Python
        platform (`python_info`), and `tablekeeper_build_info{version=...}`."""
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        Info("tablekeeper_build", "The server's build", registry=self.registry).info(
            {"version": version or package_version(), "python": platform.python_version()}
        )

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


@dataclass(frozen=True, slots=True)
class RangeStats:
    """One open range, as the metrics endpoint reports it."""

    range: str
    wal_bytes: int
    applied_sequence: int
    checkpoint_age_s: float | None
    """None if this process has not checkpointed the range yet."""
    checkpoint_duration_s: float
    checkpoint_bytes_uploaded: int
    checkpoint_files_uploaded: int
    checkpoint_files_reused: int


class _RangeCollector(Collector):
    def __init__(self, stats: Callable[[], list[RangeStats]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def family(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"tablekeeper_range_{name}", text, labels=["range"])

        wal = family("wal_bytes", "Bytes in the range's write-ahead log")
        applied = family("applied_sequence", "Last log sequence applied to the range's store")
        age = family("checkpoint_age_seconds", "Seconds since the range's last checkpoint")
        duration = family("checkpoint_duration_seconds", "Duration of the last checkpoint")
        uploaded = family("checkpoint_bytes_uploaded", "Bytes the last checkpoint uploaded")
        files_up = family("checkpoint_files_uploaded", "Files the last checkpoint uploaded")
        files_reused = family("checkpoint_files_reused", "Stored files the last one reused")
        for r in self._stats():
            wal.add_metric([r.range], r.wal_bytes)
            applied.add_metric([r.range], r.applied_sequence)
            if r.checkpoint_age_s is not None:
                age.add_metric([r.range], r.checkpoint_age_s)
                duration.add_metric([r.range], r.checkpoint_duration_s)
                uploaded.add_metric([r.range], r.checkpoint_bytes_uploaded)
                files_up.add_metric([r.range], r.checkpoint_files_uploaded)
                files_reused.add_metric([r.range], r.checkpoint_files_reused)
        yield from (wal, applied, age, duration, uploaded, files_up, files_reused)


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
