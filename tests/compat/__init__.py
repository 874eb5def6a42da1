"""The unmodified apache-bookkeeper-client against a real TableKeeper server.

These tests run in their own pytest process (`make test-compat`): the client's generated protobuf
modules register the same `bookkeeper.proto.*` symbols as `tablekeeper_proto`, so nothing here may
import `tablekeeper`, `tablekeeper_proto` or `tablekeeper_server`, directly or through a helper.
"""

import pytest

pytestmark = pytest.mark.compat
