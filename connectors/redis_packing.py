"""Redis commands packed by hiredis, in C, instead of by redis-py's asyncio connection.

redis-py's asyncio ``Connection.pack_command`` encodes and joins each argument in Python,
about 0.6 us an argument on this machine. A worker's result write and ack and a client's
submit send two to four arguments per request, so that is a few microseconds of every
request on both sides; ``hiredis.pack_command`` does the same in about 0.1 us. The wire
bytes are identical (tests/unit/test_redis_packing.py). Anything hiredis does not take
(a bool or None, which redis-py refuses with its own error, a command name with a
space, a small bytearray) goes to redis-py's own packing. A large value is kept out of
the joined buffer, as redis-py keeps it.
"""

from __future__ import annotations

from typing import Any

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _hiredis_pack = None  # type: ignore[assignment]

#: An argument larger than this is sent as its own buffer, as redis-py sends large values,
#: instead of being copied into the packed command a second time.
LARGE_ARGUMENT_BYTES = 1024 * 1024
_BUFFERS = (bytes, memoryview, bytearray)
#: Commands with at most this many arguments are looked through before packing, so a
#: large value in one (a bulk request's payload) is never copied; longer ones are packed
#: first and looked through only when the packed command is over the limit.
_LOOK_FIRST = 16


def hiredis_packs(args: tuple[Any, ...]) -> list[bytes] | None:
    """The command packed by hiredis, or None where redis-py must pack it.

    One C call for any command under :data:`LARGE_ARGUMENT_BYTES` in all, however many
    arguments it has: a worker's result write for a full batch carries about 500 of
    them, one an announcement of about 80 KB, and packing those in Python (as a 64 KB
    cutoff for "large" did) cost more than the rest of the write. Large arguments go as
    their own buffers, the ones around them still packed by hiredis."""
    if _hiredis_pack is None:
        return None
    first = args[0]
    if not ((type(first) is str and " " not in first) or (type(first) is bytes
                                                            and b" " not in first)):
        return None
    try:
        if len(args) <= _LOOK_FIRST:  # a few arguments, maybe one large (a bulk payload)
            large = _large(args)
            return _packed_around(args, large) if large else [_hiredis_pack(args)]
        packed = _hiredis_pack(args)
        if len(packed) <= LARGE_ARGUMENT_BYTES:
            return [packed]
        large = _large(args)
        return _packed_around(args, large) if large else [packed]
    except TypeError:  # a type it does not take: redis-py packs it, or says why not
        return None


def _large(args: tuple[Any, ...]) -> list[int]:
    return [i for i, arg in enumerate(args)
            if type(arg) in _BUFFERS and len(arg) > LARGE_ARGUMENT_BYTES]


def _packed_around(args: tuple[Any, ...], large: list[int]) -> list[bytes]:
    """RESP for ``args``: each run of small arguments packed by hiredis (less the array
    header it writes), each large one as a length line, its own buffer and CRLF."""
    out: list[Any] = [b"*%d\r\n" % len(args)]
    start = 0
    for at in [*large, len(args)]:
        if start < at:
            run = _hiredis_pack(args[start:at])
            out.append(run[run.index(b"\r\n") + 2:])
        if at < len(args):
            value = args[at]
            out += (b"$%d\r\n" % len(value), value, b"\r\n")  # len(), as redis-py
        start = at + 1
    return out


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
