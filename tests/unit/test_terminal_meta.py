"""The terminal write's arguments beside its keys and bodies (``terminal_meta``): what
Redis reads per write is a two-byte index into tuples sent once, and each channel's
``results`` announcement comes built, in the bytes §8 of docs/wire-format.md pins."""

from __future__ import annotations

import struct

import msgpack
import pytest

from batchfleet.connectors.result_store import terminal_meta
from batchfleet.connectors.values import TerminalWrite
from batchfleet.schemas.envelopes import NOTIFY_RESULTS

pytestmark = pytest.mark.unit


def _channel(client: str) -> str:
    return f"bf:notify:{client}"


def test_one_clients_batch_sends_one_tuple_and_one_built_announcement() -> None:
    writes = [TerminalWrite(f"r{i}", "succeeded", b"body-%d" % i, "c1",
                            notify_format=NOTIFY_RESULTS) for i in range(300)]
    kinds, channels, codes, announcements = terminal_meta(writes, _channel)
    assert list(kinds) == [("succeeded", 1, 0, 1)]
    assert channels == ["bf:notify:c1"]
    assert codes == struct.pack(">300H", *[1] * 300)
    assert announcements == [msgpack.packb(
        [x for i in range(300) for x in (f"r{i}", b"body-%d" % i)])]
    assert announcements[0][:3] == bytes.fromhex("dc0258")  # array16 of 600: §8's framing


def test_kinds_channels_and_formats_are_told_apart_in_order_of_first_use() -> None:
    writes = [
        TerminalWrite("a", "succeeded", b"1", "c1", notify_format=NOTIFY_RESULTS),
        TerminalWrite("b", "failed", b"2", "c2"),  # IDs only: nothing built for c2
        TerminalWrite("c", "succeeded", b"3", None),  # no channel at all
        TerminalWrite("d", "succeeded", b"4", "c1", generation=2,
                      notify_format=NOTIFY_RESULTS),
        TerminalWrite("e", "succeeded", b"5", "c1", notify_format=NOTIFY_RESULTS),
    ]
    kinds, channels, codes, announcements = terminal_meta(writes, _channel)
    assert list(kinds) == [("succeeded", 1, 0, 1), ("failed", 2, 0, 0),
                           ("succeeded", 0, 0, 0), ("succeeded", 1, 2, 1)]
    assert struct.unpack(">5H", codes) == (1, 2, 3, 4, 1)
    assert channels == ["bf:notify:c1", "bf:notify:c2"]
    assert announcements == [msgpack.packb(["a", b"1", "d", b"4", "e", b"5"]), b""]


def test_no_writes_build_nothing() -> None:
    assert terminal_meta([], _channel) == ({}, [], b"", [])
