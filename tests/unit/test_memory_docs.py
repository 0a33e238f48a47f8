"""docs/memory.md's examples run as written: the seams example always, the worker and
client example as well (the doors take ``memory://`` URLs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from batchfleet.connectors.memory_state import reset_memory

pytestmark = pytest.mark.unit
DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_seams_example_runs() -> None:
    [seams] = [code for code in examples() if "first_wins" in code]
    exec(compile(seams, f"{DOC}:seams", "exec"), {"__name__": "__doc_example__"})
    reset_memory("memory://seams")


def test_the_worker_and_client_example_runs() -> None:
    [worker] = [code for code in examples() if "Worker(" in code]
    exec(compile(worker, f"{DOC}:worker", "exec"), {"__name__": "__doc_example__"})
    reset_memory("memory://doc")
