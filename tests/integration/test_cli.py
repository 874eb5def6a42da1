"""The `tablekeeper` command against real server processes.

Most commands run in this process through `tablekeeper.cli.main` (what the console script
calls), each with its own standard input, output, error and environment, and their exit status:
a Python start per command would cost this module most of its time. What depends on the process
itself runs the installed console script as a subprocess: `--help`, `--version`, usage errors
(`tk_all`), Ctrl-C, `tablekeeper server`, and any `tk(..., process=True)`.

One server is shared by the module (each test uses its own namespace); the metrics / SIGTERM
test starts its own server with `tablekeeper server ...`, as an operator would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tablekeeper import Client
from tablekeeper_server.cluster.zookeeper import ZkCoordinator
from tablekeeper_server.core.clock import SystemClock
from tests.support.cli import cli_env, run_cli
from tests.support.cluster import TestCluster
from tests.support.server import REPO, TABLEKEEPER, ServerProcess, free_port

pytestmark = pytest.mark.integration

if (
    signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    and threading.main_thread() is threading.current_thread()
):
    # A shell ignores Ctrl-C for the jobs it starts in the background (`make test &`), and the
    # commands these tests interrupt would inherit that and never end; a handled signal is
    # reset to its default in a child, so handle it here.
    signal.signal(signal.SIGINT, signal.default_int_handler)

SUBCOMMANDS = [
    "server",
    "import",
    "cluster",
    "ns",
    "table",
    "put",
    "get",
    "incr",
    "del",
    "scan",
    "watch",
    "session",
    "admin",
    "auth",
    "token",
    "completion",
]


def tk(
    *args: str,
    service: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `tablekeeper [--service S] ARGS...`; never raises on a non-zero exit. `env`: extra
    environment variables; `stdin`: bytes for its standard input (else none). In this process
    (see the module) unless `process`: then the console script, `timeout` seconds at most."""
    argv = [str(TABLEKEEPER)]
    if service is not None:
        argv += ["--service", service]
    if not process:
        return run_cli([*argv[1:], *args], env, stdin)
    result = subprocess.run(
        [*argv, *args],
        capture_output=True,
        timeout=timeout,
        cwd=REPO,
        env=cli_env(env),
        input=stdin if stdin is not None else b"",
    )
    return subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode(errors="backslashreplace"),
        result.stderr.decode(errors="backslashreplace"),
    )


def tk_all(*commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run several independent `tablekeeper` commands at once (they are startup-bound)."""
    processes = [
        (
            argv,
            subprocess.Popen(
                [str(TABLEKEEPER), *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env=cli_env(),
            ),
        )
        for argv in commands
    ]
    results = []
    for argv, process in processes:
        stdout, stderr = process.communicate(timeout=60)
        results.append(subprocess.CompletedProcess(argv, process.returncode, stdout, stderr))
    return results


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], code: int, error: str) -> str:
    """Assert the command failed with `code` and `error: <error>...` on stderr; return stderr."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert error in result.stderr, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("cli") / "data").start()
    yield server
    assert server.process is not None
    if server.process.poll() is None:
        server.stop()


@pytest.fixture
def svc(shared_server: ServerProcess) -> str:
    return shared_server.service


# --------------------------------------------------------------------------- help


def test_help_of_every_command() -> None:
    top, *subs = tk_all(["--help"], *([command, "--help"] for command in SUBCOMMANDS))
    out = ok(top)
    assert out.startswith("usage: tablekeeper")
    assert "--service" in out
    for command in SUBCOMMANDS:
        assert re.search(rf"^\s+{command}\s", out, re.MULTILINE), command
    for command, result in zip(SUBCOMMANDS, subs, strict=True):
        out = ok(result)
        assert out.startswith(f"usage: tablekeeper {command}"), out
        assert "-h, --help" in out
    server_help = ok(subs[SUBCOMMANDS.index("server")])
    for option in ("--data-dir", "--port", "--metrics-port", "--containers"):
        assert option in server_help, option
    assert "NAMESPACE/TABLE" in ok(subs[SUBCOMMANDS.index("put")])


def test_every_argument_has_help_text() -> None:
    """Every option and positional of every command (server and cluster included) explains
    itself in --help."""
    from tablekeeper.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            yield path, action
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}")

    missing = [
        f"{path}: {action.option_strings or action.dest}"
        for path, action in walk(build_parser(), "tablekeeper")
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert missing == []
    actions = [a for _, a in walk(build_parser(), "tablekeeper")]
    assert len(actions) > 100  # the walk saw every command


def test_version_and_completion() -> None:
    version, bash_script, zsh_script = tk_all(
        ["--version"], ["completion", "bash"], ["completion", "zsh"]
    )
    assert re.fullmatch(r"tablekeeper \d+\.\d+\.\d+\S*\n", ok(version)), version.stdout
    script = ok(bash_script)
    assert "complete -o default -F _tablekeeper tablekeeper" in script
    assert "bashcompinit" in ok(zsh_script) and script in zsh_script.stdout
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash to run the completion script")
    # Ask the completion function what it offers after each command line (last word = cursor).
    probe = script + textwrap.dedent(
        """
        complete_line() {
            read -ra COMP_WORDS <<< "$1"
            [[ $1 == *" " ]] && COMP_WORDS+=("")
            COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
            COMPREPLY=()
            _tablekeeper
            echo "${COMPREPLY[*]}"
        }
        complete_line "tablekeeper "
        complete_line "tablekeeper ns "
        complete_line "tablekeeper --service bk://h:1 ta"
        complete_line "tablekeeper -o "
        complete_line "tablekeeper ns delete --f"
        complete_line "tablekeeper get app/t key --o"
        complete_line "tablekeeper session "
        complete_line "tablekeeper completion "
        complete_line "tablekeeper cluster status --w"
        """
    )
    result = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=60)
    lines = ok(result).splitlines()
    assert lines[0].split() == [
        "server", "token", "import", "cluster", "ns", "table", "put", "get", "incr", "del",
        "scan", "watch", "session", "admin", "auth", "completion",
    ]  # fmt: skip
    assert lines[1:] == [
        "create get delete list",
        "table",
        "text json table",
        "--force",
        "--output",
        "create keep-alive close",
        "bash zsh",
        "--wait",
    ]


def test_usage_errors_exit_2() -> None:
    results = tk_all(
        [],
        ["frobnicate"],
        ["get", "no-slash", "k"],
        ["incr", "ns/t", "k", "not-a-number"],
        ["ns", "rename", "x"],
        ["scan", "ns/t", "--start", "a"],
        ["watch", "ns/t", "k", "--prefix"],
        ["-o", "xml", "ns", "list"],
        ["ns", "list", "--timeout", "0"],
        ["session", "create", "ns/t", "p"],
        ["put", "ns/t", "k", "v", "--bogus"],
        ["put", "ns/t", "k"],
        ["server", "--containers", "0", "--data-dir", "/nonexistent/never"],
        ["--service", "http://127.0.0.1:1", "ns", "get", "x"],
        ["table", "create", "ns/t", "--ranges", "0"],
        ["table", "create", "ns/t", "--ranges", "-5"],
        ["table", "create", "ns/t", "--ttl", "-1"],
        ["server", "--log-level", "verbose"],
    )
    expected = [
        "usage:",
        "invalid choice",
        "expected NAMESPACE/TABLE",
        "invalid int value",
        "invalid choice",
        "error: --start and --end need a PKEY",
        "error: --prefix needs --pkey",
        "argument -o/--output: invalid choice: 'xml'",
        "argument --timeout: must be > 0 (got 0)",
        "the following arguments are required: --ttl",
        "unrecognized arguments: --bogus",
        "the following arguments are required: value",
        "--containers must be at least 1",
        "error: service URI must start with bk://",
        "--ranges: must be at least 1 (got 0)",
        "--ranges: must be at least 1 (got -5)",
        "--ttl: must be >= 0 (got -1)",
        "--log-level: invalid choice: 'VERBOSE'",
    ]
    for result, message in zip(results, expected, strict=True):
        assert result.returncode == 2, (result.args, result.stderr)
        assert message in result.stderr, (result.args, result.stderr)
        assert result.stdout == "", result.args


def test_server_on_a_taken_port_says_so(shared_server: ServerProcess, tmp_path: Path) -> None:
    """A taken gRPC or metrics port ends the start with exit 2 and one clear line, before the
    new server serves anything (no traceback)."""
    grpc_taken = tk_all(
        ["server", "--data-dir", str(tmp_path / "a"), "--port", str(shared_server.port)],
        [
            "server",
            "--data-dir",
            str(tmp_path / "b"),
            "--port",
            str(free_port()),
            "--metrics-port",
            str(shared_server.metrics_port),
        ],
    )
    for result in grpc_taken:
        assert result.returncode == 2, result.stderr
        assert "cannot start" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on 127.0.0.1:{shared_server.port}" in grpc_taken[0].stderr
    assert "Address already in use" in grpc_taken[1].stderr


# --------------------------------------------------------------------------- admin


def test_namespace_commands(svc: str) -> None:
    out = ok(tk("ns", "create", "cli_ns", service=svc))
    match = re.fullmatch(r"created namespace cli_ns \(id (\d+)\)\n", out)
    assert match, out
    ns_id = match.group(1)
    assert ok(tk("ns", "get", "cli_ns", service=svc)) == f"namespace cli_ns: id {ns_id}\n"
    failed(tk("ns", "create", "cli_ns", service=svc), 3, "error: NamespaceExistsError")
    failed(tk("ns", "create", "bad name", service=svc), 3, "error: InvalidNamespaceNameError")
    assert ok(tk("ns", "delete", "cli_ns", service=svc)) == "deleted namespace cli_ns\n"
    err = failed(tk("ns", "get", "cli_ns", service=svc), 3, "error: NamespaceNotFoundError")
    assert "cli_ns" in err
    failed(tk("ns", "delete", "cli_ns", service=svc), 3, "error: NamespaceNotFoundError")


def test_table_commands(svc: str) -> None:
    ok(tk("ns", "create", "cli_tables", service=svc))
    out = ok(tk("table", "create", "cli_tables/t", "--ranges", "6", service=svc))
    match = re.fullmatch(r"created table cli_tables/t \(id (\d+), 6 ranges\)\n", out)
    assert match, out
    table_id = int(match.group(1))
    out = ok(tk("table", "get", "cli_tables/t", service=svc))
    ids = ", ".join(str(1024 + i) for i in range(6))  # the current ranges (a split adds some)
    assert out == f"table cli_tables/t: id {table_id}, 6 ranges ({ids}), ttl 0s\n"
    out = ok(tk("table", "create", "cli_tables/ttl", "--ranges", "2", "--ttl", "30", service=svc))
    assert "2 ranges" in out
    assert ok(tk("table", "get", "cli_tables/ttl", service=svc)).endswith("ttl 30s\n")
    with Client(svc) as client:  # the CLI really created what it said
        info = client.get_table("cli_tables", "t")
        assert (info.table_id, info.ranges) == (table_id, 6)
        assert client.get_table("cli_tables", "ttl").ttl_seconds == 30

    failed(tk("table", "create", "cli_tables/t", service=svc), 3, "error: TableExistsError")
    failed(tk("table", "create", "nope_ns/t", service=svc), 3, "error: NamespaceNotFoundError")
    failed(tk("table", "create", "cli_tables/a b", service=svc), 3, "error: InvalidTableNameError")
    out = ok(tk("table", "delete", "cli_tables/t", service=svc))
    assert out == "deleted table cli_tables/t\n"
    failed(tk("table", "get", "cli_tables/t", service=svc), 3, "error: TableNotFoundError")
    failed(tk("table", "delete", "cli_tables/t", service=svc), 3, "error: TableNotFoundError")
    failed(tk("get", "cli_tables/t", "k", service=svc), 3, "error: TableNotFoundError")
    # the default is 4 ranges
    out = ok(tk("table", "create", "cli_tables/t", service=svc))
    assert out.endswith(", 4 ranges)\n")


# --------------------------------------------------------------------------- keys


def test_put_get_json_del(svc: str) -> None:
    ok(tk("ns", "create", "cli_kv", service=svc))
    ok(tk("table", "create", "cli_kv/t", service=svc))
    t = "cli_kv/t"
    assert ok(tk("put", t, "greeting", "hello world", service=svc)) == ""
    assert ok(tk("get", t, "greeting", service=svc)) == "hello world\n"
    ok(tk("put", t, "greeting", "hi", service=svc))
    doc = json.loads(ok(tk("get", t, "greeting", "--json", service=svc)))
    assert doc["pkey"] == "greeting" and doc["lkey"] == "greeting"  # key is its own pkey
    assert doc["value"] == "hi" and doc["is_number"] is False and doc["version"] == 1
    assert doc["mod_revision"] > doc["create_revision"] > 0

    # expected version
    failed(
        tk("put", t, "greeting", "x", "--expected-version", "-1", service=svc),
        3,
        "error: KeyExistsError",
    )
    failed(
        tk("put", t, "greeting", "x", "--expected-version", "0", service=svc),
        3,
        "error: BadVersionError",
    )
    ok(tk("put", t, "greeting", "v2", "--expected-version", "1", service=svc))
    failed(
        tk("put", t, "absent", "x", "--expected-version", "0", service=svc),
        3,
        "error: KeyNotFoundError",
    )
    ok(tk("put", t, "fresh", "x", "--expected-version", "-1", service=svc))

    # missing keys: exit 1
    result = tk("get", t, "nothing-here", service=svc)
    assert result.returncode == 1 and result.stdout == ""
    assert "'nothing-here' not found" in result.stderr
    assert ok(tk("del", t, "greeting", service=svc)) == "deleted greeting\n"
    gone = tk("del", t, "greeting", service=svc)
    assert (gone.returncode, gone.stdout) == (1, "")
    assert "key 'greeting' not found: nothing deleted" in gone.stderr
    assert tk("get", t, "greeting", service=svc).returncode == 1

    # what the CLI wrote is (key, key) for the SDK, and vice versa
    with Client(svc) as client:
        table = client.table("cli_kv", "t")
        kv = table.get("fresh", "fresh")
        assert kv is not None and kv.value == b"x" and kv.version == 0
        table.put("from-sdk", "from-sdk", "sdk value")
        table.put("P", "inner", "under P")
    assert ok(tk("get", t, "from-sdk", service=svc)) == "sdk value\n"
    assert ok(tk("get", t, "inner", "--pkey", "P", service=svc)) == "under P\n"
    assert tk("get", t, "inner", service=svc).returncode == 1  # other pkey


def test_incr(svc: str) -> None:
    ok(tk("ns", "create", "cli_incr", service=svc))
    ok(tk("table", "create", "cli_incr/t", service=svc))
    t = "cli_incr/t"
    assert ok(tk("incr", t, "visits", service=svc)) == "1\n"
    assert ok(tk("incr", t, "visits", "10", service=svc)) == "11\n"
    assert ok(tk("incr", t, "visits", "-20", service=svc)) == "-9\n"
    assert ok(tk("get", t, "visits", service=svc)) == "-9\n"
    doc = json.loads(ok(tk("get", t, "visits", "--json", service=svc)))
    assert doc["value"] == -9 and doc["is_number"] is True and doc["version"] == 2
    assert ok(tk("incr", t, "big", str(2**63 - 1), service=svc)) == f"{2**63 - 1}\n"
    assert ok(tk("incr", t, "big", service=svc)) == f"{-(2**63)}\n"
    failed(tk("put", t, "visits", "text", service=svc), 3, "error: BadRequestError")
    ok(tk("put", t, "word", "text", service=svc))
    failed(tk("incr", t, "word", service=svc), 3, "error: BadRequestError")
    assert ok(tk("incr", t, "c", "3", "--pkey", "P", service=svc)) == "3\n"
    assert ok(tk("del", t, "visits", service=svc)) == "deleted visits\n"
    assert ok(tk("incr", t, "visits", "2", service=svc)) == "2\n"


def test_scan(svc: str) -> None:
    ok(tk("ns", "create", "cli_scan", service=svc))
    ok(tk("table", "create", "cli_scan/t", service=svc))
    t = "cli_scan/t"
    with Client(svc) as client:
        table = client.table("cli_scan", "t")
        for i in (3, 0, 4, 1, 2):
            table.put("user", f"k{i}", f"v{i}")
        table.put("userx", "k9", "other pkey")
    ok(tk("put", t, "k5", "v5", "--pkey", "user", service=svc))
    ok(tk("incr", t, "k6", "7", "--pkey", "user", service=svc))
    out = ok(tk("scan", t, "user", service=svc))
    assert out.splitlines() == [f"k{i}\tv{i}" for i in range(6)] + ["k6\t7"]
    out = ok(tk("scan", t, "user", "--start", "k2", "--end", "k4", service=svc))
    assert out.splitlines() == ["k2\tv2", "k3\tv3", "k4\tv4"]
    out = ok(tk("scan", t, "user", "--start", "k1", "--limit", "2", service=svc))
    assert out.splitlines() == ["k1\tv1", "k2\tv2"]
    lines = ok(tk("scan", t, "user", "--json", "--limit", "3", service=svc)).splitlines()
    docs = [json.loads(line) for line in lines]
    assert [(d["pkey"], d["lkey"], d["value"]) for d in docs] == [
        ("user", "k0", "v0"),
        ("user", "k1", "v1"),
        ("user", "k2", "v2"),
    ]
    assert ok(tk("scan", t, "nobody", service=svc)) == ""
    assert ok(tk("del", t, "k5", "--pkey", "user", service=svc)) == "deleted k5 (pkey user)\n"
    assert "k5" not in ok(tk("scan", t, "user", service=svc))


def test_service_from_environment(svc: str) -> None:
    env = dict(os.environ, TABLEKEEPER_SERVICE=svc)
    result = subprocess.run(
        [str(TABLEKEEPER), "ns", "create", "cli_env"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    with Client(svc) as client:
        assert client.get_namespace("cli_env") >= 0  # ids start at 0


def _lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(text) for text in ok(result).splitlines()]


def test_ns_and_table_list_and_guarded_ns_delete(svc: str) -> None:
    ok(tk("ns", "create", "cli_list_b", service=svc))
    ok(tk("ns", "create", "cli_list_a", service=svc))
    ok(tk("table", "create", "cli_list_a/zeta", "--ranges", "2", service=svc))
    ok(tk("table", "create", "cli_list_a/alpha", "--ttl", "9", service=svc))
    names = ok(tk("ns", "list", service=svc)).splitlines()
    assert names == sorted(names) and {"cli_list_a", "cli_list_b"} <= set(names)
    docs = _lines(tk("ns", "list", "-o", "json", service=svc))
    with Client(svc) as client:
        assert {"namespace": "cli_list_a", "id": client.get_namespace("cli_list_a")} in docs
        assert [n.name for n in client.list_namespaces()] == names
        tables = client.list_tables("cli_list_a")
        assert [t.name for t in tables] == ["alpha", "zeta"]
    assert ok(tk("table", "list", "cli_list_a", service=svc)) == "alpha\nzeta\n"
    assert _lines(tk("table", "list", "cli_list_a", "-o", "json", service=svc)) == [
        {
            "namespace": "cli_list_a",
            "table": t.name,
            "id": t.table_id,
            "ranges": t.ranges,
            "ttl_seconds": t.ttl_seconds,
        }
        for t in tables
    ]
    table_view = ok(tk("table", "list", "cli_list_a", "-o", "table", service=svc)).splitlines()
    assert table_view[0].split() == ["TABLE", "ID", "RANGES", "TTL_SECONDS"]
    assert [row.split()[0::2] for row in table_view[1:]] == [["alpha", "4"], ["zeta", "2"]]
    assert ok(tk("table", "list", "cli_list_b", service=svc)) == ""
    failed(tk("table", "list", "cli_nope", service=svc), 3, "error: NamespaceNotFoundError")

    # a namespace with tables is deleted only with --force, which says what went with it
    err = failed(tk("ns", "delete", "cli_list_a", service=svc), 3, "error: namespace cli_list_a")
    assert "not empty (2 tables: alpha, zeta); --force deletes it" in err
    ok(tk("ns", "get", "cli_list_a", service=svc))  # still there
    out = ok(tk("ns", "delete", "cli_list_a", "--force", service=svc))
    assert out == "deleted namespace cli_list_a and its 2 tables (alpha, zeta)\n"
    assert ok(tk("ns", "delete", "cli_list_b", service=svc)) == "deleted namespace cli_list_b\n"
    assert not {"cli_list_a", "cli_list_b"} & set(ok(tk("ns", "list", service=svc)).split())


def test_output_formats_on_every_command(svc: str) -> None:
    """-o json / -o table on each command, given before or after it."""
    created = json.loads(ok(tk("-o", "json", "ns", "create", "cli_fmt", service=svc)))
    assert set(created) == {"namespace", "id"} and created["namespace"] == "cli_fmt"
    assert json.loads(ok(tk("ns", "get", "cli_fmt", "-o", "json", service=svc))) == created
    ns_table = ok(tk("ns", "get", "cli_fmt", "-o", "table", service=svc)).splitlines()
    assert ns_table == ["NAMESPACE  ID", f"cli_fmt    {created['id']}"]
    info = json.loads(ok(tk("table", "create", "cli_fmt/t", "-o", "json", service=svc)))
    assert info["table"] == "t" and info["ranges"] == 4 and info["ttl_seconds"] == 0
    got = json.loads(ok(tk("table", "get", "cli_fmt/t", "-o", "json", service=svc)))
    assert got == {**info, "range_ids": [1024, 1025, 1026, 1027]}
    t = "cli_fmt/t"
    put = json.loads(ok(tk("put", t, "k", "v1", "-o", "json", service=svc)))
    assert put == {"pkey": "k", "lkey": "k", "prev": None}
    put = json.loads(ok(tk("put", t, "k", "v2", "-o", "json", service=svc)))
    assert put["prev"]["value"] == "v1" and put["prev"]["version"] == 0
    got = json.loads(ok(tk("get", t, "k", "-o", "json", service=svc)))
    assert (got["value"], got["version"]) == ("v2", 1)
    got_table = ok(tk("-o", "table", "get", t, "k", service=svc)).splitlines()
    assert got_table[0].split() == [
        "PKEY", "LKEY", "VALUE", "IS_NUMBER", "VERSION", "CREATE_REVISION", "MOD_REVISION",
    ]  # fmt: skip
    assert got_table[1].split()[:5] == ["k", "k", "v2", "False", "1"]
    assert json.loads(ok(tk("incr", t, "n", "5", "-o", "json", service=svc))) == {
        "pkey": "n",
        "lkey": "n",
        "total": 5,
    }
    assert json.loads(ok(tk("del", t, "k", "-o", "json", service=svc))) == {
        "pkey": "k",
        "lkey": "k",
        "deleted": 1,
    }
    gone = tk("del", t, "k", "-o", "json", service=svc)
    assert gone.returncode == 1 and json.loads(gone.stdout)["deleted"] == 0
    assert json.loads(ok(tk("table", "delete", t, "-o", "json", service=svc)))["deleted"]
    doc = json.loads(ok(tk("ns", "delete", "cli_fmt", "-o", "json", service=svc)))
    assert doc == {"namespace": "cli_fmt", "deleted": True, "tables_deleted": []}
    status = json.loads(ok(tk("admin", "status", "-o", "json", service=svc)))
    assert status["num_storage_containers"] > 0 and status["ranges"]
    assert status["runtime"] in ("envoy", "grpc-aio")  # --runtime auto, resolved
    assert f"; runtime: {status['runtime']}\n" in ok(tk("admin", "status", service=svc))


def test_whole_table_scan(svc: str) -> None:
    ok(tk("ns", "create", "cli_wscan", service=svc))
    ok(tk("table", "create", "cli_wscan/t", "--ranges", "4", service=svc))
    expected = {(f"p{i}", f"k{j}", f"v{i}.{j}") for i in range(12) for j in range(3)}
    with Client(svc) as client:
        table = client.table("cli_wscan", "t")
        for pkey, lkey, value in expected:
            table.put(pkey, lkey, value)
        table.increment("p0", "n", 7)
    expected.add(("p0", "n", "7"))
    rows = [
        tuple(row.split("\t")) for row in ok(tk("scan", "cli_wscan/t", service=svc)).splitlines()
    ]
    assert len(rows) == len(expected) and set(rows) == expected
    by_pkey = [r for r in rows if r[0] == "p3"]
    assert [r[1] for r in by_pkey] == ["k0", "k1", "k2"]  # in order within a pkey
    docs = _lines(tk("scan", "cli_wscan/t", "-o", "json", "--limit", "5", service=svc))
    assert len(docs) == 5 and all((d["pkey"], d["lkey"], str(d["value"])) in expected for d in docs)
    view = ok(tk("scan", "cli_wscan/t", "-o", "table", "--limit", "2", service=svc)).splitlines()
    assert view[0].split() == ["PKEY", "LKEY", "VALUE", "VERSION", "MOD_REVISION"]
    assert len(view) == 3
    ok(tk("table", "create", "cli_wscan/empty", service=svc))
    assert ok(tk("scan", "cli_wscan/empty", service=svc)) == ""
    failed(tk("scan", "cli_wscan/none", service=svc), 3, "error: TableNotFoundError")


def test_values_from_stdin_and_hex(svc: str) -> None:
    ok(tk("ns", "create", "cli_bytes", service=svc))
    ok(tk("table", "create", "cli_bytes/t", service=svc))
    t = "cli_bytes/t"
    blob = bytes(range(256)) + b"\n"
    ok(tk("put", t, "blob", "-", service=svc, stdin=blob))
    ok(tk("put", t, "text", "-", service=svc, stdin=b"line one\nline two\n"))
    assert ok(tk("get", t, "text", service=svc)) == "line one\nline two\n\n"
    assert ok(tk("get", t, b"blob".hex(), "--hex", service=svc)) == blob.hex() + "\n"
    # --hex: keys and values given as hex, also for the pkey and from stdin
    ok(tk("--hex", "put", t, "--pkey", "00ff", "0102", "ff00ff", service=svc))
    ok(tk("put", t, "--pkey", "00ff", "0103", "-", "--hex", service=svc, stdin=b"cafe\n"))
    with Client(svc) as client:
        table = client.table("cli_bytes", "t")
        blob_kv, kv = table.get("blob", "blob"), table.get(b"\x00\xff", b"\x01\x02")
        assert blob_kv is not None and blob_kv.value == blob
        assert kv is not None and kv.value == b"\xff\x00\xff"
        other = table.get(b"\x00\xff", b"\x01\x03")
        assert other is not None and other.value == b"\xca\xfe"
    out = ok(tk("scan", t, "00ff", "--hex", service=svc))
    assert out == "0102\tff00ff\n0103\tcafe\n"
    doc = json.loads(ok(tk("get", t, "--pkey", "00ff", "0102", "--hex", "-o", "json", service=svc)))
    assert (doc["pkey"], doc["lkey"], doc["value"]) == ("00ff", "0102", "ff00ff")
    failed(tk("get", t, "zz", "--hex", service=svc), 2, "error: non-hexadecimal number")


def test_put_ttl(svc: str) -> None:
    ok(tk("ns", "create", "cli_ttl", service=svc))
    ok(tk("table", "create", "cli_ttl/t", service=svc))
    ok(tk("put", "cli_ttl/t", "short", "v", "--ttl", "0.5", service=svc))
    ok(tk("put", "cli_ttl/t", "long", "v", "--ttl", "3600", service=svc))
    with Client(svc) as client:
        table = client.table("cli_ttl", "t")
        deadline = time.monotonic() + 30
        while table.get("short", "short") is not None:  # until its TTL has passed
            assert time.monotonic() < deadline, "the key never expired"
            time.sleep(0.1)
        assert table.get("long", "long") is not None
    assert tk("get", "cli_ttl/t", "short", service=svc).returncode == 1
    failed(tk("put", "cli_ttl/t", "k", "v", "--ttl", "-1", service=svc), 2, "must be > 0")


def test_watch_from_a_revision(svc: str) -> None:
    """Replays from --rev are deterministic: the changes exist before the watch starts."""
    ok(tk("ns", "create", "cli_watch", service=svc))
    ok(tk("table", "create", "cli_watch/t", service=svc))
    t = "cli_watch/t"
    with Client(svc) as client:
        table = client.table("cli_watch", "t")
        table.put("users", "user-1", "a")
        first = table.get("users", "user-1")
        assert first is not None
        table.put("users", "user-2", "b")
        table.put("users", "user.", "next to the prefix")  # the prefix's range end: not shown
        table.put("users", "other", "not under the prefix")
        table.put("people", "user-3", "another pkey")
        table.delete("users", "user-1")
        table.put("users", "user-2", "b2")
        table.put("k", "k", "own pkey")
        table.put("k", "k", "own pkey 2")
    rev = str(first.mod_revision)
    out = tk(
        "watch",
        t,
        "user-",
        "--pkey",
        "users",
        "--prefix",
        "--rev",
        rev,
        "--count",
        "4",
        service=svc,
    )
    assert ok(out).splitlines() == [
        "PUT\tuser-1\ta",
        "PUT\tuser-2\tb",
        "DELETE\tuser-1",
        "PUT\tuser-2\tb2",
    ]
    assert f"watching prefix 'user-' of pkey 'users' of {t}, from revision {rev}" in out.stderr
    docs = _lines(
        tk(
            "watch",
            t,
            "user-2",
            "--pkey",
            "users",
            "--rev",
            rev,
            "--count",
            "2",
            "--prev-kv",
            "-o",
            "json",
            service=svc,
        )
    )
    assert [(d["type"], d["lkey"], d["kv"]["value"]) for d in docs] == [
        ("put", "user-2", "b"),
        ("put", "user-2", "b2"),
    ]
    assert docs[0]["prev"] is None and docs[1]["prev"]["value"] == "b"
    assert docs[0]["revision"] < docs[1]["revision"]
    # a key is its own pkey, as for get; the whole pkey with an empty prefix
    assert ok(tk("watch", t, "k", "--rev", "1", "--count", "2", service=svc)).splitlines() == [
        "PUT\tk\town pkey",
        "PUT\tk\town pkey 2",
    ]
    whole = tk(
        "watch",
        t,
        "",
        "--pkey",
        "users",
        "--prefix",
        "--rev",
        rev,
        "--count",
        "4",
        "-o",
        "table",
        service=svc,
    )
    rows = [row.split("\t") for row in ok(whole).splitlines()]
    assert rows[0] == ["TYPE", "REVISION", "LKEY", "VALUE"]
    assert [(r[0], r[2], r[3]) for r in rows[1:]] == [
        ("PUT", "user-1", "a"),
        ("PUT", "user-2", "b"),
        ("PUT", "user.", "next to the prefix"),
        ("PUT", "other", "not under the prefix"),
    ]


def test_watch_streams_until_interrupted(svc: str) -> None:
    ok(tk("ns", "create", "cli_live", service=svc))
    ok(tk("table", "create", "cli_live/t", service=svc))
    process = subprocess.Popen(
        [str(TABLEKEEPER), "--service", svc, "watch", "cli_live/t", "", "--pkey", "P", "--prefix"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=cli_env(),
    )
    try:
        assert process.stderr is not None and process.stdout is not None
        ready = process.stderr.readline()  # printed once the server has registered the watch
        assert ready.startswith("watching prefix '' of pkey 'P' of cli_live/t, after revision"), (
            ready
        )
        with Client(svc) as client:
            table = client.table("cli_live", "t")
            table.put("P", "a", "1")
            assert process.stdout.readline() == "PUT\ta\t1\n"
            table.put("Q", "a", "other pkey")
            table.delete("P", "a")
            assert process.stdout.readline() == "DELETE\ta\n"
        process.send_signal(signal.SIGINT)  # Ctrl-C is how a watch ends: exit 0, no traceback
        assert process.wait(timeout=120) == 0
        assert "Traceback" not in process.stderr.read()
        assert process.stdout.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sessions_and_ephemeral_keys(svc: str) -> None:
    ok(tk("ns", "create", "cli_sess", service=svc))
    ok(tk("table", "create", "cli_sess/t", service=svc))
    t = "cli_sess/t"
    session = ok(tk("session", "create", t, "members", "--ttl", "30", service=svc)).strip()
    assert session.isdigit(), session
    ok(tk("put", t, "--pkey", "members", "node-1", "host:1", "--session", session, service=svc))
    ok(tk("put", t, "--pkey", "members", "durable", "stays", service=svc))
    alive = _lines(
        tk(
            "session",
            "keep-alive",
            t,
            "members",
            session,
            "--count",
            "2",
            "-o",
            "json",
            service=svc,
        )
    )
    assert alive == [{"id": int(session), "ttl_seconds": 30.0}] * 2
    assert ok(tk("get", t, "--pkey", "members", "node-1", service=svc)) == "host:1\n"
    assert (
        ok(tk("session", "close", t, "members", session, service=svc))
        == f"closed session {session}\n"
    )
    assert (
        tk("get", t, "--pkey", "members", "node-1", service=svc).returncode == 1
    )  # deleted with it
    assert ok(tk("get", t, "--pkey", "members", "durable", service=svc)) == "stays\n"
    again = tk("session", "close", t, "members", session, service=svc)
    assert again.returncode == 1 and "not found" in again.stderr
    gone = tk("session", "keep-alive", t, "members", session, service=svc)
    assert gone.returncode == 1 and f"session {session} is gone" in gone.stderr
    failed(
        tk("put", t, "--pkey", "members", "x", "y", "--session", session, service=svc),
        3,
        "error: IllegalOpError",
    )
    doc = json.loads(
        ok(tk("session", "create", t, "members", "--ttl", "0.5", "-o", "json", service=svc))
    )
    assert doc["ttl_seconds"] == 0.5 and doc["id"] > int(session)


KEEP_ALIVE_WHEN_TOLD = """
import sys
from tablekeeper.cli import main
print("imported", flush=True)
sys.exit(main(sys.stdin.readline().split()))
"""


def test_session_keep_alive_until_interrupted(svc: str) -> None:
    ok(tk("ns", "create", "cli_ka", service=svc))
    ok(tk("table", "create", "cli_ka/t", service=svc))
    # The CLI's entry point in a process that has done its imports before the session exists:
    # starting Python and importing can take longer than the 4 s TTL on a busy machine, and
    # that start-up is set-up, not the keep-alive under test.
    process = subprocess.Popen(
        [sys.executable, "-c", KEEP_ALIVE_WHEN_TOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=cli_env(),
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        assert process.stderr is not None
        assert process.stdout.readline() == "imported\n", process.stderr.read()
        session = ok(tk("session", "create", "cli_ka/t", "p", "--ttl", "4", service=svc)).strip()
        process.stdin.write(f"--service {svc} session keep-alive cli_ka/t p {session}\n")
        process.stdin.close()
        for _ in range(5):  # every TTL/3: five keep-alives outlast the TTL
            assert process.stdout.readline() == f"session {session} kept alive, ttl 4s\n"
        ok(tk("put", "cli_ka/t", "--pkey", "p", "e", "v", "--session", session, service=svc))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_global_flags_from_the_environment(svc: str, shared_server: ServerProcess) -> None:
    ok(tk("ns", "create", "cli_genv", service=svc))
    ok(tk("table", "create", "cli_genv/t", service=svc))
    env = {"TABLEKEEPER_SERVICE": svc, "TABLEKEEPER_OUTPUT": "json", "TABLEKEEPER_HEX": "1"}
    ok(tk("put", "cli_genv/t", "6b", "7631", env=env))
    doc = json.loads(ok(tk("get", "cli_genv/t", "6b", env=env)))
    assert (doc["lkey"], doc["value"]) == ("6b", "7631")
    # flags win over the environment
    assert (
        ok(tk("get", "cli_genv/t", "k", "-o", "text", env={"TABLEKEEPER_SERVICE": svc})) == "v1\n"
    )
    assert ok(
        tk(
            "--service",
            svc,
            "ns",
            "get",
            "cli_genv",
            env={"TABLEKEEPER_SERVICE": "bk://127.0.0.1:1"},
        )
    ).startswith("namespace cli_genv")
    bad = tk("ns", "list", env={"TABLEKEEPER_OUTPUT": "xml"})
    assert bad.returncode == 2 and "TABLEKEEPER_OUTPUT: invalid choice 'xml'" in bad.stderr
    bad = tk("ns", "list", env={"TABLEKEEPER_TIMEOUT": "soon"})
    assert bad.returncode == 2 and "--timeout: not a number: 'soon'" in bad.stderr


def test_timeout_bounds_a_call() -> None:
    """Nothing listens on the port: without --timeout the CLI retries for 30 s; with it, it
    gives up after about that long (flag or TABLEKEEPER_TIMEOUT)."""
    dead = f"bk://127.0.0.1:{free_port()}"
    for result in (
        tk("--timeout", "0.5", "ns", "get", "x", service=dead, timeout=20),
        tk(
            "ns",
            "list",
            env={"TABLEKEEPER_SERVICE": dead, "TABLEKEEPER_TIMEOUT": "0.5"},
            timeout=20,
        ),
    ):
        failed(result, 3, "error: UnavailableError")


def test_cluster_status_of_an_unreachable_service_is_one_line() -> None:
    """No server of the URI answers: one line naming them, exit 3 (also after --wait)."""
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    service = "bk://" + ",".join(dead)
    for result in (
        tk("cluster", "status", service=service),
        tk("cluster", "status", "--wait", "0.5", service=service),
    ):
        stderr = failed(result, 3, f"error: UnavailableError: no server of {service} answered")
        assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
        assert all(address in stderr for address in dead), stderr
    assert failed(tk("cluster", "status", "--wait", "-1"), 2, "must be >= 0")


@pytest.mark.pulsar
def test_listings_and_cluster_status_in_cluster_mode(
    make_cluster: Callable[..., TestCluster],
) -> None:
    """Listings asked of a server that does not own the root range are forwarded to its owner;
    `cluster status` asks the servers of --service (the first address is dead: the next one
    answers) and `-o json` reports the same facts as the text report; `--wait` turns a cluster
    that is not ready into exit 1."""
    cluster = make_cluster(containers=2).start(2)
    dead = f"127.0.0.1:{free_port()}"
    both = f"bk://{dead},{cluster.endpoint(0)},{cluster.endpoint(1)}"
    status = json.loads(ok(tk("cluster", "status", "--wait", "60", "-o", "json", service=both)))
    assert status["cluster"] == cluster.name and status["containers"] == 2
    assert status["ready"] is True and status["problems"] == []
    assert sorted(status["servers"]) == sorted(cluster.endpoint(i) for i in range(2))
    assert status["controller"] == cluster.controller()
    assert status["assignment"] == {s: sorted(c) for s, c in cluster.assignment().items()}
    assert status["serving"] == status["assignment"]
    root_owner = next(o["owner"] for o in status["owners"] if o["container"] == 0)
    assert status["assignment"][root_owner][0] == 0
    for owner in status["owners"]:
        ownership = cluster.owner(owner["container"])
        assert ownership is not None and owner["assigned_to"] == owner["owner"]
        assert (owner["owner"], owner["epoch"]) == (ownership.endpoint, ownership.epoch)
    others = [i for i in range(2) if cluster.endpoint(i) != root_owner]
    assert others, status  # two servers share two containers: one of them lacks the root
    svc = cluster.service(others[0])
    ok(tk("ns", "create", "cl_ns", service=svc))
    ok(tk("table", "create", "cl_ns/t", "--ranges", "2", service=svc))
    assert "cl_ns" in ok(tk("ns", "list", service=svc)).split()
    assert ok(tk("table", "list", "cl_ns", service=svc)) == "t\n"
    failed(tk("table", "list", "cl_nope", service=svc), 3, "error: NamespaceNotFoundError")
    text = ok(
        tk("cluster", "status", env={"TABLEKEEPER_OUTPUT": "text", "TABLEKEEPER_SERVICE": svc})
    )
    assert f"cluster {cluster.name}: 2 storage containers" in text and "ready: yes" in text
    assert f"servers: {', '.join(sorted(status['servers']))}" in text.splitlines()
    zk = ["--zk", cluster.zk_hosts, "--cluster", cluster.name]
    init = json.loads(ok(tk("-o", "json", "cluster", "init", *zk, "--containers", "2")))
    assert init == {"cluster": cluster.name, "containers": 2, "created": False}
    # A registered server that never answers: the cluster is not ready while it is live.
    ghost = ZkCoordinator(cluster.zk_hosts, cluster.name, clock=SystemClock())
    ghost.start()
    try:
        ghost.register(dead)
        waited = tk("cluster", "status", "--wait", "1", service=svc)
        once = tk("cluster", "status", "-o", "json", service=svc)
    finally:
        ghost.stop()
    assert waited.returncode == 1, (waited.stdout, waited.stderr)
    assert waited.stdout.splitlines()[-1].startswith("ready: no (")
    assert f"{dead}: ServerInfo failed: UNAVAILABLE" in waited.stdout
    doc = json.loads(ok(once))  # without --wait, exit 0 whether ready or not
    assert doc["ready"] is False and dead in doc["servers"]
    assert doc["serving"][dead].startswith("ServerInfo failed: UNAVAILABLE")


# --------------------------------------------------------------------------- server command


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        return str(response.read().decode())


def _samples(text: str, name: str) -> dict[str, float]:
    """{label string: value} of every sample of metric `name` (exact sample name)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)", line)
        if match:
            out[match.group(1) or ""] = float(match.group(2))
    return out


def _wait_serving(process: subprocess.Popen[bytes], service: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log.read_text()}")
        result = tk("ns", "get", "probe-for-readiness", service=service, timeout=30)
        if "NamespaceNotFoundError" in result.stderr:
            return  # the root range answered
        if time.monotonic() > deadline:
            pytest.fail(f"server not ready:\n{log.read_text()}")
        time.sleep(0.2)


def test_server_command_metrics_and_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [
                str(TABLEKEEPER),
                "server",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
                "--metrics-port",
                str(metrics_port),
                "--containers",
                "4",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        service = f"bk://127.0.0.1:{port}"
        _wait_serving(process, service, log)
        with Client(service) as client:
            assert client.server_info().num_storage_containers == 4
            client.create_namespace("m")
            client.create_table("m", "t", ranges=4)
            table = client.table("m", "t")
            for i in range(25):
                table.put(f"p{i % 5}", f"k{i}", "v")
            table.increment("p0", "n", 3)
            assert table.get("p1", "k1") is not None
        ok(tk("put", "m/t", "cli-key", "cli-value", service=service))

        text = _metrics(metrics_port)
        for name in (
            "tablekeeper_requests_total",
            "tablekeeper_request_seconds",
            "tablekeeper_wal_append_seconds",
            "tablekeeper_wal_append_records",
            "tablekeeper_container_ranges",
            "tablekeeper_container_keys",
        ):
            assert re.search(rf"^# HELP {name} ", text, re.MULTILINE), name

        requests = _samples(text, "tablekeeper_requests_total")
        puts = sum(v for labels, v in requests.items() if 'method="Put"' in labels)
        assert puts >= 26, requests
        assert any('method="Increment"' in labels for labels in requests)
        assert sum(_samples(text, "tablekeeper_request_seconds_count").values()) >= 28
        assert sum(_samples(text, "tablekeeper_wal_append_seconds_count").values()) >= 1
        # every write of this test was appended to a WAL
        appended = sum(_samples(text, "tablekeeper_wal_append_records_sum").values())
        assert appended >= 27
        ranges = _samples(text, "tablekeeper_container_ranges")
        assert set(ranges) == {f'{{container="{c}"}}' for c in range(4)}
        assert sum(ranges.values()) >= 4  # the table's 4 ranges, at least
        keys = _samples(text, "tablekeeper_container_keys")
        assert set(keys) == set(ranges)
        assert sum(keys.values()) > 0

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
        assert "stopped cleanly" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
