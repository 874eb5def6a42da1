"""Watch fan-out and session capacity of one standalone server.

    .venv/bin/python benchmarks/watch_sessions.py [--watchers 1000] [--events 500]
        [--sessions 100000] [--client-procs 4] [--streams shared,per-watch]

Watch fan-out: W watchers (spread over P client processes, one channel each) watch one pkey
(one range); one writer puts E values one after another; every watcher records when each event
arrived, and the delay is measured from the put's acknowledgement (its commit, as the writer
sees it) to delivery. Prints events/s delivered
(all watchers together) and p50/p99 delay. `--streams`: how the SDK carries the watches, each
mode run in turn against the same server: `shared` (the default: a client's watches of a table
share one `WatchMany` stream) and `per-watch` (a stream per watch, what the SDK does against a
server without `WatchMany`).

Sessions: creates S sessions (TTL 120 s) on one range through the Create RPC, then keeps every one
alive through a few KeepAlive streams (one stream carries many sessions) for two rounds, and
reports the server's RSS growth per session and keep-alives/s.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tablekeeper import AsyncClient  # noqa: E402
from tablekeeper_proto.v1 import session_pb2, session_pb2_grpc  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

NS, TABLE, PKEY = "bench", "watch", "hot"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _watchers(
    service: str, n: int, events: int, per_watch: bool, ready: object, out: object
) -> None:
    async with AsyncClient(service, channel_options=[("grpc.use_local_subchannel_pool", 1)]) as c:
        c._context.watch_streams_unsupported = per_watch  # a stream per watch, as before
        table = await c.table(NS, TABLE)
        received: list[tuple[int, float]] = []
        watches = [table.watch(PKEY, start=b"") for _ in range(n)]
        await asyncio.gather(*(w.start() for w in watches))
        ready.set()  # type: ignore[attr-defined]

        async def one(watch: object) -> None:
            got = 0
            async for event in watch:  # type: ignore[attr-defined]
                received.append((int(event.kv.value), time.time()))
                got += 1
                if got == events:
                    break

        started = time.perf_counter()
        await asyncio.gather(*(one(w) for w in watches))
        elapsed = time.perf_counter() - started
        for w in watches:
            await w.close()
        out.put((len(received), elapsed, received))  # type: ignore[attr-defined]


def _watcher_proc(
    service: str, n: int, events: int, per_watch: bool, ready: object, out: object
) -> None:
    asyncio.run(_watchers(service, n, events, per_watch, ready, out))


async def _writer(service: str, events: int) -> tuple[float, list[float]]:
    """Puts `events` values (their index) one after another; returns the time taken and each
    put's acknowledgement time (the commit as the client sees it)."""
    async with AsyncClient(service) as client:
        table = await client.table(NS, TABLE)
        acked: list[float] = []
        started = time.perf_counter()
        for i in range(events):
            await table.put(PKEY, f"k{i % 100}", str(i))
            acked.append(time.time())
        return time.perf_counter() - started, acked


def watch_fanout(
    service: str, watchers: int, events: int, procs: int, per_watch: bool
) -> dict[str, float | str]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(procs)]
    workers = [
        ctx.Process(
            target=_watcher_proc, args=(service, watchers // procs, events, per_watch, r, out)
        )
        for r in readies
    ]
    for w in workers:
        w.start()
    for r in readies:
        r.wait(120)
    write_s, acked = asyncio.run(_writer(service, events))
    results = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    delivered = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    # Delay from the put's acknowledgement to delivery (negative: delivered before the writer
    # saw its own acknowledgement).
    delays = sorted(t - acked[i] for r in results for i, t in r[2])
    return {
        "streams": "per-watch" if per_watch else "shared",
        "watchers": watchers,
        "events_written": events,
        "write_s": write_s,
        "delivered": delivered,
        "delivered_per_s": delivered / elapsed,
        "p50_ms": 1000 * statistics.median(delays),
        "p99_ms": 1000 * delays[int(0.99 * (len(delays) - 1))],
    }


async def sessions(service: str, pid: int, count: int) -> dict[str, float]:
    async with AsyncClient(service) as client:
        table = await client.table(NS, TABLE)
        stub = client._stub("sessions", session_pb2_grpc.SessionsStub)
        await table.put(PKEY, "warm", "x")
        rss_before = _rss_kib(pid)
        sem = asyncio.Semaphore(512)
        ids: list[int] = []

        async def create() -> None:
            async with sem:
                request = session_pb2.CreateSessionRequest(
                    stream_id=table.info.table_id, pkey=PKEY.encode(), ttl_ms=120_000
                )
                ids.append((await stub.Create(request)).session_id)

        started = time.perf_counter()
        await asyncio.gather(*(create() for _ in range(count)))
        create_s = time.perf_counter() - started
        rss_after = _rss_kib(pid)

        streams = 8
        per = [ids[i::streams] for i in range(streams)]

        async def keep_alive(chunk: list[int]) -> int:
            def requests() -> object:
                for session_id in chunk:
                    yield session_pb2.KeepAliveRequest(
                        stream_id=table.info.table_id, pkey=PKEY.encode(), session_id=session_id
                    )

            answered = 0
            async for _ in stub.KeepAlive(requests()):
                answered += 1
            return answered

        started = time.perf_counter()
        answered = 0
        for _ in range(2):
            answered += sum(await asyncio.gather(*(keep_alive(c) for c in per)))
        keep_s = time.perf_counter() - started
        return {
            "sessions": count,
            "create_per_s": count / create_s,
            "rss_growth_mib": (rss_after - rss_before) / 1024,
            "bytes_per_session": (rss_after - rss_before) * 1024 / count,
            "keepalives": answered,
            "keepalives_per_s": answered / keep_s,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--streams", default="shared", help="shared, per-watch, or both (a,b)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "data").start()
        try:
            assert server.process is not None

            async def setup() -> None:
                async with AsyncClient(server.service) as client:
                    await client.create_namespace(NS)
                    await client.create_table(NS, TABLE, ranges=2)

            asyncio.run(setup())
            for mode in args.streams.split(",") if args.watchers else ():
                if mode not in ("shared", "per-watch"):
                    parser.error(f"--streams: {mode!r} is not shared or per-watch")
                per_watch = mode == "per-watch"
                print(
                    watch_fanout(
                        server.service, args.watchers, args.events, args.client_procs, per_watch
                    )
                )
            if args.sessions:
                print(asyncio.run(sessions(server.service, server.process.pid, args.sessions)))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
