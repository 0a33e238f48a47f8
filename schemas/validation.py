"""The one strict check for every name and ID, and the one for tensor shapes.

Names and IDs end up in Redis keys, stream and topic names, pub/sub channels,
comma-joined notifications and URL paths, so each is held to a small ASCII
alphabet, matched with ``fullmatch`` (``re``'s ``$`` also matches before a
trailing newline, which let ``"id\\n"`` through). Shapes are plain non-negative
integers: ``10.0`` and ``True`` compare equal to ``10`` and ``1``, so a check
that trusts ``==`` (a cache lookup, say) would let them through only sometimes.

The SDK, the envelope decoder, the gateway and the CLI all call these, and
none of them keeps state, so an answer never depends on what was seen before.
"""

from __future__ import annotations

import re
from typing import Any, Final

from batchfleet.schemas.errors import ValidationError

MODEL_NAME_GRAMMAR: Final = "1-64 characters of letters, digits, '.', '_' or '-', " \
                            "starting with a letter or digit"
REQUEST_ID_GRAMMAR: Final = "1-128 characters of letters, digits or ._:@-"
KEY_ID_GRAMMAR: Final = "1-64 characters of letters, digits, '.', '_' or '-'"

_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:@-]{1,128}", re.ASCII)
_KEY_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}", re.ASCII)

#: At most this many dimensions, each below ``MAX_DIM`` (a 16 MiB message cannot
#: hold more, and numpy refuses absurd sizes with a plain ValueError).
MAX_NDIM: Final = 8
MAX_DIM: Final = 2**31 - 1


def _check(value: Any, pattern: re.Pattern[str], what: str, grammar: str) -> str:
    if type(value) is not str or pattern.fullmatch(value) is None:
        raise ValidationError(f"{what} {value!r} must be {grammar}")
    return value


def check_model_name(name: Any) -> str:
    """Model names become stream and topic names."""
    return _check(name, _MODEL_NAME, "model name", MODEL_NAME_GRAMMAR)


def check_request_id(request_id: Any) -> str:
    """Request IDs travel in keys, URLs and comma-joined notifications."""
    return _check(request_id, _REQUEST_ID, "request_id", REQUEST_ID_GRAMMAR)


def check_notify(client_id: Any) -> str:
    """A client ID becomes part of a pub/sub channel name: request-ID rules."""
    return _check(client_id, _REQUEST_ID, "notify", REQUEST_ID_GRAMMAR)


def check_key_id(key_id: Any) -> str:
    """API key IDs are stored with results as their owner and shown in logs."""
    return _check(key_id, _KEY_ID, "key id", KEY_ID_GRAMMAR)


def is_shape(shape: Any) -> bool:
    """True for a list or tuple of at most ``MAX_NDIM`` ints in ``[0, MAX_DIM]``.

    ``type(d) is int`` on purpose: bool is an int subclass, and a float is not.
    """
    if type(shape) not in (list, tuple) or len(shape) > MAX_NDIM:
        return False
    for d in shape:  # noqa: SIM110 (a plain loop: twice as fast as all() on the hot path)
        if type(d) is not int or not 0 <= d <= MAX_DIM:
            return False
    return True


def check_shape(shape: Any, where: str = "inputs") -> tuple[int, ...]:
    """``shape`` as a tuple, or ValidationError naming where it was found."""
    if not is_shape(shape):
        raise ValidationError(
            f"{where}: shape must be a list of at most {MAX_NDIM} non-negative integers "
            f"(no floats or booleans), got {shape!r}")
    return tuple(shape)
