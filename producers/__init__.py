"""What upstream code uses: the ``Client`` / ``AsyncClient`` SDK."""

from batchfleet.producers.client import AsyncClient, Client, new_request_id
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.errors import (
    BatchfleetError,
    OverloadedError,
    RequestConflictError,
    RequestLostError,
    ValidationError,
    WaitTimeoutError,
)

__all__ = [
    "AsyncClient",
    "BatchfleetError",
    "Client",
    "ErrorInfo",
    "OverloadedError",
    "RequestConflictError",
    "RequestLostError",
    "Result",
    "ValidationError",
    "WaitTimeoutError",
    "new_request_id",
]
