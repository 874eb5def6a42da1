"""The client package never imports the server: an SDK-only install has no server code, and the
`tablekeeper` CLI finds `server` / `cluster` only through the `tablekeeper.cli` entry points."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CLIENT = Path(__file__).resolve().parents[2] / "client" / "tablekeeper"


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement of `path` names (anywhere: top level, functions,
    TYPE_CHECKING blocks), plus string arguments of `importlib.import_module` / `__import__`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Call) and node.args:
            name = ast.unparse(node.func)
            first = node.args[0]
            if name in ("importlib.import_module", "import_module", "__import__") and (
                isinstance(first, ast.Constant) and isinstance(first.value, str)
            ):
                found.add(first.value)
    return found


def test_no_client_module_imports_the_server() -> None:
    files = sorted(CLIENT.rglob("*.py"))
    assert len(files) > 10, files  # the scan really looked at the package
    offenders = {
        str(path.relative_to(CLIENT)): sorted(
            m for m in _imported_modules(path) if m.split(".")[0] == "tablekeeper_server"
        )
        for path in files
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


_WITHOUT_SERVER = textwrap.dedent(
    """
    import sys

    BLOCKED = sys.argv.pop(1)

    class NoServer:
        # Makes BLOCKED (and anything under it) unimportable: tablekeeper_server as in an
        # SDK-only install, or one of its modules as in a broken install.
        def find_spec(self, name, path=None, target=None):
            if name == BLOCKED or name.startswith(BLOCKED + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoServer())
    from tablekeeper import _launch, cli

    parser = cli.build_parser()
    assert "completion" in parser.format_help()
    code = _launch.main(sys.argv[1:])  # the console script's
    loaded = sorted(m for m in sys.modules if m.startswith(BLOCKED))
    assert not loaded, loaded
    sys.exit(code)
    """
)


def _cli_without_server(
    *argv: str, blocked: str = "tablekeeper_server"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_SERVER, blocked, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["server", "--data-dir", "/tmp/x"],
        ["token", "create", "--subject", "x"],
        ["cluster", "init", "--zk", "127.0.0.1:1", "--cluster", "c", "--containers", "3"],
        ["admin", "backup", "/tmp/backup"],
        ["admin", "restore", "/tmp/backup", "--data-dir", "/tmp/x"],
        ["import", "zookeeper", "--from", "127.0.0.1:1", "--to", "oxia://127.0.0.1:2"],
    ],
)
def test_server_commands_say_how_to_get_them_without_the_server(argv: list[str]) -> None:
    result = _cli_without_server(*argv)
    assert result.returncode == 2, result.stderr
    command = " ".join(argv[:2] if argv[0] in ("cluster", "admin") else argv[:1])
    assert f"`tablekeeper {command}`" in result.stderr, result.stderr
    assert "pip install 'tablekeeper[server]'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_cluster_group_shows_status_alone_without_the_server() -> None:
    """`cluster status` is the client's own (it asks the servers); `cluster init` comes with
    the server, and without it is not listed (it still says how to get it, above)."""
    without = _cli_without_server("cluster", "--help")
    assert without.returncode == 0, without.stderr
    listed = without.stdout.split("positional arguments:")[1].split("options:")[0]
    assert "status" in listed and "init" not in listed, without.stdout
    status_help = _cli_without_server("cluster", "status", "--help")
    assert status_help.returncode == 0 and "--wait SECONDS" in status_help.stdout
    with_server = subprocess.run(
        [sys.executable, "-m", "tablekeeper.cli", "cluster", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert with_server.returncode == 0, with_server.stderr
    listed = with_server.stdout.split("positional arguments:")[1].split("options:")[0]
    assert "init" in listed and "status" in listed, with_server.stdout


def test_client_commands_work_without_the_server() -> None:
    result = _cli_without_server("completion", "bash")
    assert result.returncode == 0, result.stderr
    assert "complete -o default -F _tablekeeper tablekeeper" in result.stdout
    help_text = _cli_without_server("--help")
    assert help_text.returncode == 0, help_text.stderr
    words = " ".join(help_text.stdout.split())  # as argparse wrapped them
    assert "needs the server: pip install 'tablekeeper[server]'" in words


def test_a_broken_server_package_breaks_only_its_commands() -> None:
    """A server install missing one of its modules: `server` says why it cannot load, and
    every client command still works."""
    broken = _cli_without_server("server", "--help", blocked="tablekeeper_server.config")
    assert broken.returncode == 2, broken.stderr
    assert "cannot load it from tablekeeper_server.cli:register_server" in broken.stderr
    assert "tablekeeper_server.config" in broken.stderr
    result = _cli_without_server("completion", "zsh", blocked="tablekeeper_server.config")
    assert result.returncode == 0, result.stderr
    assert "bashcompinit" in result.stdout


def _declared_names() -> dict[str, str]:
    """name -> module, from the imports `tablekeeper/__init__.py` shows type checkers."""
    tree = ast.parse((CLIENT / "__init__.py").read_text())
    return {
        alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "typing"
        for alias in node.names
    }


def test_every_public_name_is_the_one_its_module_defines() -> None:
    """`tablekeeper` imports its names on first use: each is the object the import shown to
    type checkers names, and `__all__` lists exactly those."""
    import importlib

    import tablekeeper

    declared = _declared_names()
    assert sorted(declared) == sorted(tablekeeper.__all__)
    wrong = {
        name: module
        for name, module in declared.items()
        if getattr(tablekeeper, name) is not getattr(importlib.import_module(module), name)
    }
    assert wrong == {}
    assert set(tablekeeper.__all__) <= set(dir(tablekeeper))
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        tablekeeper.Clinet  # type: ignore[attr-defined]  # noqa: B018


_LIGHT = textwrap.dedent(
    """
    import sys

    import tablekeeper

    assert "grpc" not in sys.modules, "import tablekeeper loaded grpc"
    from tablekeeper._launch import main

    code = main(["server", "--print-config", "--data-dir", sys.argv[1]])
    sdk = sorted(m for m in sys.modules if m.split(".")[0] == "tablekeeper")
    print(sdk)
    sys.exit(code)
    """
)


def test_the_server_command_does_not_load_the_sdk(tmp_path: Path) -> None:
    """`tablekeeper server` (the console script) parses its flags without the SDK and the full
    CLI: with Envoy, that process only becomes Envoy, and every start paid for them."""
    result = subprocess.run(
        [sys.executable, "-c", _LIGHT, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    from tablekeeper import _launch, cli

    assert _launch.PLUGIN_GROUP == cli.PLUGIN_GROUP
    assert "--print-config" in result.stdout  # the configuration was printed
    assert result.stdout.strip().splitlines()[-1] == "['tablekeeper', 'tablekeeper._launch']"
