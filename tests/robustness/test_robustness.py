"""The short robustness run of `make test`: real clients of every protocol (the SDK, etcd's
clientv3, Oxia's Java client) against a 3-server cluster in network namespaces (ZooKeeper and
Pulsar in their own), while faults are injected; each seed's histories are checked with
porcupine against what the protocol promises (tests/robustness/checker/guarantees.go).

Two seeds, each with faults of its own, keep it near two minutes: the stale-read case (an owner
cut from ZooKeeper, Pulsar and its peers but not from its clients) with kill -9, and a pause past
the session timeout with a range split. `make robustness` runs every kind for longer. A failure
prints the seed, the histories, the visualisation and the command replaying it; replay here with
`--robustness-seeds N --robustness-nemesis KINDS --robustness-duration S`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.robustness.harness import Environment, Tools, run_seed

SHORT_RUN = {
    # seed: the fault kinds it injects
    1: ("partition-owner", "kill"),
    2: ("pause", "split"),
}
SHORT_DURATION_S = 25.0

pytestmark = pytest.mark.timeout(900)


def _seeds(config: pytest.Config) -> list[tuple[int, tuple[str, ...]]]:
    given = str(config.getoption("--robustness-seeds"))
    if not given:
        return sorted(SHORT_RUN.items())
    nemesis = str(config.getoption("--robustness-nemesis"))
    return [
        (int(s), tuple(k for k in nemesis.split(",") if k) or SHORT_RUN.get(int(s), ("kill",)))
        for s in given.split(",")
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed_and_kinds" in metafunc.fixturenames:
        seeds = _seeds(metafunc.config)
        metafunc.parametrize("seed_and_kinds", seeds, ids=[f"seed-{s}" for s, _ in seeds])


def test_histories_under_faults_are_what_each_protocol_promises(
    environment: Environment,
    robustness_tools: Tools,
    seed_and_kinds: tuple[int, tuple[str, ...]],
    run_dir: Path,
    pytestconfig: pytest.Config,
) -> None:
    seed, kinds = seed_and_kinds
    duration_s = float(pytestconfig.getoption("--robustness-duration")) or SHORT_DURATION_S
    replay = (
        f"pytest tests/robustness/test_robustness.py --robustness-seeds {seed} "
        f"--robustness-nemesis {','.join(kinds)} --robustness-duration {duration_s:g}"
        f"  (or: make robustness SEED={seed} NEMESIS={','.join(kinds)} DURATION={duration_s:g})"
    )
    result = run_seed(
        environment, robustness_tools, seed, run_dir, duration_s=duration_s, kinds=kinds,
        replay=replay,
    )  # fmt: skip
    print(result.report())
    assert result.faults, f"no fault was injected:\n{result.report()}"
    assert result.ok, result.report()
