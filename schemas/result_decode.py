"""Result decoding for callers: msgspec's typed path first, the msgpack decoder otherwise.

A caller decodes one result per request, so its CPU per request follows this. Results
on the common path (no error, one tensor, no pipeline steps) are decoded by msgspec into
a typed struct; anything else, and every message msgspec refuses, goes to
:func:`batchfleet.schemas.envelopes.decode_result`, which says why it is wrong. Both give
the same :class:`Result` for every message the typed path accepts
(tests/unit/test_result_decode.py).
"""

from __future__ import annotations

from typing import Any

from batchfleet.schemas import envelopes
from batchfleet.schemas.envelope_struct import result_decoder
from batchfleet.schemas.envelopes import DEFAULT_LIMITS, SCHEMA_VERSION, STATUSES, Limits, Result
from batchfleet.schemas.errors import SchemaError
from batchfleet.schemas.tensors import decode_tensor_parts
from batchfleet.schemas.validation import check_request_id


def decode_result(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> Result:
    """:func:`batchfleet.schemas.envelopes.decode_result`, faster where msgspec is installed."""
    typed = result_decoder()
    # msgspec has no container limit: only a message shorter than it can take its path
    if typed is not None and len(raw) <= min(limits.max_message_bytes,
                                             limits.max_container_len):
        try:
            result = typed_result(typed(raw))
        except Exception:  # off the common path, or wrong: the full decoder says why
            result = None
        if result is not None:
            return result
    return envelopes.decode_result(raw, limits)


def typed_result(env: Any) -> Result | None:
    """The :class:`Result` of a typed envelope, or None where the full decoder must look."""
    if env.v != SCHEMA_VERSION or env.status not in STATUSES:
        return None
    tensor, owner = env.outputs, env.owner
    try:
        check_request_id(env.id)
        outputs = None if tensor is None else decode_tensor_parts(
            tensor.dtype, tensor.shape, tensor.data, "outputs")
        if owner is not None:
            owner = envelopes._owner(owner)
    except SchemaError:
        return None
    # positional, in field order: this runs once per result a caller gets
    return Result(
        env.id, env.status, outputs, None, env.model, env.model_version, env.attempts or 0,
        float(env.enqueued_at or 0.0), env.started_at, env.finished_at, env.queue_ms,
        env.compute_ms, env.batch_size, env.generation or 0, {}, owner, env.cached is True,
        env.degraded is True, env.degraded_reason, env.fallback, None, None,
    )
