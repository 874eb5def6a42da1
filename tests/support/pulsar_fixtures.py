"""The session fixture `pulsar_service`: the Pulsar the tests marked `pulsar` use.

It starts one Pulsar standalone (`PulsarService.launch`, tests/support/pulsar.py) on free
loopback ports, in a temporary state directory, the first time a test asks for it, and stops it
at the end of the session.

Or reuse a running one: `TABLEKEEPER_PULSAR_URL=pulsar://host:6650` and
`TABLEKEEPER_PULSAR_ADMIN_URL=http://host:8080`; add `TABLEKEEPER_PULSAR_DIR=<its --dir>` to let
the tests that restart Pulsar do so through `deploy/pulsar.sh` (they are skipped otherwise).

When Pulsar cannot be started the Pulsar tests are skipped, unless
`TABLEKEEPER_REQUIRE_PULSAR=1` (set by the Makefile): then they fail.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pulsar import PulsarService

ENV_URL = "TABLEKEEPER_PULSAR_URL"
ENV_ADMIN_URL = "TABLEKEEPER_PULSAR_ADMIN_URL"
ENV_DIR = "TABLEKEEPER_PULSAR_DIR"
ENV_REQUIRE = "TABLEKEEPER_REQUIRE_PULSAR"


def _start_own(base: Path) -> Iterator[PulsarService]:
    try:
        service = PulsarService.launch(base / "pulsar", timeout_s=240)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"deploy/pulsar.sh start did not finish: {exc}")
        raise AssertionError("unreachable") from exc
    except RuntimeError as exc:
        _unavailable(str(exc))
        raise AssertionError("unreachable") from exc
    try:
        yield service
    finally:
        service.close()


def _unavailable(reason: str) -> None:
    if os.environ.get(ENV_REQUIRE, "") not in ("", "0"):
        pytest.fail(f"Pulsar is required ({ENV_REQUIRE}) but unavailable: {reason}")
    pytest.skip(f"no Pulsar available: {reason}")


@pytest.fixture(scope="session")
def pulsar_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarService]:
    """The session's Pulsar (see the module docstring)."""
    url = os.environ.get(ENV_URL)
    if url:
        admin_url = os.environ.get(ENV_ADMIN_URL)
        if not admin_url:
            _unavailable(f"{ENV_URL} is set but {ENV_ADMIN_URL} is not")
            raise AssertionError("unreachable")
        directory = os.environ.get(ENV_DIR)
        yield PulsarService(url, admin_url, Path(directory) if directory else None)
        return
    yield from _start_own(tmp_path_factory.mktemp("pulsar-service"))
