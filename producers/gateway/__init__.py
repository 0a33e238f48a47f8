"""The HTTP gateway: FastAPI over the SDK (see docs/http-api.md)."""

from batchfleet.producers.gateway.app import create_app
from batchfleet.producers.gateway.auth import ApiKey, KeyRing, hash_key, new_key
from batchfleet.producers.gateway.settings import GatewaySettings
from batchfleet.producers.gateway.tenancy import derive_request_id, fingerprint

__all__ = ["ApiKey", "GatewaySettings", "KeyRing", "create_app", "derive_request_id",
           "fingerprint", "hash_key", "new_key"]
