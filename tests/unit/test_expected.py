"""The client's memory of the IDs it submitted (``producers/expected.py``): bounded by
count and by bytes, oldest out, and a reconnect forgets only what had not arrived."""

from __future__ import annotations

import pytest

from batchfleet.producers.expected import Expected

pytestmark = pytest.mark.unit


def test_the_count_bound_lets_the_oldest_go() -> None:
    expected = Expected(cap=3)
    assert [expected.add(rid) for rid in ("a", "b", "c", "a")] == [True, True, True, False]
    expected.add("d")
    expected.trim()
    assert list(expected) == ["b", "c", "d"]


def test_the_bytes_bound_counts_kept_bodies_and_what_is_taken_back() -> None:
    expected = Expected(bytes_cap=10)
    for rid in ("a", "b", "c"):
        expected.add(rid)
    expected.keep("a", b"123456")
    expected.keep("b", b"1234")  # 10 bytes: at the bound, all kept
    assert dict(expected) == {"a": b"123456", "b": b"1234", "c": None}
    assert expected.take("a") == b"123456"  # its 6 bytes no longer count
    expected.keep("c", b"123456")
    assert dict(expected) == {"b": b"1234", "c": b"123456"}
    expected.keep("c", b"123456")  # announced again: still 10 bytes, nothing goes
    assert dict(expected) == {"b": b"1234", "c": b"123456"}
    expected.keep("d", b"1")  # 11 bytes: the oldest goes
    assert dict(expected) == {"c": b"123456", "d": b"1"}


def test_a_reconnect_forgets_only_what_had_not_arrived() -> None:
    expected = Expected()
    for rid in ("arrived", "waiting"):
        expected.add(rid)
    expected.keep("arrived", b"body")
    expected.discard_unarrived("arrived")  # an arrived result is not undone
    expected.forget_unannounced()
    assert dict(expected) == {"arrived": b"body"}
    expected.discard_unarrived("absent")  # nothing to do, no error
    assert "waiting" not in expected and len(expected) == 1
