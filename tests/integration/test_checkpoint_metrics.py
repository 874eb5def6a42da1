"""Checkpoint and WAL figures per range on the Prometheus endpoint."""

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


def values(text: str, name: str) -> dict[str, float]:
    pattern = re.compile(rf'^{name}{{range="([^"]+)"}} (\S+)$', re.MULTILINE)
    return {match.group(1): float(match.group(2)) for match in pattern.finditer(text)}


def test_range_checkpoint_metrics(server: ServerProcess) -> None:
    with Client(server.service) as client:
        client.create_namespace("m")
        info = client.create_table("m", "t", ranges=2)
        table = client.table("m", "t")
        for i in range(200):
            table.put(f"p{i % 7}", f"k{i}", "v" * 100)
        before = scrape(server)
        assert values(before, "tablekeeper_range_checkpoint_age_seconds") == {}
        wal = values(before, "tablekeeper_range_wal_bytes")
        table_ranges = [r for r in wal if f"-{info.table_id:012d}-" in r]
        assert len(table_ranges) == 2 and all(wal[r] > 0 for r in table_ranges)

        client.checkpoint("m", "t")
        after = scrape(server)
    ages = values(after, "tablekeeper_range_checkpoint_age_seconds")
    uploaded = values(after, "tablekeeper_range_checkpoint_bytes_uploaded")
    applied = values(after, "tablekeeper_range_applied_sequence")
    for name in table_ranges:
        assert 0 <= ages[name] < 60
        assert uploaded[name] > 0
        assert applied[name] > 0
