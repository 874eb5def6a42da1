"""The Admin service: checkpoints on demand and per-range status (for `tablekeeper admin`), the
cluster's state (for `tablekeeper cluster status`; composed in `cluster.status`), listings of
namespaces and tables (for `tablekeeper ns list` / `table list`), and permissions (for
`tablekeeper auth`, and the access checks of other servers)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from tablekeeper_proto.v1 import admin_pb2, admin_pb2_grpc, tablekeeper_pb2
from tablekeeper_server.backup.source import RangeBackups
from tablekeeper_server.cluster.status import ClusterView, ViewSource
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.container.splitter import RANGE_STEPS
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import (
    BadRequestError,
    IllegalOpError,
    InvalidNamespaceNameError,
    NotServedHereError,
    StreamNotFoundError,
    UnavailableError,
)
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.frontends import find_table
from tablekeeper_server.rpc.proxy import (
    TABLEKEEPER_SERVICE,
    Forwarder,
    RemoteCatalogClient,
    local_or_forward,
    was_forwarded,
)
from tablekeeper_server.rpc.status import serve, serve_admin, stream_errors
from tablekeeper_server.security.access import Permission, parse_permissions, permission_names

_ADMIN_SERVICE = "/tablekeeper.v1.Admin/"
SPLIT_REFUSED_NAMESPACES = ("etcd", "oxia")
"""The namespaces of the etcd and Oxia front-ends' tables (each front-end reads its table's
bookkeeping as one range)."""
M = TypeVar("M")


def _bits(names: Iterable[str]) -> Permission:
    try:
        return parse_permissions(names)
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


def _role(role: str) -> str:
    if not role or len(role) > 255 or any(c in role for c in "\x00\n"):
        raise BadRequestError("a role is 1..255 characters without NUL or newline")
    return role


def _code(response: Any) -> int:
    return int(response.code)


def range_status(range_: Range, clock: Clock) -> admin_pb2.RangeStatus:
    status = admin_pb2.RangeStatus(
        container_id=range_.name.container_id,
        stream_id=range_.name.stream_id,
        range_id=range_.name.range_id,
        applied_sequence=range_.applied_sequence,
        wal_bytes=range_.wal_bytes(),
        estimated_keys=range_.estimate_num_keys(),
        checkpoint_age_ms=-1,
        error=range_.failure or "",
    )
    checkpointer = range_.checkpointer
    if checkpointer is not None:
        stats = checkpointer.stats
        status.restored_from = stats.restored_from
        if stats.count:
            status.checkpoint_sequence = stats.applied_sequence
            status.checkpoint_age_ms = clock.now_ms() - stats.created_at_ms
            status.checkpoint_seconds = stats.duration_s
            status.checkpoint_bytes_uploaded = stats.bytes_uploaded
            status.checkpoint_files_uploaded = stats.files_uploaded
            status.checkpoint_files_reused = stats.files_reused
    return status


def cluster_status_response(view: ClusterView) -> admin_pb2.ClusterStatusResponse:
    """`view` on the wire, with its readiness and problems."""
    assigned = view.assigned_to()
    containers = []
    for container in range(view.containers):
        entry = admin_pb2.ContainerStatus(
            container=container, assigned_to=assigned.get(container, "")
        )
        owner = view.owners.get(container)
        if owner is not None:
            entry.owner.CopyFrom(
                admin_pb2.ContainerOwnership(
                    endpoint=owner.endpoint, epoch=owner.epoch, released=owner.released
                )
            )
        containers.append(entry)
    serving = []
    for server in view.servers:
        served = view.serving.get(server, "not asked")
        if isinstance(served, str):
            serving.append(admin_pb2.ServerContainers(server=server, error=served))
        else:
            serving.append(admin_pb2.ServerContainers(server=server, containers=sorted(served)))
    problems = view.problems()
    return admin_pb2.ClusterStatusResponse(
        cluster=view.name,
        num_storage_containers=view.containers,
        servers=view.servers,
        controller=view.controller or "",
        assignment=[
            admin_pb2.ServerContainers(server=server, containers=sorted(owned))
            for server, owned in sorted(view.assignment.items())
        ],
        assignment_revision=view.revision,
        serving=serving,
        containers=containers,
        ready=not problems,
        problems=problems,
    )


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        registry: ContainerRegistry,
        *,
        checkpoint_store: str,
        interval_s: float,
        records: int = 0,
        runtime: str = "",
    ) -> None:
        self._registry = registry
        self._runtime = runtime
        self._checkpoint_store = checkpoint_store
        self._interval_s = interval_s
        self._records = records
        self.on_permissions_changed: Callable[[], None] = lambda: None
        """Called after a grant or revoke made here (drops cached access decisions)."""
        self.sibling_containers: list[int] = []
        """A worker of `--workers`: one container of each other worker. Checkpoint and Status
        cover the whole host: what is here, plus each other worker's answer (asked through
        that container's route)."""
        self.cluster_view: ViewSource | None = None
        """What ClusterStatus reports (set by the composition root): ZooKeeper's record in
        cluster mode, the fixed split of a standalone server (and its workers) otherwise."""
        self.backups: RangeBackups | None = None
        """Backups of the ranges hosted here (set by the composition root)."""

    async def _siblings(
        self, method: str, request: Any, response_type: Any, context: Any
    ) -> list[Any]:
        """Each other worker's answer to `method` (none when this call came from one)."""
        remote = self._registry.remote
        if not self.sibling_containers or was_forwarded(context):
            return []
        assert isinstance(remote, RemoteCatalogClient)
        return [
            await remote.forwarder.forward(
                container_id,
                _ADMIN_SERVICE + method,
                request,
                response_type,
                lambda _: 0,
                idempotent=True,
                context=context,
            )
            for container_id in self.sibling_containers
        ]

    async def Checkpoint(  # noqa: N802
        self, request: admin_pb2.CheckpointRequest, context: Any
    ) -> admin_pb2.CheckpointResponse:
        async def handle() -> admin_pb2.CheckpointResponse:
            hosted_only = bool(self.sibling_containers)  # the other workers do theirs
            ranges = await self._registry.checkpoint(request.stream_id, hosted_only=hosted_only)
            clock = self._registry.env.clock
            response = admin_pb2.CheckpointResponse(ranges=[range_status(r, clock) for r in ranges])
            others = await self._siblings(
                "Checkpoint", request, admin_pb2.CheckpointResponse, context
            )
            for other in others:
                response.ranges.extend(other.ranges)
            return response

        return await serve_admin("Checkpoint", context, handle)

    async def Status(  # noqa: N802
        self, request: admin_pb2.StatusRequest, context: Any
    ) -> admin_pb2.StatusResponse:
        clock = self._registry.env.clock
        ranges = sorted(
            self._registry.all_ranges(),
            key=lambda r: (r.name.container_id, r.name.stream_id, r.name.range_id),
        )
        response = admin_pb2.StatusResponse(
            ranges=[range_status(r, clock) for r in ranges],
            num_storage_containers=self._registry.env.containers(),
            checkpoint_store=self._checkpoint_store,
            checkpoint_interval_s=self._interval_s,
            checkpoint_records=self._records,
            runtime=self._runtime,
        )
        for other in await self._siblings("Status", request, admin_pb2.StatusResponse, context):
            response.ranges.extend(other.ranges)
        return response

    async def ClusterStatus(  # noqa: N802
        self, request: admin_pb2.ClusterStatusRequest, context: Any
    ) -> admin_pb2.ClusterStatusResponse:
        """Any server answers for the whole cluster (a `--workers` worker for every worker):
        the other servers are asked for their ServerInfo directly, not forwarded to."""

        async def handle() -> admin_pb2.ClusterStatusResponse:
            source = self.cluster_view
            if source is None:
                raise UnavailableError("this server has no view of its cluster yet")
            return cluster_status_response(await source.view(self._ask_serving))

        return await serve_admin("ClusterStatus", context, handle)

    async def _ask_serving(self, endpoint: str, timeout_s: float) -> list[int]:
        """The containers the server at `endpoint` serves: its ServerInfo, asked the way this
        server forwards to it (TLS, its own token)."""
        remote = self._registry.remote
        if not isinstance(remote, RemoteCatalogClient):
            raise UnavailableError("this server has no channel to other servers")
        try:
            info = await remote.forwarder.ask(
                endpoint,
                TABLEKEEPER_SERVICE + "ServerInfo",
                tablekeeper_pb2.ServerInfoRequest(),
                tablekeeper_pb2.ServerInfoResponse,
                timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            details = (exc.details() or "").strip()
            raise UnavailableError(
                f"{exc.code().name}{f' ({details})' if details else ''}"
            ) from None
        return [int(c) for c in info.containers]

    async def ListNamespaces(  # noqa: N802
        self, request: admin_pb2.ListNamespacesRequest, context: Any
    ) -> admin_pb2.ListNamespacesResponse:
        async def local() -> admin_pb2.ListNamespacesResponse:
            found = sorted(self._registry.root.namespaces(), key=lambda p: p.namespace_name)
            return admin_pb2.ListNamespacesResponse(namespaces=found)

        return await self._from_root(
            "ListNamespaces", context, request, local, admin_pb2.ListNamespacesResponse
        )

    async def ListTables(  # noqa: N802
        self, request: admin_pb2.ListTablesRequest, context: Any
    ) -> admin_pb2.ListTablesResponse:
        async def local() -> admin_pb2.ListTablesResponse:
            if not request.namespace:
                raise InvalidNamespaceNameError("ListTables needs a namespace")
            tables = self._registry.root.streams(request.namespace)
            found = sorted(tables, key=lambda p: p.stream_name)
            return admin_pb2.ListTablesResponse(tables=found)

        return await self._from_root(
            "ListTables", context, request, local, admin_pb2.ListTablesResponse
        )

    # ------------------------------------------------------------------ splits

    async def SplitRange(  # noqa: N802
        self, request: admin_pb2.SplitRangeRequest, context: Any
    ) -> admin_pb2.SplitRangeResponse:
        """Split a range on the owner of the table's meta range (forwarded there)."""
        return await serve_admin("SplitRange", context, lambda: self.split_range(request, context))

    async def split_by_id(self, stream_id: int, range_id: int) -> admin_pb2.SplitRangeResponse:
        """Split range `range_id` of table `stream_id` (the automatic split policy's call)."""
        request = admin_pb2.SplitRangeRequest(stream_id=stream_id, range_id=range_id)
        return await self.split_range(request)

    async def split_range(
        self, request: admin_pb2.SplitRangeRequest, context: Any = None
    ) -> admin_pb2.SplitRangeResponse:
        """`SplitRange` (also what the automatic split policy calls, without a context)."""

        async def local() -> admin_pb2.SplitRangeResponse:
            namespace = request.namespace
            if request.stream_id:
                stream_id = request.stream_id
                namespace, _ = await self.access("", "", stream_id)
            else:
                props = await find_table(
                    self._registry, self._forwarder(), request.namespace, request.table
                )
                if props is None:
                    raise StreamNotFoundError(f"no table {request.namespace}/{request.table}")
                stream_id = props.stream_id
            if namespace in SPLIT_REFUSED_NAMESPACES:
                raise IllegalOpError(
                    f"tables of namespace {namespace!r} belong to the etcd or Oxia front-end, "
                    "whose ranges cannot be split"
                )
            outcome = await self._registry.splitter.split(stream_id, request.range_id)
            return admin_pb2.SplitRangeResponse(
                stream_id=stream_id,
                parent_range_id=outcome.plan.parent.range_id,
                children=outcome.plan.children,
                sealed_sequence=outcome.sealed_sequence,
                keys_copied=outcome.keys_copied,
                paused_seconds=outcome.paused_seconds,
            )

        return await local_or_forward(
            self._forwarder(),
            context,
            local,
            _ADMIN_SERVICE + "SplitRange",
            request,
            admin_pb2.SplitRangeResponse,
            lambda _: 0,
            idempotent=False,
        )

    async def SealRange(  # noqa: N802
        self, request: admin_pb2.SealRangeRequest, context: Any
    ) -> admin_pb2.SealRangeResponse:
        async def handle() -> admin_pb2.SealRangeResponse:
            if request.step not in RANGE_STEPS:
                raise BadRequestError(f"unknown split step {request.step!r}")
            sequence = await self._registry.splitter.step_here(
                request.container_id,
                request.stream_id,
                request.range_id,
                request.step,
                tuple(request.children),
                tuple(request.start_hashes),
            )
            return admin_pb2.SealRangeResponse(sequence=sequence)

        return await serve_admin("SealRange", context, handle)

    async def BackupRange(  # noqa: N802
        self, request: admin_pb2.BackupRangeRequest, context: Any
    ) -> AsyncIterator[admin_pb2.BackupChunk]:
        """One range's backup (`backup.source`), from here or relayed from its owner."""
        async with stream_errors("BackupRange", context):
            backups = self.backups
            if backups is None:
                raise UnavailableError("this server takes no backups (no checkpoint store)")
            try:
                await backups.locate(request.container_id, request.stream_id, request.range_id)
            except NotServedHereError as elsewhere:
                forwarder = self._forwarder()
                if forwarder is None or was_forwarded(context):
                    raise
                relayed = forwarder.relay(
                    elsewhere.container_id,
                    _ADMIN_SERVICE + "BackupRange",
                    request,
                    admin_pb2.BackupChunk,
                    context,
                )
                async with contextlib.aclosing(relayed) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            async with contextlib.aclosing(backups.chunks(request)) as chunks:
                async for chunk in chunks:
                    yield chunk

    def _forwarder(self) -> Forwarder | None:
        remote = self._registry.remote
        return remote.forwarder if isinstance(remote, RemoteCatalogClient) else None

    # ------------------------------------------------------------------ permissions

    async def Grant(  # noqa: N802
        self, request: admin_pb2.GrantRequest, context: Any
    ) -> admin_pb2.GrantResponse:
        async def local() -> admin_pb2.GrantResponse:
            bits = await self._registry.root.change_permissions(
                request.namespace, _role(request.role), int(_bits(request.permissions)), 0
            )
            self.on_permissions_changed()
            return admin_pb2.GrantResponse(permissions=permission_names(bits))

        return await self._from_root(
            "Grant", context, request, local, admin_pb2.GrantResponse, idempotent=False
        )

    async def Revoke(  # noqa: N802
        self, request: admin_pb2.RevokeRequest, context: Any
    ) -> admin_pb2.GrantResponse:
        async def local() -> admin_pb2.GrantResponse:
            remove = _bits(request.permissions) if request.permissions else Permission(7)
            bits = await self._registry.root.change_permissions(
                request.namespace, _role(request.role), 0, int(remove)
            )
            self.on_permissions_changed()
            return admin_pb2.GrantResponse(permissions=permission_names(bits))

        return await self._from_root(
            "Revoke", context, request, local, admin_pb2.GrantResponse, idempotent=False
        )

    async def ListPermissions(  # noqa: N802
        self, request: admin_pb2.ListPermissionsRequest, context: Any
    ) -> admin_pb2.ListPermissionsResponse:
        async def local() -> admin_pb2.ListPermissionsResponse:
            grants = sorted(self._registry.root.permissions(request.namespace).items())
            return admin_pb2.ListPermissionsResponse(
                grants=[
                    admin_pb2.NamespaceGrant(role=role, permissions=permission_names(bits))
                    for role, bits in grants
                ]
            )

        return await self._from_root(
            "ListPermissions", context, request, local, admin_pb2.ListPermissionsResponse
        )

    async def CheckAccess(  # noqa: N802
        self, request: admin_pb2.CheckAccessRequest, context: Any
    ) -> admin_pb2.CheckAccessResponse:
        return await self._from_root(
            "CheckAccess",
            context,
            request,
            lambda: self._check_access_here(request),
            admin_pb2.CheckAccessResponse,
        )

    async def _check_access_here(
        self, request: admin_pb2.CheckAccessRequest
    ) -> admin_pb2.CheckAccessResponse:
        root = self._registry.root
        props = (
            root.get_namespace(request.namespace)
            if request.namespace
            else root.namespace_of_stream(request.stream_id)
        )
        bits = root.role_permissions(props.namespace_id, request.role)
        return admin_pb2.CheckAccessResponse(
            namespace=props.namespace_name, permissions=permission_names(bits)
        )

    async def access(self, role: str, namespace: str, stream_id: int) -> tuple[str, int]:
        """What `role` may do on a namespace (or a table's): for the access checks of every
        call. Asks the root range here, or its owner (cluster mode)."""
        request = admin_pb2.CheckAccessRequest(role=role, namespace=namespace, stream_id=stream_id)
        remote = self._registry.remote
        forwarder = remote.forwarder if isinstance(remote, RemoteCatalogClient) else None
        response = await local_or_forward(
            forwarder,
            None,
            lambda: self._check_access_here(request),
            _ADMIN_SERVICE + "CheckAccess",
            request,
            admin_pb2.CheckAccessResponse,
            _code,
            idempotent=True,
        )
        return response.namespace, int(_bits(response.permissions))

    async def _from_root(
        self,
        method: str,
        context: Any,
        request: Any,
        local: Callable[[], Awaitable[M]],
        response_type: Callable[..., M],
        *,
        idempotent: bool = True,
    ) -> M:
        """Answer from the root range here, or forward to its owner (cluster mode), with
        BookKeeper's error convention (see `rpc/status.serve`). Listings only read, so sending
        one again after a lost answer is safe."""
        remote = self._registry.remote
        forwarder = remote.forwarder if isinstance(remote, RemoteCatalogClient) else None

        async def routed() -> M:
            return await local_or_forward(
                forwarder,
                context,
                local,
                _ADMIN_SERVICE + method,
                request,
                response_type,
                _code,
                idempotent=idempotent,
            )

        return await serve(
            method,
            context,
            None,
            routed,
            lambda code: response_type(code=code),
            _code,
        )
