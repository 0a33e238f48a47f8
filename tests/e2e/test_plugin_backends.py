"""A backend added from outside: a separately installed package registers a control plane
and a broker under a new URL scheme, through the entry-point groups alone.

The package is written here, into a temporary directory with its own ``pyproject.toml``,
and installed with pip into a ``--target`` directory (never into the shared
environment). Its plane and broker wrap the built-in Redis ones and log every call.
A worker process and a client given only its URLs serve a request end to end, and the
log shows each side's calls went through the plugin. No file of ours names its scheme:
it is made up here from two parts.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchfleet.connectors import registry
from batchfleet.producers.client import AsyncClient

pytestmark = pytest.mark.e2e

SCHEME = "redis+" + "counted"
PACKAGE = "bf_plugin_" + "counted"

_PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{PACKAGE.replace('_', '-')}"
version = "0.1"

[project.entry-points."batchfleet.control_planes"]
"{SCHEME}" = "{PACKAGE}:open_plane"

[project.entry-points."batchfleet.brokers"]
"{SCHEME}" = "{PACKAGE}:open_broker"

[tool.setuptools]
packages = ["{PACKAGE}"]
"""

#: Wraps the built-in Redis backends (reached through the doors, like any caller) and
#: appends "pid kind.method" to the file BF_COUNTED_LOG names, for every call.
_MODULE = '''
import inspect
import os

from batchfleet import connectors


def _log(what):
    with open(os.environ["BF_COUNTED_LOG"], "a") as log:
        log.write(f"{os.getpid()} {what}\\n")


def _redis(url):
    return "redis://" + url.split("://", 1)[1]


class Counted:
    """Every method of ``inner``, counted; plain values pass through."""

    def __init__(self, kind, inner):
        self._kind, self._inner = kind, inner

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        what = f"{self._kind}.{name}"
        if inspect.iscoroutinefunction(value):
            async def counted(*args, **kwargs):
                _log(what)
                return await value(*args, **kwargs)
            return counted
        if callable(value) and not isinstance(value, type):
            def counted(*args, **kwargs):
                _log(what)
                return value(*args, **kwargs)
            return counted
        return value


class CountedPlane:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        seam = getattr(self._inner, name)
        return seam if callable(seam) else Counted(f"plane.{name}", seam)

    def request_control(self, broker):
        _log("plane.request_control")
        return Counted("control", self._inner.request_control(broker))

    def fleet(self, broker):
        _log("plane.fleet")
        return Counted("fleet", self._inner.fleet(broker))

    async def close(self):
        _log("plane.close")
        await self._inner.close()


class CountedBroker:
    def __init__(self, url, inner):
        self.url, self._inner = url, inner

    def publisher(self):
        _log("broker.publisher")
        return Counted("publisher", self._inner.publisher())

    def consumer(self, consumer_name):
        _log("broker.consumer")
        return Counted("consumer", self._inner.consumer(consumer_name))


def open_plane(url, **options):
    _log("open_plane")
    return CountedPlane(connectors.open_control_plane(_redis(url), **options))


def open_broker(url, **options):
    _log("open_broker")
    return CountedBroker(url, connectors.open_broker(_redis(url), **options))
'''


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The plugin, installed by pip into a directory of its own; on ``sys.path`` for the
    test's own process while the module runs."""
    root = tmp_path_factory.mktemp("plugin")
    source, target = root / "src", root / "site"
    (source / PACKAGE).mkdir(parents=True)
    (source / "pyproject.toml").write_text(_PYPROJECT)
    (source / PACKAGE / "__init__.py").write_text(_MODULE)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target),
                    str(source)], check=True, timeout=300)
    sys.path.insert(0, str(target))
    registry.forget_installed()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        sys.modules.pop(PACKAGE, None)
        registry.forget_installed()


def _counts(log: Path, pid: int) -> Counter[str]:
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    return Counter(what for who, what in lines if int(who) == pid)


async def test_a_plugin_scheme_serves_a_request_end_to_end(
        plugin_path: Path, redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    os.environ["BF_COUNTED_LOG"] = str(log)
    url = redis_url.replace("redis://", f"{SCHEME}://", 1)
    assert SCHEME in registry.broker_schemes() and SCHEME in registry.control_plane_schemes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(plugin_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # No --results: the broker's scheme has a control plane registered, so it is the default.
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", "worker", "--broker", url, "--model", "demo-mlp",
        "--namespace", "plug", "--device", "cpu", "--no-webhooks",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with AsyncClient(url, namespace="plug") as client:
            for _ in range(600):  # the worker registers its model once it is up
                if "demo-mlp" in await client.known_models() or worker.returncode is not None:
                    break
                await asyncio.sleep(0.1)
            rid = await client.submit("demo-mlp", [0.1] * 10)
            result = await client.wait(rid, timeout=60)
        assert result.status == "succeeded" and result.outputs is not None
    finally:
        if worker.returncode is None:
            worker.terminate()
        _, err = await asyncio.wait_for(worker.communicate(), 60)
        os.environ.pop("BF_COUNTED_LOG", None)
    assert worker.returncode == 0, err.decode()[-2000:]
    mine, theirs = _counts(log, os.getpid()), _counts(log, worker.pid)
    # the client: its plane and broker came from the plugin, and it recorded and published
    # through them (no one-trip shortcut: that is the built-in Redis plane's alone)
    assert mine["open_plane"] == 1 and mine["open_broker"] == 1
    assert mine["plane.results.put_pending"] >= 1 and mine["publisher.publish"] >= 1
    assert mine["plane.announcements.subscribe"] >= 1 and mine["plane.models.lookup"] >= 1
    # the worker: fetched, wrote and acked through the plugin's consumer and plane
    assert theirs["open_plane"] == 1 and theirs["open_broker"] == 1
    assert theirs["consumer.fetch"] >= 1 and theirs["consumer.ack"] >= 1
    assert theirs["plane.results.write_terminal"] >= 1 and theirs["plane.models.serve"] >= 1
    assert theirs["plane.heartbeats.write"] >= 1 and theirs["plane.close"] == 1


def test_an_unknown_scheme_is_one_line_naming_the_installed_ones() -> None:
    from batchfleet.connectors import open_broker, open_control_plane
    from batchfleet.schemas.errors import ConfigError

    for door in (open_broker, open_control_plane):
        with pytest.raises(ConfigError) as refused:
            door("nope://h:1")
        line = str(refused.value)
        assert "\n" not in line and "'nope'" in line and "redis+cluster" in line
