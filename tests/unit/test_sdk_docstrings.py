"""Every public class, function and method of the SDK's public modules has a docstring (the
API reference, `make docs`, is built from them)."""

from __future__ import annotations

import importlib
import inspect

import pytest

pytestmark = pytest.mark.unit

MODULES = [
    "tablekeeper",
    "tablekeeper.client",
    "tablekeeper.table",
    "tablekeeper.session",
    "tablekeeper.watch",
    "tablekeeper.bulk",
    "tablekeeper.errors",
    "tablekeeper.types",
    "tablekeeper.routing",
    "tablekeeper.security",
    "tablekeeper.recipes",
    "tablekeeper.recipes.coordination",
    "tablekeeper.recipes.groups",
    "tablekeeper.recipes.metadata_store",
    "tablekeeper.recipes.sync",
]


def _undocumented() -> list[str]:
    missing: list[str] = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", []):
            obj = getattr(module, attr)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not obj.__module__.startswith("tablekeeper"):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{obj.__module__}.{obj.__qualname__}")
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if member.startswith("_"):
                        continue
                    target = value.fget if isinstance(value, property) else value
                    if isinstance(target, (staticmethod, classmethod)):
                        target = target.__func__
                    if inspect.isfunction(target) and not target.__doc__:
                        missing.append(f"{obj.__module__}.{obj.__qualname__}.{member}")
    return sorted(set(missing))


def test_every_public_sdk_method_has_a_docstring() -> None:
    assert _undocumented() == []
