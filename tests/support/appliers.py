"""The server's appliers (`tablekeeper_server.appliers.server_appliers`), built once for the
tests that build ranges, state machines, followers and splits by hand, as `main` does."""

from __future__ import annotations

from tablekeeper_server.appliers import server_appliers

APPLIERS = server_appliers()
