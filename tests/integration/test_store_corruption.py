"""A flipped byte in a range's local RocksDB file (issue 17): the call that meets it hears
UNEXPECTED (600), the range rebuilds its store from its checkpoint and log, and every
acknowledged write is served again, including writes made after the checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from tablekeeper import Client
from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

TIMEOUT_S = 30
PKEY = b"p"
UNEXPECTED = 600
# Keys k01000-k01199 are where `_flip_byte_in_user_data` puts the damage; the rest fill blocks
# around them.
KEYS_IN_CHECKPOINT = 1200
KEYS_AFTER_CHECKPOINT = 200


def _key(i: int) -> bytes:
    return b"k%05d" % i


def _value(i: int, generation: int) -> bytes:
    return (b"%d-%05d-" % (generation, i)) + bytes((i * 7 + j) % 251 for j in range(200))


def _header(table_id: int) -> kv.RoutingHeader:
    return kv.RoutingHeader(stream_id=table_id, r_key=PKEY)


def _store_of(data_dir: Path, table_id: int) -> Path:
    """The local store of the table's range holding `PKEY` (the only one with data)."""
    stores = [
        p for p in data_dir.glob(f"db/*/{table_id}-*") if p.is_dir() and "unusable" not in p.name
    ]
    assert stores, sorted(data_dir.glob("db/*/*"))
    return max(stores, key=lambda p: sum(f.stat().st_size for f in p.glob("*.sst")))


def _flip_byte_in_user_data(store: Path) -> Path:
    """Flip a byte of a data block holding user keys (the store also holds the range's metadata
    and change events): one where a key written before the checkpoint is spelled out in full."""
    for sst in sorted(store.glob("*.sst"), key=lambda p: -p.stat().st_size):
        data = bytearray(sst.read_bytes())
        found = re.search(rb"k01[0-9]{3}", data)
        if found is not None:
            data[found.start() + 3] ^= 0xFF
            sst.write_bytes(bytes(data))
            return sst
    raise AssertionError(f"no SST of {store} spells out a user key")


@pytest.mark.parametrize("first_call", ["read", "write"])
def test_a_damaged_store_is_rebuilt_from_checkpoint_and_log(
    tmp_path: Path, server_factory: list[ServerProcess], first_call: str
) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir)
    server_factory.append(server)
    server.start()
    expected: dict[bytes, bytes] = {}
    with Client(server.service) as client:
        client.create_namespace("rot")
        table_id = client.create_table("rot", "t", ranges=2).table_id
        table = client.table("rot", "t")
        for i in range(KEYS_IN_CHECKPOINT):
            table.put(PKEY, _key(i), _value(i, 0))
            expected[_key(i)] = _value(i, 0)
        client.checkpoint("rot", "t")  # flushes the store into SSTs and uploads them
        for i in range(KEYS_AFTER_CHECKPOINT):  # only in the log (and the memtable)
            key = _key(KEYS_IN_CHECKPOINT + i)
            table.put(PKEY, key, _value(i, 1))
            expected[key] = _value(i, 1)
    assert server.stop() == 0  # a clean stop flushes the memtable too
    store = _store_of(data_dir, table_id)
    _flip_byte_in_user_data(store)
    server.start()

    errors: list[tuple[int, str]] = []
    with grpc.insecure_channel(server.target) as channel:
        stub = kv_rpc_pb2_grpc.TableServiceStub(channel)

        def call(key: bytes, generation: int, i: int) -> None:
            """One get or put of `key`: retried once after an error (the range rebuilds
            itself on the next request), then it must succeed."""
            for _ in range(2):
                if first_call == "read":
                    request = kv.RangeRequest(key=key, header=_header(table_id))
                    response, rpc = stub.Range.with_call(request, timeout=TIMEOUT_S)
                    if response.header.code == 0:
                        assert [x.value for x in response.kvs] == [expected[key]], key
                        return
                else:
                    value = _value(i, generation)
                    put = kv.PutRequest(key=key, value=value, header=_header(table_id))
                    response, rpc = stub.Put.with_call(put, timeout=TIMEOUT_S)
                    if response.header.code == 0:
                        expected[key] = value
                        return
                trailer = str(dict(rpc.trailing_metadata() or ()).get("tk-error", ""))
                errors.append((response.header.code, trailer))
            raise AssertionError(f"{first_call} of {key!r} failed twice: {errors}")

        for i, key in enumerate(sorted(expected)):
            call(key, 2, i)

    # The damage was met by a call (not hidden by recovery), answered as damaged data, once.
    assert len(errors) == 1, errors
    code, reason = errors[0]
    assert code == UNEXPECTED, errors
    assert "damaged" in reason or "Corruption" in reason, reason
    # The damaged store was set aside for inspection, never deleted.
    assert list(store.parent.glob(f"{store.name}.unusable-*")), sorted(store.parent.iterdir())

    # Every acknowledged write is served, also after another restart (the rebuilt store holds).
    server.stop()
    server.start()
    with Client(server.service) as client:
        table = client.table("rot", "t")
        got = {kv_.lkey: kv_.value for kv_ in table.scan(PKEY)}
    assert got == expected
