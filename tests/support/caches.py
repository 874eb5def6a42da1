"""What the test set-up keeps outside the checkout, for every clone: the user's cache directory
(`$XDG_CACHE_HOME/tablekeeper`, else `~/.cache/tablekeeper`, as the Makefile's `TK_CACHE` and the
deploy/ scripts name it) and, in it, the Pulsar jars `deploy/pulsar.sh fetch` resolves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
"""(No import of tests.support.server here: the set-up imports this module before any test.)"""
PULSAR_VERSION = "4.0.7"
"""deploy/pulsar.sh's default `PULSAR_VERSION`: the jars the tests run and build against."""


def user_cache() -> Path:
    """`$XDG_CACHE_HOME/tablekeeper`, else `~/.cache/tablekeeper` (an empty variable counts as
    unset, as in the shell's `${XDG_CACHE_HOME:-…}`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tablekeeper"


def pulsar_cache() -> Path:
    """deploy/pulsar.sh's jar cache: `$PULSAR_CACHE_DIR`, else `pulsar-<version>` in the user's
    cache (its local Maven repository is `m2/` there)."""
    return Path(os.environ.get("PULSAR_CACHE_DIR") or user_cache() / f"pulsar-{PULSAR_VERSION}")


def pulsar_classpath() -> str:
    """The classpath of Pulsar's jars (the broker, the bookie, the Oxia Java client), from
    `deploy/pulsar.sh fetch`'s cache; fetched first if missing (mvn, the first run only)."""
    path = pulsar_cache() / "classpath.txt"
    if not path.exists():
        subprocess.run([str(_DEPLOY / "pulsar.sh"), "fetch"], check=True, timeout=1800)
    return path.read_text().strip()
