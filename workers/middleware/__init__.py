"""Worker middleware: the hooks around the spine, the context they see, the production list."""

from batchfleet.workers.context import WorkerContext
from batchfleet.workers.middleware.base import Batch, BatchKey, Chain, Middleware

__all__ = ["Batch", "BatchKey", "Chain", "Middleware", "WorkerContext"]
