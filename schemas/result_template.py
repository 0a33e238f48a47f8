"""Result envelopes for a whole batch, filled in from a template.

The results of one batch share most of their envelope: version, status, model,
model version, the batch's timestamps, compute time and size, and the dtype and
shape of each output. Those are packed once per batch; per request only the ID,
the output bytes, attempts, enqueued_at, queue_ms and generation are packed and
spliced in. msgpack packs a map's entries in order, so the bytes are exactly
those :func:`encode_result` writes (tests/unit/test_result_template.py), and the
wire format does not change. A result off that path (failed, named outputs, an
odd dtype) is encoded by :func:`encode_result` itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgpack
import numpy as np

from batchfleet.schemas.envelopes import SCHEMA_VERSION, Result, encode_result
from batchfleet.schemas.tensors import DTYPES, wire_dtype
from batchfleet.schemas.validation import MAX_NDIM

#: The per-request parts of a template, in envelope order, between constant pieces.
_Template = tuple[bytes, bytes, bytes, bytes, bytes, bytes]


def encode_results(results: Sequence[Result]) -> list[bytes]:
    """``[encode_result(r) for r in results]``, byte for byte, packing a batch's shared
    fields once."""
    pack = msgpack.Packer(use_bin_type=True).pack
    templates: dict[bytes, _Template | None] = {}
    out: list[bytes] = []
    last: Result | None = None
    template: _Template | None = None
    for res in results:
        outputs = res.outputs
        if (res.status != "succeeded" or res.error is not None or res.degraded
                or res.steps is not None
                or type(outputs) is not np.ndarray):
            out.append(encode_result(res))
            continue
        # The results of one batch share these objects: identity is the cheap, exact test.
        if last is None or not (
                res.started_at is last.started_at and res.finished_at is last.finished_at
                and res.compute_ms is last.compute_ms and res.batch_size is last.batch_size
                and res.model_version is last.model_version and res.model is last.model
                and outputs.dtype is last.outputs.dtype  # type: ignore[union-attr]
                and outputs.shape == last.outputs.shape):  # type: ignore[union-attr]
            # packed, so a key never equates values that pack apart (0 and 0.0, 0.0 and -0.0)
            key = b"".join(pack(v) for v in (
                res.model, res.model_version, res.started_at, res.finished_at, res.compute_ms,
                res.batch_size, outputs.dtype.str, outputs.shape))
            try:
                template = templates[key]
            except KeyError:
                template = templates[key] = _template(res, outputs, pack)
            last = res
        if template is None:
            out.append(encode_result(res))
            continue
        p1, p2, p3, p4, p5, p6 = template
        count = 15 + (res.owner is not None) + (1 if res.cached else 0)
        parts = [_MAP_HEADERS[count], p1, pack(res.request_id), p2, pack(outputs.tobytes()),
                 p3, pack(res.attempts), p4, pack(res.enqueued_at), p5, pack(res.queue_ms), p6,
                 pack(res.generation)]
        if res.owner is not None:
            parts += (_OWNER, pack(res.owner))
        if res.cached:
            parts.append(_CACHED)
        out.append(b"".join(parts))
    return out


def _template(res: Result, outputs: np.ndarray[Any, Any], pack: Any) -> _Template | None:
    """The constant pieces for results like ``res``; None where only ``encode_tensor``
    knows what to do (a dtype to convert or refuse, too many dimensions)."""
    name = wire_dtype(outputs.dtype)
    if name is None or DTYPES[name].str != outputs.dtype.str or outputs.ndim > MAX_NDIM:
        return None
    tensor = b"\x83" + pack("dtype") + pack(name) + pack("shape") + pack(list(outputs.shape))
    return (
        pack("v") + pack(SCHEMA_VERSION) + pack("id"),
        pack("status") + pack("succeeded") + pack("outputs") + tensor + pack("data"),
        pack("error") + pack(None) + pack("model") + pack(res.model) + pack("model_version")
        + pack(res.model_version) + pack("attempts"),
        pack("enqueued_at"),
        pack("started_at") + pack(res.started_at) + pack("finished_at") + pack(res.finished_at)
        + pack("queue_ms"),
        pack("compute_ms") + pack(res.compute_ms) + pack("batch_size") + pack(res.batch_size)
        + pack("generation"),
    )


#: fixmap headers: 15 keys always, owner and cached only when set (docs/wire-format.md §6.1).
_MAP_HEADERS: Final = {15: b"\x8f", 16: b"\xde\x00\x10", 17: b"\xde\x00\x11"}
_OWNER: Final = msgpack.packb("owner")
_CACHED: Final = msgpack.packb("cached") + msgpack.packb(True)
