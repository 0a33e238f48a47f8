"""The wheels' package lists are written out, and each equals what discovery finds; a
checkout whose symlinks arrived as plain files refuses to build, naming the fix; the
license pyproject.toml declares ships (pyproject.toml, bench/pyproject.toml, setup.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINKED = ("schemas", "connectors", "producers", "workers")
#: Liveness bound for a build that stops in setup.py (~3 s here).
BUILD_TIMEOUT_S = 120


def _setuptools(pyproject: Path) -> dict[str, Any]:
    table: dict[str, Any] = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    return table


def _discovered(top: Path, name: str) -> set[str]:
    """Every package under ``top`` (a folder holding ``__init__.py``), following links
    as setuptools does."""
    found = set()
    for root, dirs, files in os.walk(top, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if "__init__.py" in files:
            found.add(".".join([name, *Path(root).relative_to(top).parts]))
    return found


@pytest.mark.unit
def test_the_batchfleet_wheel_lists_every_package_but_the_bench() -> None:
    listed = _setuptools(ROOT / "pyproject.toml")["packages"]
    everything = _discovered(ROOT / "batchfleet", "batchfleet")
    bench = {p for p in everything if p == "batchfleet.bench" or
             p.startswith("batchfleet.bench.")}
    assert bench, "batchfleet/bench/ moved: update this test and bench/pyproject.toml"
    assert sorted(listed) == sorted(everything - bench), (
        "pyproject.toml [tool.setuptools] packages differs from the packages under "
        "batchfleet/ (the bench excepted): add or remove the line")
    assert not {p for p in listed if p.partition(".")[0] != "batchfleet"}


@pytest.mark.unit
def test_the_bench_distribution_lists_every_bench_package() -> None:
    table = _setuptools(ROOT / "bench" / "pyproject.toml")
    (source,) = set(table["package-dir"].values())
    assert (ROOT / "bench" / source).resolve() == ROOT / "batchfleet" / "bench"
    assert set(table["package-dir"]) == {"batchfleet.bench"}
    assert sorted(table["packages"]) == sorted(
        _discovered(ROOT / "batchfleet" / "bench", "batchfleet.bench"))


@pytest.mark.unit
def test_the_declared_license_is_the_apache_text_and_ships() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_checkout_with_links_as_plain_files_refuses_to_build(tmp_path: Path) -> None:
    """What `git clone -c core.symlinks=false` leaves (Git for Windows' default): each link
    a small file holding its target. The build stops with the fix instead of a wheel with
    only the CLI in it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "batchfleet", *LINKED):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    for name in LINKED:
        link = src / "batchfleet" / name
        target = os.readlink(link)
        link.unlink()
        link.write_text(target)  # git writes the target with no newline
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(src)],
        cwd=tmp_path, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode != 0, done.stdout
    assert not list(tmp_path.glob("dist/*.whl"))
    output = done.stdout + done.stderr
    assert "core.symlinks=true" in output, output
    assert ("batchfleet/schemas, batchfleet/connectors, batchfleet/producers, "
            "batchfleet/workers should be folders but are plain files") in output
