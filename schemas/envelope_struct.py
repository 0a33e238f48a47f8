"""Request and result envelopes as msgspec structs: typed decoders of the common paths.

msgspec checks in C what the batch decoder's common path otherwise checks in Python
(types, integer ranges, finite floats) and builds no dict. Fields whose checks carry
meaning beyond a type (IDs, names, owners, tensors) are left ``Any`` for the same
validators as the single-request decoder. Where msgspec is not installed,
:func:`envelope_decoder` and :func:`result_decoder` are None and the msgpack paths
decode everything.
"""

# No ``from __future__ import annotations`` here: msgspec reads the structs' annotations,
# which name types local to :func:`_define`, when each class is made.
import sys
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any

from batchfleet.schemas.envelopes import MAX_EXACT_INT
from batchfleet.schemas.names import LANE_INTERACTIVE

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; a stripped install
    msgspec = None  # type: ignore[assignment]

#: An absent field (``pipeline``: absent is the common path, even nil is not).
UNSET: Any = msgspec.UNSET if msgspec is not None else object()


@cache
def _define() -> tuple[type[Any], type[Any]] | None:
    if msgspec is None:  # pragma: no cover
        return None
    big = sys.float_info.max
    finite = Annotated[float, msgspec.Meta(ge=-big, le=big)]  # NaN and infinities fail
    count = Annotated[int, msgspec.Meta(ge=0, le=MAX_EXACT_INT)]

    class Tensor(msgspec.Struct, forbid_unknown_fields=True):
        """One tensor; named tensors (a map of these) fail here and take the msgpack path."""

        dtype: str
        shape: list[int]
        data: bytes

    class Envelope(msgspec.Struct, forbid_unknown_fields=True):
        """A request envelope's fields (absent ones take the wire's defaults). An unknown
        field fails, so a key msgpack would refuse (not UTF-8, say) is never skipped."""

        v: int
        id: Any
        model: str
        inputs: Tensor
        lane: str = LANE_INTERACTIVE
        enqueued_at: finite | None = None
        deadline_at: finite | None = None
        callback_url: str | None = None
        notify: Any = None
        attempt: count = 1
        generation: count = 0
        errors: Any = None
        cache: bool | None = True
        owner: Any = None
        version: Any = None
        routing_key: Any = None
        traceparent: Any = None
        notify_format: Any = None
        degrade: Any = None
        pipeline: Any = UNSET

    class ResultEnvelope(msgspec.Struct, forbid_unknown_fields=True):
        """A result without an error, named tensors or pipeline steps (the common path);
        no field is ``Any``, so no map key msgpack would refuse is accepted here."""

        v: int
        id: str
        status: str
        outputs: Tensor | None = None
        error: None = None
        model: str = ""
        model_version: str = ""
        attempts: int | None = None
        enqueued_at: float | None = None
        started_at: finite | None = None
        finished_at: finite | None = None
        queue_ms: finite | None = None
        compute_ms: finite | None = None
        batch_size: int | None = None
        generation: int | None = None
        owner: str | None = None
        cached: bool | None = None
        degraded: bool | None = None
        degraded_reason: str | None = None
        fallback: str | None = None
        degraded_error: None = None
        steps: None = None

    return Envelope, ResultEnvelope


@cache
def envelope_decoder() -> Callable[[bytes], Any] | None:
    """``decode(raw) -> Envelope`` (raises for bytes or fields off the common path)."""
    return _decoder(0)


@cache
def result_decoder() -> Callable[[bytes], Any] | None:
    """``decode(raw) -> ResultEnvelope`` (raises for bytes or fields off the common path)."""
    return _decoder(1)


def _decoder(which: int) -> Callable[[bytes], Any] | None:
    structs = _define()
    return None if structs is None else msgspec.msgpack.Decoder(structs[which]).decode
