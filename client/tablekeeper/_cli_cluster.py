"""`tablekeeper cluster status`: the cluster's state as its servers report it (the Admin
service's ClusterStatus, through `Client.cluster_status`), as a report for people (`-o text`,
`-o table`) or one JSON object (`-o json`; deploy scripts and tests read its keys).

It needs neither ZooKeeper nor the server package: any server of `--service` answers for the
whole cluster (the servers of the URI are tried in order until one answers).
"""

from __future__ import annotations

import json
import time
from typing import Any

from tablekeeper._cli_context import EXIT_OK, CommandContext
from tablekeeper._cli_output import line
from tablekeeper.errors import UnavailableError

EXIT_NOT_READY = 1
"""`cluster status --wait`: the cluster was not ready in time."""
POLL_INTERVAL_S = 0.5
"""How often `--wait` asks again."""


def cluster(ctx: CommandContext) -> int:
    """`cluster status [--wait SECONDS]` (`cluster init` comes with the server package)."""
    wait: float | None = ctx.args.wait
    deadline = time.monotonic() + (wait or 0.0)
    while True:
        try:
            status = ctx.client.cluster_status()
        except UnavailableError:
            # While waiting, servers that are still starting may not answer yet.
            if wait is None or time.monotonic() >= deadline:
                raise
        else:
            if wait is None or status.ready or time.monotonic() >= deadline:
                break
        time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
    if ctx.out.json:
        line(json.dumps(status_doc(status)))
    else:
        for text in report(status):
            line(text)
    return EXIT_NOT_READY if wait is not None and not status.ready else EXIT_OK


def status_doc(status: Any) -> dict[str, Any]:
    """`cluster status -o json`: the facts of the text report. `cluster` is null for a
    standalone server; a live server that could not be asked has its reason (a string) under
    `serving` instead of its containers."""
    owners = []
    for entry in status.containers:
        owned = entry.HasField("owner")
        owners.append(
            {
                "container": entry.container,
                "assigned_to": entry.assigned_to or None,
                "owner": entry.owner.endpoint if owned else None,
                "epoch": entry.owner.epoch if owned else None,
                "released": entry.owner.released if owned else None,
            }
        )
    return {
        "cluster": status.cluster or None,
        "containers": status.num_storage_containers,
        "servers": list(status.servers),
        "controller": status.controller or None,
        "assignment_revision": status.assignment_revision,
        "assignment": {a.server: list(a.containers) for a in status.assignment},
        "serving": {s.server: s.error or list(s.containers) for s in status.serving},
        "owners": owners,
        "ready": status.ready,
        "problems": list(status.problems),
    }


def report(status: Any) -> list[str]:
    """The text report: servers, controller, assignment, what each live server serves, per
    container its assigned server, owner and epoch (`moving` where the owner is not the
    assigned server, `released` where the owner let go of it), and `ready: yes|no (why)`."""
    doc = status_doc(status)
    servers: list[str] = doc["servers"]
    containers = doc["containers"]
    if doc["cluster"] is not None:
        lines = [f"cluster {doc['cluster']}: {containers} storage containers"]
    elif len(servers) == 1:
        lines = [f"standalone server {servers[0]}: {containers} storage containers"]
    else:
        lines = [f"standalone server, {len(servers)} workers: {containers} storage containers"]
    lines.append(f"servers: {', '.join(servers) or '(none)'}")
    lines.append(f"controller: {doc['controller'] or '(none)'}")
    lines.append(f"assignment (revision {doc['assignment_revision']}):")
    lines += [f"  {server}: {owned}" for server, owned in doc["assignment"].items()]
    unassigned = [o["container"] for o in doc["owners"] if o["assigned_to"] is None]
    if unassigned:
        lines.append(f"  unassigned: {unassigned}")
    lines.append("serving (ServerInfo of each live server):")
    lines += [f"  {server}: {serving}" for server, serving in doc["serving"].items()]
    if not servers:
        lines.append("  (no live servers)")
    lines.append("containers:")
    rows: list[tuple[int, str, str, str]] = []
    for owner in doc["owners"]:
        target = owner["assigned_to"] or "-"
        if owner["owner"] is None:
            rows.append((owner["container"], target, "-", "unclaimed" if target != "-" else ""))
        else:
            notes = ["moving"] if owner["owner"] != target else []
            notes += ["released"] if owner["released"] else []
            shown = f"{owner['owner']} ({owner['epoch']})"
            rows.append((owner["container"], target, shown, " ".join(notes)))
    target_width = max([len("assigned to"), *(len(r[1]) for r in rows)])
    owner_width = max([len("owner (epoch)"), *(len(r[2]) for r in rows)])
    lines.append(f"  {'container':>9}  {'assigned to':<{target_width}}  owner (epoch)")
    for container, target, shown, note in rows:
        row = f"  {container:>9}  {target:<{target_width}}  {shown:<{owner_width}}  {note}"
        lines.append(row.rstrip())
    problems = doc["problems"]
    lines.append("ready: yes" if doc["ready"] else f"ready: no ({'; '.join(problems)})")
    return lines


__all__ = ["EXIT_NOT_READY", "cluster", "report", "status_doc"]
