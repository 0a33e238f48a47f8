"""The wire contract: envelopes, the tensor codec, names and the error hierarchy.

This package imports nothing else from the project, so any service (or another
language, see ``docs/wire-format.md``) can speak it on its own.
"""

from batchfleet.schemas.envelopes import (
    DEFAULT_LIMITS,
    SCHEMA_VERSION,
    STATUSES,
    TERMINAL_STATUSES,
    ErrorInfo,
    Limits,
    Request,
    RequestHeader,
    Result,
    Status,
    decode_request,
    decode_request_header,
    decode_result,
    encode_request,
    encode_result,
    request_from_header,
)
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.names import LANE_BULK, LANE_INTERACTIVE, LANES, Names
from batchfleet.schemas.tensors import Array, Tensors, decode_tensors, encode_tensors, signature

__all__ = [
    "DEFAULT_LIMITS",
    "LANES",
    "LANE_BULK",
    "LANE_INTERACTIVE",
    "SCHEMA_VERSION",
    "STATUSES",
    "TERMINAL_STATUSES",
    "Array",
    "BatchfleetError",
    "ErrorInfo",
    "Limits",
    "Names",
    "Request",
    "RequestHeader",
    "Result",
    "Status",
    "Tensors",
    "decode_request",
    "decode_request_header",
    "decode_result",
    "decode_tensors",
    "encode_request",
    "encode_result",
    "encode_tensors",
    "request_from_header",
    "signature",
]
