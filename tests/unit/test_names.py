"""Namespace and table names: BookKeeper's character rule, a length bound, no `/` in new names."""

from __future__ import annotations

import pytest

from tablekeeper_server.core.names import invalid_name_reason, invalid_new_name_reason, shown

pytestmark = pytest.mark.unit


def test_length_is_bounded_in_utf8_bytes() -> None:
    assert invalid_name_reason("a" * 255) is None
    assert "256 bytes" in (invalid_name_reason("a" * 256) or "")
    assert invalid_name_reason("é" * 127) is None  # 254 bytes
    assert "256 bytes" in (invalid_name_reason("é" * 128) or "")
    assert invalid_name_reason("a" * 20, bytes_max=10) is not None
    assert invalid_name_reason("x" * (4 * 1024 * 1024)) is not None


def test_new_names_may_not_contain_a_slash_lookups_may() -> None:
    assert invalid_name_reason("app/users") is None  # an old table stays reachable
    assert "'/'" in (invalid_new_name_reason("app/users") or "")
    assert invalid_new_name_reason("app-users") is None
    assert invalid_new_name_reason("a b") is not None


def test_long_names_are_cut_in_messages() -> None:
    assert shown("ns") == "'ns'"
    text = shown("n" * 1_000_000)
    assert len(text) < 100 and "1000000 characters" in text
