"""Server configuration: every setting, its default and its check, in one place."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from tablekeeper_server.logging_setup import LOG_FORMATS
from tablekeeper_server.range.validation import Limits
from tablekeeper_server.security.config import (
    SecurityConfig,
    add_security_arguments,
    security_config_from_args,
)
from tablekeeper_server.workers import WorkerSlot, resolve_workers

LOG_BACKENDS = ("local", "pulsar")
EVENT_LOOPS = ("uvloop", "asyncio")
CHECKPOINT_STORES = ("dir", "pulsar")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path = Path("./data")
    wal_dir: Path | None = None
    """Where range logs live; defaults to `<data_dir>/wal`."""
    checkpoint_dir: Path | None = None
    """Where range checkpoints go; defaults to `<data_dir>/checkpoints`. Put it (and the WAL)
    outside the data directory to be able to rebuild a server on an empty data directory."""
    checkpoint_interval_s: float = 300.0
    """0 disables periodic checkpoints (on-demand ones still work)."""
    checkpoints_kept: int = 2
    bind_host: str = "127.0.0.1"
    advertised_host: str = "127.0.0.1"
    port: int = 4181
    metrics_port: int = 9181
    """0 disables the Prometheus endpoint."""
    etcd_port: int = 0
    """The etcd v3 API (`tablekeeper_server.etcd`) on this port; 0 = off."""
    oxia_port: int = 0
    """Oxia's client protocol (`tablekeeper_server.oxia`) on this port; 0 = off."""
    containers: int = 8
    workers: int = 1
    event_loop: str = "uvloop"
    """`uvloop` (if installed; else asyncio's, with a warning) or `asyncio`."""
    """Server processes sharing this host's containers (`tablekeeper_server.workers`)."""
    worker: WorkerSlot | None = None
    """Set in a worker process (by its supervisor): which worker it is."""
    max_open_ranges: int = 1000
    """Table ranges open at once in this server (each holds ~8 file descriptors); the least
    recently used idle ones are closed to open more. Root and meta ranges are not counted."""
    limits: Limits = field(default_factory=Limits)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    wal_segment_bytes_max: int = 64 * 1024 * 1024
    shutdown_grace_s: float = 10.0
    log_level: str = "INFO"
    log_format: str = "text"
    """`text` (readable lines) or `json` (one JSON object per line); see `logging_setup`."""
    log_backend: str = "local"
    """`local` (segment files in `wal_dir`) or `pulsar` (one Pulsar topic per range)."""
    checkpoint_store: str = "dir"
    """`dir` (`checkpoint_dir`) or `pulsar` (topics in `<pulsar_namespace>-checkpoints`)."""
    pulsar_url: str = "pulsar://127.0.0.1:6650"
    pulsar_admin_url: str = "http://127.0.0.1:8080"
    pulsar_namespace: str = "public/tablekeeper"
    """`tenant/namespace` of the range logs; checkpoints go to `tenant/namespace-checkpoints`.
    Servers that should share (take over) ranges use the same one."""
    pulsar_timeout_s: float = 30.0
    """Pulsar operation and send timeout: how long an append waits while Pulsar is away."""
    zk_hosts: str | None = None
    """ZooKeeper connect string; set, the server joins cluster `cluster` (cluster mode)."""
    cluster: str = "tablekeeper"
    zk_session_timeout_s: float = 5.0
    """How long ZooKeeper keeps a silent server's session: the failure-detection time."""

    @property
    def cluster_mode(self) -> bool:
        return self.zk_hosts is not None

    @property
    def effective_wal_dir(self) -> Path:
        return self.wal_dir if self.wal_dir is not None else self.data_dir / "wal"

    @property
    def effective_checkpoint_dir(self) -> Path:
        return (
            self.checkpoint_dir
            if self.checkpoint_dir is not None
            else self.data_dir / "checkpoints"
        )

    @property
    def db_dir(self) -> Path:
        return self.data_dir / "db"

    def validate(self) -> None:
        if self.containers < 1:
            raise ValueError("--containers must be at least 1")
        if not 0 < self.port < 65536:
            raise ValueError("--port must be in 1..65535")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError("--metrics-port must be in 0..65535 (0 disables metrics)")
        if not 0 <= self.etcd_port < 65536:
            raise ValueError("--etcd-port must be in 0..65535 (0 = off)")
        if not 0 <= self.oxia_port < 65536:
            raise ValueError("--oxia-port must be in 0..65535 (0 = off)")
        if self.max_open_ranges < 1:
            raise ValueError("--max-open-ranges must be at least 1")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"--event-loop must be one of {', '.join(EVENT_LOOPS)}")
        if self.workers < 1:
            raise ValueError("--workers must be at least 1 (0 = one per core)")
        if self.workers > 1:
            self._validate_workers()
        self.limits.check()
        self.security.validate()
        if self.checkpoint_interval_s < 0:
            raise ValueError("--checkpoint-interval must be >= 0 (0 = only on demand)")
        if self.wal_segment_bytes_max < 4096:
            raise ValueError("--wal-segment-bytes must be at least 4096")
        if self.checkpoints_kept < 1:
            raise ValueError("--checkpoints-kept must be at least 1")
        if self.log_backend not in LOG_BACKENDS:
            raise ValueError(f"--log must be one of {', '.join(LOG_BACKENDS)}")
        if self.checkpoint_store not in CHECKPOINT_STORES:
            raise ValueError(f"--checkpoint-store must be one of {', '.join(CHECKPOINT_STORES)}")
        tenant, _, namespace = self.pulsar_namespace.partition("/")
        if not tenant or not namespace or "/" in namespace:
            raise ValueError("--pulsar-namespace must be TENANT/NAMESPACE")
        if self.pulsar_timeout_s <= 0:
            raise ValueError("--pulsar-timeout must be positive")
        if self.cluster_mode:
            self._validate_cluster()
            if self.etcd_port:
                raise ValueError("--etcd-port is not available in cluster mode yet")
            if self.oxia_port:
                raise ValueError("--oxia-port is not available in cluster mode yet")

    def _validate_workers(self) -> None:
        if self.cluster_mode:
            raise ValueError(
                "--workers is for a standalone server (in cluster mode, run more servers)"
            )
        if self.containers < self.workers:
            raise ValueError(f"--workers {self.workers} needs at least as many --containers")
        if self.etcd_port or self.oxia_port:
            raise ValueError(
                "the etcd and Oxia ports are served by one process: use --workers 1 with "
                "--etcd-port or --oxia-port"
            )

    def _validate_cluster(self) -> None:
        if not self.cluster or "/" in self.cluster:
            raise ValueError("--cluster must be a name without '/'")
        if self.zk_session_timeout_s <= 0:
            raise ValueError("--zk-session-timeout must be positive")
        if self.log_backend != "pulsar":
            raise ValueError(
                "cluster mode needs a log every server can open: --log pulsar "
                "(containers move between servers with their logs)"
            )
        if self.checkpoint_store == "dir" and self.checkpoint_dir is None:
            raise ValueError(
                "cluster mode needs a checkpoint store every server can read: "
                "--checkpoint-store pulsar, or a --checkpoint-dir shared by all servers"
            )

    @property
    def pulsar_tenant_and_namespace(self) -> tuple[str, str]:
        tenant, _, namespace = self.pulsar_namespace.partition("/")
        return tenant, namespace


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    parser.add_argument(
        "--data-dir", type=Path, default=d.data_dir, help="RocksDB state (default ./data)"
    )
    parser.add_argument(
        "--wal-dir", type=Path, default=None, help="range logs (default DATA_DIR/wal)"
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="checkpoint store directory, local or shared (default DATA_DIR/checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=d.checkpoint_interval_s,
        help="seconds between checkpoints of each changed range, 0 = on demand only (default 300)",
    )
    parser.add_argument(
        "--wal-segment-bytes",
        type=int,
        default=d.wal_segment_bytes_max,
        help="WAL segment size; truncation deletes whole segments (default 64 MiB)",
    )
    parser.add_argument(
        "--checkpoints-kept",
        type=int,
        default=d.checkpoints_kept,
        help="checkpoints kept per range (default 2)",
    )
    parser.add_argument("--host", default=d.bind_host, help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--advertise-host", default=None, help="host clients should use (default: --host)"
    )
    parser.add_argument("--port", type=int, default=d.port, help="gRPC port (default 4181)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=d.metrics_port,
        help="Prometheus port, 0 = off (default 9181)",
    )
    parser.add_argument(
        "--etcd-port",
        type=int,
        default=d.etcd_port,
        help="serve the etcd v3 API on this port, 0 = off (default 0)",
    )
    parser.add_argument(
        "--oxia-port",
        type=int,
        default=d.oxia_port,
        help="serve Oxia's client protocol on this port, 0 = off (default 0)",
    )
    parser.add_argument(
        "--containers", type=int, default=d.containers, help="storage containers (default 8)"
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=d.event_loop,
        help="the event loop: uvloop (default; asyncio's if uvloop is not installed) or asyncio",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help="server processes sharing the containers, each with its own port and core; "
        "0 = one per core (default 1; the etcd and Oxia ports need 1)",
    )
    parser.add_argument(
        "--max-open-ranges",
        type=int,
        default=d.max_open_ranges,
        help="table ranges open at once (~8 file descriptors each); the least recently used "
        f"idle ones are closed to open more, and reopen on their next request "
        f"(default {d.max_open_ranges})",
    )
    _add_limit_arguments(parser, d.limits)
    add_security_arguments(parser)
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=d.log_level,
        help=f"{', '.join(LOG_LEVELS)} (default {d.log_level})",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=d.log_format,
        help="text: readable lines; json: one JSON object per line (time, level, logger, "
        f"message, worker) (default {d.log_format})",
    )
    parser.add_argument(
        "--log",
        choices=LOG_BACKENDS,
        default=d.log_backend,
        help="range write-ahead logs: local segment files (default) or Pulsar topics",
    )
    parser.add_argument(
        "--checkpoint-store",
        choices=CHECKPOINT_STORES,
        default=d.checkpoint_store,
        help="checkpoints: a directory (--checkpoint-dir, default) or Pulsar topics",
    )
    parser.add_argument(
        "--pulsar-url",
        default=d.pulsar_url,
        help=f"Pulsar service URL for --log/--checkpoint-store pulsar (default {d.pulsar_url})",
    )
    parser.add_argument(
        "--pulsar-admin-url",
        default=d.pulsar_admin_url,
        help=f"Pulsar admin (HTTP) URL (default {d.pulsar_admin_url})",
    )
    parser.add_argument(
        "--pulsar-namespace",
        default=d.pulsar_namespace,
        help="TENANT/NAMESPACE of the range logs; checkpoints use NAMESPACE-checkpoints "
        f"(default {d.pulsar_namespace})",
    )
    parser.add_argument(
        "--pulsar-timeout",
        type=float,
        default=d.pulsar_timeout_s,
        help="seconds a Pulsar operation or append may take before failing (default 30)",
    )
    parser.add_argument(
        "--zk",
        default=None,
        metavar="HOST:PORT[,...]",
        help="ZooKeeper connect string: join a cluster (cluster mode; needs --log pulsar and "
        "a shared checkpoint store; the number of containers comes from `cluster init`)",
    )
    parser.add_argument(
        "--cluster", default=d.cluster, help=f"cluster name in ZooKeeper (default {d.cluster})"
    )
    parser.add_argument(
        "--zk-session-timeout",
        type=float,
        default=d.zk_session_timeout_s,
        help="seconds without contact before ZooKeeper declares this server dead and its "
        f"containers move (default {d.zk_session_timeout_s:g})",
    )


_LIMIT_FLAGS = (
    # (flag, Limits field, help)
    ("--max-key-bytes", "key_bytes_max", "largest key"),
    ("--max-value-bytes", "value_bytes_max", "largest value"),
    ("--max-txn-ops", "txn_ops_max", "compares plus ops of one txn"),
    ("--max-batch-ops", "batch_ops_max", "ops of one Batch RPC"),
    (
        "--max-response-bytes",
        "response_bytes_max",
        "keys and values one response may carry (scans page below it)",
    ),
    (
        "--max-history-bytes",
        "history_bytes_max",
        "change events one range keeps in memory for watches",
    ),
    (
        "--max-history-bytes-total",
        "history_bytes_total_max",
        "change events kept in memory by all ranges of this server",
    ),
    (
        "--max-watcher-queue-bytes",
        "watcher_queue_bytes_max",
        "undelivered events one watcher may queue before it is cancelled as too slow",
    ),
    ("--max-table-ranges", "table_ranges_max", "ranges of one table"),
)


def _human(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return str(value)


def _add_limit_arguments(parser: argparse.ArgumentParser, limits: Limits) -> None:
    group = parser.add_argument_group("limits (a request over one is refused, nothing applied)")
    for flag, name, text in _LIMIT_FLAGS:
        default = getattr(limits, name)
        group.add_argument(
            flag,
            type=int,
            default=default,
            dest=name,
            help=f"{text} (default {_human(default) if name.endswith('bytes_max') else default})",
        )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    config = ServerConfig(
        data_dir=args.data_dir,
        wal_dir=args.wal_dir,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval_s=args.checkpoint_interval,
        checkpoints_kept=args.checkpoints_kept,
        wal_segment_bytes_max=args.wal_segment_bytes,
        bind_host=args.host,
        advertised_host=args.advertise_host or args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        etcd_port=args.etcd_port,
        oxia_port=args.oxia_port,
        containers=args.containers,
        workers=resolve_workers(args.workers),
        event_loop=args.event_loop,
        worker=WorkerSlot.from_env(),
        max_open_ranges=args.max_open_ranges,
        limits=Limits(**{name: getattr(args, name) for _, name, _ in _LIMIT_FLAGS}),
        security=security_config_from_args(args),
        log_level=args.log_level.upper(),
        log_format=args.log_format,
        log_backend=args.log,
        checkpoint_store=args.checkpoint_store,
        pulsar_url=args.pulsar_url,
        pulsar_admin_url=args.pulsar_admin_url,
        pulsar_namespace=args.pulsar_namespace,
        pulsar_timeout_s=args.pulsar_timeout,
        zk_hosts=args.zk,
        cluster=args.cluster,
        zk_session_timeout_s=args.zk_session_timeout,
    )
    config.validate()
    return config
