"""The fleet runtime: consumer loop, micro-batcher, model runner and result writing.

``Worker`` is resolved on first use: the settings (which the CLI reads to build
``batchfleet worker --help``) must import without torch, so that help works on a
client-only install and names the missing extra only when a worker really starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchfleet.workers.settings import WorkerSettings

if TYPE_CHECKING:
    from batchfleet.workers.worker import Worker

__all__ = ["Worker", "WorkerSettings"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from batchfleet.workers.worker import Worker

        return Worker
    raise AttributeError(f"module 'batchfleet.workers' has no attribute {name!r}")
