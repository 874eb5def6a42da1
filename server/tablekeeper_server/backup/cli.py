"""`tablekeeper admin backup` and `tablekeeper admin restore` (entry points of the
`tablekeeper.cli.admin` group: the client's `admin` group finds them when the server package is
installed). Both need it: a backup reads its copy of the catalog with the server's own code,
a restore writes a server's stores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tablekeeper_server.core.clock import SystemClock

_CLOCK = SystemClock()  # progress and elapsed time of an offline command


EXIT_OK, EXIT_USAGE, EXIT_ERROR = 0, 2, 3
PROGRESS_INTERVAL_S = 2.0

BACKUP_HELP = """\
Copy every range of the service (root range, every container's meta range, every table's
data ranges), of one namespace (--namespace) or of one table (--table) into DEST, online:
writes go on while it runs.

Each range is checkpointed when its turn comes (only SSTs written since its last checkpoint
are uploaded to the server's checkpoint store) and that checkpoint is copied, so each range is
a consistent cut at one log position (its revision), holding every write acknowledged before
the backup started. Ranges are cut one after another, not at one instant: see the README,
"Backup and restore", for what that promises across ranges.

DEST is a new (or empty) directory: backup.json (the manifest: ranges, their positions, every
file's size and SHA-256) and ranges/<range>/<files>. With --archive DEST is one file instead
(a tar plus a SHA-256 trailer, the layout `etcdctl snapshot save` writes from TableKeeper's
etcd port). Every file is checked against its SHA-256 as it arrives; the manifest is written
last, so a backup cut short is refused by `admin restore`.

Progress goes to stderr (-q: none); the summary to stdout (-o json: one JSON object)."""

RESTORE_HELP = """\
Restore a backup (a directory from `admin backup`, an archive from `admin backup --archive`,
or a file from `etcdctl snapshot save` against TableKeeper's etcd port) into the stores of a
server that is not running. It takes the server's own settings (flags, TOML file,
environment), so it writes where that server reads: --data-dir, --wal-dir, --checkpoint-dir,
or --log pulsar / --checkpoint-store pulsar with their --pulsar-* settings.

Every file's size and SHA-256 is checked first; a damaged, truncated or incomplete backup is
refused naming the file and what is wrong, before anything is written. A target that holds
data is refused unless --force (which deletes it). Each range is written as its only
checkpoint; start the server afterwards and every range restores from it, continuing its
revisions from the backup's position. A namespace or table backup leaves exactly its tables
(the restored catalog's other namespaces and tables are deleted).

Cluster mode: restore once, before the cluster's servers start, into the stores they share
(--log pulsar --checkpoint-store pulsar, or a shared --checkpoint-dir), with --containers at
least the backup's (`tablekeeper cluster init --containers N` the same); see the README."""


def register_backup(actions: Any, common: argparse.ArgumentParser) -> None:
    """Add `backup` to the client's `admin` group (`actions`: its subparsers; `common`: the
    parser of the CLI's global flags, --service, --tls-*, --token, -o)."""
    backup = actions.add_parser(
        "backup",
        parents=[common],
        help="copy the service, a namespace or a table into a backup, online",
        description=BACKUP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backup.add_argument("dest", type=Path, metavar="DEST", help="new directory (or file)")
    scope = backup.add_mutually_exclusive_group()
    scope.add_argument("--namespace", metavar="NS", help="only this namespace's tables")
    scope.add_argument("--table", metavar="NS/TABLE", help="only this table")
    backup.add_argument(
        "--archive", action="store_true", help="write one file (tar + SHA-256) instead"
    )
    backup.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    backup.set_defaults(run=_backup)


def register_restore(actions: Any, common: argparse.ArgumentParser) -> None:
    """Add `restore` to the client's `admin` group (the server's flags, not the client's)."""
    from tablekeeper_server.config import HELP_EPILOG, add_server_arguments

    restore = actions.add_parser(
        "restore",
        help="restore a backup into a server that is not running (its flags say where)",
        description=RESTORE_HELP,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    restore.add_argument("backup", type=Path, metavar="BACKUP", help="directory or file")
    restore.add_argument(
        "--force", action="store_true", help="delete the data the target holds, then restore"
    )
    restore.add_argument(
        "--check-only", action="store_true", help="check the backup's files; restore nothing"
    )
    restore.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "table"),
        default=argparse.SUPPRESS,
        help="json: the summary as one JSON object",
    )
    restore.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    add_server_arguments(restore)
    restore.set_defaults(run=_restore)


def _say(args: argparse.Namespace) -> Any:
    quiet = bool(getattr(args, "quiet", False))

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    return say


# ---------------------------------------------------------------------------------- backup


def _endpoints(service: str) -> list[str]:
    scheme, sep, rest = service.partition("://")
    if not sep or scheme != "bk" or not rest:
        raise ValueError(f"service URI {service!r}: expected bk://HOST:PORT[,HOST:PORT...]")
    return [e for e in rest.rstrip("/").split(",") if e]


def _channel(args: argparse.Namespace, endpoint: str) -> Any:
    import grpc

    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    if not (args.tls_ca or args.tls_cert):
        return grpc.aio.insecure_channel(endpoint, options=options)

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    credentials = grpc.ssl_channel_credentials(
        read(args.tls_ca), read(args.tls_key), read(args.tls_cert)
    )
    return grpc.aio.secure_channel(endpoint, credentials, options=options)


def _backup(args: argparse.Namespace) -> int:
    from tablekeeper_server.backup.format import BackupError

    say = _say(args)
    try:
        manifest, seconds = asyncio.run(_take(args, say))
    except BackupError as exc:
        print(f"error: backup failed: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: backup failed: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        details = exc.details() if hasattr(exc, "details") else str(exc)
        code = exc.code().name if hasattr(exc, "code") else type(exc).__name__
        print(f"error: backup failed: {code}: {details}", file=sys.stderr)
        return EXIT_ERROR
    summary = {
        "backup": str(args.dest),
        "scope": manifest.scope or "(whole service)",
        "ranges": len(manifest.ranges),
        "tables": len(manifest.tables),
        "files": sum(len(r.files) for r in manifest.ranges),
        "bytes": manifest.size,
        "seconds": round(seconds, 3),
    }
    if getattr(args, "output", "text") == "json":
        print(json.dumps(summary))
    else:
        print(
            f"backup {args.dest}: {summary['scope']}, {summary['ranges']} ranges "
            f"({summary['tables']} tables), {summary['files']} files, "
            f"{manifest.size / 2**20:.1f} MiB in {seconds:.1f} s"
        )
    return EXIT_OK


async def _take(args: argparse.Namespace, say: Any) -> Any:
    from tablekeeper_proto.v1 import admin_pb2, admin_pb2_grpc
    from tablekeeper_server.backup.format import ArchiveSink, BackupError, DirectorySink, Sink
    from tablekeeper_server.backup.take import BackupTaker, Scope
    from tablekeeper_server.storage.rocksdb import RocksKvStore

    scope = Scope()
    if args.table:
        namespace, sep, table = args.table.partition("/")
        if not sep or not namespace or not table:
            raise ValueError(f"--table {args.table!r}: expected NAMESPACE/TABLE")
        scope = Scope(namespace, table)
    elif args.namespace:
        scope = Scope(args.namespace)
    endpoint = _endpoints(args.service)[0]
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    channel = _channel(args, endpoint)
    stub = admin_pb2_grpc.AdminStub(channel)
    status = await stub.Status(admin_pb2.StatusRequest(), metadata=metadata, timeout=60)

    def fetch(container_id: int, stream_id: int, range_id: int) -> AsyncIterator[Any]:
        request = admin_pb2.BackupRangeRequest(
            container_id=container_id, stream_id=stream_id, range_id=range_id
        )
        return stub.BackupRange(request, metadata=metadata)  # type: ignore[no-any-return]

    sink: Sink
    out = None
    dest: Path = args.dest
    if args.archive:
        if dest.exists():
            raise BackupError(str(dest), "exists; a backup never overwrites, choose another")
        partial = dest.with_name(f".{dest.name}.part")
        out = open(partial, "wb")  # noqa: SIM115 (closed below)
        sink = ArchiveSink(out)
    else:
        sink = DirectorySink(dest)
    started = _CLOCK.monotonic_s()
    progress = _Progress(say)
    taker = BackupTaker(
        fetch,
        sink,
        scratch=Path(os.environ.get("TMPDIR", "/tmp")) / f"tablekeeper-backup-{uuid.uuid4().hex}",
        opener=RocksKvStore,
        progress=progress,
    )
    from importlib.metadata import version

    say(f"backup of {str(scope) or 'the whole service'} from {args.service} into {dest}")
    try:
        manifest = await taker.take(
            scope,
            num_containers=status.num_storage_containers,
            source=args.service,
            version=version("tablekeeper"),
        )
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            out = None
            os.replace(partial, dest)
    finally:
        if out is not None:
            out.close()
            partial.unlink(missing_ok=True)
        await channel.close()
    return manifest, _CLOCK.monotonic_s() - started


class _Progress:
    """Progress lines on stderr: each range when done, and bytes every few seconds."""

    def __init__(self, say: Any) -> None:
        self._say = say
        self._said = _CLOCK.monotonic_s()

    def __call__(self, event: Any) -> None:
        from tablekeeper_server.backup.take import BytesCopied

        if isinstance(event, BytesCopied):
            now = _CLOCK.monotonic_s()
            if now - self._said >= PROGRESS_INTERVAL_S and event.size:
                self._said = now
                self._say(
                    f"  {event.name}: {event.done / 2**20:.1f} of {event.size / 2**20:.1f} MiB"
                )
            return
        entry = event.entry
        what = {"root": "root range", "meta": f"meta range of container {entry.container_id}"}
        label = what.get(entry.kind, f"{entry.table} range {entry.range_id}")
        self._said = _CLOCK.monotonic_s()
        self._say(
            f"[{event.index}/{event.total}] {label}: {len(entry.files)} files, "
            f"{entry.size / 2**20:.1f} MiB, cut at position {entry.applied_sequence} "
            f"({event.seconds:.1f} s)"
        )


# ---------------------------------------------------------------------------------- restore


def _restore(args: argparse.Namespace) -> int:
    from tablekeeper_server.backup.format import BackupError, open_backup
    from tablekeeper_server.backup.restore import RestoreRefusedError, check_backup, restore
    from tablekeeper_server.config import config_from_settings, resolve_settings

    say = _say(args)
    try:
        config = config_from_settings(resolve_settings(args, os.environ))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        backup = open_backup(args.backup)
    except BackupError as exc:
        print(f"error: refusing the backup: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        manifest = backup.manifest
        say(
            f"backup {args.backup}: {manifest.scope or 'the whole service'}, "
            f"{len(manifest.ranges)} ranges, {len(manifest.tables)} tables, "
            f"{manifest.size / 2**20:.1f} MiB, taken from {manifest.source or '?'}"
        )
        check_backup(backup, say)
        if args.check_only:
            return EXIT_OK
        result = restore(backup, config, force=args.force, say=say)
    except BackupError as exc:
        print(f"error: refusing the backup: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except RestoreRefusedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        backup.close()
    if getattr(args, "output", "text") == "json":
        print(
            json.dumps(
                {
                    "backup": str(args.backup),
                    "data_dir": str(config.data_dir),
                    "ranges": result.ranges,
                    "tables": result.tables,
                    "files": result.files,
                    "bytes": result.bytes,
                    "pruned": list(result.pruned),
                    "seconds": round(result.seconds, 3),
                }
            )
        )
    else:
        print(
            f"restored {result.ranges} ranges ({result.tables} tables, {result.files} files, "
            f"{result.bytes / 2**20:.1f} MiB) into {config.data_dir} in {result.seconds:.1f} s; "
            "start the server with the same settings"
        )
    return EXIT_OK
