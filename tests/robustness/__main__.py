"""The long robustness run (`make robustness`), or one seed again (`make robustness SEED=N`).

    python -m tests.robustness --minutes 60             # seeds 1, 2, ... for an hour
    python -m tests.robustness --seed 17                # seed 17 once (a replay)
    python -m tests.robustness --seed 17 --nemesis pause,kill --duration 60

One environment (ZooKeeper, Pulsar, 3 servers, each in a network namespace of its own; needs
root, `ip` and `nft`) serves the seeds one after another, each with keys of its own; it is
started afresh after a run whose cluster did not recover. Each run writes its histories, the
nemesis log and, for a key no order explains, porcupine's visualisation under --out/seed-N/.
A seed fixes the operation mix and the fault schedule (kinds, targets, hold times), not the
timing of a real cluster: a replay runs the same schedule and usually, not always, meets the
same anomaly. Exit status 0 when every run's histories check out and every fault was injected
and healed, 1 otherwise (the failing seeds are listed with their files at the end).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType

from tests.robustness.harness import (
    Environment,
    RunResult,
    build_tools,
    run_seed,
)
from tests.robustness.nemesis import KINDS
from tests.support.server import REPO


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through every cleanup


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, help="run this seed once (a replay)")
    p.add_argument("--first-seed", type=int, default=1, help="the long run's first seed")
    p.add_argument("--minutes", type=float, default=30.0, help="the long run's length")
    p.add_argument("--duration", type=float, default=45.0, help="seconds of load per seed")
    p.add_argument("--nemesis", default=",".join(KINDS), help="comma-separated fault kinds")
    p.add_argument(
        "--protocols", default="", help="sdk,etcd,oxia[,zk] (default: all the server speaks)"
    )
    p.add_argument("--clients", type=int, default=4, help="clients per protocol")
    p.add_argument("--keys", type=int, default=6, help="keys per protocol and model")
    p.add_argument("--out", type=Path, default=REPO / "build" / "robustness")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    kinds = tuple(k for k in args.nemesis.split(",") if k)
    protocols = tuple(p for p in args.protocols.split(",") if p) or None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    tools = build_tools(args.out / "bin")
    seeds = [args.seed] if args.seed is not None else None
    deadline = time.monotonic() + args.minutes * 60
    results: list[RunResult] = []
    env: Environment | None = None
    seed = args.seed if args.seed is not None else args.first_seed
    try:
        while True:
            if env is None:
                env = Environment(out / f"environment-{seed}").start()
            replay = f"make robustness SEED={seed} DURATION={args.duration:g}" + (
                f" NEMESIS={','.join(kinds)}" if kinds != KINDS else ""
            )
            result = run_seed(
                env, tools, seed, out / f"seed-{seed}",
                duration_s=args.duration, kinds=kinds, protocols=protocols,
                clients=args.clients, keys=args.keys, replay=replay,
            )  # fmt: skip
            results.append(result)
            print(result.report(), flush=True)
            if any("did not recover" in p for p in result.problems):
                env.close()  # a fresh cluster for the next seed
                env = None
            if seeds is not None or time.monotonic() > deadline:
                break
            seed += 1
    finally:
        if env is not None:
            env.close()
    failed = [r for r in results if not r.ok]
    kinds_seen = Counter(fault.split(" on ", 1)[0] for r in results for fault in r.faults)
    ops = sum(int(n) for r in results for n in re.findall(r" ops=(\d+)", r.checker_output))
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds_seen.items()))
    print(
        f"\n{len(results)} seeds of {args.duration:g}s, {ops} operations checked, "
        f"{sum(kinds_seen.values())} faults ({by_kind}); {len(failed)} failed; results in {out}",
        flush=True,
    )
    for r in failed:
        print(f"FAILED seed {r.seed}: {r.verdict}; {r.out_dir}; replay: {r.replay}")
        for v in r.visualizations:
            print(f"  visualization: {v}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(parse()))
