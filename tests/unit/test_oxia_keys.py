"""Oxia's key order and its store encoding (`tablekeeper_server.oxia.keys`)."""

from __future__ import annotations

import functools
import random

import pytest

from tablekeeper_server.oxia import keys


@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        ("a", "b"),
        ("b", "a/b"),  # a key that ends at a level sorts before any deeper key
        ("a/z", "a/b/c"),
        ("a/", "a/a"),
        ("a/", "a//"),
        ("a/b", "a//"),  # the children of a lie in [a/, a//)
        ("a//", "a/b/"),
        ("a", "a\x00"),
        ("a\x00", "a\x01"),
        ("a/b", "a\x00/b"),
        ("", "a"),
        ("x/y", "x0/y"),
    ],
)
def test_order(smaller: str, larger: str) -> None:
    assert keys.compare(smaller, larger) == -1
    assert keys.compare(larger, smaller) == 1
    assert keys.encode(smaller) < keys.encode(larger)


def test_encoding_preserves_the_order_and_decodes() -> None:
    rng = random.Random(7)
    alphabet = ["a", "b", "/", "\x00", "\x01", "\xff", "é", "z", "-"]
    generated = {
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(5000)
    }
    for key in generated:
        assert keys.decode(keys.encode(key)) == key
        assert keys.from_store_key(keys.store_key(key)) == key
    by_oxia = sorted(generated, key=functools.cmp_to_key(keys.compare))
    assert by_oxia == sorted(generated, key=keys.encode)


def test_decode_refuses_what_encode_never_makes() -> None:
    for raw in (b"", b"\x03a", b"\x02a", b"\x02a\x00\x05", b"\x02a\x00\x01", b"\x02a\x00"):
        with pytest.raises(ValueError):
            keys.decode(raw)


def test_a_listing_decodes_each_key_as_decode_does() -> None:
    """`decode_children` (one step for the keys of the listed directory) and `decode` (every
    key in full) agree on every key of a span, whichever directory the span starts in."""
    rng = random.Random(11)
    alphabet = ["a", "b", "/", "\x00", "\xff", "é", "\U0001f600", "", "x/y", "//"]
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(3000)}
    stored = sorted(keys.store_key(name) for name in names)
    for start in ["", "/", "a/", "a/b", "x/y/", "\x00/", "//", "é/\U0001f600"]:
        low = keys.store_key(start)
        span = [key for key in stored if key >= low]
        assert keys.decode_children(span, start) == [keys.from_store_key(k) for k in span]
