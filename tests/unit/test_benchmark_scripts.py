"""The benchmark scripts run as `python benchmarks/<name>.py`, which puts `benchmarks/` first on
`sys.path`: a script named like a standard-library module would shadow it for every other
script (a `profile.py` there broke `import cProfile`, and with it pyspark, in spark_load.py)."""

from __future__ import annotations

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
