"""The server's layering, checked on its import statements: `range/` knows nothing of the
containers, the cluster or the gRPC servicers, and only the Pulsar modules import the `pulsar`
client. (The front-ends' commands reach the range through its applier seam, `range/apply.py`:
the range imports none of them.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_client_imports import _imported_modules as _imports

pytestmark = pytest.mark.unit

SERVER = Path(__file__).resolve().parents[2] / "server" / "tablekeeper_server"


def _offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    files = sorted((SERVER / package).rglob("*.py"))
    assert files, package
    out = {}
    for path in files:
        bad = sorted(m for m in _imports(path) if m.startswith(forbidden))
        if bad:
            out[str(path.relative_to(SERVER))] = bad
    return out


def test_range_imports_neither_containers_nor_servicers() -> None:
    forbidden = tuple(f"tablekeeper_server.{p}" for p in ("container", "rpc", "cluster"))
    assert _offenders("range", forbidden) == {}


def test_checkpoint_store_does_not_import_the_log() -> None:
    assert _offenders("checkpoint", ("tablekeeper_server.log",)) == {}


def test_only_the_pulsar_modules_import_the_pulsar_client() -> None:
    allowed = {"log/pulsar.py", "checkpoint/pulsar.py"}
    importers = {
        str(path.relative_to(SERVER))
        for path in SERVER.rglob("*.py")
        if any(m == "pulsar" or m.startswith("pulsar.") for m in _imports(path))
    }
    assert importers, "the scan found no importer at all"
    assert {
        p for p in importers if p not in allowed and not p.startswith("pulsar_common/")
    } == set()
