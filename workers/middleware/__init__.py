"""Worker middleware: the hooks around the spine, and the production list."""

from batchfleet.workers.middleware.base import Batch, BatchKey, Chain, Middleware

__all__ = ["Batch", "BatchKey", "Chain", "Middleware"]
