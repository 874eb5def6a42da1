"""Where a server spends its CPU under a native load: py-spy samples a standalone server while
ghz sends unary calls, then prints how much of the time each of the server's threads ran and
waited for a core (the host's cores all busy), and the hottest functions.

    make profile                                   # put, 64 in flight, 15 s
    .venv/bin/python benchmarks/cpu_profile.py --server-args "--runtime envoy"
    .venv/bin/python benchmarks/cpu_profile.py --op get --concurrency 16 --duration 10

Output: benchmarks/out/profile-<op>.txt, collapsed stacks (one line per stack with its sample
count; flamegraph tools read it).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._common import thread_times  # noqa: E402
from benchmarks.native import GHZ_DEFAULT, tablekeeper_target  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
OUT = REPO / "benchmarks" / "out"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=("put", "get", "batch-put"), default="put")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--ranges", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--ghz", type=Path, default=Path(os.environ.get("GHZ", GHZ_DEFAULT)))
    parser.add_argument("--top", type=int, default=25, help="functions to print")
    parser.add_argument(
        "--server-args", default="", help="extra `tablekeeper server` flags (--runtime envoy)"
    )
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tk-profile-") as tmp:
        args.work = Path(tmp)
        server = ServerProcess(args.work / "data", extra_args=args.server_args.split()).start()
        try:
            assert server.process is not None
            target = tablekeeper_target(server, args.work, args)
            data = args.work / "data.json"
            data.write_text(json.dumps(target.messages["put"]))
            base = [str(args.ghz), "--insecure", "--protoset", str(target.protoset)]
            base += ["--data-file", str(data), "--concurrency", str(args.concurrency)]
            prefill = [*base, "--call", target.calls["put"], "--total", str(args.keys)]
            subprocess.run([*prefill, server.target], check=True, capture_output=True)
            data.write_text(json.dumps(target.messages[args.op]))
            collapsed = OUT / f"profile-{args.op}.txt"
            spy = subprocess.Popen(
                [str(PY_SPY), "record", "--pid", str(server.process.pid), "--rate", str(args.rate)]
                + ["--format", "raw", "--output", str(collapsed), "--nonblocking"]
            )
            time.sleep(1.0)  # py-spy attaches
            load = [*base, "--call", target.calls[args.op], "--duration", f"{args.duration}s"]
            before, started = thread_times(server.process.pid), time.monotonic()
            result = subprocess.run(
                [*load, "--format", "json", server.target], capture_output=True, text=True
            )
            after, elapsed = thread_times(server.process.pid), time.monotonic() - started
            spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
            spy.wait(60)
        finally:
            server.stop()  # also when ghz or py-spy fails
    rps = json.loads(result.stdout)["rps"] if result.stdout else 0.0
    print(f"{args.op} at {args.concurrency} in flight: {rps:,.0f} calls/s while sampled")
    self_time: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        self_time[frames[-1]] += int(count)
    print(
        "server threads during the load (share of the time running on a core / ready but "
        "waiting for one; threads running over 2 %):"
    )
    busy = []
    for tid, (name, ran, waited) in after.items():
        _, ran0, waited0 = before.get(tid, (name, 0.0, 0.0))
        busy.append((ran - ran0, waited - waited0, name, tid))
    for ran, waited, name, tid in sorted(busy, reverse=True):
        if ran / elapsed > 0.02:
            print(f"  {100 * ran / elapsed:5.1f}% / {100 * waited / elapsed:5.1f}%  {name} ({tid})")
    print(f"{total} samples; hottest functions (self time):")
    for frame, samples in self_time.most_common(args.top):
        print(f"  {100 * samples / max(total, 1):5.1f}%  {frame}")
    print(f"collapsed stacks: {collapsed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
