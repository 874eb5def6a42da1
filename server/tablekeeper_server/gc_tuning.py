"""The server process's cyclic garbage collector, tuned for a server's allocation pattern.

CPython's defaults (`gc.get_threshold()` == (700, 10, 10)) collect the youngest generation
every 700 allocations of container objects. A put allocates dozens (the request, its command,
futures, the response, a change event), so under load the young collections come every few
milliseconds and catch every call that is still in flight: its objects survive two
collections and reach the oldest generation. Objects that live long enough to be kept there
anyway (each range's ring of recent change events for watchers, 4,096 events with their
records) join them. A full collection runs whenever what reached the oldest generation since
the last one exceeds a quarter of what lives there, which under that churn is several times a
second, and it walks every tracked object of the process while the event loop stands still.

Measured on the 2-core development machine (ghz, unary puts, 64 in flight, Envoy runtime):
with the defaults a full collection every ~0.28 s, each pausing the loop 15 ms at first and
45-65 ms once the rings were full (~100,000 tracked objects); every call in flight waited for
it, which made the p99 latency 51-67 ms against a p50 of 7 ms. With the youngest generation
collected every 50,000 allocations, the calls in flight are mostly answered and freed before a
collection sees them: no full collection in an 8 s run, p99 13-16 ms, 8.0-9.7k puts/s instead
of 6.6-7.4k (benchmarks/RESULTS.md, "The collector's pauses"). `tablekeeper_gc_pause_seconds`
shows each collection's pause.

Reference cycles are still collected: young cycles at each young collection (every 50,000
allocations, a few MiB of objects), older ones at the rarer full collections.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_ALLOCATIONS: Final = 50_000
"""Container allocations (net of frees) between two collections of the youngest generation."""
MIDDLE_COLLECTIONS: Final = 10
"""Young collections between two collections of the middle generation (CPython's default)."""
OLD_COLLECTIONS: Final = 10
"""Middle collections before a full one is considered (CPython's default; CPython then runs it
only when a quarter of the oldest generation is new since the last full collection)."""


def tune_garbage_collector() -> None:
    """Set the process's collector thresholds for serving (see the module). Called once by the
    server's entry points, before the server starts; an embedding host keeps its own."""
    gc.set_threshold(YOUNG_ALLOCATIONS, MIDDLE_COLLECTIONS, OLD_COLLECTIONS)
