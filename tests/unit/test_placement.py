from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tablekeeper_server.cluster.placement import compute_assignment, moved_containers

pytestmark = pytest.mark.unit


def loads(assignment: dict[str, frozenset[int]]) -> list[int]:
    return sorted(len(c) for c in assignment.values())


def test_first_assignment_spreads_evenly() -> None:
    a = compute_assignment(["s1", "s2", "s3"], 8)
    assert loads(a) == [2, 3, 3]
    assert sorted(c for cs in a.values() for c in cs) == list(range(8))


def test_unchanged_balanced_cluster_moves_nothing() -> None:
    first = compute_assignment(["a", "b", "c"], 10)
    assert compute_assignment(["a", "b", "c"], 10, first) == first


def test_dead_server_containers_move_and_nothing_else() -> None:
    before = {"a": {0, 1, 2}, "b": {3, 4, 5}, "c": {6, 7}}
    after = compute_assignment(["a", "b"], 8, before)
    assert loads(after) == [4, 4]
    assert moved_containers(before, after) == {6, 7}


def test_new_server_takes_only_its_share() -> None:
    before = {"a": set(range(0, 4)), "b": set(range(4, 8))}
    after = compute_assignment(["a", "b", "c"], 8, before)
    assert loads(after) == [2, 3, 3]
    assert len(moved_containers(before, after)) == 2
    assert len(after["c"]) == 2


def test_no_servers_assigns_nothing() -> None:
    assert compute_assignment([], 8, {"a": {1}}) == {}


def test_stale_and_duplicate_previous_entries_are_ignored() -> None:
    a = compute_assignment(["a", "b"], 4, {"a": {0, 1, 9}, "b": {1, 2}})
    assert sorted(c for cs in a.values() for c in cs) == [0, 1, 2, 3]
    assert a["a"] >= {0, 1}


servers_strategy = st.sets(st.sampled_from([f"s{i}" for i in range(8)]), max_size=8)


@settings(max_examples=300)
@given(
    before_servers=servers_strategy,
    after_servers=servers_strategy,
    n=st.integers(min_value=0, max_value=40),
)
def test_properties(before_servers: set[str], after_servers: set[str], n: int) -> None:
    before = compute_assignment(before_servers, n)
    after = compute_assignment(after_servers, n, before)
    if not after_servers or n == 0:
        assert after == {}
        return
    # Every container exactly once, on a live server; loads within one of each other.
    flat = [c for cs in after.values() for c in cs]
    assert sorted(flat) == list(range(n))
    assert set(after) == after_servers
    assert max(loads(after)) - min(loads(after)) <= 1
    # Little movement: only containers of dead servers and the excess of overfull servers
    # (over the smaller share) change owner; unowned containers just get one.
    share = n // len(after_servers)
    must_move = sum(len(cs) for s, cs in before.items() if s not in after_servers) + sum(
        max(0, len(cs) - share) for s, cs in before.items() if s in after_servers
    )
    owned_before = {c for cs in before.values() for c in cs}
    assert len(moved_containers(before, after) & owned_before) <= must_move
    # Idempotent: recomputing with the same membership moves nothing.
    assert compute_assignment(after_servers, n, after) == after
