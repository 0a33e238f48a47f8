"""The HTTP gateway: FastAPI over the SDK (see docs/http-api.md).

``create_app`` is imported on first use: the key tools (``gateway hash-key``) need
only the standard library, not the gateway extra.
"""

from typing import TYPE_CHECKING, Any

from batchfleet.producers.gateway.auth import ApiKey, KeyRing, hash_key, new_key
from batchfleet.producers.gateway.settings import GatewaySettings
from batchfleet.producers.gateway.tenancy import derive_request_id, fingerprint

if TYPE_CHECKING:
    from batchfleet.producers.gateway.app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from batchfleet.producers.gateway.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ApiKey", "GatewaySettings", "KeyRing", "create_app", "derive_request_id",
           "fingerprint", "hash_key", "new_key"]
