"""Request and pending-result envelopes from a template: the producer's fast encoder.

Every request a client sends to one model with one set of options shares all
of its envelope but the ID, the times, the trace context and the inputs.
``encode_request`` validates and packs those shared fields again for each
request; a :class:`RequestTemplate` validates them once, packs them once, and
then joins the few per-request pieces between the packed parts. The same
goes for the ``pending`` record a submit writes (``encode_result`` of a
pending :class:`Result`).

The output is byte for byte what ``encode_request`` and ``encode_result``
give for the same request. The template proves that once when it is built,
on a probe request; should the reference encoders ever pack differently
(a field added, say), the template notices and sends everything through
them instead, so the wire never depends on two copies of the layout agreeing.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import msgpack
import numpy as np

from batchfleet.schemas.envelopes import (
    DEGRADE_ALLOW,
    SCHEMA_VERSION,
    Request,
    Result,
    degrade_of,
    encode_request,
    encode_result,
    notify_format_of,
)
from batchfleet.schemas.tensors import Tensors, as_array, encode_tensor, encode_tensors

_DOUBLE: Final = struct.Struct(">d")
#: (dtype.str, shape) -> a packed tensor map up to its raw bytes: checked once, then reused.
_TENSOR_HEADS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_MAX_TENSOR_HEADS = 4096
_PROBE_ID: Final = "probe-0"
_PROBE_TRACEPARENT: Final = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


_DEADLINE_KEY: Final = _pack("deadline_at")
_TRACEPARENT_KEY: Final = _pack("traceparent")


def _float(value: float) -> bytes:
    """msgpack float 64, as ``packb`` writes a Python float."""
    return b"\xcb" + _DOUBLE.pack(value)


def _map_header(entries: int) -> bytes:
    return msgpack.Packer().pack_map_header(entries)  # type: ignore[no-any-return]


def _pairs(*items: tuple[str, Any]) -> bytes:
    return b"".join(_pack(key) + _pack(value) for key, value in items)


def pack_inputs(value: Tensors | Any) -> bytes:
    """The packed ``inputs`` value, as ``packb(encode_tensors(value))`` gives it.

    A plain ndarray whose (dtype, shape) was packed before costs one dict lookup and
    one ``tobytes``; anything else (named tensors, lists, big-endian or unsupported
    dtypes) goes through ``encode_tensors``, which validates and raises as usual.
    """
    arr = value if type(value) is np.ndarray else None
    if arr is None and not isinstance(value, Mapping):
        converted = as_array(value)
        arr = converted if type(converted) is np.ndarray else None
    # Big-endian arrays are swapped by encode_tensor: tobytes() would not match.
    if arr is None or arr.dtype.str[0] == ">":
        return _pack(encode_tensors(value))
    key = (arr.dtype.str, arr.shape)
    head = _TENSOR_HEADS.get(key)
    if head is None:
        packed = _pack(encode_tensor(arr))  # validates dtype and rank, or raises
        head = packed[:len(packed) - arr.nbytes]
        if len(_TENSOR_HEADS) < _MAX_TENSOR_HEADS:
            _TENSOR_HEADS[key] = head
        return packed
    return head + arr.tobytes()


class RequestTemplate:
    """Encodes requests that share model, lane, callback, notify, owner, version,
    routing key, cache flag and announcement format; see the module doc.

    Building one validates those fields exactly as ``encode_request`` does (it encodes
    a probe request), so a bad one raises ValidationError here, once.
    """

    __slots__ = ("_head", "_head_traced", "_mid", "_pending_head", "_pending_mid",
                 "_pending_tail", "_pk", "_reference", "_tail", "_tail_traced", "cache",
                 "callback_url", "degrade", "lane", "model", "notify", "notify_format", "owner",
                 "routing_key", "version")

    def __init__(self, model: str, lane: str, *, notify: str | None = None,
                 callback_url: str | None = None, owner: str | None = None,
                 version: str | None = None, routing_key: str | None = None,
                 cache: bool = True, notify_format: str | None = None,
                 degrade: str = DEGRADE_ALLOW) -> None:
        self.model, self.lane, self.notify, self.callback_url = model, lane, notify, callback_url
        self.degrade = degrade_of(degrade)
        never = self.degrade != DEGRADE_ALLOW
        self.notify_format = notify_format_of(notify_format)
        self.owner, self.version, self.routing_key, self.cache = owner, version, routing_key, cache
        #: Its own packer: a template serves one client, so one thread.
        self._pk = msgpack.Packer(use_bin_type=True).pack
        optional = [(k, v) for k, v in (("notify_format", self.notify_format),
                                        ("owner", owner), ("version", version),
                                        ("routing_key", routing_key)) if v is not None]
        # Fields in encode_request's order: id, times, constants, traceparent, cache, inputs.
        entries = 12 + len(optional) + (0 if cache else 1) + never
        self._head = _map_header(entries) + _pairs(("v", SCHEMA_VERSION)) + _pack("id")
        self._head_traced = (_map_header(entries + 1) + _pairs(("v", SCHEMA_VERSION))
                             + _pack("id"))
        self._mid = _pairs(("model", model), ("lane", lane)) + _pack("enqueued_at")
        constants = _pairs(("callback_url", callback_url), ("notify", notify),
                           ("attempt", 1), ("generation", 0), ("errors", []), *optional)
        last = ((b"" if cache else _pairs(("cache", False)))
                + (_pairs(("degrade", self.degrade)) if never else b"") + _pack("inputs"))
        self._tail = constants + last
        self._tail_traced = (constants, last)
        pending = 15 + (owner is not None)
        self._pending_head = _map_header(pending) + _pairs(("v", SCHEMA_VERSION)) + _pack("id")
        self._pending_mid = (_pairs(("status", "pending"), ("outputs", None), ("error", None),
                                    ("model", model), ("model_version", ""), ("attempts", 0))
                             + _pack("enqueued_at"))
        self._pending_tail = (_pairs(("started_at", None), ("finished_at", None),
                                     ("queue_ms", None), ("compute_ms", None),
                                     ("batch_size", None), ("generation", 0))
                              + (b"" if owner is None else _pairs(("owner", owner))))
        self._reference = False
        self._reference = not self._agrees()

    def request(self, request_id: str, enqueued_at: float, inputs: Any,
                deadline_at: float | None = None, traceparent: str | None = None) -> Request:
        """The :class:`Request` these bytes stand for (tests, tracing, the reference path)."""
        return Request(request_id=request_id, model=self.model, inputs=inputs, lane=self.lane,
                       enqueued_at=enqueued_at, deadline_at=deadline_at,
                       callback_url=self.callback_url, notify=self.notify, owner=self.owner,
                       version=self.version, routing_key=self.routing_key,
                       traceparent=traceparent, cache=self.cache,
                       notify_format=self.notify_format, degrade=self.degrade)

    def encode(self, request_id: str, enqueued_at: float, inputs: Any,
               deadline_at: float | None = None, traceparent: str | None = None) -> bytes:
        """``encode_request`` of :meth:`request`. ``request_id`` must already be valid
        (checked by the caller, or made by ``uuid4().hex``); inputs are validated here."""
        if self._reference:
            return encode_request(self.request(request_id, enqueued_at, inputs, deadline_at,
                                               traceparent))
        deadline = b"\xc0" if deadline_at is None else _float(deadline_at)
        if traceparent is None:
            return b"".join((self._head, self._pk(request_id), self._mid, _float(enqueued_at),
                             _DEADLINE_KEY, deadline, self._tail, pack_inputs(inputs)))
        constants, last = self._tail_traced
        return b"".join((self._head_traced, self._pk(request_id), self._mid,
                         _float(enqueued_at), _DEADLINE_KEY, deadline, constants,
                         _TRACEPARENT_KEY, self._pk(traceparent), last, pack_inputs(inputs)))

    def pending(self, request_id: str, enqueued_at: float) -> bytes:
        """``encode_result`` of the ``pending`` result a submit records first."""
        if self._reference:
            return encode_result(Result(request_id, "pending", model=self.model,
                                        enqueued_at=enqueued_at, owner=self.owner))
        return b"".join((self._pending_head, self._pk(request_id), self._pending_mid,
                         _float(enqueued_at), self._pending_tail))

    def _agrees(self) -> bool:
        """Encode a probe both ways (validating every constant field as a side effect)."""
        inputs = np.zeros(2, np.float32)
        probe = self.request(_PROBE_ID, 1.5, inputs, 2.5)
        traced = self.request(_PROBE_ID, 1.5, inputs, None, _PROBE_TRACEPARENT)
        return (self.encode(_PROBE_ID, 1.5, inputs, 2.5) == encode_request(probe)
                and self.encode(_PROBE_ID, 1.5, inputs, None, traced.traceparent)
                == encode_request(traced)
                and self.pending(_PROBE_ID, 1.5) == encode_result(Result(
                    _PROBE_ID, "pending", model=self.model, enqueued_at=1.5,
                    owner=self.owner)))


__all__ = ["RequestTemplate", "pack_inputs"]
