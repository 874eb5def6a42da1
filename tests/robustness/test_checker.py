"""The checker itself: its models' Go tests, and the built checker on histories written in the
workloads' format -- one that some order explains, and ones no order explains (a lost
acknowledged write, a stale read), which it must refuse with a visualisation; and real
ZooKeeper's own history, which its ZooKeeper model must accept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.robustness.harness import ROBUST, Tools, check_histories
from tests.robustness.history import HistoryWriter
from tests.support.server import REPO
from tests.support.zookeeper import ZooKeeperProcess

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")


def test_the_models_go_tests_pass() -> None:
    done = subprocess.run(
        ["go", "test", "./checker"],
        cwd=ROBUST,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _op(session: str, op: str, call: int, ret: int, **fields: Any) -> dict[str, Any]:
    return {"proto": "etcd", "session": session, "key": "k", "model": "register", "op": op,
            "call": call, "ret": ret, "status": "ok", **fields}  # fmt: skip


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    with HistoryWriter(path) as history:
        for record in records:
            history.add(record)
    return path


def test_a_linearizable_history_passes(robustness_tools: Tools, tmp_path: Path) -> None:
    history = _write(tmp_path / "ok.jsonl", [
        _op("a", "put", 0, 10, value="x", modrev=5),
        _op("b", "get", 5, 20, found=True, rvalue="x", version=1, modrev=5),
        _op("a", "cas", 30, 40, value="y", expect=1, modrev=6),
        _op("b", "put", 35, 1000, value="z", status="unknown", error="deadline"),
        _op("a", "get", 50, 60, found=True, rvalue="y", version=2, modrev=6),
    ])  # fmt: skip
    verdict, output, visualizations = check_histories(robustness_tools, [history], tmp_path)
    assert verdict == "ok", output
    assert "proto=etcd keys=1 ops=5 unknown=1 illegal=0" in output
    assert visualizations == []


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(
            [_op("a", "put", 0, 10, value="x", modrev=5), _op("b", "get", 20, 30, found=False)],
            id="lost-write",
        ),
        pytest.param(
            [
                _op("a", "put", 0, 10, value="x", modrev=5),
                _op("a", "put", 20, 30, value="y", modrev=6),
                _op("b", "get", 40, 50, found=True, rvalue="x", version=1, modrev=5),
            ],
            id="stale-read",
        ),
    ],
)
def test_a_history_no_order_explains_is_refused(
    robustness_tools: Tools, tmp_path: Path, records: list[dict[str, Any]]
) -> None:
    history = _write(tmp_path / "bad.jsonl", records)
    verdict, output, visualizations = check_histories(robustness_tools, [history], tmp_path / "v")
    assert verdict == "illegal", output
    assert "ILLEGAL proto=etcd model=register key=k" in output
    assert len(visualizations) == 1 and Path(visualizations[0]).stat().st_size > 0


def test_a_malformed_history_is_an_error_not_a_pass(
    robustness_tools: Tools, tmp_path: Path
) -> None:
    history = _write(tmp_path / "bad.jsonl", [_op("a", "put", 10, 5, value="x")])  # ret < call
    verdict, output, _ = check_histories(robustness_tools, [history], tmp_path)
    assert verdict == "error" and "returned" in output


def test_zookeepers_own_histories_pass_the_zookeeper_model(
    robustness_tools: Tools, tmp_path: Path
) -> None:
    """The kazoo workload against a real Apache ZooKeeper (deploy/zookeeper.sh), restarted while
    it runs (sessions survive, calls in flight fail): ZooKeeper itself keeps the promise the
    checker holds TableKeeper's ZooKeeper port to, so the model is not stricter than it."""
    zookeeper = ZooKeeperProcess(tmp_path / "zookeeper").start()
    history = tmp_path / "zk-history.jsonl"
    try:
        workload = subprocess.Popen(
            [sys.executable, "-m", "tests.robustness.zk_workload", "--hosts", zookeeper.hosts,
             "--out", str(history), "--clients", "4", "--keys", "4", "--duration", "8"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert workload.stdout is not None
        started = workload.stdout.readline()  # the keys exist, the clients are starting
        assert started.strip() == "STARTED", started + workload.stdout.read()
        zookeeper.stop()
        zookeeper.start()
        out, _ = workload.communicate(timeout=300)
        assert workload.returncode == 0, out
    finally:
        zookeeper.stop()
    verdict, output, _ = check_histories(robustness_tools, [history], tmp_path / "v")
    assert verdict == "ok", output
    assert "proto=zk keys=4" in output
