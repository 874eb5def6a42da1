"""Password hashes of etcd users: salted scrypt, verified in constant time, never plaintext."""

from __future__ import annotations

import pytest

from tablekeeper_server.security.passwords import NO_PASSWORD, hash_password, verify_password

pytestmark = pytest.mark.unit


def test_a_hash_verifies_its_password_only() -> None:
    record = hash_password("correct horse")
    assert b"correct horse" not in record and record.startswith(b"scrypt$")
    assert verify_password(record, "correct horse")
    assert not verify_password(record, "correct hors")
    assert not verify_password(record, "")
    assert hash_password("correct horse") != record  # a fresh salt each time


def test_damaged_records_and_no_password_users_never_verify() -> None:
    record = hash_password("pw")
    assert not verify_password(NO_PASSWORD, "nopassword")
    assert not verify_password(b"", "pw")
    assert not verify_password(record.replace(b"scrypt", b"bcrypt"), "pw")
    assert not verify_password(record[:-3] + b"zzz", "pw")
    assert not verify_password(b"\xff\xfe", "pw")


def test_empty_and_huge_passwords_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        hash_password("")
    with pytest.raises(ValueError, match="at most"):
        hash_password("x" * 5000)
