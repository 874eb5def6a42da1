"""/metrics labels the open ranges' figures by namespace and table: at most
`--metrics-max-tables` (namespace, table) pairs at once, the rest folded into `<other>`; a table
without open ranges (deleted, evicted, moved) loses its series and its label; names are learned
off the request path when a table range opens."""

from __future__ import annotations

import asyncio
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tablekeeper_server.metrics import (
    META_TABLE,
    OTHER,
    ROOT_TABLE,
    SYSTEM_NAMESPACE,
    UNKNOWN,
    RangeStats,
    ServerMetrics,
    TableKey,
    TableLabels,
    TableNames,
)

pytestmark = pytest.mark.unit

ROOT = (SYSTEM_NAMESPACE, ROOT_TABLE)
META = (SYSTEM_NAMESPACE, META_TABLE)
FOLDED = (OTHER, OTHER)


def test_tables_under_the_bound_keep_their_names() -> None:
    labels = TableLabels(3)
    tables = [("a", "t1"), ("a", "t2"), ("b", "t1")]
    assert labels.assign(tables) == {t: t for t in tables}


def test_tables_over_the_bound_fold_into_other_in_name_order() -> None:
    labels = TableLabels(2)
    tables = [("b", "x"), ("a", "y"), ("a", "x"), ROOT, META, (UNKNOWN, UNKNOWN)]
    assigned = labels.assign(tables)
    assert assigned[("a", "x")] == ("a", "x") and assigned[("a", "y")] == ("a", "y")
    assert assigned[("b", "x")] == FOLDED
    # The root and meta ranges and the unknown ones are not counted against the bound.
    assert assigned[ROOT] == ROOT and assigned[META] == META
    assert assigned[(UNKNOWN, UNKNOWN)] == (UNKNOWN, UNKNOWN)


def test_a_labelled_table_keeps_its_label_while_it_has_open_ranges() -> None:
    labels = TableLabels(1)
    assert labels.assign([("m", "t")]) == {("m", "t"): ("m", "t")}
    # A table that sorts first arrives: the one labelled already keeps the label.
    assert labels.assign([("m", "t"), ("a", "a")]) == {
        ("m", "t"): ("m", "t"),
        ("a", "a"): FOLDED,
    }


def test_a_table_without_open_ranges_gives_its_label_to_a_folded_one() -> None:
    labels = TableLabels(1)
    labels.assign([("m", "t"), ("z", "z")])
    assert labels.assign([("z", "z")]) == {("z", "z"): ("z", "z")}  # ("m", "t") was deleted
    assert labels.assign([("m", "t"), ("z", "z")])[("m", "t")] == FOLDED  # back: over the bound


def test_zero_folds_every_table() -> None:
    assert TableLabels(0).assign([("a", "b"), ROOT]) == {("a", "b"): FOLDED, ROOT: ROOT}


def _range(
    table: TableKey, wal: int, applied: int, age: float | None = None, uploaded: int = 0
) -> RangeStats:
    return RangeStats(
        namespace=table[0],
        table=table[1],
        wal_bytes=wal,
        applied_sequence=applied,
        checkpoint_age_s=age,
        checkpoint_duration_s=0.0 if age is None else age / 10,
        checkpoint_bytes_uploaded=uploaded,
        checkpoint_files_uploaded=1 if age is not None else 0,
        checkpoint_files_reused=0,
    )


def _samples(registry: CollectorRegistry, name: str) -> dict[TableKey, float]:
    text = generate_latest(registry).decode()
    pattern = rf'^{name}{{namespace="([^"]*)",table="([^"]*)"}} (\S+)$'
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(pattern, text, re.M)}


def test_the_collector_sums_a_tables_ranges_and_drops_tables_without_ranges() -> None:
    registry = CollectorRegistry()
    ranges = [
        _range(ROOT, 10, 5),
        _range(("a", "t"), 100, 7, age=30.0, uploaded=1000),
        _range(("a", "t"), 50, 3, age=90.0, uploaded=10),
        _range(("a", "u"), 1, 1),
        _range(("b", "v"), 2, 2),
        _range(("c", "w"), 4, 4),
    ]
    ServerMetrics(registry).register_range_stats(lambda: list(ranges), TableLabels(2))

    assert _samples(registry, "tablekeeper_table_open_ranges") == {
        ROOT: 1,
        ("a", "t"): 2,
        ("a", "u"): 1,
        FOLDED: 2,
    }
    assert _samples(registry, "tablekeeper_range_wal_bytes") == {
        ROOT: 10,
        ("a", "t"): 150,
        ("a", "u"): 1,
        FOLDED: 6,
    }
    assert _samples(registry, "tablekeeper_range_applied_sequence")[("a", "t")] == 10
    # Checkpoint figures: only for tables with a checkpointed range; the oldest age.
    assert _samples(registry, "tablekeeper_range_checkpoint_age_seconds") == {("a", "t"): 90}
    assert _samples(registry, "tablekeeper_range_checkpoint_bytes_uploaded") == {("a", "t"): 1010}
    text = generate_latest(registry).decode()
    assert "tablekeeper_metrics_folded_tables 2.0" in text
    assert 'range="' not in text

    # Table a/t is deleted (its ranges are dropped): its series go, and b/v gets a label.
    ranges[:] = [r for r in ranges if r.table != "t"]
    wal = _samples(registry, "tablekeeper_range_wal_bytes")
    assert ("a", "t") not in wal
    assert wal == {ROOT: 10, ("a", "u"): 1, ("b", "v"): 2, FOLDED: 4}
    assert _samples(registry, "tablekeeper_range_checkpoint_age_seconds") == {}


async def test_names_are_learned_once_in_the_background() -> None:
    calls: list[int] = []
    release = asyncio.Event()

    async def resolve(stream_id: int) -> TableKey | None:
        calls.append(stream_id)
        await release.wait()
        return ("ns", f"t{stream_id}")

    names = TableNames(resolve, set)
    names.opened(1024)
    names.opened(1024)  # a second range of the same table while the first is learned
    assert names.get(1024) is None  # the opening request never waits for the name
    release.set()
    await names.learned()
    assert names.get(1024) == ("ns", "t1024") and calls == [1024]
    names.opened(1024)  # known: nothing to learn
    await names.learned()
    assert calls == [1024]
    names.forget(1024)
    assert names.get(1024) is None


async def test_a_gone_table_is_not_learned_and_failures_are_retried_then_given_up() -> None:
    attempts: dict[int, int] = {}

    async def resolve(stream_id: int) -> TableKey | None:
        attempts[stream_id] = attempts.get(stream_id, 0) + 1
        if stream_id == 1:
            return None  # deleted meanwhile
        if stream_id == 2 and attempts[2] < 3:
            raise ConnectionError("root range's owner unreachable")
        if stream_id == 3:
            raise ConnectionError("never reachable")
        return ("ns", "t")

    names = TableNames(resolve, set)
    names.RETRY_DELAY_S = 0.0
    for stream_id in (1, 2, 3):
        names.opened(stream_id)
    await names.learned()
    assert names.get(1) is None and attempts[1] == 1
    assert names.get(2) == ("ns", "t") and attempts[2] == 3
    assert names.get(3) is None and attempts[3] == TableNames.RETRIES + 1


async def test_names_beyond_the_bound_keep_only_tables_with_open_ranges() -> None:
    async def resolve(stream_id: int) -> TableKey | None:
        return ("ns", str(stream_id))

    open_now = {2}
    names = TableNames(resolve, lambda: set(open_now), entries_max=3)
    for stream_id in (1, 2, 3):
        names.opened(stream_id)
        await names.learned()
    names.opened(4)
    await names.learned()
    assert [names.get(s) for s in (1, 2, 3, 4)] == [None, ("ns", "2"), None, ("ns", "4")]


@pytest.mark.parametrize("seconds", [0.0, 0.0001, 0.001, 0.0042, 0.5, 3.0, 1e6])
def test_requests_answered_together_expose_what_single_observations_do(seconds: float) -> None:
    """`observe_requests(..., count)` (a group of replies that took the same time) leaves
    /metrics exactly as `count` calls of `observe_request` would: counter, sum, every bucket
    (on a bound or between two, and past the last)."""
    one_by_one, together = ServerMetrics(CollectorRegistry()), ServerMetrics(CollectorRegistry())
    for _ in range(7):
        one_by_one.observe_request("ZooKeeper/setData", 0, seconds)
    one_by_one.observe_request("ZooKeeper/setData", -101, seconds)
    together.observe_requests("ZooKeeper/setData", 0, seconds, 7)
    together.observe_requests("ZooKeeper/setData", -101, seconds, 1)

    def requests(metrics: ServerMetrics) -> tuple[list[str], float]:
        text = generate_latest(metrics.registry).decode()
        lines = [
            line
            for line in text.splitlines()
            if line.startswith(("tablekeeper_requests_total", "tablekeeper_request_seconds_"))
            and "_created" not in line
        ]
        (total,) = [line for line in lines if line.startswith("tablekeeper_request_seconds_sum")]
        lines.remove(total)
        return lines, float(total.rsplit(" ", 1)[1])

    expected, expected_sum = requests(one_by_one)
    assert 'tablekeeper_request_seconds_bucket{le="+Inf",method="ZooKeeper/setData"} 8.0' in (
        expected
    )
    lines, total = requests(together)
    assert lines == expected
    assert total == pytest.approx(expected_sum, rel=1e-12, abs=0)
    assert total == pytest.approx(8 * seconds)
