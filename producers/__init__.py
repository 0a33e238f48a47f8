"""What upstream code uses: the ``Client`` / ``AsyncClient`` SDK."""

from producers.client import AsyncClient, Client, new_request_id
from schemas.envelopes import ErrorInfo, Result
from schemas.errors import BatchfleetError, ValidationError, WaitTimeoutError

__all__ = [
    "AsyncClient",
    "BatchfleetError",
    "Client",
    "ErrorInfo",
    "Result",
    "ValidationError",
    "WaitTimeoutError",
    "new_request_id",
]
