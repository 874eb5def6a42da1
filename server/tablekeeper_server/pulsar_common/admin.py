"""The few Pulsar admin REST calls we need, over `urllib` (JSON in, JSON out)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tablekeeper_server.errors import UnavailableError


class PulsarAdmin:
    """Calls to the admin REST API at `admin_url` (`http://host:8080`)."""

    def __init__(self, admin_url: str, *, timeout_s: float = 10.0) -> None:
        self.url = admin_url.rstrip("/")
        self.timeout_s = timeout_s

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        allow: tuple[int, ...] = (),
        timeout_s: float | None = None,
    ) -> tuple[int, Any]:
        """Return (status, decoded JSON body or None). 2xx and the `allow`ed statuses are
        returned; anything else, and any connection problem, raises `UnavailableError`."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as response:
                status, raw = int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            status, raw = int(exc.code), exc.read()
            if status not in allow:
                reason = raw.decode(errors="replace")[:300]
                raise UnavailableError(
                    f"pulsar admin {method} {path}: HTTP {status}: {reason}"
                ) from None
        except (OSError, ValueError) as exc:
            raise UnavailableError(f"pulsar admin {method} {path} failed: {exc}") from exc
        try:
            decoded = json.loads(raw) if raw.strip() else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return status, decoded

    def ensure_namespace(self, tenant: str, namespace: str, policies: dict[str, object]) -> None:
        """Create `tenant/namespace` if absent and (re)apply `policies` (path -> JSON body)."""
        base = f"/admin/v2/namespaces/{tenant}/{namespace}"
        self.call("PUT", base, allow=(409,))
        for policy, body in policies.items():
            self.call("POST", f"{base}/{policy}", body)

    def topic_path(self, tenant: str, namespace: str, local_name: str) -> str:
        return f"/admin/v2/persistent/{tenant}/{namespace}/{urllib.parse.quote(local_name, '')}"
