"""The Grafana dashboard and the Prometheus alert rules (deploy/monitoring) against a real server.

* Every query of the dashboard and of the rules names only series real servers export: a
  standalone server with the etcd and Oxia ports is driven through each protocol (so the
  per-protocol request series, sessions and checkpoints exist) and a server of two workers
  forwards calls; their /metrics are scraped, and every metric name and label a query selects
  is looked up there (Prometheus's own `up` and the `instance`/`job` labels it adds are the only
  names allowed besides).
* The rules pass Debian's `promtool check rules` (and the example prometheus.yml `promtool
  check config`), and their unit tests
  (`tablekeeper-alerts.test.yml`) pass `promtool test rules`: the alerts fire on a troubled
  server's series and not on a healthy one's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tablekeeper import Client
from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tests.support.oxia import shard_leaders
from tests.support.server import REPO, ServerProcess, free_port

pytestmark = pytest.mark.integration

MONITORING = REPO / "deploy" / "monitoring"
DASHBOARD = MONITORING / "tablekeeper-dashboard.json"
RULES = MONITORING / "tablekeeper-alerts.yml"
RULE_TESTS = MONITORING / "tablekeeper-alerts.test.yml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself for each target."""
ADDED_LABELS = {"instance", "job"}
"""Labels Prometheus adds to every scraped series."""
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    found = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    for variable in doc["templating"]["list"]:
        if variable.get("type") == "query":
            found.append(variable["definition"])
    return found


def rule_queries() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression (or Grafana's label_values()) selects."""
    text = _without_strings(expr)
    text = re.sub(r"\$\w+", "", text)  # Grafana's variables ($__rate_interval)
    text = re.sub(r"\{[^}]*\}", "", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    text = re.sub(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*\w+\s*\)", r"\1", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(?![\w:])(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def selected_labels(expr: str) -> list[tuple[str, str]]:
    """(metric, label) of every matcher `metric{label=...}` in the expression."""
    text = _without_strings(expr)
    found = []
    for match in re.finditer(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", text):
        for label in re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", match.group(2)):
            found.append((match.group(1), label))
    return found


def grouping_labels(expr: str) -> set[str]:
    text = _without_strings(expr)
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", text):
        labels.update(name.strip() for name in group.split(",") if name.strip())
    return labels


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The /metrics text of two servers driven through every protocol: a standalone one with
    the etcd and Oxia ports (each front-end's calls are counted where they are served), and one
    of two workers whose worker 0 forwards calls for the other's containers (the forwarded
    series; a `--workers` server's metrics are worker 0's)."""
    base = tmp_path_factory.mktemp("monitoring")
    etcd_port, oxia_port = free_port(), free_port()
    standalone = ServerProcess(
        base / "standalone",
        extra_args=["--etcd-port", str(etcd_port), "--oxia-port", str(oxia_port)],
    )
    workers = ServerProcess(base / "workers", extra_args=["--workers", "2"])
    try:
        standalone.launch()
        workers.launch()
        standalone.wait_serving(180)
        workers.wait_serving(180)
        _drive(standalone, etcd_port, oxia_port)
        _forward(workers)
        yield standalone.metrics(60) + workers.metrics(60)
    finally:
        for server in (standalone, workers):
            if server.running:
                server.stop()


@pytest.fixture(scope="module")
def scraped(scrape: str) -> dict[str, set[str]]:
    """Series name -> its label names."""
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


@pytest.fixture(scope="module")
def scraped_methods(scrape: str) -> set[str]:
    """The `method` labels of the request counter."""
    return {
        sample.labels["method"]
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
        if sample.name == "tablekeeper_requests_total"
    }


def _drive(server: ServerProcess, etcd_port: int, oxia_port: int) -> None:
    """Calls of every protocol, a session, a checkpoint."""
    with Client(server.service) as client:
        client.create_namespace("mon")
        client.create_table("mon", "t", ranges=4)
        table = client.table("mon", "t")
        for i in range(40):
            table.put(f"p{i}", "k", f"v{i}")
            table.get(f"p{i}", "k")
        with table.session("p1", 30):
            client.checkpoint()
    with grpc.insecure_channel(f"127.0.0.1:{etcd_port}") as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        kv.Put(rpc_pb2.PutRequest(key=b"/mon", value=b"1"), timeout=60)
        kv.Range(rpc_pb2.RangeRequest(key=b"/mon"), timeout=60)
    leaders = shard_leaders(f"127.0.0.1:{oxia_port}", "default")
    shard, leader = sorted(leaders.items())[0]
    with grpc.insecure_channel(leader) as channel:
        oxia = client_pb2_grpc.OxiaClientStub(channel)
        put = client_pb2.PutRequest(key="/mon", value=b"1")
        oxia.Write(client_pb2.WriteRequest(shard=shard, puts=[put]), timeout=60)


def _forward(server: ServerProcess) -> None:
    """Puts through worker 0 only: those for the other worker's containers are forwarded."""
    with Client(server.service) as client:
        client.create_namespace("mon")
        client.create_table("mon", "t", ranges=4)
    with Client(server.service, direct_routing=False) as client:
        table = client.table("mon", "t")
        for i in range(20):
            table.put(f"p{i}", "k", f"v{i}")


def test_dashboard_and_rules_name_only_series_the_server_exports(
    scraped: dict[str, set[str]],
) -> None:
    queries = dashboard_queries() + rule_queries()
    assert len(queries) > 40, "the scan found the queries"
    problems = []
    for expr in queries:
        names = metric_names(expr)
        if not names:
            problems.append(f"no series named in {expr!r}")
        unknown = sorted(names - set(scraped) - PROMETHEUS_OWN)
        if unknown:
            problems.append(f"{unknown} not exported, in {expr!r}")
        for metric, label in selected_labels(expr):
            if metric in scraped and label not in scraped[metric] | ADDED_LABELS:
                problems.append(f"{metric} has no label {label!r}, in {expr!r}")
        known = set().union(*(scraped.get(n, set()) for n in names)) | ADDED_LABELS
        missing = sorted(grouping_labels(expr) - known)
        if missing:
            problems.append(f"grouping by {missing}, which no series of {expr!r} has")
    assert problems == []


def test_each_protocols_requests_are_told_apart_as_the_dashboard_does(
    scraped_methods: set[str],
) -> None:
    """The per-protocol panels select methods by name pattern: each pattern matches methods the
    server really reported for the calls made (etcd's and Oxia's full gRPC names, BookKeeper's
    short ones), and no method matches two."""
    doc = json.loads(DASHBOARD.read_text())
    rates = next(p for p in doc["panels"] if p["title"] == "Requests per second")
    by_protocol = {}
    for target in rates["targets"]:
        matcher = re.search(r'method(=~|!~)"((?:[^"\\]|\\.)*)"', target["expr"])
        assert matcher is not None, target["expr"]
        pattern = re.compile(matcher.group(2).encode().decode("unicode_escape"))
        matches = {m for m in scraped_methods if pattern.fullmatch(m)}
        by_protocol[target["legendFormat"]] = (
            matches if matcher.group(1) == "=~" else scraped_methods - matches
        )
    assert "etcdserverpb.KV/Put" in by_protocol["etcd"]
    assert "io.streamnative.oxia.proto.OxiaClient/Write" in by_protocol["Oxia"]
    assert "Put" in by_protocol["BookKeeper / TableKeeper"]
    counted = [m for methods in by_protocol.values() for m in methods]
    assert sorted(counted) == sorted(scraped_methods), "a method in two protocols, or none"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: make promtool")
def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rule_queries())} rules found" in checked.stdout
    config = subprocess.run(
        [PROMTOOL, "check", "config", "prometheus.yml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=MONITORING,
    )
    assert config.returncode == 0, config.stdout + config.stderr
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=MONITORING,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_name_scan_finds_what_a_query_selects() -> None:
    """The scan itself: names, matchers and groupings of a query like the dashboard's."""
    expr = (
        "histogram_quantile(0.99, sum by (le, generation) (rate(tablekeeper_gc_pause_seconds_"
        'bucket{instance=~"$instance",method!~"a\\\\..*"}[$__rate_interval]))) / on (instance) '
        "up and tablekeeper_open_files > 0.9"
    )
    assert metric_names(expr) == {
        "tablekeeper_gc_pause_seconds_bucket",
        "up",
        "tablekeeper_open_files",
    }
    assert selected_labels(expr) == [
        ("tablekeeper_gc_pause_seconds_bucket", "instance"),
        ("tablekeeper_gc_pause_seconds_bucket", "method"),
    ]
    assert grouping_labels(expr) == {"le", "generation"}
    assert metric_names("label_values(tablekeeper_build_info, instance)") == {
        "tablekeeper_build_info"
    }
