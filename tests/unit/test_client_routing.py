"""The SDK's routing (pure-Python MurmurHash3 and range lookup) agrees with the server's."""

from __future__ import annotations

import random

import pytest

from tablekeeper import routing
from tablekeeper.bulk import Epoch, marker_lkey, once_txns
from tablekeeper_server.core import routing as server_routing

pytestmark = pytest.mark.unit


def test_pure_python_hash_matches_the_servers() -> None:
    rng = random.Random(7)
    samples = [b"", b"a", b"user-1", bytes(range(256))]
    samples += [rng.randbytes(rng.randrange(0, 70)) for _ in range(2000)]
    for data in samples:
        assert routing.murmur3_x64_128_h1(data) == server_routing.routing_hash(data), data
        assert routing.routing_hash(data) == server_routing.routing_hash(data)


@pytest.mark.parametrize("n", [2, 4, 5, 8, 16])
def test_router_picks_the_servers_range(n: int) -> None:
    split = server_routing.split_hash_space(n)
    ids = [1024 + i for i in range(len(split))]
    server = server_routing.RangeRouter([r.start for r in split], ids)
    ranges = [routing.RangeInfo(i, r.start, r.end, 0) for i, r in zip(ids, split, strict=True)]
    client = routing.RangeRouter(list(reversed(ranges)))
    for i in range(3000):
        pkey = f"pkey-{i}".encode()
        assert client.route(pkey).range_id == server.route(pkey)


def test_once_txns_are_deterministic_and_chunked() -> None:
    increments = {b"b": {f"k{i}".encode(): i for i in range(2500)}, b"a": {b"x": 1}}
    shuffled = {p: dict(reversed(list(lk.items()))) for p, lk in reversed(increments.items())}
    epoch = Epoch.sequence(3)
    ops = once_txns(1024, increments, scope=b"q", partition=2, epoch=epoch)
    assert ops == once_txns(1024, shuffled, scope=b"q", partition=2, epoch=epoch)
    assert [op.txn.header.r_key for op in ops] == [b"a", b"b", b"b", b"b"]
    markers = [op.txn.compare[0].key for op in ops]
    assert markers[1:] == [marker_lkey(b"q", 2, c) for c in range(3)]
    assert all(len(op.txn.failure) <= 1001 for op in ops)
    assert sum(len(op.txn.failure) - 1 for op in ops) == 2501
    assert Epoch.sequence(0).compare_to == b"" and Epoch.sequence(3).compare_to == (2).to_bytes(
        8, "big"
    )
    with pytest.raises(ValueError):
        Epoch.token(b"")
