"""A private network on this machine for a cluster under test: one network namespace per node,
all plugged into a bridge, and network partitions between them (nftables).

    with Network.create() as net:
        zk = net.add_node("zk")                 # Node(name, netns, address)
        s0 = net.add_node("s0")
        ... start processes with `ip netns exec s0.netns ...`, binding s0.address ...
        net.cut(s0, [zk])                       # s0 and zk no longer reach each other
        net.heal(s0)

Layout: a hub namespace holds the bridge; every node namespace has one veth (`eth0`, its one
address in 10.213.X.0/24) whose other end is a port of the bridge; the root namespace (where the
test and the clients run) gets one veth into the bridge too, at .1, and a route to the subnet,
nothing else. Nothing here forwards packets anywhere else: the namespaces have no default route,
so the nodes reach each other and the root namespace only.

A cut is a pair of nftables rules in the node's own namespace (drop input from, and output to,
the addresses in a set): both directions stop, established TCP connections hang as across a
real partition, and other namespaces (and the machine) are untouched. Deleting the namespaces
removes everything; `close` does that (and ends nothing else). Names carry the creating
process's id (`tkr<pid>-...`): `reap_stale` removes what a killed earlier run left behind.
Needs root, `ip` (iproute2) and `nft` (nftables).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

PREFIX = "tkr"
SUBNET_PREFIX = "10.213"
NFT_TABLE = "robust"


class NetworkUnavailableError(RuntimeError):
    """This machine cannot make the namespaces (not root, no `ip` or `nft`)."""


def _run(*args: str, input_text: str | None = None) -> str:
    done = subprocess.run(
        list(args), capture_output=True, text=True, input=input_text, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _in(netns: str, *args: str, input_text: str | None = None) -> str:
    return _run("ip", "netns", "exec", netns, *args, input_text=input_text)


def check_available() -> None:
    """Raise `NetworkUnavailableError` saying what is missing."""
    if os.geteuid() != 0:
        raise NetworkUnavailableError("network namespaces need root")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            raise NetworkUnavailableError(
                f"`{tool}` is not installed (make robustness-tools installs iproute2 and nftables)"
            )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    """Every network namespace name on this machine."""
    out = _run("ip", "netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    """The processes running in `netns`."""
    try:
        out = _run("ip", "netns", "pids", netns)
    except RuntimeError:
        return []
    return [int(p) for p in out.split()]


def reap_stale() -> list[str]:
    """Remove the namespaces (and the processes in them, and the root-side veth) of earlier runs
    whose creating process is gone. Returns the namespaces removed."""
    removed = []
    for name in namespaces():
        if not name.startswith(PREFIX) or "-" not in name:
            continue
        owner = name[len(PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)):
            continue
        for pid in netns_pids(name):  # processes an earlier run of ours left in its namespace
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        with contextlib.suppress(RuntimeError):
            _run("ip", "netns", "delete", name)
        with contextlib.suppress(RuntimeError):
            _run("ip", "link", "delete", f"{PREFIX}{owner}h")
        removed.append(name)
    return removed


@dataclass(frozen=True)
class Node:
    name: str
    netns: str
    address: str


@dataclass
class Network:
    tag: str
    """`tkr<pid>`: the prefix of every name this network made."""
    subnet: str
    """`10.213.X`: the nodes are .2, .3, ...; the root namespace is .1."""
    host_address: str
    nodes: dict[str, Node] = field(default_factory=dict)
    _cut: dict[str, set[str]] = field(default_factory=dict)
    _closed: bool = False

    @classmethod
    def create(cls) -> Network:
        """Make the hub and the root namespace's way in. `NetworkUnavailableError` if the
        machine cannot; anything made is removed again if a step fails."""
        check_available()
        reap_stale()
        tag = f"{PREFIX}{os.getpid()}"
        subnet = _free_subnet()
        net = cls(tag, subnet, f"{subnet}.1")
        try:
            hub = net.hub
            _run("ip", "netns", "add", hub)
            _in(hub, "ip", "link", "set", "lo", "up")
            _in(hub, "ip", "link", "add", "br0", "type", "bridge")
            _in(hub, "ip", "link", "set", "br0", "up")
            root_side = f"{tag}h"
            _run(
                "ip", "link", "add", root_side, "type", "veth", "peer", "name", "up0", "netns", hub
            )
            _in(hub, "ip", "link", "set", "up0", "master", "br0")
            _in(hub, "ip", "link", "set", "up0", "up")
            _run("ip", "addr", "add", f"{net.host_address}/24", "dev", root_side)
            _run("ip", "link", "set", root_side, "up")
        except BaseException:
            net.close()
            raise
        return net

    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    def add_node(self, name: str) -> Node:
        """A namespace `tkr<pid>-<name>` plugged into the bridge, with lo up, one address, and
        an empty nftables cut set."""
        index = len(self.nodes) + 2
        node = Node(name, f"{self.tag}-{name}", f"{self.subnet}.{index}")
        port = f"p{index}"
        _run("ip", "netns", "add", node.netns)
        self.nodes[name] = node
        _in(node.netns, "ip", "link", "set", "lo", "up")
        _run(
            "ip", "link", "add", "eth0", "netns", node.netns, "type", "veth",
            "peer", "name", port, "netns", self.hub,
        )  # fmt: skip
        _in(self.hub, "ip", "link", "set", port, "master", "br0")
        _in(self.hub, "ip", "link", "set", port, "up")
        _in(node.netns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
        _in(node.netns, "ip", "link", "set", "eth0", "up")
        _in(
            node.netns,
            "nft",
            "-f",
            "-",
            input_text=f"""
table inet {NFT_TABLE} {{
    set cut {{ type ipv4_addr; }}
    chain input {{ type filter hook input priority 0; policy accept; ip saddr @cut drop; }}
    chain output {{ type filter hook output priority 0; policy accept; ip daddr @cut drop; }}
}}
""",
        )
        self._cut[name] = set()
        return node

    def cut(self, node: Node, others: Iterable[Node | str]) -> None:
        """`node` stops reaching `others` (nodes, or addresses such as `host_address`: the
        clients and the test) and they it, in both directions, until `heal`."""
        addresses = {o.address if isinstance(o, Node) else o for o in others}
        addresses -= self._cut[node.name]
        if not addresses:
            return
        _in(node.netns, "nft", "add", "element", "inet", NFT_TABLE, "cut",
            "{ " + ", ".join(sorted(addresses)) + " }")  # fmt: skip
        self._cut[node.name] |= addresses

    def heal(self, node: Node | None = None) -> None:
        """Undo every cut of `node` (None: of every node)."""
        for name in [node.name] if node is not None else list(self.nodes):
            if self._cut.get(name):
                _in(self.nodes[name].netns, "nft", "flush", "set", "inet", NFT_TABLE, "cut")
                self._cut[name] = set()

    def cuts(self) -> dict[str, Sequence[str]]:
        """Node name -> the addresses it is cut from now."""
        return {name: sorted(addresses) for name, addresses in self._cut.items() if addresses}

    def close(self) -> None:
        """Kill whatever still runs in the nodes' namespaces (processes of this test: callers
        stop theirs first, this is the last resort), delete every namespace and the root-side
        veth. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        for node in self.nodes.values():
            for pid in netns_pids(node.netns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        for name in [n.netns for n in self.nodes.values()] + [self.hub]:
            with contextlib.suppress(RuntimeError):
                _run("ip", "netns", "delete", name)
        with contextlib.suppress(RuntimeError):
            _run("ip", "link", "delete", f"{self.tag}h")

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _free_subnet() -> str:
    """A 10.213.X that no route of the root namespace uses (another run's network)."""
    routes = _run("ip", "-4", "route", "show")
    used = {
        int(word.split(".")[2])
        for word in routes.split()
        if word.startswith(f"{SUBNET_PREFIX}.") and word.count(".") == 3
    }
    start = os.getpid() % 200
    for offset in range(250):
        x = (start + offset) % 250 + 1
        if x not in used:
            return f"{SUBNET_PREFIX}.{x}"
    raise NetworkUnavailableError(f"no free {SUBNET_PREFIX}.X/24 subnet")
