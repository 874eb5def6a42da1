"""Container placement: a pure function from (live servers, containers, previous assignment) to
the next assignment.

Rules, in order of priority:
1. every container is assigned to exactly one live server (none if there are no servers);
2. loads differ by at most one container;
3. as few containers as possible move: a container stays where it is unless its server died or
   holds more than its share. Shares go to the servers that already hold the most, so a balanced
   cluster whose membership did not change moves nothing, and a dead server's containers are
   reassigned at once (there is no throttle).

Deterministic: ties break by server id, containers are taken lowest id first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Assignment = dict[str, frozenset[int]]
"""server id (its gRPC endpoint) → the containers it owns."""


def compute_assignment(
    servers: Iterable[str],
    num_containers: int,
    previous: Mapping[str, Iterable[int]] | None = None,
) -> Assignment:
    live = sorted(set(servers))
    if not live or num_containers <= 0:
        return {}
    previous = previous or {}
    valid = range(num_containers)
    held: dict[str, list[int]] = {}
    taken: set[int] = set()
    for server in live:
        mine = sorted(c for c in set(previous.get(server, ())) if c in valid and c not in taken)
        held[server] = mine
        taken.update(mine)
    base, extra = divmod(num_containers, len(live))
    by_load = sorted(live, key=lambda s: (-len(held[s]), s))
    quota = {server: base + (1 if i < extra else 0) for i, server in enumerate(by_load)}
    kept: dict[str, list[int]] = {}
    pool = sorted(set(valid) - taken)
    for server in live:
        kept[server] = held[server][: quota[server]]
        pool.extend(held[server][quota[server] :])
    pool.sort()
    result: dict[str, list[int]] = {server: list(kept[server]) for server in live}
    for server in live:
        while len(result[server]) < quota[server]:
            result[server].append(pool.pop(0))
    return {server: frozenset(containers) for server, containers in result.items()}


def moved_containers(before: Mapping[str, Iterable[int]], after: Assignment) -> set[int]:
    """Containers whose owner differs between two assignments (unowned counts as an owner)."""
    owner_before = {c: s for s, cs in before.items() for c in cs}
    owner_after = {c: s for s, cs in after.items() for c in cs}
    return {
        c for c in set(owner_before) | set(owner_after) if owner_before.get(c) != owner_after.get(c)
    }
