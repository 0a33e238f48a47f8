"""hiredis packs commands to the same bytes as redis-py, and leaves to redis-py what it
does not take (so redis-py's own errors are unchanged)."""

from __future__ import annotations

from typing import Any

import pytest
from redis._parsers import _AsyncHiredisParser, _AsyncRESP3Parser
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.redis_connection import fleet_connection
from batchfleet.connectors.redis_packing import (
    LARGE_ARGUMENT_BYTES,
    hiredis_packs,
    packed_by_hiredis,
)

pytestmark = pytest.mark.unit

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", "k", b"\x00\xff" * 10, 5, 1.5, -0.0, 1e20, float("inf"), "é", ""),
    (b"EVALSHA", "a" * 40, 2, "bf:result:1", "bf:result:2", 86400, b"meta", b"body"),
    ("XADD", "s", "*", "p", b"x" * 7000),  # above redis-py's 6,000-byte buffer cutoff
    # a full batch's result write: 500 arguments, an announcement of 80 KB, one C call
    (b"EVALSHA", "a" * 40, 250, *(f"bf:result:{i:032x}" for i in range(250)), 86400,
     b"meta", b"\x00\x01" * 250, *(b"b" * 300 for _ in range(250)), b"a" * 80_000),
    ("PING",),
    ("SET", "k", memoryview(b"v")),
]

BIG = b"v" * (LARGE_ARGUMENT_BYTES + 1)
#: A large value among small ones: hiredis packs the runs around it, the value goes as
#: its own buffer.
AROUND_LARGE: list[tuple[Any, ...]] = [
    ("SET", "k", BIG),
    ("SET", "k", memoryview(BIG)),
    ("SET", "k", bytearray(BIG)),
    (b"EVALSHA", "a" * 40, 3, *(f"bf:result:{i}" for i in range(3)), 86400, b"m", 2,
     *(b"body-%d" % i for i in range(3)), BIG),  # the large one last
    ("XADD", "s", "*", BIG, BIG, "p", 1.5, BIG),  # first, twice in a row, and last
    # more arguments than are looked through first: packed, then found over the limit
    (b"EVALSHA", "a" * 40, 20, *(f"bf:result:{i}" for i in range(20)), 86400, b"m", BIG,
     *(b"body-%d" % i for i in range(20))),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_hiredis_packs_the_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    packed = hiredis_packs(args)
    assert packed is not None and len(packed) == 1  # one buffer, from one C call
    assert b"".join(packed) == b"".join(Connection().pack_command(*args))
    conn = packed_by_hiredis(Connection)()
    assert conn.pack_command(*args) == packed


@pytest.mark.parametrize("args", AROUND_LARGE)
def test_a_large_value_goes_as_its_own_buffer_and_the_rest_through_hiredis(
        args: tuple[Any, ...]) -> None:
    packed = hiredis_packs(args)
    assert packed is not None
    assert b"".join(packed) == b"".join(Connection().pack_command(*args))
    large = [arg for arg in args if isinstance(arg, bytes | bytearray | memoryview)
             and len(arg) > LARGE_ARGUMENT_BYTES]
    assert [part for part in packed if part is BIG or isinstance(
        part, bytearray | memoryview)] == large  # never copied into a joined buffer
    assert len(packed) <= 2 + 4 * len(large)  # header, 3 per large, one per run between


@pytest.mark.parametrize("args", [
    ("CONFIG GET", "maxmemory"),  # redis-py splits a command name with a space
    ("SET", "k", bytearray(b"v")),
])
def test_what_hiredis_does_not_pack_redis_py_packs_as_before(args: tuple[Any, ...]) -> None:
    assert hiredis_packs(args) is None
    conn = packed_by_hiredis(Connection)()
    assert b"".join(conn.pack_command(*args)) == b"".join(Connection().pack_command(*args))


@pytest.mark.parametrize("bad", [True, None])
def test_values_redis_py_refuses_are_still_refused_by_it(bad: Any) -> None:
    with pytest.raises(DataError):
        packed_by_hiredis(Connection)().pack_command("SET", "k", bad)
    assert hiredis_packs(("SET", BIG, bad)) is None  # beside a large value too
    with pytest.raises(DataError):
        packed_by_hiredis(Connection)().pack_command("SET", BIG, bad)


async def test_every_connection_of_a_client_packs_with_hiredis() -> None:
    """And sends under ``asyncio.timeout`` (``connectors.redis_connection``)."""
    for url, base in (("redis://127.0.0.1:1/0", Connection),
                      ("unix:///tmp/none.sock", UnixDomainSocketConnection)):
        client = redis_client(url)
        cls = client.connection_pool.connection_class
        assert cls is fleet_connection(base) and issubclass(cls, packed_by_hiredis(base))
        await client.aclose()


class _Unprintable(list[Any]):
    """A pub/sub message that fails the test if anything formats it."""

    def __str__(self) -> str:
        raise AssertionError("a pub/sub message was formatted")

    __repr__ = __str__


@pytest.mark.parametrize("parser", [_AsyncHiredisParser, _AsyncRESP3Parser])
async def test_a_pubsub_message_is_handed_on_without_being_formatted(parser: Any) -> None:
    """redis-py 8.1 builds ``"Push response: " + str(message)`` for each one, at any log
    level (redis/redis-py#4230); a fleet connection's parser hands it on as it came."""
    conn = fleet_connection(Connection)(parser_class=parser, protocol=3)
    message = _Unprintable([b"message", b"bf:notify:c1", b"payload"])
    assert await conn._parser.handle_push_response(message) is message
