"""The HTTP gateway: FastAPI over the SDK (see docs/http-api.md)."""

from producers.gateway.app import create_app
from producers.gateway.auth import ApiKey, KeyRing, hash_key, new_key
from producers.gateway.routes import derive_request_id
from producers.gateway.settings import GatewaySettings

__all__ = ["ApiKey", "GatewaySettings", "KeyRing", "create_app", "derive_request_id",
           "hash_key", "new_key"]
