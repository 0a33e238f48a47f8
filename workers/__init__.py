"""The fleet runtime: consumer loop, micro-batcher, model runner and result writing."""

from workers.settings import WorkerSettings
from workers.worker import Worker

__all__ = ["Worker", "WorkerSettings"]
