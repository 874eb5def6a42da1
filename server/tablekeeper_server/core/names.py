"""Validation of namespace and table names, as BookKeeper's `validateStreamName` defines it."""

from __future__ import annotations


def invalid_name_reason(name: str) -> str | None:
    """Why `name` is not a valid namespace or table name, or None if it is valid.

    Rejected: the empty string, NUL, space, `<`, `>`, and characters strictly inside the
    intervals (0x00, 0x1f), (0x7f, 0x9f), (0xd800, 0xf8ff) and (0xfff0, 0xffff). `/` is allowed.
    """
    if not name:
        return "name is empty"
    for ch in name:
        c = ord(ch)
        if ch in "\0 <>":
            return f"name contains the character {ch!r}"
        if 0x00 < c < 0x1F or 0x7F < c < 0x9F or 0xD800 < c < 0xF8FF or 0xFFF0 < c < 0xFFFF:
            return f"name contains the disallowed character U+{c:04X}"
    return None
