"""The server's collector thresholds keep full collections rare under a serving load, and its
metrics say how long each collection held the process."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from tablekeeper_server import gc_tuning
from tablekeeper_server.metrics import ServerMetrics

pytestmark = pytest.mark.unit


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*saved)


@dataclass
class _Record:
    value: bytes


@dataclass
class _Event:
    key: bytes
    record: _Record
    prev: _Record | None


def _full_collections_while_serving(calls: int) -> int:
    """Full collections during `calls` simulated puts: 64 calls in flight, each a dozen
    container objects in a reference cycle (as a call's task, futures and callbacks are) that
    only the collector frees once the call is answered, and a ring of the last 4,096 change
    events (with their records) that outlives many calls, as a range's watch ring does."""
    full = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal full
        if phase == "start" and info["generation"] == 2:
            full += 1

    in_flight: deque[list[object]] = deque()
    ring: deque[_Event] = deque(maxlen=4096)
    # The test process's own objects (pytest's, every module's) stay out of the count, so the
    # oldest generation holds what the simulated server keeps, as a server's mostly does.
    gc.collect()
    gc.freeze()
    gc.collect()  # and the collector's count of old objects starts from none
    gc.callbacks.append(count)
    try:
        for i in range(calls):
            key = b"key-%d" % i
            call: list[object] = [{"call": i, "part": part} for part in range(12)]
            call.append(call)  # a cycle: freed by the collector, not by reference counts
            in_flight.append(call)
            if len(in_flight) > 64:
                in_flight.popleft()  # answered
            ring.append(_Event(key, _Record(b"v"), _Record(b"p")))
    finally:
        gc.callbacks.remove(count)
        gc.unfreeze()
    return full


def test_tuning_sets_the_thresholds(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    gc_tuning.tune_garbage_collector()
    assert gc.get_threshold() == (
        gc_tuning.YOUNG_ALLOCATIONS,
        gc_tuning.MIDDLE_COLLECTIONS,
        gc_tuning.OLD_COLLECTIONS,
    )


def test_calls_in_flight_no_longer_drive_full_collections(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    with_defaults = _full_collections_while_serving(200_000)
    gc_tuning.tune_garbage_collector()
    tuned = _full_collections_while_serving(200_000)
    assert with_defaults >= 20, "the simulation no longer shows the defaults' churn"
    assert tuned * 10 <= with_defaults, (with_defaults, tuned)


def test_metrics_time_each_collection_until_closed() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    metrics.register_process()

    def full_collections() -> float:
        value = registry.get_sample_value("tablekeeper_gc_pause_seconds_count", {"generation": "2"})
        assert value is not None
        return value

    try:
        before = full_collections()  # (the process may have collected on its own meanwhile)
        gc.collect()
        gc.collect()
        assert full_collections() >= before + 2
        pause = registry.get_sample_value("tablekeeper_gc_pause_seconds_sum", {"generation": "2"})
        assert pause is not None and pause > 0
        assert registry.get_sample_value("python_gc_collections_total", {"generation": "2"})
    finally:
        metrics.close()
    timed = full_collections()
    gc.collect()
    assert full_collections() == timed
    metrics.close()  # again: nothing to stop
