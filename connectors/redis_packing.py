"""Redis commands packed by hiredis, in C, instead of by redis-py's asyncio connection.

redis-py's asyncio ``Connection.pack_command`` encodes and joins each argument in Python,
about 0.6 us an argument on this machine. A worker's result write and ack and a client's
submit send two to four arguments per request, so that is a few microseconds of every
request on both sides; ``hiredis.pack_command`` does the same in about 0.1 us. The wire
bytes are identical (tests/unit/test_redis_packing.py). Anything hiredis does not take
(a bool or None, which redis-py refuses with its own error, a command name with a
space) and any command carrying a large value (kept out of one joined buffer, as
redis-py does) goes to redis-py's own packing.
"""

from __future__ import annotations

from typing import Any

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _hiredis_pack = None  # type: ignore[assignment]

#: A command with an argument larger than this is packed by redis-py, which sends large
#: values as their own buffers instead of copying them into one.
LARGE_ARGUMENT_BYTES = 64 * 1024
_BUFFERS = (bytes, memoryview, bytearray)


def hiredis_packs(args: tuple[Any, ...]) -> list[bytes] | None:
    """The command packed by hiredis, or None where redis-py must pack it."""
    if _hiredis_pack is None:
        return None
    first = args[0]
    if not ((type(first) is str and " " not in first) or (type(first) is bytes
                                                            and b" " not in first)):
        return None
    for arg in args:
        if type(arg) in _BUFFERS and len(arg) > LARGE_ARGUMENT_BYTES:
            return None
    try:
        return [_hiredis_pack(args)]
    except TypeError:  # a type it does not take: redis-py packs it, or says why not
        return None


_PACKED: dict[type[Any], type[Any]] = {}


def packed_by_hiredis(base: type[Any]) -> type[Any]:
    """``base`` (a redis-py asyncio connection class) packing commands with hiredis;
    one subclass per base, made on first use."""
    made = _PACKED.get(base)
    if made is None:
        made = _PACKED[base] = _subclass(base)
    return made


def _subclass(base: type[Any]) -> type[Any]:
    def pack_command(self: Any, *args: Any) -> list[bytes]:
        packed = hiredis_packs(args)
        return packed if packed is not None else base.pack_command(self, *args)

    return type(f"HiredisPacked{base.__name__}", (base,), {"pack_command": pack_command})
