"""Concurrent clients of the SDK (`tablekeeper.AsyncClient`, the BookKeeper protocol) against a
table, recording every operation for the checker.

    python -m tests.robustness.sdk_workload --service bk://A,B,C --table robust/t \\
        --out HISTORY.jsonl --clients 6 --keys 8 --duration 30 --seed 1

Each client is an `AsyncClient` of its own (its own connections and route cache) running one
call at a time: on register keys (pkey `<prefix>r<n>`, lkey `v`) gets, puts, compare-and-set on
the version (`expected_version`, -1 for absent) and deletes; on counter keys (pkey
`<prefix>c<n>`, lkey `n`) increments that return the total, and gets. Every value written is
unique. What the SDK says about a failure is what the history says: a read that fails changed
nothing ("error"); a conditional write refused for its condition (`BadVersionError`,
`KeyExistsError`, `KeyNotFoundError`) is "fail"; a write whose error has `outcome_unknown` (a
timeout, a cut connection, an "outcome unknown" answer) is "unknown"; a write refused with
`outcome_unknown` false was not applied ("error") -- if it was, the checker finds out. Every
other client gives up on a call after 1 s instead of `--op-timeout`. After a
failure a client waits 0.3-0.7 s. After
`--duration` the clients stop issuing, the calls in flight end (each bounded by `--op-timeout`),
the history is written and "DONE" printed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Any

from tablekeeper import AsyncClient
from tablekeeper.errors import (
    BadVersionError,
    KeyExistsError,
    KeyNotFoundError,
    TableKeeperError,
)
from tablekeeper.table import AsyncTable
from tests.robustness.history import HistoryWriter, now_ns

REGISTER_LKEY = b"v"
COUNTER_LKEY = b"n"
CONDITION_FAILED = (BadVersionError, KeyExistsError, KeyNotFoundError)


def _outcome(error: BaseException, *, write: bool) -> str:
    """The history status of a failed call: reads change nothing; a write's error says whether
    it may have been applied (anything not from the SDK's table: it may have)."""
    if not write:
        return "error"
    if isinstance(error, TableKeeperError) and not error.outcome_unknown:
        return "error"
    return "unknown"


class Client:
    def __init__(self, index: int, table: AsyncTable, args: argparse.Namespace) -> None:
        self.session = f"sdk-{index}"
        self.table = table
        self.args = args
        self.rng = random.Random(args.seed * 1000 + index)
        self.versions: dict[str, int] = {}  # the last version this client saw; -1: absent
        # Every other client gives up after 1 s: while an owner is paused it keeps calling
        # (its calls to the paused server may be answered when it resumes); the others wait
        # the full --op-timeout.
        self.timeout_s = args.op_timeout if index % 2 == 0 else min(1.0, args.op_timeout)

    async def run(self, history: HistoryWriter, stop_at: float) -> None:
        loop = asyncio.get_running_loop()
        pause_s = 1.0 / self.args.rate
        seq = 0
        while loop.time() < stop_at:
            seq += 1
            record = await self.one(f"{self.session}-{seq}")
            history.add(record)
            if record["status"] in ("error", "unknown"):
                # Back off after a failure, as an application would: an outage then costs a
                # few unknown writes, not hundreds (each of which the checker must place).
                await asyncio.sleep(self.rng.uniform(0.3, 0.7))
            await asyncio.sleep(self.rng.uniform(0, 2 * pause_s))

    async def one(self, value: str) -> dict[str, Any]:
        dice = self.rng.randrange(100)
        timeout = self.timeout_s
        prefix = self.args.prefix
        if dice >= 85:
            pkey = f"{prefix}c{self.rng.randrange(self.args.keys)}"
            record: dict[str, Any] = {"model": "counter", "key": f"{pkey}/n"}
        else:
            pkey = f"{prefix}r{self.rng.randrange(self.args.keys)}"
            record = {"model": "register", "key": f"{pkey}/v"}
        record.update(proto="sdk", session=self.session)
        key = record["key"]
        record["call"] = now_ns()
        try:
            if dice >= 95:
                record["op"] = "get"
                kv = await self.table.get(pkey, COUNTER_LKEY, timeout=timeout)
                record.update(status="ok", found=kv is not None)
                if kv is not None:
                    record.update(total=kv.number, has_total=True)
            elif dice >= 85:
                delta = self.rng.randrange(1, 10)
                record.update(op="incr", delta=delta)
                total = await self.table.increment(
                    pkey, COUNTER_LKEY, delta, get_total=True, timeout=timeout
                )
                record.update(status="ok", total=total, has_total=True)
            elif dice < 35:
                record["op"] = "get"
                kv = await self.table.get(pkey, REGISTER_LKEY, timeout=timeout)
                record.update(status="ok", found=kv is not None)
                self.versions[key] = -1
                if kv is not None:
                    record.update(
                        rvalue=kv.value.decode(), version=kv.version, modrev=kv.mod_revision
                    )
                    self.versions[key] = kv.version
            elif dice < 60:
                record.update(op="put", value=value)
                await self.table.put(pkey, REGISTER_LKEY, value, timeout=timeout)
                record["status"] = "ok"
            elif dice < 80:
                expect = self.versions.get(key, -1)
                record.update(op="cas", value=value, expect=expect)
                await self.table.put(
                    pkey, REGISTER_LKEY, value, expected_version=expect, timeout=timeout
                )
                record["status"] = "ok"
            else:
                record["op"] = "del"
                deleted = await self.table.delete(pkey, REGISTER_LKEY, timeout=timeout)
                record.update(status="ok", found=deleted > 0)
        except CONDITION_FAILED as error:
            record["status"] = "fail" if record["op"] == "cas" else _outcome(error, write=True)
            record["error"] = f"{type(error).__name__}: {error}"
        except Exception as error:  # every failure is recorded as what it means
            record["status"] = _outcome(error, write=record["op"] != "get")
            record["error"] = f"{type(error).__name__}: {error}"
        record["ret"] = now_ns()
        return record


async def main(args: argparse.Namespace) -> int:
    namespace, _, name = args.table.partition("/")
    clients = [AsyncClient(args.service) for _ in range(args.clients)]
    try:
        tables = [await c.table(namespace, name, timeout=60) for c in clients]
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + args.duration
        with HistoryWriter(Path(args.out)) as history:
            workers = [Client(i, t, args) for i, t in enumerate(tables)]
            await asyncio.gather(*(w.run(history, stop_at) for w in workers))
    finally:
        for c in clients:
            await c.close()
    print("DONE", flush=True)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--service", required=True)
    p.add_argument("--table", required=True, help="NAMESPACE/TABLE (it must exist)")
    p.add_argument("--out", required=True)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--keys", type=int, default=8)
    p.add_argument("--prefix", default="", help="of every pkey (a run's keys of its own)")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--op-timeout", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=20.0, help="ops/s per client, at most")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
