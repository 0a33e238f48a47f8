"""batchfleet: asynchronous micro-batching PyTorch inference workers.

The public client API is re-exported here (``from batchfleet import Client``), and the
handler API for serving one's own model (``ModelHandler``, ``TensorSpec``,
``InvalidInputError``; docs/models.md);
the runtime is ``batchfleet.workers``, the SDK ``batchfleet.producers``, the
wire contract ``batchfleet.schemas`` and the broker and store adapters
``batchfleet.connectors``. Names are resolved on first use, so importing the
package (the CLI does) loads nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Client": "batchfleet.producers.client",
    "AsyncClient": "batchfleet.producers.client",
    "new_request_id": "batchfleet.producers.client",
    "Result": "batchfleet.schemas.envelopes",
    "ErrorInfo": "batchfleet.schemas.envelopes",
    "BatchfleetError": "batchfleet.schemas.errors",
    "ConfigError": "batchfleet.schemas.errors",
    "TransportError": "batchfleet.schemas.errors",
    "ResultStoreError": "batchfleet.schemas.errors",
    "ValidationError": "batchfleet.schemas.errors",
    "WaitTimeoutError": "batchfleet.schemas.errors",
    "RequestLostError": "batchfleet.schemas.errors",
    "RequestConflictError": "batchfleet.schemas.errors",
    "OverloadedError": "batchfleet.schemas.errors",
    "UnknownModelError": "batchfleet.schemas.errors",
    "InvalidInputError": "batchfleet.schemas.errors",
    # the handler API (docs/models.md): ModelHandler needs torch, the worker extra
    "TensorSpec": "batchfleet.schemas.tensor_spec",
    "ModelHandler": "batchfleet.workers.models.handler",
}

if TYPE_CHECKING:
    from batchfleet.producers.client import AsyncClient, Client, new_request_id
    from batchfleet.schemas.envelopes import ErrorInfo, Result
    from batchfleet.schemas.errors import (
        BatchfleetError,
        ConfigError,
        InvalidInputError,
        OverloadedError,
        RequestConflictError,
        RequestLostError,
        ResultStoreError,
        TransportError,
        UnknownModelError,
        ValidationError,
        WaitTimeoutError,
    )
    from batchfleet.schemas.tensor_spec import TensorSpec
    from batchfleet.workers.models.handler import ModelHandler

__all__ = [
    "AsyncClient",
    "BatchfleetError",
    "Client",
    "ConfigError",
    "ErrorInfo",
    "InvalidInputError",
    "ModelHandler",
    "OverloadedError",
    "RequestConflictError",
    "RequestLostError",
    "Result",
    "ResultStoreError",
    "TensorSpec",
    "TransportError",
    "UnknownModelError",
    "ValidationError",
    "WaitTimeoutError",
    "new_request_id",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'batchfleet' has no attribute {name!r}")
    import importlib

    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:  # torch, for ModelHandler in a producer-only install
        raise ImportError(f"batchfleet.{name} needs the worker extra: "
                          f"pip install 'batchfleet[worker]' ({exc})") from exc
    value = getattr(imported, name)
    globals()[name] = value  # resolved once; later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
