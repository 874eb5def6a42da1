"""Server configuration: every setting, its default and its check, in one place.

Each setting is a flag of `tablekeeper server`, a key of its configuration file (`--config FILE`
or `TABLEKEEPER_SERVER_CONFIG`, TOML; the limits under `[limits]`, the security settings under
`[security]`) and an environment variable (`TABLEKEEPER_SERVER_` + the flag's name in capitals).
A flag beats the environment, which beats the file, which beats the default; see
`tablekeeper_server.settings`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tablekeeper_server.etcd.names import DEFAULT_KEYSPACE, front_end_name
from tablekeeper_server.logging_setup import LOG_FORMATS
from tablekeeper_server.oxia.keys import FRONT_END as OXIA_FRONT_END
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.security.config import SECURITY_SETTINGS, SecurityConfig
from tablekeeper_server.settings import (
    BOOL,
    DURATION,
    INT,
    LIST,
    PATH,
    SIZE,
    STRING,
    Resolved,
    Setting,
    SettingError,
    SettingGroup,
    SettingsSpec,
    add_flags,
    choice,
)
from tablekeeper_server.workers import WorkerSlot, resolve_workers

LOG_BACKENDS = ("local", "pulsar")
EVENT_LOOPS = ("uvloop", "asyncio")
RUNTIMES = ("auto", "envoy", "grpc-aio")
"""`auto` is resolved when the configuration is made (`resolve_runtime`)."""
CHECKPOINT_STORES = ("dir", "pulsar")
CHECKPOINT_RECORDS_DEFAULT = 10_000
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_KEYSPACE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""An etcd keyspace's name: a table name that also fits the cluster membership's encoding."""


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
    checkpoint_records: int = CHECKPOINT_RECORDS_DEFAULT
    """Checkpoint a range once it applied this many commands since its last checkpoint; 0 =
    never for that reason. Bounds what a restart or a takeover replays."""
    split_keys: int = 0
    """Split a table range automatically once it holds about this many keys; 0 = never."""
    split_writes: int = 0
    """Split a table range automatically once it applies this many writes/s; 0 = never."""
    split_check_interval_s: float = 30.0
    """How often the automatic split policy looks at the ranges (when one of the above is on)."""
    checkpoints_kept: int = 2
    bind_host: str = "127.0.0.1"
    advertised_host: str = "127.0.0.1"
    port: int = 4181
    metrics_port: int = 9181
    """0 disables the Prometheus endpoint."""
    etcd_port: int = 0
    """The etcd v3 API (`tablekeeper_server.etcd`) on this port; 0 = off."""
    etcd_keyspaces: tuple[str, ...] = ()
    """More etcd keyspaces, `NAME=PORT` each: keyspace NAME (table `etcd/NAME`) on its own
    port (`etcd_keyspace_ports`)."""
    oxia_port: int = 0
    """Oxia's client protocol (`tablekeeper_server.oxia`) on this port; 0 = off."""
    zookeeper_port: int = 0
    """ZooKeeper's client protocol (`tablekeeper_server.zookeeper`) on this port; 0 = off. Not
    to be confused with `zk_hosts`, the ZooKeeper a cluster of servers coordinates through."""
    zookeeper_tick_s: float = 2.0
    """ZooKeeper's tickTime: session timeouts default to 2 and 20 ticks."""
    zookeeper_min_session_timeout_s: float = 0.0
    """The shortest session timeout a client is given; 0 = 2 ticks."""
    zookeeper_max_session_timeout_s: float = 0.0
    """The longest session timeout a client is given; 0 = 20 ticks."""
    zookeeper_max_packet_bytes: int = 0xFFFFF
    """ZooKeeper's jute.maxbuffer: a longer packet closes its connection."""
    zookeeper_container_check_interval_s: float = 60.0
    """How often empty containers and expired TTL nodes are deleted (ZooKeeper's
    znode.container.checkIntervalMs); 0 = never."""
    containers: int = 8
    workers: int = 1
    """Server processes sharing this host's containers (`tablekeeper_server.workers`)."""
    event_loop: str = "uvloop"
    """`uvloop` (if installed; else asyncio's, with a warning) or `asyncio`."""
    runtime: str = "grpc-aio"
    """What serves the gRPC ports' HTTP/2 (main, etcd, Oxia): `envoy` (Envoy's, the calls
    handed to Python as ASGI requests; `rpc.envoy`) or `grpc-aio` (grpcio's server). The
    `--runtime` setting's default, `auto`, is `envoy` when pyvoy is installed, else
    `grpc-aio` (a configuration made in code, without settings, runs in-process)."""
    runtime_fell_back: bool = False
    """`auto` became `grpc-aio` because pyvoy is not installed (the server says so)."""
    wal_syncs_on_loop: bool | None = None
    """Whether a local log may write and sync its groups on the event loop's thread while its
    syncs average under `log.local.INLINE_BELOW_S` (not a setting). None: on Envoy only; grpc.aio
    reads and writes the network on the loop itself, and a sync there stalls every call (puts
    at 16 in flight lost 39 % when it did)."""
    worker: WorkerSlot | None = None
    """Set in a worker process (by its supervisor): which worker it is."""
    max_open_ranges: int = 1000
    max_followers: int = 64
    standby: bool = False
    """Table ranges open at once in this server (each holds ~8 file descriptors); the least
    recently used idle ones are closed to open more. Root and meta ranges are not counted."""
    metrics_max_tables: int = 1000
    """Distinct (namespace, table) label pairs on /metrics; the ranges of further tables are
    counted under `<other>` (`tablekeeper_server.metrics.TableLabels`)."""
    limits: Limits = field(default_factory=Limits)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    wal_segment_bytes_max: int = 64 * 1024 * 1024
    rocksdb_memory_bytes: int = 256 * 1024 * 1024
    """RocksDB memory shared by all of this process's ranges: block cache and (up to half of
    it) memtables (`storage.rocksdb.RocksMemory`)."""
    shutdown_grace_s: float = 10.0
    """On SIGTERM, how long in-flight calls may take to finish before they are cut."""
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
    def etcd_keyspace_ports(self) -> dict[str, int]:
        """Every etcd keyspace served -> its port: `keyspace` on `--etcd-port` (if on), then
        `--etcd-keyspaces`. Raises ValueError for a malformed or repeated entry."""
        ports: dict[str, int] = {DEFAULT_KEYSPACE: self.etcd_port} if self.etcd_port else {}
        for entry in self.etcd_keyspaces:
            name, sep, port_text = entry.partition("=")
            name = name.strip()
            if not sep or not port_text.strip().isdigit():
                raise ValueError(f"--etcd-keyspaces: {entry!r} is not NAME=PORT")
            if not _KEYSPACE_NAME.fullmatch(name):
                raise ValueError(
                    f"--etcd-keyspaces: keyspace {name!r}: use 1-64 letters, digits, '_', '.' "
                    "or '-'"
                )
            if name in ports:
                raise ValueError(
                    f"--etcd-keyspaces: keyspace {name!r} is given twice"
                    + (" (keyspace is --etcd-port's)" if name == DEFAULT_KEYSPACE else "")
                )
            port = int(port_text)
            if not 0 < port < 65536:
                raise ValueError(f"--etcd-keyspaces: port {port} of {name!r} is not in 1..65535")
            ports[name] = port
        return ports

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
        etcd_ports = list(self.etcd_keyspace_ports.values())
        taken = [self.port, self.metrics_port, self.oxia_port, self.zookeeper_port, *etcd_ports]
        for port in etcd_ports:
            if taken.count(port) > 1:
                raise ValueError(f"etcd port {port} is also used by another port setting")
        self._validate_zookeeper(taken)
        if self.max_open_ranges < 1:
            raise ValueError("--max-open-ranges must be at least 1")
        if self.max_followers < 0:
            raise ValueError("--max-followers must be at least 0")
        if self.metrics_max_tables < 0:
            raise ValueError("--metrics-max-tables must be >= 0 (0 = no table labels)")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"--event-loop must be one of {', '.join(EVENT_LOOPS)}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"--runtime must be one of {', '.join(RUNTIMES)}")
        if self.workers < 1:
            raise ValueError("--workers must be at least 1 (0 = one per core)")
        if self.workers > 1:
            self._validate_workers()
        for setting in LIMIT_SETTINGS:
            if getattr(self.limits, setting.field.partition(".")[2]) < 1:
                raise ValueError(f"{setting.flag} must be at least 1")
        self.security.validate()
        if self.checkpoint_interval_s < 0:
            raise ValueError("--checkpoint-interval must be >= 0 (0 = only on demand)")
        if self.checkpoint_records < 0:
            raise ValueError("--checkpoint-records must be >= 0 (0 = not by records)")
        if self.shutdown_grace_s < 0:
            raise ValueError("--shutdown-grace must be >= 0")
        if self.split_keys < 0 or self.split_writes < 0:
            raise ValueError("--split-keys and --split-writes must be >= 0 (0 = never)")
        if self.split_check_interval_s <= 0:
            raise ValueError("--split-check-interval must be > 0")
        if self.rocksdb_memory_bytes < 8 * 1024 * 1024:
            raise ValueError("--rocksdb-memory must be at least 8MiB")
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

    def _validate_zookeeper(self, taken: list[int]) -> None:
        if not 0 <= self.zookeeper_port < 65536:
            raise ValueError("--zookeeper-port must be in 0..65535 (0 = off)")
        if self.zookeeper_port and taken.count(self.zookeeper_port) > 1:
            raise ValueError(
                f"--zookeeper-port {self.zookeeper_port} is also used by another port setting"
            )
        if self.zookeeper_tick_s <= 0:
            raise ValueError("--zookeeper-tick-time must be positive")
        if self.zookeeper_min_session_timeout_s < 0 or self.zookeeper_max_session_timeout_s < 0:
            raise ValueError("ZooKeeper session timeouts must be >= 0 (0 = from the tick time)")
        if (
            self.zookeeper_min_session_timeout_s
            and self.zookeeper_max_session_timeout_s
            and self.zookeeper_min_session_timeout_s > self.zookeeper_max_session_timeout_s
        ):
            raise ValueError(
                "--zookeeper-min-session-timeout is over --zookeeper-max-session-timeout"
            )
        if self.zookeeper_max_packet_bytes < 1024:
            raise ValueError("--zookeeper-max-packet-bytes must be at least 1KiB")
        if self.zookeeper_container_check_interval_s < 0:
            raise ValueError("--zookeeper-container-check-interval must be >= 0 (0 = never)")
        if self.zookeeper_port and (self.security.tls_on or self.security.auth_on):
            raise ValueError(
                "--zookeeper-port serves neither TLS nor TableKeeper's tokens and roles yet "
                "(ZooKeeper's own ACLs and digest authentication are enforced on it): leave it "
                "off on a server with --tls-cert or authentication"
            )

    def _validate_workers(self) -> None:
        if self.cluster_mode:
            raise ValueError(
                "--workers is for a standalone server (in cluster mode, run more servers)"
            )
        if self.containers < self.workers:
            raise ValueError(f"--workers {self.workers} needs at least as many --containers")

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


ENV_PREFIX = "TABLEKEEPER_SERVER_"
"""Each setting's environment variable: this plus the flag's name in capitals (`-` as `_`)."""
CONFIG_ENV_VAR = "TABLEKEEPER_SERVER_CONFIG"
"""Names the configuration file when `--config` is not given."""

_D = ServerConfig()
_L = Limits()


def _s(key: str, kind: Any, field: str, text: str, **more: Any) -> Setting:
    """A setting whose default is `ServerConfig`'s (or `Limits`') value of `field`."""
    owner: Any = _L if field.startswith("limits.") else _D
    default = getattr(owner, field.rpartition(".")[2])
    return Setting(key, kind, default, text, field, **more)


STORAGE_SETTINGS = (
    _s("data-dir", PATH, "data_dir", "RocksDB state", default_text="./data"),
    _s("wal-dir", PATH, "wal_dir", "range logs", default_text="DATA_DIR/wal"),
    _s(
        "checkpoint-dir",
        PATH,
        "checkpoint_dir",
        "checkpoint store directory, local or shared",
        default_text="DATA_DIR/checkpoints",
    ),
    _s(
        "checkpoint-interval",
        DURATION,
        "checkpoint_interval_s",
        "time between checkpoints of each changed range (seconds, or 90s, 5m, 1h), 0 = on "
        "demand only",
    ),
    _s(
        "checkpoint-records",
        INT,
        "checkpoint_records",
        "also checkpoint a range once it applied this many commands since its last "
        "checkpoint: bounds what a restart or a takeover replays, 0 = never for that reason",
    ),
    _s("checkpoints-kept", INT, "checkpoints_kept", "checkpoints kept per range"),
    _s(
        "split-keys",
        INT,
        "split_keys",
        "split a table range automatically (online, like `table split`) once it holds about "
        "this many keys (RocksDB's estimate, watch history included), 0 = never",
    ),
    _s(
        "split-writes",
        INT,
        "split_writes",
        "split a table range automatically once it applies more writes per second than this "
        "(measured over --split-check-interval), 0 = never",
    ),
    _s(
        "split-check-interval",
        DURATION,
        "split_check_interval_s",
        "how often the automatic split policy looks at the open table ranges",
    ),
    _s(
        "shutdown-grace",
        DURATION,
        "shutdown_grace_s",
        "on SIGTERM, how long in-flight calls may take to finish before they are cut (watch "
        "and keep-alive streams end at once; their clients resume elsewhere)",
    ),
    _s(
        "wal-segment-bytes",
        SIZE,
        "wal_segment_bytes_max",
        "WAL segment size (bytes, or 512KiB, 64MiB); truncation deletes whole segments",
    ),
    _s(
        "log",
        choice(*LOG_BACKENDS),
        "log_backend",
        "range write-ahead logs: local segment files or Pulsar topics",
    ),
    _s(
        "checkpoint-store",
        choice(*CHECKPOINT_STORES),
        "checkpoint_store",
        "checkpoints: a directory (--checkpoint-dir) or Pulsar topics",
    ),
    _s(
        "pulsar-url",
        STRING,
        "pulsar_url",
        "Pulsar service URL for --log/--checkpoint-store pulsar",
    ),
    _s("pulsar-admin-url", STRING, "pulsar_admin_url", "Pulsar admin (HTTP) URL"),
    _s(
        "pulsar-namespace",
        STRING,
        "pulsar_namespace",
        "TENANT/NAMESPACE of the range logs; checkpoints use NAMESPACE-checkpoints",
    ),
    _s(
        "pulsar-timeout",
        DURATION,
        "pulsar_timeout_s",
        "time a Pulsar operation or append may take before failing",
    ),
)
NETWORK_SETTINGS = (
    _s("host", STRING, "bind_host", "address to bind"),
    # Its default is empty, not ServerConfig's: unset, it follows --host (a server bound to
    # another address must not register as 127.0.0.1).
    Setting(
        "advertise-host",
        STRING,
        "",
        "host clients should use",
        "advertised_host",
        default_text="the --host value",
    ),
    _s("port", INT, "port", "gRPC port"),
    _s("metrics-port", INT, "metrics_port", "Prometheus port, 0 = off"),
    _s(
        "metrics-max-tables",
        INT,
        "metrics_max_tables",
        "distinct namespace/table label pairs on /metrics; the ranges of further tables are "
        "counted under namespace and table <other> (0: every table)",
    ),
    _s("etcd-port", INT, "etcd_port", "serve the etcd v3 API on this port, 0 = off"),
    _s(
        "etcd-keyspaces",
        LIST,
        "etcd_keyspaces",
        "more etcd keyspaces, NAME=PORT each (comma-separated): keyspace NAME, table etcd/NAME, "
        "on its own port",
        metavar="NAME=PORT,...",
    ),
    _s("oxia-port", INT, "oxia_port", "serve Oxia's client protocol on this port, 0 = off"),
)
ZOOKEEPER_SETTINGS = (
    _s(
        "zookeeper-port",
        INT,
        "zookeeper_port",
        "serve ZooKeeper's client protocol (jute over TCP) on this port, 0 = off",
    ),
    _s(
        "zookeeper-tick-time",
        DURATION,
        "zookeeper_tick_s",
        "ZooKeeper's tickTime: session timeouts default to 2 and 20 ticks",
    ),
    _s(
        "zookeeper-min-session-timeout",
        DURATION,
        "zookeeper_min_session_timeout_s",
        "the shortest session timeout a client is given, 0 = 2 ticks",
    ),
    _s(
        "zookeeper-max-session-timeout",
        DURATION,
        "zookeeper_max_session_timeout_s",
        "the longest session timeout a client is given, 0 = 20 ticks",
    ),
    _s(
        "zookeeper-max-packet-bytes",
        SIZE,
        "zookeeper_max_packet_bytes",
        "ZooKeeper's jute.maxbuffer: a longer packet closes its connection",
    ),
    _s(
        "zookeeper-container-check-interval",
        DURATION,
        "zookeeper_container_check_interval_s",
        "how often empty containers and expired TTL znodes are deleted, 0 = never",
    ),
)
PROCESS_SETTINGS = (
    _s("containers", INT, "containers", "storage containers"),
    _s(
        "workers",
        INT,
        "workers",
        "server processes sharing the containers, each with its own port and core, 0 = one "
        "per core",
    ),
    _s(
        "event-loop",
        choice(*EVENT_LOOPS),
        "event_loop",
        "the event loop: uvloop (asyncio's if uvloop is not installed) or asyncio",
    ),
    Setting(
        "runtime",
        choice(*RUNTIMES),
        "auto",
        "what serves the gRPC ports' HTTP/2: envoy (Envoy's, from pyvoy: the calls reach "
        "Python as ASGI requests, at less CPU per call), grpc-aio (grpcio's server), or auto: "
        "envoy if pyvoy is installed (tablekeeper[envoy]), else grpc-aio",
        "runtime",
    ),
    _s(
        "max-open-ranges",
        INT,
        "max_open_ranges",
        "table ranges open at once (~8 file descriptors each); the least recently used idle "
        "ones are closed to open more, and reopen on their next request",
    ),
    _s(
        "max-followers",
        INT,
        "max_followers",
        "cluster mode: followers (read-only copies of ranges other servers own, for reads "
        "with read_from='follower') kept open at once; 0 = answer those reads from the owner",
    ),
    _s(
        "standby",
        BOOL,
        "standby",
        "cluster mode: follow every range of the containers other servers own (not only those "
        "read with read_from='follower'), so a container taken over opens on up-to-date "
        "copies instead of restoring checkpoints; one follower per range: raise "
        "--max-followers to match",
    ),
    _s(
        "rocksdb-memory",
        SIZE,
        "rocksdb_memory_bytes",
        "RocksDB memory shared by all ranges of a server process: block cache, and memtables "
        "up to half of it",
    ),
    _s(
        "log-level",
        choice(*LOG_LEVELS, normalize=str.upper),
        "log_level",
        "the least severe level logged",
    ),
    _s(
        "log-format",
        choice(*LOG_FORMATS),
        "log_format",
        "text: readable lines; json: one JSON object per line (time, level, logger, message, "
        "worker)",
    ),
)
CLUSTER_SETTINGS = (
    _s(
        "zk",
        STRING,
        "zk_hosts",
        "ZooKeeper connect string: join a cluster (cluster mode; needs --log pulsar and a shared "
        "checkpoint store; the number of containers comes from `cluster init`)",
        metavar="HOST:PORT[,...]",
        default_text="standalone",
    ),
    _s("cluster", STRING, "cluster", "cluster name in ZooKeeper"),
    _s(
        "zk-session-timeout",
        DURATION,
        "zk_session_timeout_s",
        "time without contact before ZooKeeper declares this server dead and its containers move",
    ),
)
LIMIT_SETTINGS = tuple(
    _s(key, kind, f"limits.{name}", text, section="limits")
    for key, kind, name, text in (
        ("max-key-bytes", SIZE, "key_bytes_max", "largest key"),
        ("max-value-bytes", SIZE, "value_bytes_max", "largest value"),
        ("max-txn-ops", INT, "txn_ops_max", "compares plus ops of one txn"),
        ("max-batch-ops", INT, "batch_ops_max", "ops of one Batch RPC"),
        (
            "max-response-bytes",
            SIZE,
            "response_bytes_max",
            "keys and values one response may carry (scans page below it)",
        ),
        (
            "max-history-bytes",
            SIZE,
            "history_bytes_max",
            "change events one range keeps in memory for watches",
        ),
        (
            "max-history-bytes-total",
            SIZE,
            "history_bytes_total_max",
            "change events kept in memory by all ranges of this server",
        ),
        (
            "max-watcher-queue-bytes",
            SIZE,
            "watcher_queue_bytes_max",
            "undelivered events one watcher may queue before it is cancelled as too slow",
        ),
        ("max-table-ranges", INT, "table_ranges_max", "ranges of one table"),
    )
)

SERVER_SETTINGS = SettingsSpec(
    groups=(
        SettingGroup("storage: data, logs and checkpoints", STORAGE_SETTINGS),
        SettingGroup("network", NETWORK_SETTINGS),
        SettingGroup(
            "ZooKeeper's client protocol (not --zk, the cluster's own ZooKeeper)",
            ZOOKEEPER_SETTINGS,
        ),
        SettingGroup("processes and logging", PROCESS_SETTINGS),
        SettingGroup("cluster mode", CLUSTER_SETTINGS),
        SettingGroup(
            "limits, [limits] in a --config file (a request over one is refused, nothing "
            "applied; sizes in bytes or 64KiB, 4MiB, 1GiB)",
            LIMIT_SETTINGS,
            section="limits",
        ),
        SettingGroup(
            "security, [security] in a --config file (TLS and authentication; off by default)",
            tuple(
                dataclasses.replace(s, field=f"security.{s.field}", section="security")
                for s in SECURITY_SETTINGS
            ),
            section="security",
        ),
    ),
    env_prefix=ENV_PREFIX,
    config_env_var=CONFIG_ENV_VAR,
)

HELP_EPILOG = f"""\
Every flag can also be set in a configuration file or the environment. A flag given on the
command line wins over the environment, which wins over the file, which wins over the default.

  file:  --config FILE, or {CONFIG_ENV_VAR}=FILE. TOML; each key is a flag's name
         without "--"; the limits go under [limits], the security flags under [security]:
             data-dir = "/var/lib/tablekeeper"
             checkpoint-interval = "5m"
             superuser-roles = ["admin"]
             [limits]
             max-value-bytes = "8MiB"
         Unknown keys are errors. Relative paths are relative to the working directory.
  env:   {ENV_PREFIX}<FLAG>, the flag's name in capitals with "-" as "_":
             {ENV_PREFIX}DATA_DIR=/var/lib/tablekeeper
             {ENV_PREFIX}CHECKPOINT_INTERVAL=5m  {ENV_PREFIX}METRICS_TLS=true
         An empty variable counts as unset; unknown {ENV_PREFIX}* variables are errors.
  --print-config prints the effective configuration as such a file, each value's source in a
  comment, and exits.

Durations are seconds or take a unit (250ms, 90s, 5m, 1h); sizes are bytes or take one
(512KiB, 64MiB, 1GiB; KB, MB, GB are powers of 1000). Switches take --no-X to turn them off.
"""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config`, `--print-config` and a flag per setting (`SERVER_SETTINGS`)."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        dest="config_file",
        help=f"read settings from this TOML file (env {CONFIG_ENV_VAR}); see below",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration (a file for --config) and exit",
    )
    add_flags(parser, SERVER_SETTINGS.groups)


def resolve_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> Resolved:
    """Every setting's value and source: the flags in `args` over `environ` over the
    configuration file over the defaults. Raises `SettingError`."""
    return SERVER_SETTINGS.resolve(
        SERVER_SETTINGS.given_on_command_line(args),
        environ,
        getattr(args, "config_file", None),
    )


def resolve_runtime() -> str:
    """What `--runtime auto` is: `envoy` when pyvoy (`tablekeeper[envoy]`) is installed, else
    `grpc-aio`."""
    return "envoy" if importlib.util.find_spec("pyvoy") is not None else "grpc-aio"


def config_from_settings(resolved: Resolved, worker: WorkerSlot | None = None) -> ServerConfig:
    """The validated configuration; a `ValueError` names the source of each setting involved
    (`--containers must be at least 1 (--containers from tk.toml: containers)`)."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {"limits": {}, "security": {}}
    for setting in SERVER_SETTINGS.settings:
        value = resolved.values[setting.key]
        owner, _, name = setting.field.rpartition(".")
        (nested[owner] if owner else top)[name] = value
    top["advertised_host"] = top["advertised_host"] or top["bind_host"]
    try:
        if top["workers"] < 0:
            raise ValueError("--workers must be at least 1 (0 = one per core)")
        top["workers"] = resolve_workers(top["workers"])
        if top["runtime"] == "auto":
            top["runtime"] = resolve_runtime()
            top["runtime_fell_back"] = top["runtime"] != "envoy"
        config = ServerConfig(
            **top,
            worker=worker,
            limits=Limits(**nested["limits"]),
            security=SecurityConfig(**nested["security"]),
        )
        config.validate()
    except ValueError as exc:
        raise SettingError(resolved.explain(str(exc))) from None
    return config


def effective_values(config: ServerConfig) -> dict[str, Any]:
    """Each setting's value in `config`, by key (what `config_from_settings` made of them)."""
    values = {}
    for setting in SERVER_SETTINGS.settings:
        value: Any = config
        for name in setting.field.split("."):
            value = getattr(value, name)
        values[setting.key] = value
    return values


def printed_config(config: ServerConfig, resolved: Resolved) -> str:
    """`--print-config`: `config` as a TOML file, each value's source in a comment."""
    return SERVER_SETTINGS.to_toml(effective_values(config), resolved.sources)


def worker_command(
    config: ServerConfig, environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The flags and environment a worker of `--workers` runs with: exactly the supervisor's
    configuration, as flags, and its environment without the settings' variables (and so
    without the configuration file, which could have changed since the supervisor read it)."""
    flags = SERVER_SETTINGS.to_argv(effective_values(config))
    env = {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX)}
    return flags, env


def front_end_port(worker: WorkerSlot | None, name: str, port: int) -> int:
    """The port this process serves front-end `name` on: the configured one, or (a worker)
    the one its supervisor gave it."""
    if worker is None:
        return port
    given = worker.frontend_port(name)
    assert given is not None, f"the supervisor gave worker {worker.index} no port for {name}"
    return given


def front_end_ports(config: ServerConfig) -> dict[str, int]:
    """Front-end name -> configured port, of every front-end this server serves."""
    ports = {front_end_name(ks): port for ks, port in config.etcd_keyspace_ports.items()}
    if config.oxia_port:
        ports[OXIA_FRONT_END] = config.oxia_port
    return ports


def front_end_ports_of(config: ServerConfig) -> list[int]:
    """The ports this process serves its etcd keyspaces and Oxia on (as `serve` opens them)."""
    return [
        front_end_port(config.worker, name, port) for name, port in front_end_ports(config).items()
    ]
