"""Nothing above ``connectors`` holds a driver client: no module under workers/,
producers/ or batchfleet/ (the CLI) imports ``redis``, calls ``redis_client(...)`` or
reaches for a ``.redis`` attribute (the result store's client). Driver errors are
wrapped into the project's error tree inside ``connectors``, so nothing above catches
them either. Tests are not checked: they may inspect Redis directly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: batchfleet/{schemas,connectors,producers,workers} are symlinks to the top-level folders.
LINKED = {"schemas", "connectors", "producers", "workers"}
#: Module (relative path) -> why it may import redis. Keep this short.
ALLOWED = {
    # The benchmark's baseline *is* plain RQ on a plain Redis client: that is what it measures.
    "batchfleet/bench/naive_rq.py": "the RQ baseline it benchmarks against",
    "batchfleet/bench/broker_loop.py": "the broker-only baseline: raw XADD and XREADGROUP",
    "batchfleet/bench/capacity_meter.py": "counts what requests cost Redis: CONFIG "
                                          "RESETSTAT, INFO commandstats on every node",
}


def _modules() -> list[Path]:
    found = [*(ROOT / "workers").rglob("*.py"), *(ROOT / "producers").rglob("*.py")]
    for path in (ROOT / "batchfleet").rglob("*.py"):
        if path.relative_to(ROOT / "batchfleet").parts[0] not in LINKED:
            found.append(path)
    return sorted(found)


def _imports_redis(path: Path) -> list[int]:
    """Lines that import redis, call ``redis_client`` or read a ``.redis`` attribute."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.stmt | ast.expr) and _holds_a_client(node)]


def _holds_a_client(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "redis" or a.name.startswith("redis.") for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and node.module is not None \
            and (node.module == "redis" or node.module.startswith("redis."))
    if isinstance(node, ast.Attribute):
        return node.attr == "redis"
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else None
        return name == "redis_client"
    return False


def test_nothing_above_connectors_imports_redis() -> None:
    modules = _modules()
    assert len(modules) > 30  # the walk found the packages
    offenders = {str(p.relative_to(ROOT)): lines for p in modules
                 if (lines := _imports_redis(p)) and str(p.relative_to(ROOT)) not in ALLOWED}
    assert offenders == {}


def test_the_check_sees_each_escape_hatch(tmp_path: Path) -> None:
    """Each way above connectors to hold a client is flagged, and plain code is not."""
    cases = {"import redis.asyncio": 1, "from redis import Redis": 1,
             "c = redis_client(url)": 1, "c = connectors.redis_client(url)": 1,
             "c = store.redis": 1, "c = store.results.redis.get(k)": 1,
             "from batchfleet.connectors import open_result_store": 0, "x = redis_url": 0}
    for source, expected in cases.items():
        path = tmp_path / "m.py"
        path.write_text(source + "\n")
        assert len(_imports_redis(path)) == expected, source


def test_the_allow_list_is_not_stale() -> None:
    """An entry whose module no longer imports redis must go, so the list only shrinks."""
    stale = [rel for rel in ALLOWED
             if not (ROOT / rel).exists() or not _imports_redis(ROOT / rel)]
    assert stale == []
