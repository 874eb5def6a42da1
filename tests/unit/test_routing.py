from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tablekeeper_server.core.names import invalid_name_reason
from tablekeeper_server.core.routing import (
    INT64_MAX,
    INT64_MIN,
    RangeRouter,
    routing_hash,
    split_hash_space,
)

pytestmark = pytest.mark.unit


def test_routing_hash_matches_bookkeeper_vector() -> None:
    assert routing_hash(b"foo") == -2336792112830167536


def test_split_of_four_ranges_matches_bookkeeper() -> None:
    ranges = split_hash_space(4)
    assert [(r.start, r.end) for r in ranges] == [
        (-9223372036854775808, -4611686018427387905),
        (-4611686018427387905, -2),
        (-2, 4611686018427387901),
        (4611686018427387901, 9223372036854775807),
    ]


@pytest.mark.parametrize(
    ("asked", "got"), [(0, 2), (1, 2), (2, 2), (3, 4), (4, 4), (5, 6), (24, 24)]
)
def test_split_rounds_up_to_even_and_at_least_two(asked: int, got: int) -> None:
    assert len(split_hash_space(asked)) == got


@given(st.integers(min_value=1, max_value=64))
def test_split_is_contiguous_and_covers_the_space(n: int) -> None:
    ranges = split_hash_space(n)
    assert ranges[0].start == INT64_MIN
    assert ranges[-1].end == INT64_MAX
    for left, right in zip(ranges, ranges[1:], strict=False):
        assert left.end == right.start
        assert left.start < left.end


def test_foo_routes_to_the_second_of_four_ranges() -> None:
    ranges = split_hash_space(4)
    router = RangeRouter([r.start for r in ranges], [1024 + i for i in range(4)])
    assert router.route(b"foo") == 1025


@given(st.integers(min_value=INT64_MIN, max_value=INT64_MAX), st.integers(1, 32))
def test_router_finds_the_range_holding_the_hash(hash_value: int, n: int) -> None:
    ranges = split_hash_space(n)
    router = RangeRouter([r.start for r in ranges], list(range(len(ranges))))
    chosen = ranges[router.route_hash(hash_value)]
    assert chosen.start <= hash_value
    assert hash_value < chosen.end or hash_value == INT64_MAX == chosen.end


@pytest.mark.parametrize("name", ["a", "app/users", "ns-1_x.y", "名前"])
def test_valid_names(name: str) -> None:
    assert invalid_name_reason(name) is None


@pytest.mark.parametrize("name", ["", "a b", "a<b", "a>b", "a\0b", "a\x01b", "a\x85b", "a\ue000b"])
def test_invalid_names(name: str) -> None:
    assert invalid_name_reason(name) is not None


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_an_exact_split_has_n_equal_ranges_and_matches_bookkeeper_for_even_n(n: int) -> None:
    ranges = split_hash_space(n, exact=True)
    assert len(ranges) == n
    assert ranges[0].start == INT64_MIN and ranges[-1].end == INT64_MAX
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:], strict=False))
    if n % 2 == 0:
        assert ranges == split_hash_space(n)
