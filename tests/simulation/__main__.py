"""Run the simulation: `python -m tests.simulation --seed N [--trace]` or `--seeds COUNT`."""

from __future__ import annotations

import argparse
import sys
import time

from tests.simulation.sim import SimulationError, Stats, simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="run this seed (replays exactly)")
    group.add_argument("--seeds", type=int, help="run seeds FIRST .. FIRST+SEEDS-1")
    parser.add_argument("--first", type=int, default=0, help="first seed with --seeds")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--trace", action="store_true", help="print the faults as they happen")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    total = Stats()
    started = time.monotonic()
    for seed in seeds:
        try:
            stats = simulate(seed, rounds=args.rounds, trace=args.trace)
        except SimulationError as exc:
            print(f"FAILED: {exc}\nreplay: python -m tests.simulation --seed {seed} --trace")
            return 1
        for name, value in vars(stats).items():
            setattr(total, name, getattr(total, name) + value)
    elapsed = time.monotonic() - started
    print(f"{len(seeds)} seeds passed in {elapsed:.1f}s: {vars(total)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
