"""`AsyncClient` (grpc.aio; the one implementation) and `Client`, its synchronous twin, which
runs an `AsyncClient` on a private event-loop thread.

The client makes namespaces, tables and admin calls itself; everything else (tables, watches,
sessions, bulk access) works through its `ClientContext` (`_context`), which owns the channels,
the route cache, the coalescer and the retry policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import grpc

from tablekeeper._context import ClientContext
from tablekeeper._loop import LoopThread
from tablekeeper._routes import RouteCache, RouteStats
from tablekeeper._transport import RetryPolicy, _split_host_port, parse_service_uri, within
from tablekeeper.bulk import table_layout
from tablekeeper.errors import TableKeeperError, UnavailableError, error_for_rpc_error
from tablekeeper.security import TlsConfig, Token, token_interceptors
from tablekeeper.session import Session
from tablekeeper.table import AsyncTable, AsyncTxn, ReadFrom
from tablekeeper.types import (
    CompareOp,
    Key,
    KeyValue,
    NamespaceInfo,
    ReadInfo,
    TableInfo,
    TableLayout,
    TxnResult,
)
from tablekeeper.watch import Watch
from tablekeeper_proto.bookkeeper import storage_pb2, stream_pb2
from tablekeeper_proto.v1 import admin_pb2, admin_pb2_grpc, tablekeeper_pb2, tablekeeper_pb2_grpc

T = TypeVar("T")

DEFAULT_SERVICE = "bk://127.0.0.1:4181"
SPLIT_TIMEOUT_S = 600.0
"""How long `split_range` waits at least (a split copies the whole range)."""


def _service_endpoints(service: str) -> list[str]:
    """Each `host:port` of a service URI, in order."""
    target = service.split("://", 1)[1] if "://" in service else service
    endpoints = []
    for part in target.strip("/").split(","):
        if part.strip():
            host, port = _split_host_port(part.strip(), service)
            endpoints.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return endpoints


def _table_info(namespace: str, props: stream_pb2.StreamProperties) -> TableInfo:
    ranges = max(2, props.stream_conf.initial_num_ranges)
    return TableInfo(
        namespace=namespace,
        name=props.stream_name,
        table_id=props.stream_id,
        ranges=ranges + (ranges % 2),
        ttl_seconds=props.stream_conf.ttl_seconds,
    )


class AsyncClient:
    """A connection to a TableKeeper service. Many calls may be in flight at once.

    `service` is `bk://host:port` (several `host:port` separated by commas are balanced).
    Use `async with AsyncClient(...) as client:` or call `close()`.

    The namespace, table and permission calls take `timeout=` (seconds for the whole call,
    retries included; None: only the `RetryPolicy` bounds it), as the table ops do: past it
    they raise `DeadlineExceededError`, a write `WriteTimeoutError` (it may have been applied).
    """

    def __init__(
        self,
        service: str = DEFAULT_SERVICE,
        *,
        retry: RetryPolicy | None = None,
        coalesce: bool = True,
        channel_options: Sequence[tuple[str, Any]] = (),
        direct_routing: bool = True,
        tls: TlsConfig | None = None,
        token: Token | None = None,
    ) -> None:
        """`tls`: talk TLS (see `TlsConfig`); `token`: a bearer token (or a callable returning
        one, asked before each call) sent with every call. `coalesce`: send concurrent
        single-key ops (put, get, increment, delete, scan pages) of this client as one Batch
        RPC when several are waiting (see `_coalesce`); off, every op is its own unary call, as
        the BookKeeper client does. `channel_options` are extra
        gRPC channel arguments (e.g. `("grpc.use_local_subchannel_pool", 1)` for a connection
        of its own). `direct_routing`: send each table op straight to the server that owns its
        range (ranges and owners are looked up through `service` and cached, see `_routes`);
        off, everything goes to `service`, whose servers forward to the owner. Turn it off when
        the servers' advertised addresses are not reachable from this client."""
        self.service = service
        self._context = ClientContext(
            parse_service_uri(service),
            retry or RetryPolicy(),
            coalesce=coalesce,
            direct_routing=direct_routing,
            channel_options=channel_options,
            credentials=tls.credentials() if tls is not None else None,
            interceptors=token_interceptors(token) if token is not None else (),
        )
        self._table_ids: dict[tuple[str, str], int] = {}

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of every call of this client."""
        return self._context.retry

    @property
    def coalesce(self) -> bool:
        """Whether concurrent single-key ops are sent together as Batch RPCs."""
        return self._context.coalesce

    @property
    def _routes(self) -> RouteCache:
        return self._context.routes

    def _stub(self, name: str, factory: Any, endpoint: str | None = None) -> Any:
        """The `factory` stub on the channel to `endpoint` (`host:port`; None = the service)."""
        return self._context.stub(name, factory, endpoint)

    def route_stats(self) -> RouteStats:
        """How often routes were fetched and invalidated (a copy)."""
        return dataclasses.replace(self._context.routes.stats)

    async def close(self) -> None:
        """Close the channels (and the coalescer and route lookups in flight)."""
        await self._context.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ namespaces

    async def create_namespace(self, name: str, *, timeout: float | None = None) -> int:
        """Create a namespace; returns its id. Raises `NamespaceExistsError`."""
        response = await self._context.root(
            "CreateNamespace",
            storage_pb2.CreateNamespaceRequest(name=name),
            idempotent=False,
            timeout=timeout,
        )
        return int(response.ns_props.namespace_id)

    async def get_namespace(self, name: str, *, timeout: float | None = None) -> int:
        """The namespace's id. Raises `NamespaceNotFoundError`."""
        response = await self._context.root(
            "GetNamespace",
            storage_pb2.GetNamespaceRequest(name=name),
            idempotent=True,
            timeout=timeout,
        )
        return int(response.ns_props.namespace_id)

    async def delete_namespace(self, name: str, *, timeout: float | None = None) -> None:
        """Delete a namespace and every table in it."""
        await self._context.root(
            "DeleteNamespace",
            storage_pb2.DeleteNamespaceRequest(name=name),
            idempotent=False,
            timeout=timeout,
        )
        for key in [key for key in self._table_ids if key[0] == name]:
            self._context.routes.forget_table(self._table_ids.pop(key))

    async def list_namespaces(self, *, timeout: float | None = None) -> list[NamespaceInfo]:
        """Every namespace, ordered by name (TableKeeper's Admin service; BookKeeper has no
        listing)."""
        response = await self._admin_list(
            "ListNamespaces", admin_pb2.ListNamespacesRequest(), timeout
        )
        return [NamespaceInfo(p.namespace_name, p.namespace_id) for p in response.namespaces]

    async def _admin_list(self, method: str, request: Any, timeout: float | None) -> Any:
        return await within(
            self._context.call(
                getattr(self._context.stub("admin", admin_pb2_grpc.AdminStub), method),
                request,
                idempotent=True,
                status_of=lambda r: r.code,
            ),
            timeout,
            what=method,
            write=False,
        )

    # ------------------------------------------------------------------ permissions

    async def grant(
        self, namespace: str, role: str, permissions: Sequence[str], *, timeout: float | None = None
    ) -> list[str]:
        """Give `role` permissions ("read", "write", "admin") on `namespace`; returns all it has
        there now. Needs admin on the namespace (or a superuser)."""
        request = admin_pb2.GrantRequest(
            namespace=namespace, role=role, permissions=list(permissions)
        )
        return list((await self._admin_change("Grant", request, timeout)).permissions)

    async def revoke(
        self,
        namespace: str,
        role: str,
        permissions: Sequence[str] = (),
        *,
        timeout: float | None = None,
    ) -> list[str]:
        """Take permissions (all, if none are named) of `role` on `namespace`; returns what it
        keeps there."""
        request = admin_pb2.RevokeRequest(
            namespace=namespace, role=role, permissions=list(permissions)
        )
        return list((await self._admin_change("Revoke", request, timeout)).permissions)

    async def list_permissions(
        self, namespace: str, *, timeout: float | None = None
    ) -> dict[str, list[str]]:
        """role -> permissions on `namespace`."""
        response = await self._admin_list(
            "ListPermissions", admin_pb2.ListPermissionsRequest(namespace=namespace), timeout
        )
        return {grant.role: list(grant.permissions) for grant in response.grants}

    async def _admin_change(self, method: str, request: Any, timeout: float | None) -> Any:
        return await within(
            self._context.call(
                getattr(self._context.stub("admin", admin_pb2_grpc.AdminStub), method),
                request,
                idempotent=True,  # setting permissions again gives the same result
                status_of=lambda r: r.code,
            ),
            timeout,
            what=method,
            write=True,
        )

    # ------------------------------------------------------------------ tables

    async def list_tables(self, namespace: str, *, timeout: float | None = None) -> list[TableInfo]:
        """The namespace's tables, ordered by name. Raises `NamespaceNotFoundError`."""
        response = await self._admin_list(
            "ListTables", admin_pb2.ListTablesRequest(namespace=namespace), timeout
        )
        return [_table_info(namespace, props) for props in response.tables]

    async def create_table(
        self,
        namespace: str,
        name: str,
        *,
        ranges: int = 4,
        ttl_seconds: int = 0,
        timeout: float | None = None,
    ) -> TableInfo:
        """Create a table split into `ranges` hash ranges (at least 2; odd rounds up; in
        namespace `oxia`, whose tables are Oxia namespaces, exactly `ranges` shards).
        `ttl_seconds` > 0 makes keys invisible that long after their last write."""
        if ranges < 1:
            raise ValueError(f"a table needs at least 1 range (got ranges={ranges})")
        if ttl_seconds < 0:
            raise ValueError(f"ttl_seconds must be >= 0 (got {ttl_seconds})")
        conf = stream_pb2.StreamConfiguration(
            key_type=stream_pb2.HASH,
            min_num_ranges=ranges,
            initial_num_ranges=ranges,
            storage_type=stream_pb2.TABLE,
            ttl_seconds=ttl_seconds,
        )
        request = storage_pb2.CreateStreamRequest(ns_name=namespace, name=name, stream_conf=conf)
        response = await self._context.root(
            "CreateStream", request, idempotent=False, timeout=timeout
        )
        return self._known(_table_info(namespace, response.stream_props))

    async def get_table(
        self, namespace: str, name: str, *, timeout: float | None = None
    ) -> TableInfo:
        """The table's `TableInfo`. Raises `TableNotFoundError`."""
        request = storage_pb2.GetStreamRequest(
            stream_name=stream_pb2.StreamName(namespace_name=namespace, stream_name=name)
        )
        response = await self._context.root("GetStream", request, idempotent=True, timeout=timeout)
        return self._known(_table_info(namespace, response.stream_props))

    def _known(self, info: TableInfo) -> TableInfo:
        """Remember the table's id, to drop its cached ranges when it is deleted."""
        self._table_ids[(info.namespace, info.name)] = info.table_id
        return info

    async def delete_table(
        self, namespace: str, name: str, *, timeout: float | None = None
    ) -> None:
        """Delete a table and its keys. Raises `TableNotFoundError`."""
        await self._context.root(
            "DeleteStream",
            storage_pb2.DeleteStreamRequest(ns_name=namespace, name=name),
            idempotent=False,
            timeout=timeout,
        )
        table_id = self._table_ids.pop((namespace, name), None)
        if table_id is not None:
            self._context.routes.forget_table(table_id)

    async def table(self, namespace: str, name: str, *, timeout: float | None = None) -> AsyncTable:
        """A handle on an existing table. Raises `TableNotFoundError`."""
        return AsyncTable(self._context, await self.get_table(namespace, name, timeout=timeout))

    async def checkpoint(self, namespace: str | None = None, table: str | None = None) -> Any:
        """Checkpoint one table's ranges now (or every open range if no table is given) and
        truncate their logs; returns the server's `CheckpointResponse` (per-range status)."""
        stream_id = 0
        if table is not None:
            if namespace is None:
                raise ValueError("a table needs its namespace")
            stream_id = (await self.get_table(namespace, table)).table_id
        stub = self._context.stub("admin", admin_pb2_grpc.AdminStub)
        return await stub.Checkpoint(
            admin_pb2.CheckpointRequest(stream_id=stream_id), timeout=self.retry.call_timeout_s * 10
        )

    async def layout(self, namespace: str, table: str) -> TableLayout:
        """The table's current ranges (their hash intervals and containers), which a split
        changes. Raises `TableNotFoundError`."""
        return await table_layout(self._context, namespace, table)

    async def split_range(
        self, namespace: str, table: str, range_id: int = 0
    ) -> admin_pb2.SplitRangeResponse:
        """Split one range of a table into two halves of its hash interval (`range_id` 0: the
        table's widest range) while the table serves, and return once the children serve
        (`SplitRangeResponse`: the children, keys copied, how long the range paused). Requests
        to the range meanwhile are refused as retryable and resent by the retry loops.
        Superusers only; tables of the etcd and Oxia front-ends cannot be split."""
        stub = self._context.stub("admin", admin_pb2_grpc.AdminStub)
        request = admin_pb2.SplitRangeRequest(namespace=namespace, table=table, range_id=range_id)
        response: admin_pb2.SplitRangeResponse = await stub.SplitRange(
            request, timeout=max(self.retry.call_timeout_s * 10, SPLIT_TIMEOUT_S)
        )
        self._context.routes.forget_table(response.stream_id)
        return response

    async def status(self) -> Any:
        """The server's per-range status (`StatusResponse`): applied positions, WAL sizes,
        checkpoints."""
        stub = self._context.stub("admin", admin_pb2_grpc.AdminStub)
        return await stub.Status(admin_pb2.StatusRequest(), timeout=self.retry.call_timeout_s)

    async def cluster_status(self) -> admin_pb2.ClusterStatusResponse:
        """The cluster as one of its servers sees it (`ClusterStatusResponse`): live servers,
        the controller, the container assignment, what each live server serves, each
        container's owner and ownership epoch, and whether the cluster is `ready` (else its
        `problems`). A standalone server answers for itself (`cluster` is empty).

        The servers of the service URI are asked one at a time, in order, until one answers;
        one that cannot be reached, or cannot read the cluster's state right now, is skipped.
        Raises `UnavailableError` when none answers, `PermissionDeniedError` unless a superuser
        asks (on servers with authentication)."""
        failures: list[str] = []
        for endpoint in _service_endpoints(self.service):
            stub = self._context.stub("admin", admin_pb2_grpc.AdminStub, endpoint)
            try:
                response: admin_pb2.ClusterStatusResponse = await stub.ClusterStatus(
                    admin_pb2.ClusterStatusRequest(), timeout=self.retry.call_timeout_s
                )
                return response
            except grpc.aio.AioRpcError as exc:
                error = error_for_rpc_error(exc, idempotent=True)
                if not isinstance(error, UnavailableError):
                    raise error from None
                failures.append(f"{endpoint}: {error}")
        raise UnavailableError(
            f"no server of {self.service} answered ClusterStatus ({'; '.join(failures)})"
        )

    async def server_info(self) -> tablekeeper_pb2.ServerInfoResponse:
        """The server's version and endpoints (`ServerInfoResponse`)."""
        stub: tablekeeper_pb2_grpc.TableKeeperStub = self._context.stub(
            "tk", tablekeeper_pb2_grpc.TableKeeperStub
        )
        response: tablekeeper_pb2.ServerInfoResponse = await self._context.call(
            stub.ServerInfo,
            tablekeeper_pb2.ServerInfoRequest(),
            idempotent=True,
            status_of=lambda r: 0,
        )
        return response


class Client:
    """Synchronous client: the same calls as `AsyncClient`, blocking. Thread-safe.

    It runs an `AsyncClient` on a private event-loop thread; use `with Client(...) as client:`
    or call `close()`."""

    def __init__(
        self,
        service: str = DEFAULT_SERVICE,
        *,
        retry: RetryPolicy | None = None,
        coalesce: bool = True,
        channel_options: Sequence[tuple[str, Any]] = (),
        direct_routing: bool = True,
        tls: TlsConfig | None = None,
        token: Token | None = None,
    ) -> None:
        """Blocking twin of `AsyncClient` (same arguments)."""
        self._runner = LoopThread()
        self._async = AsyncClient(
            service,
            retry=retry,
            coalesce=coalesce,
            channel_options=channel_options,
            direct_routing=direct_routing,
            tls=tls,
            token=token,
        )

    @property
    def async_client(self) -> AsyncClient:
        """The `AsyncClient` this client runs (on its own loop thread: call it only there)."""
        return self._async

    def run_async(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` (one using `async_client` or the async objects it hands out) on this
        client's loop thread and return its result: for the SDK's async-only parts."""
        return self._runner.run(coroutine)

    def close(self) -> None:
        """Close the channels and stop the loop thread."""
        self._runner.run(self._async.close())
        self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def create_namespace(self, name: str, *, timeout: float | None = None) -> int:
        """Create a namespace; returns its id. Raises `NamespaceExistsError`."""
        return self._runner.run(self._async.create_namespace(name, timeout=timeout))

    def get_namespace(self, name: str, *, timeout: float | None = None) -> int:
        """The namespace's id. Raises `NamespaceNotFoundError`."""
        return self._runner.run(self._async.get_namespace(name, timeout=timeout))

    def delete_namespace(self, name: str, *, timeout: float | None = None) -> None:
        """Delete a namespace and every table in it."""
        self._runner.run(self._async.delete_namespace(name, timeout=timeout))

    def list_namespaces(self, *, timeout: float | None = None) -> list[NamespaceInfo]:
        """Every namespace, ordered by name."""
        return self._runner.run(self._async.list_namespaces(timeout=timeout))

    def list_tables(self, namespace: str, *, timeout: float | None = None) -> list[TableInfo]:
        """The namespace's tables, ordered by name. Raises `NamespaceNotFoundError`."""
        return self._runner.run(self._async.list_tables(namespace, timeout=timeout))

    def grant(
        self, namespace: str, role: str, permissions: Sequence[str], *, timeout: float | None = None
    ) -> list[str]:
        """Give `role` permissions ("read", "write", "admin") on `namespace`; returns all it has
        there now."""
        return self._runner.run(self._async.grant(namespace, role, permissions, timeout=timeout))

    def revoke(
        self,
        namespace: str,
        role: str,
        permissions: Sequence[str] = (),
        *,
        timeout: float | None = None,
    ) -> list[str]:
        """Take permissions (all, if none are named) of `role` on `namespace`; returns what it
        keeps there."""
        return self._runner.run(self._async.revoke(namespace, role, permissions, timeout=timeout))

    def list_permissions(
        self, namespace: str, *, timeout: float | None = None
    ) -> dict[str, list[str]]:
        """role -> permissions on `namespace`."""
        return self._runner.run(self._async.list_permissions(namespace, timeout=timeout))

    def create_table(
        self,
        namespace: str,
        name: str,
        *,
        ranges: int = 4,
        ttl_seconds: int = 0,
        timeout: float | None = None,
    ) -> TableInfo:
        """Create a table split into `ranges` hash ranges (at least 2; odd rounds up; in
        namespace `oxia`, whose tables are Oxia namespaces, exactly `ranges` shards).
        `ttl_seconds` > 0 makes keys invisible that long after their last write."""
        return self._runner.run(
            self._async.create_table(
                namespace, name, ranges=ranges, ttl_seconds=ttl_seconds, timeout=timeout
            )
        )

    def get_table(self, namespace: str, name: str, *, timeout: float | None = None) -> TableInfo:
        """The table's `TableInfo`. Raises `TableNotFoundError`."""
        return self._runner.run(self._async.get_table(namespace, name, timeout=timeout))

    def delete_table(self, namespace: str, name: str, *, timeout: float | None = None) -> None:
        """Delete a table and its keys."""
        self._runner.run(self._async.delete_table(namespace, name, timeout=timeout))

    def table(self, namespace: str, name: str, *, timeout: float | None = None) -> Table:
        """A handle on an existing table. Raises `TableNotFoundError`."""
        return Table(
            self._runner, self._runner.run(self._async.table(namespace, name, timeout=timeout))
        )

    def server_info(self) -> tablekeeper_pb2.ServerInfoResponse:
        """The server's version and endpoints (`ServerInfoResponse`)."""
        return self._runner.run(self._async.server_info())

    def checkpoint(self, namespace: str | None = None, table: str | None = None) -> Any:
        """Checkpoint one table's ranges now (or every open range); see `AsyncClient`."""
        return self._runner.run(self._async.checkpoint(namespace, table))

    def layout(self, namespace: str, table: str) -> TableLayout:
        """The table's current ranges; see `AsyncClient.layout`."""
        return self._runner.run(self._async.layout(namespace, table))

    def split_range(
        self, namespace: str, table: str, range_id: int = 0
    ) -> admin_pb2.SplitRangeResponse:
        """Split one range of a table in two; see `AsyncClient.split_range`."""
        return self._runner.run(self._async.split_range(namespace, table, range_id))

    def status(self) -> Any:
        """The server's per-range status (`StatusResponse`)."""
        return self._runner.run(self._async.status())

    def cluster_status(self) -> admin_pb2.ClusterStatusResponse:
        """The cluster's live servers, assignment, owners and readiness; see `AsyncClient`."""
        return self._runner.run(self._async.cluster_status())

    def route_stats(self) -> RouteStats:
        """How often routes were fetched and invalidated (a copy)."""
        return self._async.route_stats()


class Txn:
    """Synchronous twin of `AsyncTxn`: same builder methods, blocking `commit()`."""

    def __init__(self, runner: LoopThread, txn: AsyncTxn) -> None:
        self._runner = runner
        self._txn = txn

    def if_version(self, lkey: Key, op: CompareOp, version: int) -> Txn:
        """Compare: the key's version `op` `version` (a missing key fails the txn)."""
        self._txn.if_version(lkey, op, version)
        return self

    def if_create_revision(self, lkey: Key, op: CompareOp, revision: int) -> Txn:
        """Compare: the revision that created the key `op` `revision`."""
        self._txn.if_create_revision(lkey, op, revision)
        return self

    def if_mod_revision(self, lkey: Key, op: CompareOp, revision: int) -> Txn:
        """Compare: the revision of the key's last change `op` `revision`."""
        self._txn.if_mod_revision(lkey, op, revision)
        return self

    def if_value(self, lkey: Key, op: CompareOp, value: Key) -> Txn:
        """Compare: the key's value `op` `value`."""
        self._txn.if_value(lkey, op, value)
        return self

    def if_absent(self, lkey: Key) -> Txn:
        """Compare: the key does not exist."""
        self._txn.if_absent(lkey)
        return self

    def if_exists(self, lkey: Key) -> Txn:
        """Compare: the key exists."""
        self._txn.if_exists(lkey)
        return self

    def then_put(self, lkey: Key, value: Key) -> Txn:
        """If the compares hold: put `value`."""
        self._txn.then_put(lkey, value)
        return self

    def then_delete(self, lkey: Key, end: Key | None = None) -> Txn:
        """If the compares hold: delete the key (or the keys in [lkey, end])."""
        self._txn.then_delete(lkey, end)
        return self

    def then_get(self, lkey: Key, end: Key | None = None) -> Txn:
        """If the compares hold: read the key (or the keys in [lkey, end])."""
        self._txn.then_get(lkey, end)
        return self

    def otherwise_put(self, lkey: Key, value: Key) -> Txn:
        """If a compare fails: put `value`."""
        self._txn.otherwise_put(lkey, value)
        return self

    def otherwise_delete(self, lkey: Key, end: Key | None = None) -> Txn:
        """If a compare fails: delete the key (or the keys in [lkey, end])."""
        self._txn.otherwise_delete(lkey, end)
        return self

    def otherwise_get(self, lkey: Key, end: Key | None = None) -> Txn:
        """If a compare fails: read the key (or the keys in [lkey, end])."""
        self._txn.otherwise_get(lkey, end)
        return self

    def commit(self, *, timeout: float | None = None) -> TxnResult:
        """Send the transaction; see `AsyncTxn.commit`."""
        return self._runner.run(self._txn.commit(timeout=timeout))


class Table:
    """Synchronous twin of `AsyncTable` (same methods and arguments, blocking).

    Every call takes `timeout=` (seconds, retries included; see `tablekeeper.table`)."""

    def __init__(self, runner: LoopThread, table: AsyncTable) -> None:
        self._runner = runner
        self._table = table
        self.info = table.info

    @property
    def async_table(self) -> AsyncTable:
        """The `AsyncTable` behind this one (on the client's loop thread)."""
        return self._table

    def put(
        self,
        pkey: Key,
        lkey: Key,
        value: Key,
        *,
        expected_version: int | None = None,
        prev_kv: bool = False,
        ttl_s: float | None = None,
        session: Session | None = None,
        timeout: float | None = None,
    ) -> KeyValue | None:
        """Store `value`; durable when this returns. See `AsyncTable.put` for the arguments.
        Returns the previous value if `prev_kv`."""
        return self._runner.run(
            self._table.put(
                pkey,
                lkey,
                value,
                expected_version=expected_version,
                prev_kv=prev_kv,
                ttl_s=ttl_s,
                session=session.async_session if session is not None else None,
                timeout=timeout,
            )
        )

    def put_sequential(
        self,
        pkey: Key,
        prefix: Key,
        value: Key,
        *,
        ttl_s: float | None = None,
        session: Session | None = None,
        timeout: float | None = None,
    ) -> bytes:
        """Create the key `prefix` + a 20-digit counter unique under `pkey`; returns its lkey."""
        return self._runner.run(
            self._table.put_sequential(
                pkey,
                prefix,
                value,
                ttl_s=ttl_s,
                session=session.async_session if session is not None else None,
                timeout=timeout,
            )
        )

    def session(self, pkey: Key, ttl_s: float) -> Session:
        """A session on the range of `pkey` (`with table.session(...) as session:`)."""
        return Session(self._runner, self._table.session(pkey, ttl_s))

    def get(
        self,
        pkey: Key,
        lkey: Key,
        *,
        read_from: ReadFrom = "leader",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> KeyValue | None:
        """The key's current value, or None if it does not exist (or expired). `read_from`,
        `max_staleness_s`: see `AsyncTable.get` (follower reads)."""
        return self._runner.run(
            self._table.get(
                pkey, lkey, read_from=read_from, max_staleness_s=max_staleness_s, timeout=timeout
            )
        )

    def get_with_info(
        self,
        pkey: Key,
        lkey: Key,
        *,
        read_from: ReadFrom = "follower",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> tuple[KeyValue | None, ReadInfo]:
        """`get` (a follower read by default) and who answered it how fresh."""
        return self._runner.run(
            self._table.get_with_info(
                pkey, lkey, read_from=read_from, max_staleness_s=max_staleness_s, timeout=timeout
            )
        )

    def scan(
        self,
        pkey: Key,
        start: Key = b"",
        end: Key | None = None,
        *,
        limit: int | None = None,
        page_size: int = 1000,
        keys_only: bool = False,
        read_from: ReadFrom = "leader",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> Iterator[KeyValue]:
        """Iterate the keys of `pkey` in [start, end] in key order; see `AsyncTable.scan`
        (`timeout` bounds each page's request)."""
        iterator = self._table.scan(
            pkey,
            start,
            end,
            limit=limit,
            page_size=page_size,
            keys_only=keys_only,
            read_from=read_from,
            max_staleness_s=max_staleness_s,
            timeout=timeout,
        ).__aiter__()

        async def next_item() -> KeyValue | None:
            try:
                return await iterator.__anext__()
            except StopAsyncIteration:
                return None

        while (item := self._runner.run(next_item())) is not None:
            yield item

    def count(
        self,
        pkey: Key,
        start: Key = b"",
        end: Key | None = None,
        *,
        read_from: ReadFrom = "leader",
        max_staleness_s: float | None = None,
        timeout: float | None = None,
    ) -> int:
        """How many keys of `pkey` lie in [start, end] (None = to the end)."""
        return self._runner.run(
            self._table.count(
                pkey,
                start,
                end,
                read_from=read_from,
                max_staleness_s=max_staleness_s,
                timeout=timeout,
            )
        )

    def delete(
        self,
        pkey: Key,
        lkey: Key,
        *,
        expected_version: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Delete one key; returns 1 if it existed, else 0 (see `AsyncTable.delete`)."""
        return self._runner.run(
            self._table.delete(pkey, lkey, expected_version=expected_version, timeout=timeout)
        )

    def delete_range(
        self, pkey: Key, start: Key = b"", end: Key | None = None, *, timeout: float | None = None
    ) -> int:
        """Atomically delete the keys of `pkey` in [start, end]; returns how many existed."""
        return self._runner.run(self._table.delete_range(pkey, start, end, timeout=timeout))

    def increment(
        self,
        pkey: Key,
        lkey: Key,
        amount: int = 1,
        *,
        get_total: bool = False,
        timeout: float | None = None,
    ) -> int | None:
        """Add `amount` to a number key (created at `amount`); the new total if `get_total`."""
        return self._runner.run(
            self._table.increment(pkey, lkey, amount, get_total=get_total, timeout=timeout)
        )

    def txn(self, pkey: Key) -> Txn:
        """A transaction on the keys of `pkey`: add compares and ops, then `commit()`."""
        return Txn(self._runner, self._table.txn(pkey))

    def watch(
        self,
        pkey: Key,
        lkey: Key | None = None,
        *,
        start: Key | None = None,
        end: Key | None = None,
        start_revision: int = 0,
        prev_kv: bool = False,
    ) -> Watch:
        """Synchronous `AsyncTable.watch`: `with table.watch(...) as w: for event in w: ...`."""
        return Watch(
            self._runner,
            self._table.watch(
                pkey, lkey, start=start, end=end, start_revision=start_revision, prev_kv=prev_kv
            ),
        )

    def batch_put(
        self,
        items: Sequence[tuple[Key, Key, Key | int]],
        *,
        mode: Literal["put", "increment"] = "put",
        timeout: float | None = None,
    ) -> list[TableKeeperError | None]:
        """Write many independent keys in one request per server; see `AsyncTable.batch_put`."""
        return self._runner.run(self._table.batch_put(items, mode=mode, timeout=timeout))


__all__ = ["AsyncClient", "Client", "NamespaceInfo", "Table", "TableKeeperError", "Txn"]
