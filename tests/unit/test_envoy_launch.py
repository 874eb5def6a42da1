"""The environment a server hands to the Python that Envoy embeds (`rpc.envoy_launch`)."""

from __future__ import annotations

import pytest

from tablekeeper_server.rpc.envoy_launch import embedded_python_environ


def test_the_embedded_pythons_environment_is_the_one_pyvoy_gives() -> None:
    """The launcher builds it itself (pyvoy's own search is slower, see the function); Envoy's
    Python must still find the same packages and preload the same libpython."""
    pyvoy_server = pytest.importorskip("pyvoy._server")
    assert embedded_python_environ() == pyvoy_server.get_envoy_environ()
