"""The server's layering, checked on its import statements (anywhere in a module: imports
inside functions count): `range/` knows nothing of the containers, the cluster or the gRPC
servicers; `range/`, `log/`, `storage/` and `checkpoint/` know no front-end, no front-end's
protos and no gRPC (the front-ends' commands reach the range through its applier seam,
`range/apply.py`); no module imports another's `_private` names; nothing imports `main` (the
composition root) but the CLI that starts it; only `core/clock.py` reads the time (with a
shrinking list of modules not moved yet); the modules import one another in no circle; and
only the Pulsar modules import the `pulsar` client. Each rule is shown to fail on a planted
violation (the `..._is_caught` tests)."""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

import pytest

from tests.unit.test_client_imports import _imported_modules as _imports

pytestmark = pytest.mark.unit

SERVER = Path(__file__).resolve().parents[2] / "server" / "tablekeeper_server"


def _offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    files = sorted((SERVER / package).rglob("*.py"))
    assert files, package
    out = {}
    for path in files:
        bad = sorted(m for m in _imports(path) if m.startswith(forbidden))
        if bad:
            out[str(path.relative_to(SERVER))] = bad
    return out


def test_range_imports_neither_containers_nor_servicers() -> None:
    forbidden = tuple(f"tablekeeper_server.{p}" for p in ("container", "rpc", "cluster"))
    assert _offenders("range", forbidden) == {}


def test_checkpoint_store_does_not_import_the_log() -> None:
    assert _offenders("checkpoint", ("tablekeeper_server.log",)) == {}


def test_only_the_pulsar_modules_import_the_pulsar_client() -> None:
    allowed = {"log/pulsar.py", "checkpoint/pulsar.py"}
    importers = {
        str(path.relative_to(SERVER))
        for path in SERVER.rglob("*.py")
        if any(m == "pulsar" or m.startswith("pulsar.") for m in _imports(path))
    }
    assert importers, "the scan found no importer at all"
    assert {
        p for p in importers if p not in allowed and not p.startswith("pulsar_common/")
    } == set()


# ---------------------------------------------------------------------------- the layer rules
#
# Each rule is a function of a package root (the server's, or a planted copy in a test), so the
# tests below can show that every rule fails on a violation of it.

FRONT_ENDS = ("etcd", "oxia", "rpc", "edge", "zookeeper")
"""The front-end packages (BookKeeper's front-end is `rpc/`; `edge/` is their shared kit)."""
CORE_LAYERS = ("range", "log", "storage", "checkpoint")
"""Packages that know no protocol and no gRPC."""
TIME_READERS_LEFT = {
    # Time read directly, still to move behind the injected clock (each entry may only go):
    "core/failpoints.py": "a failpoint's pause polls",
    "log/local.py": "append timings for the metrics",
    "log/pulsar.py": "the fenced-outcome poll's deadline",
    "main.py": "the readiness poll before on_port",
    "metrics.py": "GC pause timings; the scrape retry",
    "range/checkpoint.py": "checkpoint timings for the log",
    "range/replica.py": "recovery and append timings for the log and metrics",
    "range/split.py": "the split build's timing for the log",
    "rpc/asgi.py": "a call's gRPC deadline",
    "rpc/status.py": "a call's duration for the metrics",
    "security/access.py": "the decision cache's default clock",
    "security/certs.py": "a generated certificate's validity",
    "security/tokens.py": "a token's expiry (JWT claims are wall-clock)",
    "workers.py": "the worker supervisor's restart pacing (its own process)",
}
"""Modules that read the time themselves although only `core/clock.py` should. The rule holds
for every other module; this list is a ratchet (a module that stops reading time must leave it,
see `test_the_time_readers_left_are_still_time_readers`)."""


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name (as `root`'s package) -> file."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


@functools.cache
def _parsed(text: str, filename: str) -> ast.Module:
    """A source's tree, parsed once for all the rules (each walks every module)."""
    return ast.parse(text, filename=filename)


def _tree(path: Path) -> ast.Module:
    return _parsed(path.read_text(), str(path))


@functools.cache
def _import_nodes_of(text: str, filename: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    tree = _parsed(text, filename)
    return tuple(n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))


def _import_nodes(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """Every import statement of `path`, anywhere (top level, functions, TYPE_CHECKING)."""
    return _import_nodes_of(path.read_text(), str(path))


def _imported(path: Path, package: str) -> set[str]:
    """The modules `path` imports, and `module.name` for each name it imports from one (so an
    imported submodule counts), relative imports resolved against `package`."""
    found: set[str] = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        module = node.module or ""
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*base, module] if module else base)
        found.add(module)
        found.update(f"{module}.{alias.name}" for alias in node.names)
    return found | _imports(path)


def front_end_imports_in_core(root: Path) -> dict[str, list[str]]:
    """Modules of `CORE_LAYERS` importing a front-end, a front-end's protos or gRPC."""
    top = root.name
    forbidden = (
        *(f"{top}.{p}" for p in FRONT_ENDS),
        "tablekeeper_proto.etcd",
        "tablekeeper_proto.oxia",
        "grpc",
    )
    out = {}
    for name, path in _modules(root).items():
        if name.split(".")[1:2] and name.split(".")[1] in CORE_LAYERS:
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            bad = sorted(
                m for m in _imported(path, package) if m == "grpc" or m.startswith(forbidden)
            )
            if bad:
                out[name] = bad
    return out


def private_imports(root: Path) -> dict[str, list[str]]:
    """Modules importing another module's `_private` name (`from x import _name`)."""
    out = {}
    for name, path in _modules(root).items():
        bad = sorted(
            f"{node.module}.{alias.name}"
            for node in _import_nodes(path)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")
        )
        if bad:
            out[name] = bad
    return out


def main_importers(root: Path) -> list[str]:
    """Modules importing the composition root, `main` (but `cli`, the process entry point that
    starts it, with a lazy import so that the CLI stays fast)."""
    top = root.name
    mains = {f"{top}.main"}
    out = []
    for name, path in _modules(root).items():
        if name in (f"{top}.main", f"{top}.cli"):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = _imported(path, package)
        if imported & mains:
            out.append(name)
    return out


_TIME_CALLS = {"now", "utcnow", "today", "monotonic", "perf_counter", "time", "time_ns"}


def time_readers(root: Path) -> set[str]:
    """Modules (paths relative to `root`) other than `core/clock.py` that read the time: they
    import `time`, call `datetime.now`/`utcnow`/`today`, read the event loop's clock
    (`loop.time()`), or sleep (`asyncio.sleep` for more than a yield)."""
    out = set()
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel == "core/clock.py":
            continue
        tree = _tree(path)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Import)
                and any(a.name == "time" for a in node.names)
                or isinstance(node, ast.ImportFrom)
                and node.module == "time"
            ):
                out.add(rel)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                attr = node.func.attr
                if owner.endswith(("datetime", "date")) and attr in _TIME_CALLS:
                    out.add(rel)
                elif attr == "time" and owner.endswith(("loop", "loop()")):
                    out.add(rel)  # the event loop's clock (`asyncio.get_running_loop().time()`)
                elif owner == "asyncio" and attr == "sleep":
                    first = node.args[0] if node.args else None
                    if not (isinstance(first, ast.Constant) and first.value == 0):
                        out.add(rel)
    return out


def import_cycles(root: Path) -> list[list[str]]:
    """Sets of modules that import one another in a circle (strongly connected components of
    the import graph, imports inside functions included)."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in _imported(path, package) if m in modules and m != name}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_range_log_storage_and_checkpoint_know_no_front_end_and_no_grpc() -> None:
    assert front_end_imports_in_core(SERVER) == {}


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports(SERVER) == {}


def test_nothing_imports_main() -> None:
    assert main_importers(SERVER) == []


def test_only_the_clock_reads_the_time() -> None:
    assert time_readers(SERVER) - set(TIME_READERS_LEFT) == set()


def test_the_time_readers_left_are_still_time_readers() -> None:
    assert set(TIME_READERS_LEFT) - time_readers(SERVER) == set()


def test_the_import_structure_has_no_circle() -> None:
    assert import_cycles(SERVER) == []


# ---------------------------------------------------------------------- each rule can fail


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package `tablekeeper_server` under `tmp_path` holding `files` (path -> source)."""
    root = tmp_path / "tablekeeper_server"
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source))
    return root


@pytest.mark.parametrize(
    "source",
    [
        "from tablekeeper_server.etcd.apply import EtcdApplier\n",
        "def late():\n    from tablekeeper_server.oxia import apply\n",
        "import grpc\n",
        "from tablekeeper_proto.oxia import client_pb2\n",
        "from ..rpc import servicers\n",
    ],
)
def test_a_front_end_imported_by_the_range_is_caught(tmp_path: Path, source: str) -> None:
    root = _plant(tmp_path, {"range/state_machine.py": source, "etcd/apply.py": ""})
    assert list(front_end_imports_in_core(root)) == ["tablekeeper_server.range.state_machine"]


def test_a_private_import_is_caught(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "range/apply.py": "_view = 1\n",
            "etcd/apply.py": "def f():\n    from tablekeeper_server.range.apply import _view\n",
        },
    )
    assert private_imports(root) == {
        "tablekeeper_server.etcd.apply": ["tablekeeper_server.range.apply._view"]
    }


@pytest.mark.parametrize(
    "source",
    [
        "from tablekeeper_server.main import serve\n",
        "from tablekeeper_server import main\n",
        "def f():\n    import tablekeeper_server.main\n",
    ],
)
def test_an_import_of_main_is_caught(tmp_path: Path, source: str) -> None:
    root = _plant(tmp_path, {"main.py": "", "rpc/envoy.py": source})
    assert main_importers(root) == ["tablekeeper_server.rpc.envoy"]


@pytest.mark.parametrize(
    "source",
    [
        "import time\n",
        "from time import monotonic\n",
        "import datetime\nx = datetime.datetime.now()\n",
        "import asyncio\nasync def f():\n    await asyncio.sleep(1)\n",
        "import asyncio\nasync def f():\n    return asyncio.get_running_loop().time()\n",
        "def f(loop):\n    return loop.time()\n",
    ],
)
def test_reading_the_time_outside_the_clock_is_caught(tmp_path: Path, source: str) -> None:
    root = _plant(
        tmp_path,
        {"core/clock.py": "import time\n", "container/splitter.py": source, "ok.py": ""},
    )
    assert time_readers(root) == {"container/splitter.py"}


def test_an_import_circle_is_caught(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "container/registry.py": "from tablekeeper_server.container.splitter import S\n",
            "container/splitter.py": "def f():\n    from . import registry\n",
            "container/other.py": "from tablekeeper_server.container import registry\n",
        },
    )
    assert import_cycles(root) == [
        ["tablekeeper_server.container.registry", "tablekeeper_server.container.splitter"]
    ]
