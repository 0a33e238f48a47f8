"""``from batchfleet import Client, AsyncClient, Result`` and the error types, resolved on
first use (PEP 562), so importing the package or its CLI loads nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import batchfleet
from batchfleet.schemas import errors

pytestmark = pytest.mark.unit

HEAVY = ("torch", "fastapi", "pyarrow", "aiokafka", "matplotlib", "prometheus_client", "rq")


def test_every_public_name_resolves_to_its_one_class() -> None:
    for name in batchfleet.__all__:
        assert getattr(batchfleet, name) is not None, name
        assert name in dir(batchfleet)
    assert batchfleet.ValidationError is errors.ValidationError
    assert issubclass(batchfleet.WaitTimeoutError, batchfleet.BatchfleetError)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        batchfleet.Nope  # type: ignore[attr-defined]  # noqa: B018


def test_importing_the_package_and_the_cli_loads_nothing_heavy() -> None:
    """In the full install too: the heavy modules are there, and still not imported."""
    probe = ("import json, sys; import batchfleet; from batchfleet import Client, Result; "
             "import batchfleet.cli; loaded = {m.partition('.')[0] for m in sys.modules}; "
             f"print(json.dumps(sorted(loaded & {set(HEAVY)!r})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert json.loads(out) == []
