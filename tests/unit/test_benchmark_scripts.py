"""The benchmark scripts run as `python benchmarks/<name>.py`, which puts `benchmarks/` first on
`sys.path`: a script named like a standard-library module would shadow it for every other
script (a `profile.py` there broke `import cProfile`, and with it pyspark, in spark_load.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

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


def _benchmark(name: str) -> Any:
    """benchmarks/<name>.py imported as a module (its `main` not run)."""
    sys.path.insert(0, str(BENCHMARKS.parent))
    try:
        return __import__(f"benchmarks.{name}", fromlist=["main"])
    finally:
        sys.path.remove(str(BENCHMARKS.parent))


def test_prometheus_text_is_read_into_samples_and_summed_by_label() -> None:
    common = _benchmark("_common")
    counter_by, counter_delta, parse_prometheus = (
        common.counter_by,
        common.counter_delta,
        common.parse_prometheus,
    )

    text = (
        "# HELP x_total what\n"
        "# TYPE x_total counter\n"
        'x_total{method="Range",code="0"} 3.0\n'
        'x_total{method="Range",code="1"} 2\n'
        'x_total{method="Txn",note="a \\"quoted\\" , comma"} 1e3 1795840010000\n'
        "plain 7\n"
        "\n"
    )
    samples = parse_prometheus(text)
    assert samples[2] == ("x_total", {"method": "Txn", "note": 'a "quoted" , comma'}, 1000.0)
    assert counter_by(samples, "x_total", "method") == {"Range": 5.0, "Txn": 1000.0}
    assert counter_by(samples, "x_total", "method", code="1") == {"Range": 2.0}
    assert counter_by(samples, "plain") == {"plain": 7.0}
    assert counter_by(samples, "missing", "method") == {}
    with pytest.raises(ValueError, match="line 1"):
        parse_prometheus("not a sample line at all\n")
    # Kinds that did not move are left out; a kind new on one side counts from 0.
    assert counter_delta({"get": 5, "put": 2}, {"get": 9, "put": 2, "del": 1}) == {
        "del": 1,
        "get": 4,
    }


def test_each_store_counts_its_own_requests_by_kind() -> None:
    common = _benchmark("_common")
    parse_mntr, parse_prometheus = common.parse_mntr, common.parse_prometheus
    pm = _benchmark("pulsar_metadata")
    mntr = parse_mntr(
        "zk_version\t3.8.0\nzk_cnt_readlatency\t155\nzk_cnt_updatelatency\t116\n"
        "zk_packets_received\t272\nzk_server_state\tstandalone\n"
    )
    assert pm.zk_counters(mntr) == {"reads": 155, "writes": 116, "packets": 272}
    broker = parse_prometheus(
        'pulsar_metadata_store_ops_latency_ms_count{name="metadata-store",type="get",'
        'status="success"} 56.0\n'
        'pulsar_metadata_store_ops_latency_ms_count{name="other",type="get",status="success"} 4\n'
        'pulsar_metadata_store_ops_latency_ms_count{name="metadata-store",type="put",'
        'status="fail"} 1.0\n'
        'pulsar_metadata_store_ops_latency_ms_sum{name="metadata-store",type="get",'
        'status="success"} 574.0\n'
    )
    assert pm.broker_counters(broker) == {"get": 60.0, "put-fail": 1.0}
    etcd = parse_prometheus(
        'grpc_server_msg_received_total{grpc_method="Range",grpc_service="etcdserverpb.KV",'
        'grpc_type="unary"} 12\n'
        'grpc_server_handled_total{grpc_method="Range",grpc_code="OK"} 12\n'
    )
    assert pm.etcd_counters(etcd) == {"Range": 12.0}
    oxia = parse_prometheus(
        'grpc_server_msg_received_total{grpc_method="WriteStream",grpc_type="bidi_stream"} 9\n'
        'oxia_server_db_puts_count_total{shard="0"} 3\n'
        'oxia_server_db_puts_count_total{shard="1"} 4\n'
        'oxia_server_db_list_latency_milliseconds_count{shard="0"} 5\n'
    )
    assert pm.oxia_counters(oxia) == {"WriteStream": 9.0, "db:puts": 7.0}
    tk = parse_prometheus(
        'tablekeeper_requests_total{method="Put",code="0"} 2\n'
        "tablekeeper_wal_append_records_sum 40\n"
        "tablekeeper_wal_append_records_count 8\n"
    )
    assert pm.tk_counters(tk) == {"bk:Put": 2.0, "wal-commands": 40.0, "wal-appends": 8.0}
    assert pm.tk_counters([]) == {}


def test_pulsar_metadata_compares_each_front_end_with_its_protocols_server() -> None:
    pm = _benchmark("pulsar_metadata")
    assert pm.ratio_pairs(["zk", "oxia", "tk-oxia", "etcd", "tk-etcd"]) == [
        ("oxia", "zk"),
        ("tk-oxia", "zk"),
        ("etcd", "zk"),
        ("tk-etcd", "zk"),
        ("tk-oxia", "oxia"),
        ("tk-etcd", "etcd"),
    ]
    assert pm.ratio_pairs(["tk-oxia", "oxia"]) == [("oxia", "tk-oxia"), ("tk-oxia", "oxia")]
    assert pm.ratio_pairs(["zk", "tk-etcd"]) == [("tk-etcd", "zk")]

    def phase(store: str, ops_per_s: float, store_cpu_s: float | None) -> Any:
        return pm.Phase(store, 16, "create-topic", 100, 0, 1.0, ops_per_s, 10.0, 20.0, 30.0,
                        12.0, store_cpu_s, 2.0)  # fmt: skip

    runs = [
        pm.Run("oxia", "", 0.0, phases=[phase("oxia", 50.0, 0.4)]),
        pm.Run("tk-oxia", "", 0.0, phases=[phase("tk-oxia", 25.0, None)]),
    ]
    (row,) = [r for r in pm.ratios(runs) if r["store"] == "tk-oxia"]
    assert row["anchor"] == "oxia" and row["ops_per_s"] == 0.5 and row["p50"] == 1.0
    assert row["store_cpu_per_op"] is None and row["pulsar_cpu_per_op"] == 1.0
    assert pm.per_call({"get": 12.0, "put": 30.0, "del": 3.0}, 3, limit=2) == (
        "put=10.0 get=4.0 (+1 more)"
    )
    assert pm.per_call(None, 3) == "-" and pm.per_call({}, 3) == "none"
    assert pm.has_subscription(b'{"subscriptions": {"sub": {}}}') is None
    assert "no 'sub'" in pm.has_subscription(b'{"subscriptions": {}}')
    assert "not a JSON object" in pm.has_subscription(b"[]")


def test_pulsar_metadata_refuses_unknown_stores_and_phases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pm = _benchmark("pulsar_metadata")
    args = pm.parse_args(["--topics", "50", "--stores", "zk,oxia,tk-oxia"])
    assert args.partitioned == 5 and args.skip == [] and args.stores == ["zk", "oxia", "tk-oxia"]
    for bad, message in (
        (["--stores", "zk,mysql"], "unknown ['mysql']"),
        (["--stores", "zk,zk"], "named twice"),
        (["--skip", "create"], "--skip: unknown ['create']"),
        (["--profile-native"], "needs --profile"),
    ):
        with pytest.raises(SystemExit):
            pm.parse_args(bad)
        assert message in capsys.readouterr().err


def test_metadata_capacity_reads_memory_and_decides_when_a_load_ends() -> None:
    mc = _benchmark("metadata_capacity")
    status = "Name:\tjava\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t9\n"
    assert mc.parse_status_memory(status) == (1024 * 1024, 2048 * 1024)
    assert mc.parse_status_memory("Name:\tzombie\n") is None
    jstat = (
        " S0C    S1C    S0U    S1U      EC       EU        OC         OU  \n"
        " 0.0   1024.0  0.0   512.0   8192.0   4096.0   16384.0    2048.0\n"
    )
    assert mc.jstat_heap_used(jstat) == (512 + 4096 + 2048) * 1024
    assert mc.jstat_heap_used("") is None
    # Pulsar's layout: 3 keys a topic, parents once each (checked against the loader's own count
    # in a run: 20,000 topics gave 60,010 keys, 20,003 gave 60,022).
    assert mc.total_keys(20_000) == 60_010 and mc.total_keys(20_003) == 60_022

    def ends(**changes: Any) -> Any:
        state = {"written": 10, "target": 100, "failed": 0, "alive": True, "recent_rate": 50.0,
                 "peak_rate": 100.0, "stall_fraction": 0.05, "elapsed": 5.0,
                 "max_seconds": 600.0}  # fmt: skip
        state.update(changes)
        return mc.outcome(*state.values())

    assert ends() is None
    assert ends(recent_rate=None) is None  # no full window yet
    assert ends(written=100) == "done"
    assert ends(failed=1) == "failed"
    assert ends(alive=False) == "exited"
    assert ends(recent_rate=5.0) == "stalled"  # a crawl at 5 % of the best
    assert ends(recent_rate=0.0) == "stalled"
    assert ends(elapsed=600.0) == "time limit"
    history = [(0.0, 0), (10.0, 1000), (20.0, 3000), (30.0, 3100)]
    assert mc.window_rate(history, 10.0) == 10.0
    assert mc.window_rate(history, 20.0) == (3100 - 1000) / 20.0
    assert mc.window_rate(history, 40.0) is None
