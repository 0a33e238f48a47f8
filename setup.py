"""Refuse to build from a checkout whose package links are plain files.

``batchfleet/{schemas,connectors,producers,workers}`` are symlinks to the top-level
folders. A clone made with ``core.symlinks=false`` (Git for Windows' default, and so
``pip install git+…`` there) writes each link as a small text file holding its target;
setuptools would then build a wheel with only the CLI in it and report success, and
``batchfleet --help`` would fail on import. Failing here names the fix instead.
Everything else about the build is in ``pyproject.toml``.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

#: The package folders that ``batchfleet/`` reaches through a symlink.
LINKED = ("schemas", "connectors", "producers", "workers")
ADVICE = ("clone with symlinks enabled, git clone -c core.symlinks=true ... (on Windows, "
          "turn on Developer Mode first, or install from a built wheel), then build again")


def linked_folders_missing(root: Path) -> list[str]:
    """The ``batchfleet/<name>`` entries that are not directories (a link written as a file)."""
    return [name for name in LINKED if not (root / "batchfleet" / name).is_dir()]


missing = linked_folders_missing(Path(__file__).resolve().parent)
if missing:
    raise SystemExit(
        f"batchfleet: {', '.join(f'batchfleet/{name}' for name in missing)} should be "
        f"folders but are plain files: this checkout wrote its symlinks as files (git "
        f"core.symlinks=false): {ADVICE}")
setup()
