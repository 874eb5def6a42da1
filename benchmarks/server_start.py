"""How long a standalone `tablekeeper server` takes to start: from the command to its gRPC
health check answering SERVING, on a fresh data directory, per runtime.

A start is what a restart after a crash costs in unavailability, and what each of the hundreds
of servers the test suite starts costs in time. Two settings of Python's compiled bytecode:

* `cached`: the `__pycache__` files Python keeps next to the sources (written on a first import
  unless PYTHONDONTWRITEBYTECODE is set; the Makefile unsets it);
* `none`: TableKeeper's own modules compiled from source at every start, as in a checkout where
  PYTHONDONTWRITEBYTECODE is set (container images often set it); the installed packages keep
  the bytecode pip compiled when it installed them, as they do there.

Each setting runs a copy of this tree's sources (client, server, proto/gen; first on PYTHONPATH,
which Envoy's interpreter inherits) without any `__pycache__`.

The settings and runtimes take turns within each round, so a slow minute of a shared machine
hits them all. The JSON goes to benchmarks/out/ (gitignored).

    .venv/bin/python benchmarks/server_start.py                        # 5 rounds
    .venv/bin/python benchmarks/server_start.py --rounds 10 --runtimes envoy

Exit status: 0 ok, 1 a server did not start, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    REPO,
    SRC_PATHS,
    fmt,
    git_info,
    positive_int,
    sigterm_as_interrupt,
    write_report,
)
from tests.support.server import ServerProcess  # noqa: E402

BYTECODE = ("cached", "none")


def copy_sources(scratch: Path, bytecode: str) -> str:
    """This tree's sources, copied without bytecode under `scratch`: their PYTHONPATH."""
    paths = []
    for source in SRC_PATHS:
        copy = scratch / f"src-{bytecode}" / source.relative_to(REPO)
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        paths.append(str(copy))
    return os.pathsep.join(paths)


def start_seconds(runtime: str, bytecode: str, scratch: Path, pythonpath: str) -> float:
    """One start, timed from the launch to SERVING (the probe polls every 20 ms)."""
    data = Path(tempfile.mkdtemp(dir=scratch)) / "data"
    env = {
        "PYTHONPATH": pythonpath,
        "PYTHONDONTWRITEBYTECODE": "1" if bytecode == "none" else "",
    }
    server = ServerProcess(data, extra_args=["--runtime", runtime], env=env)
    began = time.monotonic()
    server.launch()
    try:
        server.wait_serving(120.0, poll_s=0.02)
        return time.monotonic() - began
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=5, help="starts per cell")
    parser.add_argument(
        "--runtimes", default="envoy,grpc-aio", help="comma-separated --runtime values"
    )
    parser.add_argument(
        "--bytecode",
        default=",".join(BYTECODE),
        help="comma-separated: cached (Python's __pycache__), none (compiled on every import)",
    )
    args = parser.parse_args(argv)
    runtimes = [r for r in args.runtimes.split(",") if r]
    settings = [b for b in args.bytecode.split(",") if b]
    unknown = set(settings) - set(BYTECODE)
    if unknown:
        parser.error(f"--bytecode: unknown {sorted(unknown)} (choose from {BYTECODE})")
    load_start = os.getloadavg()
    results: dict[str, list[float]] = {f"{r} {b}": [] for r in runtimes for b in settings}
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="tk-start-") as scratch:
        paths = {b: copy_sources(Path(scratch), b) for b in settings}
        try:
            if "cached" in paths:  # the first start writes the cache
                start_seconds(runtimes[0], "cached", Path(scratch), paths["cached"])
            for round_ in range(args.rounds):
                for runtime in runtimes:
                    for bytecode in settings:
                        seconds = start_seconds(runtime, bytecode, Path(scratch), paths[bytecode])
                        results[f"{runtime} {bytecode}"].append(seconds)
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        except KeyboardInterrupt:
            return 130
        except (RuntimeError, TimeoutError) as exc:
            print(f"a server did not start: {exc}", file=sys.stderr)
            return 1
    print(f"{'runtime, bytecode':<22} {'median s':>9} {'min s':>7} {'max s':>7}")
    for cell, values in results.items():
        print(
            f"{cell:<22} {fmt(statistics.median(values)):>9} "
            f"{fmt(min(values)):>7} {fmt(max(values)):>7}"
        )
    report = {
        "benchmark": "server_start",
        "when": datetime.now(UTC).isoformat(),
        "git": git_info(),
        "rounds": args.rounds,
        "seconds": results,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    write_report(report, REPO / "benchmarks" / "out" / f"server_start-{stamp}.json", load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
