"""Where an import writes: an Oxia namespace or an etcd keyspace, through the same protocol
Pulsar's metadata drivers use (so the keys land exactly where they read them).

Layout, as Pulsar 4.0's drivers read it (`OxiaMetadataStore`, `EtcdMetadataStore` in
pulsar-metadata):
- **Keys** are the znode paths themselves (`/admin/policies/public/default`), values their data.
- **Parents are keys too.** ZooKeeper has every parent as a znode, so every one is copied: the
  Oxia driver creates missing parents as empty records itself and lists a path's children as
  the keys in `[path/, path//)` (Oxia's hierarchical order); the etcd driver lists them as the
  first segment of the keys under the prefix `path/` (so it would not need them; they are
  copied for `exists`).
- **Versions** start afresh: Pulsar reads the store's own version (Oxia's `version_id`, etcd's
  `version - 1`) before each conditional write, so nothing depends on ZooKeeper's numbers.
- **Sequential children** (ledger ids under `/ledgers/idgen`, `/counters/...`): ZooKeeper
  numbers them with the parent's `cversion`; the Oxia driver with the parent's
  `modifications_count` (it puts the parent, then appends the count), the etcd driver with the
  parent's etcd `version` before such a put. So those parents are put again `cversion` times
  (`bump`), and the next number issued is above every one ZooKeeper issued (a ledger id used
  twice would mix two ledgers' entries on the bookies).

Each target writes with "must not exist" conditions unless forced, so an import never
overwrites a key silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

PUTS_PER_REQUEST_MAX = 500
REQUEST_BYTES_MAX = 1024 * 1024
ETCD_TXN_OPS_MAX = 128
"""etcd's default `--max-txn-ops` (TableKeeper's too)."""
CALL_TIMEOUT_S = 60.0


class TargetError(Exception):
    """The target refused a write (a key exists, a limit) or cannot be reached."""


class Target(Protocol):
    def describe(self) -> str: ...

    def top_level(self) -> list[str]:
        """Keys directly under `/` (any: the target is not empty)."""
        ...

    def put_many(self, items: Sequence[tuple[str, bytes]], *, create_only: bool) -> None:
        """Write every (key, value); with `create_only`, raise `TargetError` naming a key that
        exists (keys of other requests may be written already)."""
        ...

    def bump(self, key: str, value: bytes, times: int) -> None:
        """Put `key` (with `value`, unchanged) `times` more times: see the module doc."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def children(self, path: str) -> list[str]:
        """Names of the keys directly under `path`, sorted."""
        ...

    def close(self) -> None: ...


def parse_target(url: str) -> Target:
    """`oxia://HOST:PORT[/NAMESPACE]` or `etcd:http://HOST:PORT` (Pulsar's metadataStoreUrl
    forms; `etcd://HOST:PORT` too). Raises `ValueError` for anything else (before connecting)."""
    if url.startswith("oxia://"):
        address, _, namespace = url[len("oxia://") :].partition("/")
        if _ADDRESS.fullmatch(address):
            return OxiaTarget(address, namespace.strip("/") or "default")
    elif url.startswith("etcd:"):
        rest = url[len("etcd:") :]
        for scheme in ("http://", "//"):
            if rest.startswith(scheme):
                rest = rest[len(scheme) :]
                break
        address = rest.split(",")[0].rstrip("/")
        if _ADDRESS.fullmatch(address):
            return EtcdTarget(address)
    raise ValueError(f"{url}: expected oxia://HOST:PORT[/NAMESPACE] or etcd:http://HOST:PORT")


_ADDRESS = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}")


def _batches(items: Sequence[tuple[str, bytes]], ops_max: int) -> Iterable[list[tuple[str, bytes]]]:
    """Consecutive runs of at most `ops_max` items and about `REQUEST_BYTES_MAX` bytes."""
    batch: list[tuple[str, bytes]] = []
    size = 0
    for key, value in items:
        weight = len(key) + len(value) + 16
        if batch and (len(batch) >= ops_max or size + weight > REQUEST_BYTES_MAX):
            yield batch
            batch, size = [], 0
        batch.append((key, value))
        size += weight
    if batch:
        yield batch


def _call(what: str, target: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, timeout=CALL_TIMEOUT_S, **kwargs)
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "error"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        raise TargetError(f"{target}: {what}: {code}: {details}") from None


# ---------------------------------------------------------------------------------- Oxia


@dataclass(frozen=True, slots=True)
class _Shard:
    shard: int
    leader: str
    hash_min: int
    hash_max: int


class OxiaTarget:
    """An Oxia namespace: each key goes to the shard whose hash range holds the low 32 bits of
    XXH3-64 of its UTF-8 bytes (what Oxia's clients route by), at that shard's leader."""

    def __init__(self, address: str, namespace: str = "default") -> None:
        from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc

        self._pb = client_pb2
        self._grpc = client_pb2_grpc
        self.address = address
        self.namespace = namespace
        self._channels: dict[str, grpc.Channel] = {}
        request = client_pb2.ShardAssignmentsRequest(namespace=namespace)
        stream = self._stub(address).GetShardAssignments(request, timeout=CALL_TIMEOUT_S)
        try:
            first = next(stream)
        except grpc.RpcError as exc:
            raise TargetError(
                f"oxia://{address}/{namespace}: shard assignments: {exc.code().name}: "
                f"{exc.details()}"
            ) from None
        finally:
            stream.cancel()
        assignment = first.namespaces.get(namespace)
        if assignment is None or not assignment.assignments:
            raise TargetError(f"oxia://{address}: no namespace {namespace!r}")
        self._shards = [
            _Shard(
                a.shard,
                a.leader,
                a.int32_hash_range.min_hash_inclusive,
                a.int32_hash_range.max_hash_inclusive,
            )
            for a in assignment.assignments
        ]

    def describe(self) -> str:
        return f"oxia://{self.address}/{self.namespace} ({len(self._shards)} shards)"

    def _stub(self, address: str) -> Any:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
            )
            self._channels[address] = channel
        return self._grpc.OxiaClientStub(channel)

    def _shard_of(self, key: str) -> _Shard:
        import xxhash

        hashed = xxhash.xxh3_64_intdigest(key.encode()) & 0xFFFFFFFF
        for shard in self._shards:
            if shard.hash_min <= hashed <= shard.hash_max:
                return shard
        raise TargetError(f"{self.describe()}: no shard holds hash {hashed} (key {key!r})")

    def put_many(self, items: Sequence[tuple[str, bytes]], *, create_only: bool) -> None:
        by_shard: dict[int, list[tuple[str, bytes]]] = {}
        shards = {}
        for key, value in items:
            shard = self._shard_of(key)
            shards[shard.shard] = shard
            by_shard.setdefault(shard.shard, []).append((key, value))
        for shard_id, shard_items in by_shard.items():
            for batch in _batches(shard_items, PUTS_PER_REQUEST_MAX):
                self._write(shards[shard_id], batch, create_only)

    def _write(self, shard: _Shard, batch: list[tuple[str, bytes]], create_only: bool) -> None:
        pb = self._pb
        puts = [
            pb.PutRequest(key=k, value=v, expected_version_id=-1)
            if create_only
            else pb.PutRequest(key=k, value=v)
            for k, v in batch
        ]
        request = pb.WriteRequest(shard=shard.shard, puts=puts)
        stub = self._stub(shard.leader)
        response = _call("write", self.describe(), stub.Write, request)
        for (key, _), put in zip(batch, response.puts, strict=True):
            if put.status == pb.UNEXPECTED_VERSION_ID:
                raise TargetError(
                    f"{self.describe()}: {key} exists already (nothing is overwritten without "
                    "--force)"
                )
            if put.status != pb.OK:
                raise TargetError(f"{self.describe()}: put {key}: status {put.status}")

    def bump(self, key: str, value: bytes, times: int) -> None:
        shard = self._shard_of(key)
        per_request = max(1, min(PUTS_PER_REQUEST_MAX * 4, REQUEST_BYTES_MAX // (len(value) + 64)))
        left = times
        while left > 0:
            count = min(left, per_request)
            self._write(shard, [(key, value)] * count, False)
            left -= count

    def get(self, key: str) -> bytes | None:
        pb = self._pb
        shard = self._shard_of(key)
        get = pb.GetRequest(key=key, include_value=True)
        request = pb.ReadRequest(shard=shard.shard, gets=[get])
        stub = self._stub(shard.leader)
        try:
            for response in stub.Read(request, timeout=CALL_TIMEOUT_S):
                for got in response.gets:
                    return bytes(got.value) if got.status == pb.OK else None
        except grpc.RpcError as exc:
            raise TargetError(f"{self.describe()}: read {key}: {exc.code().name}") from None
        return None

    def children(self, path: str) -> list[str]:
        pb = self._pb
        start = path if path.endswith("/") else path + "/"
        names: set[str] = set()
        for shard in self._shards:
            request = pb.ListRequest(
                shard=shard.shard, start_inclusive=start, end_exclusive=start + "/"
            )
            stub = self._stub(shard.leader)
            try:
                for page in stub.List(request, timeout=CALL_TIMEOUT_S):
                    names.update(key[len(start) :] for key in page.keys)
            except grpc.RpcError as exc:
                raise TargetError(f"{self.describe()}: list {path}: {exc.code().name}") from None
        return sorted(names)

    def top_level(self) -> list[str]:
        return self.children("/")

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


# ---------------------------------------------------------------------------------- etcd


class EtcdTarget:
    """An etcd keyspace (TableKeeper's `--etcd-port`, or an etcd)."""

    def __init__(self, address: str) -> None:
        from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc

        self._pb = rpc_pb2
        self.address = address
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        )
        self._kv = rpc_pb2_grpc.KVStub(self._channel)
        probe = rpc_pb2.RangeRequest(key=b"/", count_only=True)
        _call("range", self.describe(), self._kv.Range, probe)

    def describe(self) -> str:
        return f"etcd:http://{self.address}"

    def put_many(self, items: Sequence[tuple[str, bytes]], *, create_only: bool) -> None:
        pb = self._pb
        for batch in _batches(items, ETCD_TXN_OPS_MAX):
            txn = pb.TxnRequest()
            for key, value in batch:
                if create_only:
                    txn.compare.add(
                        result=pb.Compare.EQUAL,
                        target=pb.Compare.CREATE,
                        key=key.encode(),
                        create_revision=0,
                    )
                txn.success.add().request_put.CopyFrom(pb.PutRequest(key=key.encode(), value=value))
            response = _call("txn", self.describe(), self._kv.Txn, txn)
            if not response.succeeded:
                existing = next((k for k, _ in batch if self.get(k) is not None), batch[0][0])
                raise TargetError(
                    f"{self.describe()}: {existing} exists already (nothing is overwritten "
                    "without --force)"
                )

    def bump(self, key: str, value: bytes, times: int) -> None:
        put = self._pb.PutRequest(key=key.encode(), value=value)
        for _ in range(times):  # one key may not be written twice in one etcd txn
            _call("put", self.describe(), self._kv.Put, put)

    def get(self, key: str) -> bytes | None:
        request = self._pb.RangeRequest(key=key.encode())
        response = _call("range", self.describe(), self._kv.Range, request)
        return bytes(response.kvs[0].value) if response.kvs else None

    def children(self, path: str) -> list[str]:
        prefix = (path if path.endswith("/") else path + "/").encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        names: set[str] = set()
        start = prefix
        while True:
            request = self._pb.RangeRequest(key=start, range_end=end, keys_only=True, limit=10_000)
            response = _call("range", self.describe(), self._kv.Range, request)
            for kv in response.kvs:
                names.add(kv.key[len(prefix) :].decode().split("/", 1)[0])
            if not response.more or not response.kvs:
                return sorted(names)
            start = response.kvs[-1].key + b"\x00"

    def top_level(self) -> list[str]:
        return self.children("/")

    def close(self) -> None:
        self._channel.close()
