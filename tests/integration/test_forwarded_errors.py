"""An owner's refusal reaches the caller unchanged when a non-owner forwarded the request: the
forwarder reads the owner's gRPC status back through the error table. Before, a write refused
with RESOURCE_EXHAUSTED by its owner (nothing applied) reached the caller as "outcome unknown"
(UNEXPECTED, 600)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tablekeeper import Client, ResourceLimitError
from tests.integration.test_cluster import CONTAINERS, PATIENT, _pkey_on, _router
from tests.integration.test_crash import NS, TABLE
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.integration
RESPONSE_BYTES_MAX = 65_536


def test_an_owners_resource_limit_is_passed_on(make_cluster: Callable[..., TestCluster]) -> None:
    cluster = make_cluster(
        containers=CONTAINERS, extra_args=["--max-response-bytes", str(RESPONSE_BYTES_MAX)]
    ).start(3)
    with Client(cluster.service(0), retry=PATIENT) as client:
        client.create_namespace(NS)
        table_id = client.create_table(NS, TABLE, ranges=4).table_id
    elsewhere = frozenset(range(CONTAINERS)) - cluster.assignment()[cluster.endpoint(0)]
    pkey = _pkey_on(_router(cluster, table_id), elsewhere)
    with Client(cluster.service(0), retry=PATIENT, direct_routing=False) as client:
        table = client.table(NS, TABLE)
        for i in range(3):
            table.put(pkey, f"k{i}", b"v" * 30_000)
        # A read-only txn whose reads carry more than a response may: the owner refuses it
        # (nothing applied); through server 0, which forwards it, the caller hears the same.
        txn = table.txn(pkey)
        for _ in range(3):
            txn.then_get("k0", "k9")
        with pytest.raises(ResourceLimitError, match="--max-response-bytes") as refused:
            txn.commit()
        assert not refused.value.outcome_unknown
        assert table.get(pkey, "k0") is not None
