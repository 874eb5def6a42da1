"""ZooKeeper's four-letter words, answered on the client port as ZooKeeper answers them: a
connection whose first four bytes spell a command gets its text and is closed.

Served: `ruok` ("imok"), `srvr` and `stat` (version, latency, packets, connections, zxid, mode,
node count; `stat` lists the connections too), `mntr` (tab-separated monitoring values),
`conf` (the port's settings), `isro` ("rw": never read-only). Any other word is not a command
here, so its four bytes read as a packet length far past the limit and the connection closes,
as ZooKeeper does with a word it does not know.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from tablekeeper_server.zookeeper.protocol import VERSION

_INT = struct.Struct(">i")


def code(word: bytes) -> int:
    return int(_INT.unpack(word)[0])


@dataclass
class Stats:
    """What the words report about the server (a snapshot)."""

    received: int
    sent: int
    connections: list[str]
    """One line per connection (`stat`)."""
    outstanding: int
    zxid: int
    nodes: int
    watches: int
    ephemerals: int
    sessions: int
    latency_ms: tuple[float, float, float]
    """min, avg, max."""
    settings: dict[str, str]


WORDS: dict[int, str] = {
    code(w): w.decode() for w in (b"ruok", b"srvr", b"stat", b"mntr", b"conf", b"isro")
}


def answer(word: str, stats: Callable[[], Stats]) -> bytes:
    if word == "ruok":
        return b"imok"
    if word == "isro":
        return b"rw"
    snapshot = stats()
    if word == "conf":
        return "".join(f"{k}={v}\n" for k, v in snapshot.settings.items()).encode()
    low, avg, high = snapshot.latency_ms
    if word == "mntr":
        values = {
            "zk_version": VERSION,
            "zk_server_state": "standalone",
            "zk_avg_latency": f"{avg:.4f}",
            "zk_max_latency": f"{high:.0f}",
            "zk_min_latency": f"{low:.0f}",
            "zk_packets_received": snapshot.received,
            "zk_packets_sent": snapshot.sent,
            "zk_num_alive_connections": len(snapshot.connections),
            "zk_outstanding_requests": snapshot.outstanding,
            "zk_znode_count": snapshot.nodes,
            "zk_watch_count": snapshot.watches,
            "zk_ephemerals_count": snapshot.ephemerals,
            "zk_global_sessions": snapshot.sessions,
            "zk_local_sessions": 0,
        }
        return "".join(f"{k}\t{v}\n" for k, v in values.items()).encode()
    lines = [f"Zookeeper version: {VERSION}"]
    if word == "stat":
        lines.append("Clients:")
        lines.extend(f" {c}" for c in snapshot.connections)
        lines.append("")
    lines += [
        f"Latency min/avg/max: {low:.0f}/{avg:.4f}/{high:.0f}",
        f"Received: {snapshot.received}",
        f"Sent: {snapshot.sent}",
        f"Connections: {len(snapshot.connections)}",
        f"Outstanding: {snapshot.outstanding}",
        f"Zxid: 0x{snapshot.zxid:x}",
        "Mode: standalone",
        f"Node count: {snapshot.nodes}",
    ]
    return ("\n".join(lines) + "\n").encode()
