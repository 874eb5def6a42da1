"""Checkpoint and WAL figures of a table's open ranges on the Prometheus endpoint, labelled by
namespace and table."""

from __future__ import annotations

import re
import urllib.request

import pytest

from tablekeeper import Client
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


def scrape(server: ServerProcess) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def values(text: str, name: str) -> dict[tuple[str, str], float]:
    pattern = re.compile(rf'^{name}{{namespace="([^"]*)",table="([^"]*)"}} (\S+)$', re.M)
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in pattern.finditer(text)}


def test_range_checkpoint_metrics(server: ServerProcess) -> None:
    table_key = ("m", "t")
    with Client(server.service) as client:
        client.create_namespace("m")
        client.create_table("m", "t", ranges=2)
        table = client.table("m", "t")
        for i in range(200):
            table.put(f"p{i % 7}", f"k{i}", "v" * 100)
        # The table's name is learned as its ranges open, off the request path.
        server.wait_for(
            lambda: table_key in values(scrape(server), "tablekeeper_range_wal_bytes"),
            "the table's labels",
        )
        before = scrape(server)
        assert values(before, "tablekeeper_range_checkpoint_age_seconds") == {}
        assert values(before, "tablekeeper_range_wal_bytes")[table_key] > 0
        assert values(before, "tablekeeper_table_open_ranges")[table_key] == 2

        client.checkpoint("m", "t")
        after = scrape(server)
    assert 0 <= values(after, "tablekeeper_range_checkpoint_age_seconds")[table_key] < 60
    assert values(after, "tablekeeper_range_checkpoint_bytes_uploaded")[table_key] > 0
    assert values(after, "tablekeeper_range_checkpoint_files_uploaded")[table_key] > 0
    assert values(after, "tablekeeper_range_applied_sequence")[table_key] > 0
