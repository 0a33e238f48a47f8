"""``pip install batchfleet`` with no extras, as a producer installs it: the wheel built
from this tree goes into a clean venv (no torch, no fastapi, no pyarrow), and there the
client imports, lives beside an app's own ``schemas`` package, and round-trips a request
through a worker running from the full install. A CLI command without its extra says
which one, in one line. The same client and commands run again on a venv holding the
oldest version of each core dependency that pyproject admits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.support.fleet import running_worker

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
#: What `pip install .` reads (the same as .dockerignore lets through).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "batchfleet", "schemas",
           "connectors", "producers", "workers", "bench")
TOP_LEVEL = ("schemas", "workers", "producers", "connectors")
HEAVY = ("torch", "fastapi", "pyarrow", "aiokafka", "matplotlib")
#: Generous liveness bound for building and installing (~30 s here).
INSTALL_TIMEOUT_S = 180


@dataclass(frozen=True)
class SlimVenv:
    src: Path
    wheel: Path
    python: Path
    cli: Path
    site_packages: Path
    env: dict[str, str]


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _checked(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _install(base: Path, constraints: list[str]) -> SlimVenv:
    """Build the wheel from a copy of the tree and install it, without extras, into a
    clean venv under ``base``, with pip's ``constraints`` (``name==version`` lines)."""
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():  # batchfleet/'s links stay links, as `COPY .` keeps them
            shutil.copytree(path, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    _checked(_run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist",
                  src, cwd=base))
    (wheel,) = (base / "dist").glob("batchfleet-*.whl")
    venv = base / "venv"
    _checked(_run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=base))
    python = venv / "bin" / "python"
    pinned = base / "constraints.txt"
    pinned.write_text("".join(f"{line}\n" for line in constraints))
    # this interpreter's pip installs into the clean venv: no pip bootstrap, the same index
    _checked(_run(sys.executable, "-m", "pip", "--python", python, "install", "-q",
                  "-c", pinned, wheel, cwd=base))
    site = Path(_checked(_run(python, "-c", "import sysconfig; print(sysconfig.get_path("
                                            "'purelib'))", cwd=base)).strip())
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return SlimVenv(src, wheel, python, venv / "bin" / "batchfleet", site, env)


def dependency_floors() -> list[str]:
    """``name==floor`` for each of pyproject's core dependencies: the oldest versions it
    admits, which an environment that already has them keeps (pip upgrades nothing that
    satisfies ``>=``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = []
    for line in project["dependencies"]:
        requirement = Requirement(line)
        (lowest,) = [s.version for s in requirement.specifier if s.operator == ">="]
        floors.append(f"{requirement.name}=={lowest}")
    return floors


@pytest.fixture(scope="module")
def slim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlimVenv]:
    """The wheel without extras, on the newest dependencies the index has."""
    yield _install(tmp_path_factory.mktemp("slim"), [])


@pytest.fixture(scope="module")
def floors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlimVenv]:
    """The wheel without extras, on the oldest dependencies pyproject admits."""
    yield _install(tmp_path_factory.mktemp("floors"), dependency_floors())


def _app(tmp_path: Path) -> Path:
    """An app with its own ``schemas`` package that submits with the slim client."""
    app = tmp_path / "app"
    (app / "schemas").mkdir(parents=True)
    (app / "schemas" / "__init__.py").write_text("")
    (app / "schemas" / "orders.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass

        import numpy as np

        @dataclass
        class Order:
            amount: float

            def features(self) -> np.ndarray:
                return np.full(10, self.amount / 100, np.float32)
    """))
    (app / "main.py").write_text(textwrap.dedent("""
        import json
        import sys

        from schemas.orders import Order

        import batchfleet.schemas
        import schemas
        from batchfleet import Client

        out = {"app_schemas": schemas.__file__, "bf_schemas": batchfleet.schemas.__file__,
               "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in sys.argv[2:])}
        if sys.argv[1] != "-":
            with Client(sys.argv[1]) as client:
                rid = client.submit("demo-mlp", Order(42.0).features(), deadline_s=30)
                result = client.wait(rid, timeout=30)
            out.update(status=result.status, shape=list(result.outputs.shape),
                       request_id=result.request_id, sent=rid)
        print(json.dumps(out))
    """))
    return app


def test_the_wheel_holds_only_the_batchfleet_namespace(slim: SlimVenv) -> None:
    with zipfile.ZipFile(slim.wheel) as wheel:
        names = wheel.namelist()
        links = [i.filename for i in wheel.infolist() if (i.external_attr >> 16) & 0o170000
                 == 0o120000]
    assert {n.split("/")[0] for n in names} == {"batchfleet", "batchfleet-0.1.0.dist-info"}
    assert not links
    for package in TOP_LEVEL:  # the linked folders arrive as real files
        assert f"batchfleet/{package}/__init__.py" in names
    assert not [n for n in names if n.endswith(".png")]  # the bench's plots stay in docs/
    assert not [n for n in names if n.startswith("batchfleet/bench/")]  # batchfleet-bench's
    assert "batchfleet-0.1.0.dist-info/licenses/LICENSE" in names
    # the console's page and uPlot ship in the wheel, its license beside it (issue 30)
    static = "batchfleet/producers/console/static/"
    assert {static + f for f in ("index.html", "console.js", "console.css", "uPlot.iife.min.js",
                                 "uPlot.min.css", "uPlot.LICENSE")} <= set(names)


def test_no_top_level_packages_in_site_packages(slim: SlimVenv) -> None:
    entries = {p.name for p in slim.site_packages.iterdir()}
    assert "batchfleet" in entries
    for package in TOP_LEVEL:
        assert package not in entries and f"{package}.py" not in entries
        assert not (slim.site_packages / "batchfleet" / package).is_symlink()


def test_the_client_imports_without_anything_heavy(slim: SlimVenv, tmp_path: Path) -> None:
    probe = textwrap.dedent(f"""
        import importlib.util, json, sys
        import batchfleet
        from batchfleet import (AsyncClient, BatchfleetError, Client, ConfigError,
                                OverloadedError, RequestLostError, Result, UnknownModelError,
                                ValidationError, WaitTimeoutError)
        import batchfleet.cli
        from batchfleet import InvalidInputError, TensorSpec  # the handler API's light half
        try:
            from batchfleet import ModelHandler
            handler = "imported"
        except ImportError as exc:
            handler = str(exc)
        heavy = {list(HEAVY)!r}
        print(json.dumps({{
            "installed": [m for m in heavy if importlib.util.find_spec(m) is not None],
            "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in heavy),
            "client": Client.__module__, "spec": TensorSpec.parse("float32[2]").describe(),
            "handler": handler}}))
    """)
    out = json.loads(_checked(_run(slim.python, "-c", probe, cwd=tmp_path, env=slim.env)))
    assert out.pop("handler").startswith(
        "batchfleet.ModelHandler needs the worker extra: pip install 'batchfleet[worker]'")
    assert out == {"installed": [], "loaded": [], "client": "batchfleet.producers.client",
                   "spec": "float32[2]"}


def test_an_app_with_its_own_schemas_package_imports_both(slim: SlimVenv,
                                                          tmp_path: Path) -> None:
    app = _app(tmp_path)
    out = json.loads(_checked(_run(slim.python, "main.py", "-", cwd=app, env=slim.env)))
    assert out["app_schemas"] == str(app / "schemas" / "__init__.py")
    assert out["bf_schemas"] == str(slim.site_packages / "batchfleet" / "schemas" / "__init__.py")


def test_the_floors_install_holds_the_floors(floors: SlimVenv, tmp_path: Path) -> None:
    """The floors venv runs what it claims to (else the two tests below on it prove nothing)."""
    probe = ("import importlib.metadata as m, sys; "
             "print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))")
    pinned = [Requirement(line) for line in dependency_floors()]
    listing = _checked(_run(floors.python, "-c", probe, *(r.name for r in pinned),
                            cwd=tmp_path, env=floors.env))
    installed = dict(item.split("==") for item in listing.split())
    assert len(pinned) >= 6 and set(installed) == {r.name for r in pinned}
    for requirement in pinned:  # "redis==8" holds 8.0.0
        assert requirement.specifier.contains(installed[requirement.name]), (
            requirement, installed[requirement.name])


@pytest.mark.parametrize("install", ["slim", "floors"])
async def test_the_slim_client_round_trips_through_a_full_worker(
        install: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str) -> None:
    """Newest and oldest admitted dependencies alike: the client and the light commands."""
    slim: SlimVenv = request.getfixturevalue(install)

    async def slim_run(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=app, env=slim.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 90)
        return proc.returncode or 0, stdout.decode(), stderr.decode()

    app = _app(tmp_path)
    async with running_worker(redis_url):  # the repo's full install: torch, on this loop
        code, stdout, stderr = await slim_run(str(slim.python), "main.py", redis_url, *HEAVY)
        assert code == 0, stderr
        out = json.loads(stdout)
        # the light CLI commands, run from the slim install against the same fleet
        cli = str(slim.cli)
        result = await slim_run(cli, "result", out["sent"], "--broker", redis_url, "--json")
        status = await slim_run(cli, "status", "--broker", redis_url, "--json")
        dlq = await slim_run(cli, "dlq", "list", "--broker", redis_url, "--json")
    assert out["status"] == "succeeded" and out["shape"] == [1]
    assert out["request_id"] == out["sent"]
    assert out["loaded"] == []
    assert result[0] == 0 and json.loads(result[1])["status"] == "succeeded", result
    assert status[0] == 0 and "demo-mlp" in status[1], status
    assert dlq[0] == 0, dlq


def _names_extra(done: subprocess.CompletedProcess[str], command: str, extra: str) -> bool:
    return done.returncode == 2 and done.stderr.splitlines() == [
        f"error: 'batchfleet {command}' needs the {extra} extra: "
        f"pip install 'batchfleet[{extra}]'"]


@pytest.mark.parametrize("install", ["slim", "floors"])
def test_light_commands_work_and_heavy_ones_name_their_extra(
        install: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    slim: SlimVenv = request.getfixturevalue(install)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _run(slim.cli, *args, cwd=tmp_path, env=slim.env, timeout=60)

    for args in (["--help"], ["submit", "--help"], ["result", "--help"], ["status", "--help"],
                 ["dlq", "--help"]):
        assert cli(*args).returncode == 0, args
    nowhere = "redis://127.0.0.1:9/0"  # never reached: the extra is missing first
    for args, extra in ((["worker", "--broker", nowhere], "worker"),
                        (["gateway", "--broker", nowhere], "gateway"),
                        (["demo", "--requests", "1"], "worker")):
        done = cli(*args)
        assert _names_extra(done, args[0], extra), (args, done.returncode, done.stderr)
    # the worker's options come from its settings, which import without torch: help shows
    done = cli("worker", "--help")
    assert done.returncode == 0 and "--max-batch-size" in done.stdout, done.stderr
    done = cli("submit", "-m", "demo-mlp", "--broker", "kafka://127.0.0.1:9",
               "--results", nowhere, "--inputs", "[1.0]")
    assert done.returncode == 2  # refused, nothing sent: a setting that cannot work here
    assert done.stderr.splitlines() == [
        "error: kafka:// brokers need the kafka extra: pip install 'batchfleet[kafka]'"]


def test_bench_is_its_own_distribution_and_says_how_to_get_it(slim: SlimVenv,
                                                              tmp_path: Path) -> None:
    """Without batchfleet-bench, `bench` is one line naming it (exit 2, as a missing extra);
    with its wheel installed over the slim one, the command finds it and names the bench
    extra for its dependencies instead."""
    def bench() -> subprocess.CompletedProcess[str]:
        return _run(slim.cli, "bench", "--quick", "--out", tmp_path / "out", cwd=tmp_path,
                    env=slim.env, timeout=60)

    done = bench()
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: 'batchfleet bench' needs the batchfleet-bench package: pip install "
        "batchfleet-bench (from a clone: pip install ./bench)"], done.stderr
    dist = tmp_path / "dist"
    _checked(_run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist,
                  slim.src / "bench", cwd=tmp_path))
    (wheel,) = dist.glob("batchfleet_bench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert {n.split("/")[0] for n in archive.namelist()} == {
            "batchfleet", "batchfleet_bench-0.1.0.dist-info"}
        assert "batchfleet/bench/__init__.py" in archive.namelist()
        assert "batchfleet/__init__.py" not in archive.namelist()  # batchfleet's own
    pip = (sys.executable, "-m", "pip", "--python", slim.python)
    _checked(_run(*pip, "install", "-q", "--no-deps", wheel, cwd=tmp_path))
    try:
        done = bench()
        assert _names_extra(done, "bench", "bench"), (done.returncode, done.stderr)
    finally:  # the other tests see the slim install again
        _checked(_run(*pip, "uninstall", "-q", "-y", "batchfleet-bench", cwd=tmp_path))
    assert not (slim.site_packages / "batchfleet" / "bench").exists()
