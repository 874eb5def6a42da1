"""Composition root of the server: build everything from config, run, shut down.

Standalone, the server hosts every container; in cluster mode (`--zk`) a `ClusterMember` starts
and stops containers as the cluster's assignment says, and the RPC layer forwards requests for
containers hosted elsewhere.

Only this module picks implementations (RocksDB store, local or Pulsar log, directory or Pulsar
checkpoint store) and wires them together.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import os
import resource
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry, start_http_server

from tablekeeper_server.appliers import server_appliers
from tablekeeper_server.backup.source import RangeBackups
from tablekeeper_server.catalog.meta import CONTAINER_META_STREAM_ID
from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.checkpoint.pinning import PinningCheckpointStore
from tablekeeper_server.cluster.errors import ClusterError
from tablekeeper_server.cluster.status import FixedView, ZooKeeperView
from tablekeeper_server.config import (
    ServerConfig,
    front_end_port,
    front_end_ports,
    worker_command,
)
from tablekeeper_server.container.checkpoint_policy import CheckpointPolicy, CheckpointTriggers
from tablekeeper_server.container.container import ROOT_STREAM_ID, ContainerEnv, OpenRangeLimit
from tablekeeper_server.container.followers import Followers
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.container.split_policy import SplitPolicy, SplitThresholds
from tablekeeper_server.container.standby import Standby
from tablekeeper_server.core.clock import Clock, SystemClock
from tablekeeper_server.core.failpoints import Failpoints
from tablekeeper_server.edge.limits import packet_refusal
from tablekeeper_server.edge.streams import OpenStreams
from tablekeeper_server.errors import CorruptionError, NamespaceNotFoundError, StreamNotFoundError
from tablekeeper_server.etcd.names import front_end_name
from tablekeeper_server.gc_tuning import tune_garbage_collector
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.log.local import INLINE_BELOW_S, LocalLogBackend
from tablekeeper_server.logging_setup import configure_logging
from tablekeeper_server.metrics import (
    META_TABLE,
    ROOT_TABLE,
    SYSTEM_NAMESPACE,
    UNKNOWN,
    FollowerStats,
    LiveCounts,
    OpenFilesStats,
    RangeStats,
    ServerMetrics,
    TableKey,
    TableLabels,
    TableNames,
)
from tablekeeper_server.oxia.keys import FRONT_END as OXIA_FRONT_END
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.admin import AdminServicer
from tablekeeper_server.rpc.envoy import EnvoyApp
from tablekeeper_server.rpc.frontends import FrontEndPeers
from tablekeeper_server.rpc.listen import GrpcPort
from tablekeeper_server.rpc.proxy import Forwarder, RemoteCatalogClient
from tablekeeper_server.rpc.server import SERVICE_NAMES, GrpcServer
from tablekeeper_server.security.access import ACCESS_CACHE_S, AccessControl
from tablekeeper_server.security.auth import Authenticator, AuthInterceptor
from tablekeeper_server.security.tls import ServerTls
from tablekeeper_server.storage.rocksdb import RocksKvStore, RocksMemory
from tablekeeper_server.workers import WorkerSlot, supervise, worker_argv
from tablekeeper_server.zookeeper import FRONT_END as ZOOKEEPER_FRONT_END

if TYPE_CHECKING:  # cluster mode's modules import kazoo (the `cluster` extra): only with --zk
    from tablekeeper_server.cluster.member import ClusterMember
    from tablekeeper_server.cluster.zookeeper import ZkCoordinator

    # The etcd, Oxia and ZooKeeper front-ends: loaded when their ports are served (each range's
    # appliers of every protocol are loaded whatever the flags: replay needs them).
    from tablekeeper_server.etcd.server import EtcdServer
    from tablekeeper_server.oxia.server import OxiaServer
    from tablekeeper_server.zookeeper.server import ZooKeeperServer

log = logging.getLogger(__name__)


def _lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on the data directory so two servers never share it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"error: {data_dir} is in use by another TableKeeper server") from None
    return fd


FILES_PER_RANGE = 8
"""About what one open range holds: its RocksDB files (LOCK, LOG, MANIFEST, SSTs) and its
local log's segment and LOCK."""


def _raise_open_files_limit(max_open_ranges: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (servers hold many files); log it and
    warn when the bound on open ranges (followers included) may not fit. Returns the soft
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open files limit raised from %d to %d", soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    else:
        log.info("open files limit %d", soft)
    needed = max_open_ranges * FILES_PER_RANGE + 256
    if soft != resource.RLIM_INFINITY and needed > soft:
        log.warning(
            "--max-open-ranges + --max-followers (%d) may need about %d file descriptors, "
            "over the limit of %d: "
            "lower it (or raise the hard limit) before puts and checkpoints run out of files",
            max_open_ranges,
            needed,
            soft,
        )
    return int(soft)


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def _syncs_on_loop(config: ServerConfig) -> bool:
    """`ServerConfig.wal_syncs_on_loop`, decided: on Envoy the network I/O runs on Envoy's
    threads, so a sync on the event loop holds up only the Python."""
    if config.wal_syncs_on_loop is not None:
        return config.wal_syncs_on_loop
    return config.runtime == "envoy"


def _log_backend(
    config: ServerConfig, failpoints: Failpoints
) -> tuple[LogBackend, str, Callable[[], None]]:
    """The configured log backend, a description, and how to release it."""
    if config.log_backend == "pulsar":
        from tablekeeper_server.log.pulsar import PulsarLogBackend

        tenant, namespace = config.pulsar_tenant_and_namespace
        pulsar_log = PulsarLogBackend(
            config.pulsar_url,
            config.pulsar_admin_url,
            tenant=tenant,
            namespace=namespace,
            timeout_s=config.pulsar_timeout_s,
            failpoints=failpoints,
        )
        return pulsar_log, pulsar_log.describe(), pulsar_log.close
    local = LocalLogBackend(
        config.effective_wal_dir,
        segment_bytes_max=config.wal_segment_bytes_max,
        failpoints=failpoints,
        inline_below_s=INLINE_BELOW_S if _syncs_on_loop(config) else 0.0,
    )
    return local, f"local {config.effective_wal_dir}", lambda: None


def _checkpoint_store(
    config: ServerConfig, clock: Clock
) -> tuple[CheckpointStore, Callable[[], None]]:
    """The configured checkpoint store and how to release it."""
    if config.checkpoint_store == "pulsar":
        from tablekeeper_server.checkpoint.pulsar import PulsarCheckpointStore

        tenant, namespace = config.pulsar_tenant_and_namespace
        store = PulsarCheckpointStore(
            config.pulsar_url,
            config.pulsar_admin_url,
            tenant=tenant,
            namespace=f"{namespace}-checkpoints",
            timeout_s=config.pulsar_timeout_s,
            clock=clock,
        )
        return store, store.close
    return DirectoryCheckpointStore(config.effective_checkpoint_dir), lambda: None


async def _join_cluster(config: ServerConfig, clock: Clock) -> tuple[ZkCoordinator, int]:
    """Connect to ZooKeeper and read the cluster's number of containers."""
    from tablekeeper_server.cluster.zookeeper import ZkCoordinator

    assert config.zk_hosts is not None
    coordinator = ZkCoordinator(
        config.zk_hosts,
        config.cluster,
        session_timeout_s=config.zk_session_timeout_s,
        clock=clock,
    )
    try:
        await asyncio.to_thread(coordinator.start)
    except Exception as exc:
        raise ClusterError(f"cannot reach ZooKeeper at {config.zk_hosts}: {exc}") from exc
    try:
        num_containers = await asyncio.to_thread(coordinator.num_containers)
    except BaseException:
        await asyncio.to_thread(coordinator.stop)
        raise
    return coordinator, num_containers


async def serve(
    config: ServerConfig,
    *,
    stop: asyncio.Event | None = None,
    on_port: Callable[[GrpcPort], None] | None = None,
) -> None:
    """Run the server until SIGTERM / SIGINT, or until `stop` is set when it is given (then no
    signal handlers are installed: the host that embeds it, whose event loop may not run on
    the main thread, owns the process's signals). `on_port(port)` is called for each gRPC port
    once it can take calls: the main port first, before recovery, then each etcd keyspace's and
    Oxia's (`rpc.envoy` serves them from then on)."""
    # (A follower holds a store as an open range does.)
    files_limit = _raise_open_files_limit(config.max_open_ranges + config.max_followers)
    worker = config.worker
    # A worker's supervisor holds the data directory's lock (see `workers`).
    lock_fd = _lock_data_dir(config.data_dir) if worker is None else None
    coordinator: ZkCoordinator | None = None
    clock = SystemClock()  # the one clock of the server (tests inject their own below this)
    num_containers = config.containers
    if config.cluster_mode:
        coordinator, num_containers = await _join_cluster(config, clock)
    registry_metrics = CollectorRegistry()
    metrics = ServerMetrics(registry_metrics)
    failpoints = Failpoints.from_env()
    log_backend, log_description, close_log = _log_backend(config, failpoints)
    stored_checkpoints, close_checkpoint_store = _checkpoint_store(config, clock)
    # Backups pin the checkpoint they copy against the ranges' garbage collection.
    checkpoint_store = PinningCheckpointStore(stored_checkpoints)
    # Table names for the metrics' labels, learned as table ranges open (from the root range,
    # here or on its owner; `registry` and `admin` exist by the time the first range opens).
    table_names = TableNames(
        lambda stream_id: _table_name(registry, admin, stream_id),
        lambda: {r.name.stream_id for r in registry.all_ranges()},
    )
    rocks_memory = RocksMemory(config.rocksdb_memory_bytes)  # shared by every range's store
    store_factory = functools.partial(RocksKvStore, memory=rocks_memory)
    appliers = server_appliers()  # every protocol's, whatever the flags: replay needs them all
    followers = None
    standby: Standby | None = None
    if coordinator is not None and config.max_followers > 0:
        # Read replicas: a log other servers can read while its owner writes, and shared
        # checkpoints (a follower of a range on the local log could not see its writes).
        followers = Followers(
            config.data_dir / "followers",
            log_backend=log_backend,
            store_factory=store_factory,
            checkpoint_store=checkpoint_store,
            clock=clock,
            appliers=appliers,
            max_open=config.max_followers,
        )
    env = ContainerEnv(
        num_containers=num_containers,
        log_backend=log_backend,
        store_factory=store_factory,
        db_dir=config.db_dir,
        clock=clock,
        appliers=appliers,
        limits=config.limits,
        metrics=metrics,
        checkpoint_store=checkpoint_store,
        checkpoints_kept=config.checkpoints_kept,
        failpoints=failpoints,
        open_hosted_ranges_on_start=coordinator is not None,
        range_limit=OpenRangeLimit(config.max_open_ranges, clock),
        on_table_range_opened=table_names.opened,
        followers=followers,
    )
    # Standalone: every container, here. Cluster: the ones the assignment gives us, later.
    # A worker: its share.
    hosted = [c for c in range(num_containers) if worker is None or worker.owns(c)]
    registry = ContainerRegistry(env, [] if coordinator else hosted)
    streams = OpenStreams()  # every front-end's open streams, ended on shutdown
    _register_metrics(
        metrics,
        registry,
        table_names,
        rocks_memory,
        followers,
        config.metrics_max_tables,
        files_limit,
        streams,
    )
    log.info(
        "starting: data dir %s, logs: %s, checkpoints in %s, %d containers%s",
        config.data_dir,
        log_description,
        checkpoint_store.describe(),
        num_containers,
        f", cluster {config.cluster} at {config.zk_hosts}"
        if coordinator
        else f", worker {worker.index} of {worker.count} hosting {hosted}"
        if worker
        else "",
    )
    tls = config.security.server_tls()
    authenticator = config.security.authenticator()
    admin = AdminServicer(
        registry,
        checkpoint_store=checkpoint_store.describe(),
        interval_s=config.checkpoint_interval_s,
        records=config.checkpoint_records,
        runtime=config.runtime,
    )
    admin.backups = RangeBackups(registry, checkpoint_store, config.data_dir)
    access = (
        AccessControl(admin.access, config.security.is_superuser)
        if authenticator is not None
        else None
    )
    # Cluster mode and workers: the root range may be in another process.
    root_elsewhere = config.cluster_mode or worker is not None
    front = _FrontEndSecurity(tls, authenticator, metrics, admin, root_elsewhere, streams)
    if access is not None:
        main_access = access

        def permissions_changed() -> None:
            main_access.forget()
            front.forget()

        admin.on_permissions_changed = permissions_changed
    if worker is not None:  # container j belongs to worker j
        admin.sibling_containers = [j for j in range(worker.count) if j != worker.index]
    # The port is fixed by configuration (never 0), so the endpoint we register is known now.
    member: ClusterMember | None = None
    if coordinator is not None:
        from tablekeeper_server.cluster.member import ClusterMember

        member = ClusterMember(coordinator, f"{config.advertised_host}:{config.port}", registry)
        # Published with our membership: other servers pass etcd calls on to the keyspace's
        # owner at its etcd port (one port per keyspace).
        for keyspace, port in config.etcd_keyspace_ports.items():
            coordinator.frontends[front_end_name(keyspace)] = f"{config.advertised_host}:{port}"
        # And Oxia clients are told each shard's leader: its container's owner's Oxia port.
        if config.oxia_port:
            coordinator.frontends[OXIA_FRONT_END] = f"{config.advertised_host}:{config.oxia_port}"
        # And ZooKeeper connections to a server that does not own the keyspace are relayed to
        # the owner's ZooKeeper port.
        if config.zookeeper_port:
            coordinator.frontends[ZOOKEEPER_FRONT_END] = (
                f"{config.advertised_host}:{config.zookeeper_port}"
            )
    owner_of = member.owner_of if member is not None else None
    if worker is not None:
        owner_of = worker.owner_of
    server = GrpcServer(
        registry,
        bind_host=config.bind_host,
        port=config.port if worker is None else worker.port,
        advertised_host=config.advertised_host,
        limits=config.limits,
        metrics=metrics,
        admin=admin,
        owner_of=owner_of,
        tls=tls,
        authenticator=authenticator,
        access=access,
        server_token=authenticator.verifier.server_token()
        if authenticator is not None and authenticator.verifier is not None
        else None,
        runtime=config.runtime,
        streams=streams,
    )
    if coordinator is not None and member is not None:
        admin.cluster_view = ZooKeeperView(
            coordinator, config.cluster, member.endpoint, registry.serving
        )
    else:
        endpoints = worker.endpoints if worker is not None else (server.endpoint,)
        index = worker.index if worker is not None else 0
        admin.cluster_view = FixedView(endpoints, index, num_containers, registry.serving)
    if member is not None:
        assert server.forwarder is not None and server.endpoint == member.endpoint
        cluster_member = member
        server.forwarder.draining = lambda: cluster_member.draining
        registry.remote = RemoteCatalogClient(server.forwarder)
        registry.still_owns = member.still_owns
    elif worker is not None:
        assert server.forwarder is not None
        registry.remote = RemoteCatalogClient(server.forwarder)
    _enable_reflection(server)
    # Listen before recovering: while containers open, requests get gRPC NOT_FOUND ("not open
    # yet"), which BookKeeper clients retry, instead of a refused connection, which they do not.
    await server.start(serving=False)
    if on_port is not None:
        on_port(server.grpc)
    etcds: list[EtcdServer] = []  # one per etcd keyspace
    zookeeper: ZooKeeperServer | None = None
    try:
        # Metrics before recovery, so a long recovery can be watched (and a taken port fails
        # now, not after the server already serves).
        if config.metrics_port and (worker is None or worker.index == 0):
            metrics_tls = config.security.metrics_tls
            start_http_server(
                config.metrics_port,
                addr=config.bind_host,
                registry=registry_metrics,
                certfile=str(config.security.tls_cert) if metrics_tls else None,
                keyfile=str(config.security.tls_key) if metrics_tls else None,
            )
        await failpoints.hit_async("server.before_recovery")
        if followers is not None:
            followers.start()
            if config.standby:
                standby = Standby(registry, followers)
                standby.start()
        if member is not None:
            await member.start()
        else:
            await registry.start()
        # Before health says SERVING: a client that waited for it finds the etcd port open.
        for keyspace, port in config.etcd_keyspace_ports.items():
            name = front_end_name(keyspace)
            peers = _front_end_peers(name, coordinator, member, worker, server)
            port = front_end_port(worker, name, port)
            etcds.append(await _start_etcd(config, registry, front, peers, keyspace, port))
            if on_port is not None:
                on_port(etcds[-1].grpc)
        oxia = (
            await _start_oxia(
                config,
                registry,
                front,
                _front_end_peers(OXIA_FRONT_END, coordinator, member, worker, server),
                front_end_port(worker, OXIA_FRONT_END, config.oxia_port),
            )
            if config.oxia_port
            else None
        )
        if oxia is not None and on_port is not None:
            on_port(oxia.grpc)
        if oxia is not None and member is not None:
            member.on_assignment_changed(oxia.leaders.assignment_changed)
        if config.zookeeper_port:
            zookeeper = await _start_zookeeper(
                config,
                registry,
                clock,
                metrics,
                _front_end_peers(ZOOKEEPER_FRONT_END, coordinator, member, worker, server),
                front_end_port(worker, ZOOKEEPER_FRONT_END, config.zookeeper_port),
            )
    except BaseException:
        await server.stop(0)
        if coordinator is not None:
            await asyncio.to_thread(coordinator.stop)
        raise
    if worker is not None and worker.index == 0:
        await _wait_for_workers(worker.siblings(), tls)
    await server.set_serving()
    log.info(
        "serving on %s:%d (metrics on %s)",
        config.bind_host,
        server.port,
        f"{config.bind_host}:{config.metrics_port}/metrics" if config.metrics_port else "off",
    )
    policies = _start_policies(config, registry, admin, clock)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if tls is not None:
            # New connections get the re-read certificate; open ones go on.
            loop.add_signal_handler(signal.SIGHUP, tls.reload)
    await stop.wait()
    for periodic in policies:
        periodic.cancel()
    if member is not None:
        # Hand the containers over first, while this server still forwards requests to
        # their next owners.
        log.info("shutting down: closing and releasing containers")
        await server.set_not_serving()
        await member.stop()
    log.info("shutting down: draining in-flight requests (up to %.0fs)", config.shutdown_grace_s)
    for etcd in etcds:
        await etcd.stop(config.shutdown_grace_s)
    if oxia is not None:
        await oxia.stop(config.shutdown_grace_s)
    if zookeeper is not None:
        await zookeeper.stop()
    await server.stop(config.shutdown_grace_s)
    table_names.close()
    metrics.close()
    if standby is not None:
        await standby.stop()
    if followers is not None:
        await followers.stop()
    await registry.stop()
    await asyncio.to_thread(close_log)
    await asyncio.to_thread(close_checkpoint_store)
    if lock_fd is not None:
        os.close(lock_fd)
    log.info("stopped cleanly")


def _register_metrics(
    metrics: ServerMetrics,
    registry: ContainerRegistry,
    table_names: TableNames,
    rocks_memory: RocksMemory,
    followers: Followers | None,
    metrics_max_tables: int,
    files_limit: int,
    streams: OpenStreams,
) -> None:
    """What the metrics read at each scrape: ranges, open files, containers, the process,
    RocksDB's memory, followers, live watches, sessions and front-ends' open streams."""
    env = registry.env
    metrics.register_range_stats(
        lambda: [_range_stats(r, env.clock, table_names) for r in registry.all_ranges()],
        TableLabels(metrics_max_tables),
    )
    metrics.register_open_files(
        lambda: OpenFilesStats(
            open_table_ranges=env.range_limit.open_count,
            max_open_ranges=env.range_limit.max_open,
            evictions=env.range_limit.evictions,
            open_files=_open_files(),
            open_files_limit=files_limit,
        )
    )
    metrics.register_container_stats(
        lambda: {
            cid: (len(c.ranges), sum(r.estimate_num_keys() for r in c.ranges.values()))
            for cid, c in list(registry.containers.items())  # scraped from another thread
        }
    )
    metrics.register_process()
    metrics.register_rocksdb_memory(rocks_memory.usage, rocks_memory.bytes)
    if followers is not None:
        known = followers
        metrics.register_followers(
            lambda: FollowerStats(
                open=known.open_count,
                handed_over=known.handed_over,
                staleness_max_s=known.staleness_max_s(),
            )
        )
    metrics.register_live_counts(
        lambda: LiveCounts(
            watches=sum(r.watch.watchers for r in registry.all_ranges()),
            sessions=sum(len(r.sessions) for r in registry.all_ranges()),
            streams=streams.counts(),
        )
    )


def _start_policies(
    config: ServerConfig, registry: ContainerRegistry, admin: AdminServicer, clock: Clock
) -> list[asyncio.Task[None]]:
    """The periodic work of a serving server (each only if configured): checkpoints by time
    and records, and splits of ranges past their thresholds."""
    tasks = []
    triggers = CheckpointTriggers(config.checkpoint_interval_s, config.checkpoint_records)
    if triggers.enabled:
        policy = CheckpointPolicy(registry.all_ranges, registry.checkpoint_range, triggers, clock)
        tasks.append(asyncio.create_task(policy.run()))
    thresholds = SplitThresholds(
        config.split_keys, config.split_writes, config.split_check_interval_s
    )
    if thresholds.enabled:
        splits = SplitPolicy(registry.all_ranges, admin.split_by_id, thresholds, clock)
        tasks.append(asyncio.create_task(splits.run()))
    return tasks


def _enable_reflection(server: GrpcServer) -> None:
    """gRPC server reflection on the main port (`grpcurl -plaintext host:port list`)."""
    from grpc_health.v1.health import SERVICE_NAME as HEALTH_SERVICE
    from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

    from tablekeeper_proto.v1 import admin_pb2

    names = (
        *SERVICE_NAMES,
        admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
        HEALTH_SERVICE,
        reflection.SERVICE_NAME,
    )
    # The asyncio servicer, added where the port's other services are (so Envoy serves it too).
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(names), server.grpc.services
    )


async def _wait_for_workers(endpoints: list[str], tls: ServerTls | None) -> None:
    """Until every other worker reports SERVING (worker 0 reports it only then, so a client
    that waited for the server finds every container open)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # only workers need it

    for endpoint in endpoints:
        waited = 0
        while True:
            channel = (
                grpc.aio.secure_channel(endpoint, tls.channel_credentials())
                if tls is not None
                else grpc.aio.insecure_channel(endpoint)
            )
            async with channel:
                stub = health_pb2_grpc.HealthStub(channel)
                try:
                    answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
            waited += 1
            if waited % 50 == 0:
                log.info("waiting for worker %s to serve", endpoint)
            await asyncio.sleep(0.1)


@dataclass
class _FrontEndSecurity:
    """TLS and authentication of the etcd and Oxia ports: the gRPC port's certificate and
    credentials. Each front-end adapts the interceptor (`security.frontend.secure_front_end`):
    its own token metadata and error wording, and permissions on its namespace (`etcd`,
    `oxia`), read from the root range here or on its owner (as the gRPC port's are)."""

    tls: ServerTls | None
    authenticator: Authenticator | None
    metrics: ServerMetrics
    admin: AdminServicer
    root_elsewhere: bool
    """Cluster mode or a worker: the root range may be in another process."""
    streams: OpenStreams
    """The server's open streams, the gRPC port's and every front-end's."""
    accesses: list[AccessControl] = field(default_factory=list)

    @property
    def cache_s(self) -> float:
        """One process: a grant applies to the next call. Otherwise each check could be a call
        to the root range's owner, so decisions are kept as long as the gRPC port's."""
        return ACCESS_CACHE_S if self.root_elsewhere else 0.0

    def interceptors(self) -> list[AuthInterceptor]:
        if self.authenticator is None:
            return []
        return [AuthInterceptor(self.authenticator, self.metrics.auth_failed)]

    async def namespace_bits(self, role: str, namespace: str) -> int:
        try:
            _, bits = await self.admin.access(role, namespace, 0)
        except NamespaceNotFoundError:
            return 0  # nothing granted on a namespace that is not there
        return bits

    def secured(self, access: AccessControl | None) -> None:
        """A front-end's permission checks, dropped with the gRPC port's after a grant here."""
        if access is not None:
            self.accesses.append(access)

    def forget(self) -> None:
        for access in self.accesses:
            access.forget()


def _worker_front_end_ports(config: ServerConfig) -> dict[str, int]:
    """Front-end name -> configured port, of every front-end a worker serves (the gRPC ones,
    which Envoy listens on, and ZooKeeper's, which the Python serves itself)."""
    ports = front_end_ports(config)
    if config.zookeeper_port:
        ports[ZOOKEEPER_FRONT_END] = config.zookeeper_port
    return ports


def _front_end_peers(
    name: str,
    coordinator: ZkCoordinator | None,
    member: ClusterMember | None,
    worker: WorkerSlot | None,
    server: GrpcServer,
) -> tuple[Forwarder, FrontEndPeers] | None:
    """Cluster mode and `--workers`: how front-end `name` (an etcd keyspace, Oxia) reaches the
    root range's owner (the forwarder) and the other servers' (workers') ports of it (their
    ZooKeeper registrations; the supervisor's plan)."""
    if server.forwarder is None:
        return None
    if worker is not None:
        endpoints = list(worker.endpoints)
        return server.forwarder, FrontEndPeers(
            name,
            worker.endpoints[worker.index],
            worker.owner_of,
            worker.frontends_of,
            lambda: endpoints,
        )
    if coordinator is None or member is None:
        return None
    peers = FrontEndPeers(
        name,
        member.endpoint,
        member.owner_of,
        coordinator.server_frontends,
        coordinator.live_servers,
    )
    return server.forwarder, peers


async def _start_etcd(
    config: ServerConfig,
    registry: ContainerRegistry,
    front: _FrontEndSecurity,
    cluster: tuple[Forwarder, FrontEndPeers] | None,
    keyspace: str,
    port: int,
) -> EtcdServer:
    """The etcd v3 API for `keyspace` on `port`, over the keyspace's table (created on first
    start). `cluster`: cluster mode (calls pass through to the keyspace's owner)."""
    from tablekeeper_server.etcd.server import EtcdServer
    from tablekeeper_server.etcd.snapshot import KeyspaceSnapshots

    etcd = EtcdServer(
        registry,
        bind_host=config.bind_host,
        port=port,
        keyspace=keyspace,
        advertised_host=config.advertised_host,
        limits=config.limits,
        tls=front.tls,
        interceptors=front.interceptors(),
        namespace_bits=front.namespace_bits,
        access_cache_s=front.cache_s,
        forwarder=cluster[0] if cluster is not None else None,
        peers=cluster[1] if cluster is not None else None,
        runtime=config.runtime,
        clock=registry.env.clock,
        metrics=front.metrics,
        streams=front.streams,
    )
    if front.admin.backups is not None:  # etcdctl snapshot save: a backup of the keyspace
        etcd.maintenance.snapshots = KeyspaceSnapshots(
            etcd.keyspace, front.admin.backups, config.data_dir
        )
    front.secured(etcd.security.access)
    await etcd.start()
    log.info("etcd v3 API (keyspace %s) on %s:%d", keyspace, config.bind_host, etcd.port)
    return etcd


async def _start_oxia(
    config: ServerConfig,
    registry: ContainerRegistry,
    front: _FrontEndSecurity,
    cluster: tuple[Forwarder, FrontEndPeers] | None,
    port: int,
) -> OxiaServer:
    """Oxia's client protocol on `port` (namespace `default` created on first start).
    `cluster`: cluster mode or a worker (shard leaders are their containers' owners)."""
    from tablekeeper_server.oxia.server import OxiaServer

    oxia = OxiaServer(
        registry,
        bind_host=config.bind_host,
        port=port,
        advertised_host=config.advertised_host,
        limits=config.limits,
        tls=front.tls,
        interceptors=front.interceptors(),
        namespace_bits=front.namespace_bits,
        access_cache_s=front.cache_s,
        forwarder=cluster[0] if cluster is not None else None,
        peers=cluster[1] if cluster is not None else None,
        runtime=config.runtime,
        clock=registry.env.clock,
        metrics=front.metrics,
        streams=front.streams,
    )
    front.secured(oxia.security.access)
    await oxia.start()
    log.info("Oxia client protocol on %s:%d", config.bind_host, oxia.port)
    return oxia


async def _start_zookeeper(
    config: ServerConfig,
    registry: ContainerRegistry,
    clock: Clock,
    metrics: ServerMetrics,
    cluster: tuple[Forwarder, FrontEndPeers] | None,
    port: int,
) -> ZooKeeperServer:
    """ZooKeeper's client protocol on `port`, over table zookeeper/keyspace (created on first
    start). `cluster`: cluster mode or a worker (connections to a server that does not own the
    keyspace's range are relayed to its owner)."""
    from tablekeeper_server.zookeeper.server import ZooKeeperServer, ZooKeeperSettings

    if reason := packet_refusal(config.zookeeper_max_packet_bytes, config.limits):
        log.warning("--zookeeper-max-packet-bytes: %s", reason)
    zookeeper = ZooKeeperServer(
        registry,
        clock,
        bind_host=config.bind_host,
        port=port,
        settings=ZooKeeperSettings(
            tick_ms=round(config.zookeeper_tick_s * 1000),
            min_session_timeout_ms=round(config.zookeeper_min_session_timeout_s * 1000),
            max_session_timeout_ms=round(config.zookeeper_max_session_timeout_s * 1000),
            packet_bytes_max=config.zookeeper_max_packet_bytes,
            sweep_interval_s=config.zookeeper_container_check_interval_s,
        ),
        forwarder=cluster[0] if cluster is not None else None,
        peers=cluster[1] if cluster is not None else None,
        metrics=metrics,
    )
    await zookeeper.start()
    log.info("ZooKeeper client protocol on %s:%d", config.bind_host, zookeeper.port)
    return zookeeper


async def _table_name(
    registry: ContainerRegistry, admin: AdminServicer, stream_id: int
) -> TableKey | None:
    """(namespace, table) of table `stream_id` from the root range, here or on its owner; None
    if the table is gone."""
    try:
        props = await registry.stream_props(stream_id)
        namespace, _ = await admin.access("", "", stream_id)  # the namespace's name, with it
    except StreamNotFoundError:
        return None
    return namespace, props.stream_name


def _range_labels(range_: Range, names: TableNames) -> TableKey:
    stream_id = range_.name.stream_id
    if stream_id == ROOT_STREAM_ID:
        return SYSTEM_NAMESPACE, ROOT_TABLE
    if stream_id == CONTAINER_META_STREAM_ID:
        return SYSTEM_NAMESPACE, META_TABLE
    return names.get(stream_id) or (UNKNOWN, UNKNOWN)


def _range_stats(range_: Range, clock: Clock, names: TableNames) -> RangeStats:
    checkpointer = range_.checkpointer
    stats = checkpointer.stats if checkpointer is not None else None
    done = stats is not None and stats.count > 0
    namespace, table = _range_labels(range_, names)
    return RangeStats(
        namespace=namespace,
        table=table,
        wal_bytes=range_.wal_bytes(),
        applied_sequence=range_.applied_sequence,
        checkpoint_age_s=(clock.now_ms() - stats.created_at_ms) / 1000 if stats and done else None,
        checkpoint_duration_s=stats.duration_s if stats else 0.0,
        checkpoint_bytes_uploaded=stats.bytes_uploaded if stats else 0,
        checkpoint_files_uploaded=stats.files_uploaded if stats else 0,
        checkpoint_files_reused=stats.files_reused if stats else 0,
        commands_since_checkpoint=max(0, range_.applied_sequence - range_.checkpointed_sequence),
        failed=range_.failure is not None,  # (not `failed`: that acts, on the loop)
    )


def _run_loop(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    if event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: running on asyncio's event loop")
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def run(config: ServerConfig) -> int:
    worker = config.worker
    configure_logging(
        config.log_level, config.log_format, worker.index if worker is not None else None
    )
    if config.runtime_fell_back and worker is None:
        log.warning(
            "--runtime auto: pyvoy is not installed (pip install 'tablekeeper[envoy]'): the "
            "gRPC ports are served by grpc-aio"
        )
    if config.workers > 1 and worker is None:
        lock_fd = _lock_data_dir(config.data_dir)
        server_args, worker_env = worker_command(config, os.environ)
        try:
            return supervise(
                workers=config.workers,
                bind_host=config.bind_host,
                advertised_host=config.advertised_host,
                port=config.port,
                argv=worker_argv(server_args),
                env=worker_env,
                frontend_ports=_worker_front_end_ports(config),
            )
        finally:
            os.close(lock_fd)
    # (With --runtime envoy the process became Envoy before importing this module: `cli`.)
    tune_garbage_collector()
    try:
        _run_loop(serve(config), config.event_loop)
    except (CorruptionError, ClusterError, OSError) as exc:
        return failure_exit_code(exc)
    return 0


def failure_exit_code(exc: CorruptionError | ClusterError | OSError) -> int:
    """Log why `serve` could not start or go on; the process's exit code for it."""
    if isinstance(exc, CorruptionError):
        log.error("refusing to start: %s", exc.message)
        return 3
    if isinstance(exc, ClusterError):
        log.error("cannot join the cluster: %s", exc)
        return 2
    log.error("cannot start: %s", exc)
    return 2


envoy_app = EnvoyApp(serve, failure_exit_code)
"""The ASGI application Envoy runs with `--runtime envoy` (see `rpc.envoy`): `serve` inside
Envoy's process, whose interpreter imports this module (`cli.ENVOY_APP` names it)."""
