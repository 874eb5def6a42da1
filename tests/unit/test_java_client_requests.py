"""Request shapes the BookKeeper Java client sends, served as BookKeeper's server serves them.

Its default read options (`RangeOptionBuilderImpl`, used by `Table.get(key)` and
`PTable.get(pkey, lkey)`) send `limit = -1` and revision bounds `Long.MIN_VALUE..Long.MAX_VALUE`;
BookKeeper's server reads a limit or bound <= 0 as "none" (`TableStoreImpl.buildRangeOp`).
tests/compat/test_java_client.py runs the real client; these pin the semantics here.
"""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_server.errors import BadRequestError, Code
from tablekeeper_server.range import validation
from tablekeeper_server.range.limits import Limits
from tests.unit.test_state_machine import Machine, header, put, txn

pytestmark = pytest.mark.unit

LIMITS = Limits()
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# What the Java client's default RangeOption puts in a RangeRequest.
JAVA_DEFAULTS = {
    "limit": -1,
    "min_mod_revision": INT64_MIN,
    "max_mod_revision": INT64_MAX,
    "min_create_revision": INT64_MIN,
    "max_create_revision": INT64_MAX,
}


def java_get(key: bytes, **kw: object) -> kv.RangeRequest:
    return kv.RangeRequest(key=key, header=header(), **{**JAVA_DEFAULTS, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [-1, -(2**63), 0])
def test_a_limit_of_zero_or_below_is_accepted_as_no_limit(limit: int) -> None:
    validation.check_range(java_get(b"k", limit=limit), LIMITS)
    validation.check_range(java_get(b"a", range_end=b"z", limit=limit), LIMITS)
    validation.check_txn(
        kv.TxnRequest(
            success=[kv.RequestOp(request_range=java_get(b"k", limit=limit))], header=header()
        ),
        LIMITS,
    )


def test_the_java_clients_default_get_reads_the_key() -> None:
    m = Machine()
    m.one(put(b"k", b"v"))
    got = m.sm.read(java_get(b"k"), 0)
    assert got.header.code == Code.SUCCESS
    assert (got.count, [kv_.value for kv_ in got.kvs]) == (1, [b"v"])
    missing = m.sm.read(java_get(b"absent"), 0)
    assert (missing.header.code, missing.count, list(missing.kvs)) == (Code.SUCCESS, 0, [])


def test_a_negative_limit_scans_everything_and_a_positive_one_still_caps() -> None:
    m = Machine()
    m.apply(*(put(bytes([c]), b"v") for c in b"abcdef"))
    everything = m.sm.read(java_get(b"a", range_end=b"f"), 0)
    assert [kv_.key for kv_ in everything.kvs] == [bytes([c]) for c in b"abcdef"]
    assert (everything.count, everything.more) == (6, False)
    capped = m.sm.read(java_get(b"a", range_end=b"f", limit=2), 0)
    assert ([kv_.key for kv_ in capped.kvs], capped.more) == ([b"a", b"b"], True)


def test_a_txn_get_with_the_java_defaults_reads_the_key() -> None:
    m = Machine()
    m.one(put(b"k", b"v"))
    response = m.one(txn([], [kv.RequestOp(request_range=java_get(b"k"))]))
    assert isinstance(response, kv.TxnResponse)
    assert response.succeeded
    assert [kv_.value for kv_ in response.responses[0].response_range.kvs] == [b"v"]


def test_what_stays_refused_in_a_read() -> None:
    with pytest.raises(BadRequestError, match="past revision"):
        validation.check_range(java_get(b"k", revision=5), LIMITS)
