"""Concurrent ZooKeeper sessions (kazoo) against a ZooKeeper service, recording every operation
for the checker, which holds it to ZooKeeper's promise: writes linearizable, reads sequential
per session (tests/robustness/checker/guarantees.go, "zk").

    python -m tests.robustness.zk_workload --hosts A:P,B:P --out HISTORY.jsonl \\
        --clients 4 --keys 6 --duration 30 --seed 1 --prefix /robust/s1-

Keys are znodes `<prefix>k<n>`, created (empty) before the clients start and never deleted, so
every write is a `set`: unconditional (version -1, "put") or on the version the session last
read ("cas"; `BadVersionError` is "fail"). Reads are plain `get`s (no `sync`): served by
whichever server the session is connected to, so they may lag other sessions' writes, which
the checker allows; never the session's own past. A session's history is keyed by its
ZooKeeper session id: when a session expires and kazoo makes a new one, the new one starts
with no past. A failed read is "error"; a write that failed with the connection or session
lost is "unknown" (it may have been applied); refused for its version, "fail". After a failure
a client waits 0.3-0.7 s. The znodes' `mzxid` is the revision the checker sees.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError

from tests.robustness.history import HistoryWriter, now_ns


def _session(client: KazooClient, index: int) -> str:
    session_id = client.client_id[0] if client.client_id else 0
    return f"zk-{index}-{session_id:x}"


def run_client(
    index: int,
    args: argparse.Namespace,
    history: HistoryWriter,
    lock: threading.Lock,
    stop_at: float,
) -> None:
    rng = random.Random(args.seed * 1000 + index)
    client = KazooClient(hosts=args.hosts, timeout=args.session_timeout)
    client.start(timeout=60)
    versions: dict[str, int] = {}
    pause_s = 1.0 / args.rate
    seq = 0
    try:
        while time.monotonic() < stop_at:
            seq += 1
            key = f"{args.prefix}k{rng.randrange(args.keys)}"
            value = f"zk-{index}-{seq}"
            record: dict[str, Any] = {
                "proto": "zk",
                "session": _session(client, index),
                "key": key,
                "model": "register",
                "call": now_ns(),
            }
            dice = rng.randrange(100)
            try:
                if dice < 45:
                    record["op"] = "get"
                    data, stat = client.get(key)
                    record.update(
                        status="ok",
                        found=True,
                        rvalue=data.decode(),
                        version=stat.version,
                        modrev=stat.mzxid,
                    )
                    versions[key] = stat.version
                elif dice < 75:
                    record.update(op="put", value=value)
                    stat = client.set(key, value.encode())
                    record.update(status="ok", modrev=stat.mzxid)
                else:
                    expect = versions.get(key, 0)
                    record.update(op="cas", value=value, expect=expect)
                    stat = client.set(key, value.encode(), version=expect)
                    record.update(status="ok", modrev=stat.mzxid)
            except BadVersionError as error:
                record.update(status="fail", error=f"BadVersionError: {error}")
            except (KazooException, TimeoutError) as error:
                record["status"] = "error" if record["op"] == "get" else "unknown"
                record["error"] = f"{type(error).__name__}: {error}"
            record["ret"] = now_ns()
            with lock:
                history.add(record)
            if record["status"] in ("error", "unknown"):
                time.sleep(rng.uniform(0.3, 0.7))
            time.sleep(rng.uniform(0, 2 * pause_s))
    finally:
        client.stop()
        client.close()


def create_keys(args: argparse.Namespace, history: HistoryWriter) -> None:
    """Create the znodes (empty), each create in the history as a put by session "zk-setup"."""
    setup = KazooClient(hosts=args.hosts, timeout=args.session_timeout)
    setup.start(timeout=60)
    try:
        parent = args.prefix.rsplit("/", 1)[0]
        if parent:
            setup.ensure_path(parent)
        for n in range(args.keys):
            key = f"{args.prefix}k{n}"
            call = now_ns()
            try:
                _, stat = setup.create(key, b"", include_data=True)
            except NodeExistsError as exc:
                raise SystemExit(
                    f"{key} exists already: give the run a --prefix of its own"
                ) from exc
            history.add({
                "proto": "zk", "session": "zk-setup", "key": key, "model": "register",
                "op": "put", "value": "", "call": call, "ret": now_ns(), "status": "ok",
                "modrev": stat.mzxid,
            })  # fmt: skip
    finally:
        setup.stop()
        setup.close()


def main(args: argparse.Namespace) -> int:
    lock = threading.Lock()
    failures: list[BaseException] = []
    with HistoryWriter(Path(args.out)) as history:
        create_keys(args, history)
        print("STARTED", flush=True)  # the keys exist; the clients connect now
        stop_at = time.monotonic() + args.duration

        def client(i: int) -> None:
            try:
                run_client(i, args, history, lock, stop_at)
            except BaseException as exc:  # reported below; the others run on
                failures.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failures:
        print(f"FAIL: {failures[0]!r}", flush=True)
        return 1
    print("DONE", flush=True)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", required=True, help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--out", required=True)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--keys", type=int, default=6)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=15.0, help="ops/s per client, at most")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prefix", default="/robust/", help="of every znode (a run's keys of its own)")
    p.add_argument("--session-timeout", type=float, default=10.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse()))
