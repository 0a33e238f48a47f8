"""Nothing above ``connectors`` holds a driver client: no module under workers/,
producers/ or batchfleet/ (the CLI) imports ``redis``, calls ``redis_client(...)`` or
reaches for a ``.redis`` attribute (the result store's client). Driver errors are
wrapped into the project's error tree inside ``connectors``, so nothing above catches
them either. Tests are not checked: they may inspect Redis directly.

And nothing above ``connectors`` names a backend: a backend is reached through the two
doors only (``open_control_plane``, ``open_broker``), so a module above may not import a
backend module (``connectors.redis_*``, ``cluster_*``, ``kafka*``, ``result_store``,
``embedded_*``), a name of a backend class (``Redis*``, ``Kafka*``, ``Cluster*``), or an
opener other than the doors (``open_*``). What it may import from ``connectors`` is the
doors, the protocols and their neutral values, and a seam's own value types and pure
helpers (a cancel report, a quota, ``cache_key``)."""

from __future__ import annotations

import ast
import re
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


#: Module -> the backend modules it may import, and why. Keep this short.
BACKEND_ALLOWED: dict[str, tuple[set[str], str]] = {
    "batchfleet/demo.py": ({"embedded_redis", "embedded_kafka"},
                           "starts a server process for the demo; the doors open it"),
    "batchfleet/bench/fleet.py": ({"embedded_redis", "embedded_kafka", "redis_client"},
                                  "starts servers; asks a --redis one its PID to meter it"),
    "batchfleet/bench/run.py": ({"embedded_redis"}, "finds redis-server to start it"),
    "batchfleet/bench/pipeline.py": ({"embedded_redis"}, "starts its own Redis"),
    "batchfleet/bench/capacity_meter.py": ({"redis_client"}, "meters Redis itself"),
    "batchfleet/bench/capacity_run.py": ({"redis_client"}, "meters Redis itself"),
    "batchfleet/bench/capacity_cluster.py": ({"cluster_store", "cluster_streams",
                                              "redis_streams", "result_store"},
                                             "sizes the Redis scripts it meters"),
    "batchfleet/bench/broker_loop.py": ({"kafka_publisher"},
                                        "the broker-only baseline makes its own topics"),
}
_BACKEND_MODULE = re.compile(
    r"^(redis_\w+|cluster_\w+|kafka\w*|memory_\w+|result_store|embedded_\w+)$")
_BACKEND_NAME = re.compile(
    r"^(Redis|Kafka|Cluster|Memory)[A-Z]\w*$|^open_(?!control_plane$|broker$)\w+$")
_DOORS = "batchfleet.connectors"


def _backend_imports(path: Path) -> list[str]:
    """What a module imports that names a backend: ``module`` or ``module.name``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(_DOORS + "."):
                    mod = alias.name.split(".")[2]
                    if _BACKEND_MODULE.match(mod):
                        found.append(mod)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == _DOORS or node.module.startswith(_DOORS + ".")):
            parts = node.module.split(".")
            mod = parts[2] if len(parts) > 2 else ""
            if _BACKEND_MODULE.match(mod):
                found.append(mod)
            for alias in node.names:
                if (not mod and _BACKEND_MODULE.match(alias.name)) \
                        or _BACKEND_NAME.match(alias.name):
                    found.append(f"{mod or alias.name}.{alias.name}" if mod else alias.name)
    return found


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


def test_nothing_above_connectors_names_a_backend() -> None:
    """Workers, producers, the CLI and the bench reach a backend only through the doors."""
    offenders: dict[str, list[str]] = {}
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        allowed = BACKEND_ALLOWED.get(rel, (set(), ""))[0]
        bad = [f for f in _backend_imports(path) if f.split(".")[0] not in allowed]
        if bad:
            offenders[rel] = bad
    assert offenders == {}


def test_the_backend_check_sees_each_way_to_name_one(tmp_path: Path) -> None:
    cases = {
        "from batchfleet.connectors.redis_streams import RedisStreamsPublisher": 2,
        "from batchfleet.connectors.result_store import ResultStore": 1,
        "from batchfleet.connectors import redis_streams": 1,
        "import batchfleet.connectors.kafka_publisher": 1,
        "from batchfleet.connectors.embedded_redis import EmbeddedRedis": 1,
        "from batchfleet.connectors.rollout import open_rollouts": 1,
        "from batchfleet.connectors.model_registry import RedisModelRegistry": 1,
        "from batchfleet.connectors import ClusterThing": 1,
        "from batchfleet.connectors.memory_plane import MemoryControlPlane": 2,
        "from batchfleet.connectors import memory_broker": 1,
        "from batchfleet.connectors import open_control_plane, open_broker": 0,
        "from batchfleet.connectors.control_plane import ControlPlane, StoreResults": 0,
        "from batchfleet.connectors.values import StorePressure, TerminalWrite": 0,
        "from batchfleet.connectors.quotas import Quota": 0,
    }
    for source, expected in cases.items():
        path = tmp_path / "m.py"
        path.write_text(source + "\n")
        assert len(_backend_imports(path)) == expected, source


def test_the_backend_allow_list_is_not_stale() -> None:
    stale = [rel for rel, (mods, _) in BACKEND_ALLOWED.items()
             if not (ROOT / rel).exists()
             or not mods & {f.split(".")[0] for f in _backend_imports(ROOT / rel)}]
    assert stale == []
# --- the worker's seams: middleware see a WorkerContext, the spine sees no middleware -----

#: What the spine (workers/worker.py) may import from workers/middleware: the chain and
#: base types (the package), and the default chain.
SPINE_MAY_IMPORT = {"batchfleet.workers.middleware", "batchfleet.workers.middleware.base",
                    "batchfleet.workers.middleware.defaults"}


def _imported(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import, TYPE_CHECKING ones included."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def _reaches_the_worker(path: Path) -> list[int]:
    """Lines that import ``workers.worker`` or the ``Worker`` class, or name ``Worker``."""
    lines = [line for line, module, names in _imported(path)
             if module.endswith("workers.worker")
             or (module.endswith("workers") and "Worker" in names)
             or (module.endswith("workers") and "worker" in names)]
    return lines + [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
                    if isinstance(node, ast.Name) and node.id == "Worker"]


def test_no_middleware_reaches_for_the_worker() -> None:
    """Middleware get a ``WorkerContext`` (``workers/context.py``), never the ``Worker``."""
    modules = sorted((ROOT / "workers" / "middleware").glob("*.py"))
    assert len(modules) > 15
    offenders = {p.name: lines for p in modules if (lines := _reaches_the_worker(p))}
    assert offenders == {}
    context = ROOT / "workers" / "context.py"
    assert _reaches_the_worker(context) == []


def test_the_spine_imports_no_middleware_but_the_chain_and_the_defaults() -> None:
    spine = ROOT / "workers" / "worker.py"
    found = {module for _, module, _ in _imported(spine)
             if module.startswith("batchfleet.workers.middleware")}
    assert found and found <= SPINE_MAY_IMPORT, found - SPINE_MAY_IMPORT


def test_the_worker_check_sees_each_way_in(tmp_path: Path) -> None:
    cases = {"from batchfleet.workers.worker import Worker": 1,
             "def f(w: Worker) -> None: ...": 1,
             "import batchfleet.workers.worker": 1,
             "from batchfleet.workers import Worker": 1,
             "def f(w: 'x') -> None:\n    Worker.run(w)": 1,
             "from batchfleet.workers.context import WorkerContext": 0}
    for source, expected in cases.items():
        path = tmp_path / "m.py"
        path.write_text(source + "\n")
        assert len(_reaches_the_worker(path)) == expected, source
