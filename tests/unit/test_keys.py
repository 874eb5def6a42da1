from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tablekeeper_server.core.keys import SYSTEM_PREFIX, pkey_prefix, prefix_end, store_key

pytestmark = pytest.mark.unit


@given(st.binary(max_size=20), st.binary(max_size=20), st.binary(max_size=20))
def test_a_pkey_range_never_holds_another_pkeys_keys(
    pkey: bytes, other: bytes, lkey: bytes
) -> None:
    prefix = pkey_prefix(pkey)
    key = store_key(other, lkey)
    inside = prefix <= key < prefix_end(prefix)
    assert inside == (other == pkey)


@given(st.binary(min_size=1, max_size=20), st.binary(max_size=20))
def test_data_keys_never_collide_with_system_keys(pkey: bytes, lkey: bytes) -> None:
    assert not store_key(pkey, lkey).startswith(SYSTEM_PREFIX)
    assert not store_key(b"", lkey).startswith(SYSTEM_PREFIX)


@given(st.binary(max_size=8), st.binary(max_size=8), st.binary(max_size=8))
def test_lkey_order_is_preserved_within_a_pkey(pkey: bytes, a: bytes, b: bytes) -> None:
    assert (store_key(pkey, a) < store_key(pkey, b)) == (a < b)
