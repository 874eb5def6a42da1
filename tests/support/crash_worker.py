"""A load-generating client process for crash tests, and the reader of what it records.

Run as ``python -m tests.support.crash_worker --service bk://... --journal FILE --worker N
--round R``. The worker opens an `AsyncClient` and runs ``--tasks`` concurrent tasks, each
looping over a random mix of

* ``put``: a unique key (never written before) with a value derived from its id, sent with
  ``expected_version=-1`` so a command that is ever applied twice fails instead of passing;
* ``inc``: +1 on one of a few counter keys shared by every worker;
* ``txn``: ``if_absent(a) then put(a), put(b)`` on one pkey, both keys unique.

Every operation is journaled *before* it is sent (an attempt) and again once it resolves: acked
(``ok``), compare failed (``cmp_failed``, which for unique keys means a duplicate application) or
failed (``err`` with the exception type and message). Each journal line is one JSON object
written with a single ``write`` on an ``O_APPEND`` descriptor, so it reaches the file as soon as
the event is known and survives the worker being killed; a torn last line is ignored by the
reader.

SIGTERM (or SIGINT) stops the worker: no new operations start, the ones in flight get up to
``--drain-s`` seconds to resolve (they fail fast once the server is gone: the client's retry
deadline is ``--retry-deadline-s``), and the worker writes a ``done`` line and exits 0, or 4 when
some operation was still unresolved and had to be cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tablekeeper import AsyncClient, AsyncTable, RetryPolicy

PUT_PKEYS = 32
TXN_PKEYS = 16
COUNTERS = 4
COUNTER_LKEY = "n"
REPO = Path(__file__).resolve().parents[2]


def put_pkey(slot: int) -> str:
    return f"put-{slot:02d}"


def txn_pkey(slot: int) -> str:
    return f"txn-{slot:02d}"


def counter_pkey(slot: int) -> str:
    return f"ctr-{slot}"


ALL_DATA_PKEYS = [put_pkey(i) for i in range(PUT_PKEYS)] + [txn_pkey(i) for i in range(TXN_PKEYS)]
ALL_COUNTER_PKEYS = [counter_pkey(i) for i in range(COUNTERS)]


def value_for(key_id: str) -> bytes:
    """The value written under the unique key `key_id`: 16..2064 bytes, derived from the id."""
    digest = hashlib.sha256(key_id.encode()).hexdigest().encode()
    size = 16 + int(digest[:4], 16) % 2049
    return (digest * (size // len(digest) + 1))[:size]


# --------------------------------------------------------------------------- the worker


class _Journal:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, **entry: Any) -> None:
        os.write(self._fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


async def _one_op(
    table: AsyncTable, journal: _Journal, rng: random.Random, op_id: str, counts: Counter[str]
) -> None:
    roll = rng.random()
    try:
        if roll < 0.5:
            pkey = put_pkey(rng.randrange(PUT_PKEYS))
            journal.write(op="put", id=op_id, pkey=pkey, lkey=op_id)
            await table.put(pkey, op_id, value_for(op_id), expected_version=-1)
        elif roll < 0.75:
            pkey = counter_pkey(rng.randrange(COUNTERS))
            journal.write(op="inc", id=op_id, pkey=pkey, lkey=COUNTER_LKEY)
            await table.increment(pkey, COUNTER_LKEY, 1)
        else:
            pkey = txn_pkey(rng.randrange(TXN_PKEYS))
            a, b = f"{op_id}.a", f"{op_id}.b"
            journal.write(op="txn", id=op_id, pkey=pkey, lkeys=[a, b])
            result = (
                await table.txn(pkey)
                .if_absent(a)
                .then_put(a, value_for(a))
                .then_put(b, value_for(b))
                .commit()
            )
            if not result.succeeded:
                journal.write(cmp_failed=op_id)
                counts["cmp_failed"] += 1
                return
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # every outcome is recorded; the test judges them
        journal.write(err=op_id, type=type(exc).__name__, msg=str(exc)[:300])
        counts["err"] += 1
        return
    journal.write(ok=op_id)
    counts["ok"] += 1


async def _task(
    table: AsyncTable,
    journal: _Journal,
    stop: asyncio.Event,
    worker: int,
    round_: int,
    index: int,
    counts: Counter[str],
) -> None:
    rng = random.Random(f"{round_}/{worker}/{index}")
    n = 0
    while not stop.is_set():
        await _one_op(table, journal, rng, f"r{round_}.w{worker}.t{index}.{n}", counts)
        n += 1


async def run_worker(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    journal = _Journal(args.journal)
    counts: Counter[str] = Counter()
    retry = RetryPolicy(deadline_s=args.retry_deadline_s, call_timeout_s=args.call_timeout_s)
    unresolved = 0
    try:
        async with AsyncClient(args.service, retry=retry) as client:
            table = await client.table(args.namespace, args.table)
            journal.write(ready=args.worker)
            tasks = [
                asyncio.create_task(_task(table, journal, stop, args.worker, args.round, i, counts))
                for i in range(args.tasks)
            ]
            await stop.wait()
            _, pending = await asyncio.wait(tasks, timeout=args.drain_s)
            unresolved = len(pending)
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)
        journal.write(done=args.worker, unresolved=unresolved, counts=dict(counts))
    finally:
        journal.close()
    return 4 if unresolved else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--service", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--retry-deadline-s", type=float, default=2.0)
    parser.add_argument("--call-timeout-s", type=float, default=15.0)
    parser.add_argument("--drain-s", type=float, default=20.0)
    code = asyncio.run(run_worker(parser.parse_args(argv)))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already
    return code


# --------------------------------------------------------------------------- the launcher


class WorkerProcess:
    """One worker process, started from a test. `stop()` sends SIGTERM and waits."""

    def __init__(
        self,
        *,
        service: str,
        namespace: str,
        table: str,
        journal: Path,
        worker: int,
        round_: int,
        tasks: int = 32,
        retry_deadline_s: float = 2.0,
    ) -> None:
        self.journal = journal
        self._stop_requested = False
        self.stderr_path = journal.with_suffix(".stderr")
        with open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.crash_worker",
                    f"--service={service}",
                    f"--namespace={namespace}",
                    f"--table={table}",
                    f"--journal={journal}",
                    f"--worker={worker}",
                    f"--round={round_}",
                    f"--tasks={tasks}",
                    f"--retry-deadline-s={retry_deadline_s}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=REPO,
            )

    def summary(self) -> JournalSummary:
        return read_journal(self.journal)

    def wait_acked(self, count: int, timeout_s: float) -> None:
        """Wait until the worker has `count` acknowledged operations (it is under way)."""
        deadline = time.monotonic() + timeout_s
        while self.summary().acked < count:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"worker exited with {self.process.returncode}: {self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker made no progress in {timeout_s}s: {self.stderr_tail()}")
            time.sleep(0.1)

    def request_stop(self) -> None:
        """Send SIGTERM once (a second one could land after the worker restored the default
        handler on its way out, and kill it)."""
        if not self._stop_requested and self.process.poll() is None:
            self._stop_requested = True
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, wait for the drain; kill -9 if it does not exit in time. Returns the code."""
        self.request_stop()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def stderr_tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""


# --------------------------------------------------------------------------- the reader


@dataclass
class Op:
    kind: str  # "put" | "inc" | "txn"
    id: str
    pkey: str
    lkeys: list[str]
    outcome: str | None = None  # None (unresolved) | "ok" | "cmp_failed" | "err"
    error: str = ""

    @property
    def acked(self) -> bool:
        return self.outcome == "ok"


@dataclass
class JournalSummary:
    ops: dict[str, Op] = field(default_factory=dict)
    ready: bool = False
    done: dict[str, Any] | None = None

    @property
    def acked(self) -> int:
        return sum(op.acked for op in self.ops.values())


def read_journal(path: Path) -> JournalSummary:
    """Parse a worker's journal; a torn last line (the worker was killed mid-write) is ignored."""
    summary = JournalSummary()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return summary
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "op" in entry:
            lkeys = entry["lkeys"] if "lkeys" in entry else [entry["lkey"]]
            summary.ops[entry["id"]] = Op(entry["op"], entry["id"], entry["pkey"], lkeys)
        elif "ok" in entry:
            summary.ops[entry["ok"]].outcome = "ok"
        elif "cmp_failed" in entry:
            summary.ops[entry["cmp_failed"]].outcome = "cmp_failed"
        elif "err" in entry:
            op = summary.ops[entry["err"]]
            op.outcome = "err"
            op.error = f"{entry['type']}: {entry['msg']}"
        elif "ready" in entry:
            summary.ready = True
        elif "done" in entry:
            summary.done = entry
    return summary


if __name__ == "__main__":
    sys.exit(main())
