"""The root range: namespaces and tables (BookKeeper "streams"), with BookKeeper's ids.

Key layout (BookKeeper's, longs as 8 bytes big-endian):

    0xff "nsid"                     last namespace id (the first namespace gets 0)
    0xff "streamid"                 last stream id (global; the first stream gets 1024)
    0x01 ns_name                    namespace id
    0x02 ns_id                      NamespaceMetadata
    0x02 ns_id 0x03 stream_name     stream id
    0x02 ns_id 0x04 stream_id       StreamProperties
    0x05 stream_id                  namespace id (reverse index)
    0x02 ns_id 0x06 role            permission bits of the role on the namespace
    0x07 user                       the user's password hash (`security.passwords`); a user's
                                    name is its role

Writes are serialized by a lock and committed as one txn each, so a create is all-or-nothing.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.kv import MetadataKv
from tablekeeper_server.core.names import invalid_name_reason, invalid_new_name_reason, shown
from tablekeeper_server.core.routing import normalized_num_ranges
from tablekeeper_server.errors import (
    BadRequestError,
    InvalidNamespaceNameError,
    InvalidStreamNameError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
    TableKeeperError,
)
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.replica import Range

_LONG = struct.Struct(">q")
NS_ID_KEY = b"\xffnsid"
STREAM_ID_KEY = b"\xffstreamid"
MIN_DATA_STREAM_ID = 1024


def _long(value: int) -> bytes:
    return _LONG.pack(value)


def _unlong(raw: bytes) -> int:
    return int(_LONG.unpack(raw)[0])


def _ns_name_key(name: str) -> bytes:
    return b"\x01" + name.encode()


def _ns_key(ns_id: int) -> bytes:
    return b"\x02" + _long(ns_id)


def _stream_name_key(ns_id: int, name: str) -> bytes:
    return _ns_key(ns_id) + b"\x03" + name.encode()


def _stream_props_key(ns_id: int, stream_id: int) -> bytes:
    return _ns_key(ns_id) + b"\x04" + _long(stream_id)


def _stream_ns_key(stream_id: int) -> bytes:
    return b"\x05" + _long(stream_id)


EXACT_RANGES_NAMESPACES = frozenset({"oxia"})
"""Namespaces whose tables are another protocol's ranges-as-shards (namespace `oxia`: Oxia
namespaces, which may have one shard): their tables get exactly the ranges asked for
(`StreamConfiguration.exact_num_ranges`, set here and never taken from a client); every other
table BookKeeper's split."""


class RootCatalog:
    def __init__(
        self, root_range: Range, num_containers: Callable[[], int], limits: Limits | None = None
    ) -> None:
        """`num_containers()`: the cluster's containers now (a new table's meta range goes to
        one of them). `limits`: `name_bytes_max` bounds names, `table_ranges_max` a table's
        ranges."""
        self._kv = MetadataKv(root_range)
        self._num_containers = num_containers
        self._limits = limits or Limits()
        self._lock = asyncio.Lock()

    @property
    def range(self) -> Range:
        """The range this catalog lives in."""
        return self._kv.range

    def _invalid(self, name: str) -> str | None:
        return invalid_name_reason(name, self._limits.name_bytes_max)

    def _check_num_ranges(self, conf: stream_pb2.StreamConfiguration) -> None:
        """A table gets max(2, n) ranges rounded up to even (BookKeeper's split), or with
        `exact_num_ranges` max(1, n); at most `table_ranges_max` (`--max-table-ranges`)."""
        initial_num_ranges = conf.initial_num_ranges
        if initial_num_ranges < 0:
            raise BadRequestError(f"initial_num_ranges must be >= 0, not {initial_num_ranges}")
        ranges = normalized_num_ranges(initial_num_ranges, exact=conf.exact_num_ranges)
        if ranges > self._limits.table_ranges_max:
            raise BadRequestError(
                f"initial_num_ranges {initial_num_ranges} is over the limit of "
                f"{self._limits.table_ranges_max} ranges per table (--max-table-ranges)"
            )

    # ------------------------------------------------------------------ namespaces

    def _namespace_id(self, name: str) -> int:
        raw = self._kv.get(_ns_name_key(name))
        if raw is None:
            raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
        return _unlong(raw)

    async def create_namespace(
        self, name: str, conf: stream_pb2.NamespaceConfiguration
    ) -> stream_pb2.NamespaceProperties:
        if reason := invalid_new_name_reason(name, self._limits.name_bytes_max):
            raise InvalidNamespaceNameError(f"invalid namespace name {shown(name)}: {reason}")
        async with self._lock:
            if self._kv.get(_ns_name_key(name)) is not None:
                raise NamespaceExistsError(f"namespace {name!r} already exists")
            last = self._kv.get(NS_ID_KEY)
            ns_id = 0 if last is None else _unlong(last) + 1
            props = stream_pb2.NamespaceProperties(
                namespace_id=ns_id,
                namespace_name=name,
                default_stream_conf=conf.default_stream_conf,
            )
            metadata = stream_pb2.NamespaceMetadata(props=props)
            committed = await self._kv.commit(
                absent=[_ns_name_key(name)],
                puts=[
                    (_ns_name_key(name), _long(ns_id)),
                    (_ns_key(ns_id), metadata.SerializeToString()),
                    (NS_ID_KEY, _long(ns_id)),
                ],
            )
            if not committed:
                raise NamespaceExistsError(f"namespace {name!r} already exists")
            return props

    def get_namespace(self, name: str) -> stream_pb2.NamespaceProperties:
        if reason := self._invalid(name):
            raise InvalidNamespaceNameError(f"invalid namespace name {shown(name)}: {reason}")
        ns_id = self._namespace_id(name)
        raw = self._kv.get(_ns_key(ns_id))
        if raw is None:
            raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
        return stream_pb2.NamespaceMetadata.FromString(raw).props

    async def delete_namespace(self, name: str) -> list[stream_pb2.StreamProperties]:
        """Delete a namespace and its tables; return the deleted tables so their data can go."""
        if reason := self._invalid(name):
            raise InvalidNamespaceNameError(f"invalid namespace name {shown(name)}: {reason}")
        async with self._lock:
            ns_id = self._namespace_id(name)
            streams = self._streams_of(ns_id)
            await self._kv.commit(
                deletes=[_ns_name_key(name)] + [_stream_ns_key(s.stream_id) for s in streams],
                delete_ranges=[(_ns_key(ns_id), _ns_key(ns_id) + b"\xff")],
            )
            return streams

    def _streams_of(self, ns_id: int) -> list[stream_pb2.StreamProperties]:
        start = _ns_key(ns_id) + b"\x04"
        rows = self._kv.scan(start, start + b"\xff" * 8)
        return [stream_pb2.StreamProperties.FromString(value) for _, value in rows]

    # ------------------------------------------------------------------ streams (tables)

    async def create_stream(
        self, ns_name: str, name: str, conf: stream_pb2.StreamConfiguration
    ) -> stream_pb2.StreamProperties:
        if reason := self._invalid(ns_name):
            raise InvalidNamespaceNameError(f"invalid namespace name {shown(ns_name)}: {reason}")
        if reason := invalid_new_name_reason(name, self._limits.name_bytes_max):
            raise InvalidStreamNameError(f"invalid table name {shown(name)}: {reason}")
        exact = ns_name in EXACT_RANGES_NAMESPACES
        if conf.exact_num_ranges != exact:
            asked, conf = conf, stream_pb2.StreamConfiguration()
            conf.CopyFrom(asked)
            conf.exact_num_ranges = exact
        self._check_num_ranges(conf)
        async with self._lock:
            ns_id = self._namespace_id(ns_name)
            if self._kv.get(_stream_name_key(ns_id, name)) is not None:
                raise StreamExistsError(f"table {ns_name}/{name} already exists")
            last = self._kv.get(STREAM_ID_KEY)
            stream_id = MIN_DATA_STREAM_ID if last is None else _unlong(last) + 1
            props = stream_pb2.StreamProperties(
                stream_id=stream_id,
                storage_container_id=stream_id % self._num_containers(),
                stream_name=name,
                stream_conf=conf,
            )
            committed = await self._kv.commit(
                absent=[_stream_name_key(ns_id, name)],
                puts=[
                    (_stream_name_key(ns_id, name), _long(stream_id)),
                    (_stream_props_key(ns_id, stream_id), props.SerializeToString()),
                    (_stream_ns_key(stream_id), _long(ns_id)),
                    (STREAM_ID_KEY, _long(stream_id)),
                ],
            )
            if not committed:
                raise StreamExistsError(f"table {ns_name}/{name} already exists")
            return props

    def get_stream(self, ns_name: str, name: str) -> stream_pb2.StreamProperties:
        if reason := self._invalid(ns_name):
            raise InvalidNamespaceNameError(f"invalid namespace name {shown(ns_name)}: {reason}")
        if reason := self._invalid(name):
            raise InvalidStreamNameError(f"invalid table name {shown(name)}: {reason}")
        ns_id = self._namespace_id(ns_name)
        raw = self._kv.get(_stream_name_key(ns_id, name))
        if raw is None:
            raise StreamNotFoundError(f"table {ns_name}/{name} does not exist")
        return self._props(ns_id, _unlong(raw))

    def get_stream_by_id(self, stream_id: int) -> stream_pb2.StreamProperties:
        raw = self._kv.get(_stream_ns_key(stream_id))
        if raw is None:
            raise StreamNotFoundError(f"table id {stream_id} does not exist")
        return self._props(_unlong(raw), stream_id)

    def _props(self, ns_id: int, stream_id: int) -> stream_pb2.StreamProperties:
        raw = self._kv.get(_stream_props_key(ns_id, stream_id))
        if raw is None:
            raise StreamNotFoundError(f"table id {stream_id} does not exist")
        return stream_pb2.StreamProperties.FromString(raw)

    async def delete_stream(self, ns_name: str, name: str) -> stream_pb2.StreamProperties:
        async with self._lock:
            props = self.get_stream(ns_name, name)
            ns_id = self._namespace_id(ns_name)
            await self._kv.commit(
                deletes=[
                    _stream_name_key(ns_id, name),
                    _stream_props_key(ns_id, props.stream_id),
                    _stream_ns_key(props.stream_id),
                ]
            )
            return props

    def namespaces(self) -> list[stream_pb2.NamespaceProperties]:
        rows = self._kv.scan(b"\x02", b"\x02" + b"\xff" * 8)
        result = []
        for key, value in rows:
            if len(key) == 9:
                result.append(stream_pb2.NamespaceMetadata.FromString(value).props)
        return result

    def streams(self, ns_name: str) -> list[stream_pb2.StreamProperties]:
        return self._streams_of(self._namespace_id(ns_name))

    # ------------------------------------------------------------------ permissions
    # A role's permissions on a namespace live under the namespace's own keys, so deleting the
    # namespace deletes them too (a namespace created again under that name starts with none).

    def namespace_of_stream(self, stream_id: int) -> stream_pb2.NamespaceProperties:
        raw = self._kv.get(_stream_ns_key(stream_id))
        if raw is None:
            raise StreamNotFoundError(f"table {stream_id} does not exist")
        metadata = self._kv.get(_ns_key(_unlong(raw)))
        if metadata is None:
            raise StreamNotFoundError(f"table {stream_id} does not exist")
        return stream_pb2.NamespaceMetadata.FromString(metadata).props

    def permissions(self, ns_name: str) -> dict[str, int]:
        """role -> permission bits on the namespace."""
        prefix = _permission_key(self._namespace_id(ns_name), "")
        return {
            key[len(prefix) :].decode(): value[0]
            for key, value in self._kv.scan(prefix, prefix + b"\xff" * 8)
            if value
        }

    def role_permissions(self, ns_id: int, role: str) -> int:
        raw = self._kv.get(_permission_key(ns_id, role))
        return raw[0] if raw else 0

    def role_permissions_on(self, ns_name: str, role: str) -> int:
        """The role's permission bits on a namespace by name (0 if there is no such namespace)."""
        try:
            ns_id = self._namespace_id(ns_name)
        except NamespaceNotFoundError:
            return 0
        return self.role_permissions(ns_id, role)

    async def change_permissions(self, ns_name: str, role: str, add: int, remove: int) -> int:
        """Add then remove permission bits of `role` on the namespace; returns the new bits."""
        async with self._lock:
            ns_id = self._namespace_id(ns_name)
            key = _permission_key(ns_id, role)
            bits = (self.role_permissions(ns_id, role) | add) & ~remove
            if bits:
                await self._kv.commit(puts=[(key, bytes([bits]))])
            else:
                await self._kv.commit(deletes=[key])
            return bits

    # ------------------------------------------------------------------ users
    # Users with passwords, for front-ends whose clients log in (etcd's Authenticate). A user's
    # name is its role: what it may do is the role's permissions. Only hashes are stored.

    def user(self, name: str) -> bytes | None:
        """The user's stored password hash, or None if there is no such user."""
        return self._kv.get(_user_key(name))

    def users(self) -> list[str]:
        """Every user's name, sorted."""
        rows = self._kv.scan(_USERS, _USERS_END)
        return [key[len(_USERS) :].decode() for key, _ in rows]

    async def add_user(self, name: str, password_hash: bytes) -> bool:
        """Add a user; False (nothing written) if it exists already."""
        async with self._lock:
            key = _user_key(name)
            if self._kv.get(key) is not None:
                return False
            return await self._kv.commit(absent=[key], puts=[(key, password_hash)])

    async def set_user_password(self, name: str, password_hash: bytes) -> bool:
        """Replace a user's password hash; False (nothing written) if there is no such user."""
        async with self._lock:
            key = _user_key(name)
            if self._kv.get(key) is None:
                return False
            await self._kv.commit(puts=[(key, password_hash)])
            return True

    async def delete_user(self, name: str) -> bool:
        """Delete a user (its role's permissions stay); False if there is no such user."""
        async with self._lock:
            key = _user_key(name)
            if self._kv.get(key) is None:
                return False
            await self._kv.commit(deletes=[key])
            return True


def _permission_key(ns_id: int, role: str) -> bytes:
    return _ns_key(ns_id) + b"\x06" + role.encode()


_USERS = b"\x07"
_USERS_END = b"\x07\xff"  # inclusive; UTF-8 names never hold 0xff


def _user_key(name: str) -> bytes:
    return _USERS + name.encode()


__all__ = ["RootCatalog", "TableKeeperError"]
