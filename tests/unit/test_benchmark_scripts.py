"""The benchmark scripts run as `python benchmarks/<name>.py`, which puts `benchmarks/` first on
`sys.path`: a script named like a standard-library module would shadow it for every other
script (a `profile.py` there broke `import cProfile`, and with it pyspark, in spark_load.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_no_benchmark_script_shadows_a_standard_library_module() -> None:
    names = {path.stem for path in BENCHMARKS.glob("*.py")}
    assert names, BENCHMARKS
    shadowing = sorted(names & set(sys.stdlib_module_names))
    assert shadowing == [], f"rename benchmarks/{shadowing[0]}.py: it shadows the stdlib module"


def test_the_longest_stall_is_the_longest_time_without_a_completed_call() -> None:
    sys.path.insert(0, str(BENCHMARKS.parent))
    try:
        from benchmarks._common import longest_stall_ms, rfc3339_s
    finally:
        sys.path.remove(str(BENCHMARKS.parent))

    assert rfc3339_s("2026-11-27T16:30:19.488858121Z") == pytest.approx(1795797019.488858121)
    assert rfc3339_s("2026-11-27T17:30:19+01:00") == rfc3339_s("2026-11-27T16:30:19Z")
    with pytest.raises(ValueError, match="RFC 3339"):
        rfc3339_s("yesterday")

    def call(start_ms: float, latency_ms: float) -> dict[str, object]:
        whole, fraction = divmod(start_ms, 1000.0)
        stamp = f"2026-11-27T16:30:{int(whole):02d}.{int(fraction * 1e6):09d}Z"
        return {"timestamp": stamp, "latency": int(latency_ms * 1e6)}

    # Two calls in flight at a time; nothing completes from 12 ms (4 + 8) to 52 ms (5 + 47).
    details = [call(0, 2), call(1, 2), call(3, 2), call(4, 8), call(5, 47), call(12, 40)]
    assert longest_stall_ms(details) == pytest.approx(40.0, abs=0.01)
    assert longest_stall_ms([call(0, 7.5)]) == pytest.approx(7.5, abs=0.01)  # its latency
    assert longest_stall_ms([]) != longest_stall_ms([])  # NaN


def test_thread_times_read_the_schedulers_run_and_wait_times() -> None:
    sys.path.insert(0, str(BENCHMARKS.parent))
    try:
        from benchmarks._common import parse_schedstat, thread_times
    finally:
        sys.path.remove(str(BENCHMARKS.parent))

    assert parse_schedstat("2500000000 750000000 1234\n") == (2.5, 0.75)
    with pytest.raises(ValueError, match="schedstat"):
        parse_schedstat("1 2")
    mine = thread_times(os.getpid())
    name, ran, waited = mine[str(os.getpid())]  # this process's main thread
    assert name and ran > 0 and waited >= 0


def test_workers_refuses_calls_in_flight_that_do_not_split_evenly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One call in flight over two workers would run one per worker: two against one.
    sys.path.insert(0, str(BENCHMARKS.parent))
    try:
        from benchmarks.workers import main
    finally:
        sys.path.remove(str(BENCHMARKS.parent))

    with pytest.raises(SystemExit) as exit_:
        main(["--workers", "1,2", "--concurrency", "1,16,3", "--ghz", sys.executable])
    assert exit_.value.code == 2
    assert "--concurrency 1,3: each level must divide by every --workers count" in (
        capsys.readouterr().err
    )
