"""Keep cores busy while something else runs: the busy machine a test must pass on.

    .venv/bin/python benchmarks/burn_cpu.py 2                    # until Ctrl-C or SIGTERM
    .venv/bin/python benchmarks/burn_cpu.py 2 -- make test-compat  # while the command runs

Each burner is a Python process spinning in a loop at the default priority, so it competes for
the CPU with the servers, clients, ZooKeeper and Pulsar of the run as another user's work would.
With a command, the exit status is the command's; the burners are stopped on every exit path
(they are this process's children, stopped by their own pids). `burning(n)` does the same from
Python.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import FrameType

SPIN = "while True: pass"


@contextlib.contextmanager
def burning(processes: int) -> Iterator[list[int]]:
    """`processes` busy processes for the duration of the block; yields their pids."""
    burners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(processes):
            burners.append(subprocess.Popen([sys.executable, "-c", SPIN]))
        yield [b.pid for b in burners]
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        command = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("processes", type=int, nargs="?", default=2, help="busy processes (2)")
    options = parser.parse_args(args)
    if options.processes < 1:
        parser.error("processes must be >= 1")

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    with burning(options.processes) as pids:
        print(f"burning: {options.processes} busy processes {pids}", file=sys.stderr, flush=True)
        try:
            if command:
                return subprocess.call(command)
            signal.pause()
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
