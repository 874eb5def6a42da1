"""The topics of one namespace: their names, the namespace's policies, creating and deleting them.

A topic's *local name* is its last path element; its full name is
`persistent://<tenant>/<namespace>/<local name>`.
"""

from __future__ import annotations

from tablekeeper_server.pulsar_common.admin import PulsarAdmin


def namespace_policies(*, retention_minutes: int, retention_mb: int) -> dict[str, object]:
    """Policies both backends set (admin path -> JSON body): the given retention (0/0: deleted
    once every subscription acknowledged it; -1/-1: kept forever), message TTL 0 (never
    acknowledged on age), no automatic topic creation, inactive topics never deleted."""
    return {
        "retention": {
            "retentionTimeInMinutes": retention_minutes,
            "retentionSizeInMB": retention_mb,
        },
        "messageTTL": 0,
        "autoTopicCreation": {"allowAutoTopicCreation": False},
        "inactiveTopicPolicies": {
            "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
            "maxInactiveDurationSeconds": 3600,
            "deleteWhileInactive": False,
        },
    }


class NamespaceTopics:
    """Topics in `tenant/namespace`, created there with `policies` applied on first use."""

    def __init__(
        self, admin: PulsarAdmin, tenant: str, namespace: str, policies: dict[str, object]
    ) -> None:
        self.admin = admin
        self.tenant = tenant
        self.namespace = namespace
        self._policies = policies
        self._ready = False

    def topic(self, local: str) -> str:
        """The full topic name of `local`."""
        return f"{self.prefix}{local}"

    @property
    def prefix(self) -> str:
        """What every full topic name of the namespace starts with."""
        return f"persistent://{self.tenant}/{self.namespace}/"

    def path(self, local: str) -> str:
        """The admin REST path of topic `local`."""
        return self.admin.topic_path(self.tenant, self.namespace, local)

    def ensure_namespace(self) -> None:
        """Create the namespace and apply its policies, once per instance."""
        if self._ready:
            return
        self.admin.ensure_namespace(self.tenant, self.namespace, self._policies)
        self._ready = True

    def create(self, local: str) -> None:
        """Create topic `local` (and the namespace); no-op if it exists."""
        self.ensure_namespace()
        self.admin.call("PUT", self.path(local), allow=(409,))

    def delete(self, local: str) -> None:
        """Delete topic `local` with its subscriptions; no-op if it does not exist."""
        self.admin.call("DELETE", f"{self.path(local)}?force=true", allow=(404,))

    def list(self) -> list[str]:
        """The local names of the namespace's persistent topics."""
        self.ensure_namespace()
        _, body = self.admin.call("GET", f"/admin/v2/persistent/{self.tenant}/{self.namespace}")
        prefix = self.prefix
        return [t[len(prefix) :] for t in body or () if isinstance(t, str) and t.startswith(prefix)]
