"""Fresh request IDs from the pool: the format, no repeats across threads, and a forked
child that never hands out the IDs its parent is about to."""

from __future__ import annotations

import os
import re
import threading

import pytest

from batchfleet.producers import request_ids
from batchfleet.producers.request_ids import POOL_SIZE, new_request_id

pytestmark = pytest.mark.unit


def test_ids_are_32_hex_characters_and_never_repeat_across_refills() -> None:
    ids = [new_request_id() for _ in range(POOL_SIZE * 40 + 7)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_drawing_at_once_never_share_an_id() -> None:
    found: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(len(found))

    def draw(out: list[str]) -> None:
        start.wait()
        out.extend(new_request_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in found for i in out]
    assert len(every) == 40_000 and len(set(every)) == 40_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_none_of_the_ids_its_parent_holds() -> None:
    new_request_id()  # the pool now holds the rest of a block
    held = len(request_ids._POOL)
    assert held > 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, "".join(new_request_id() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    parents = [new_request_id() for _ in range(held)]
    child_ids = [child[i:i + 32] for i in range(0, len(child), 32)]
    assert len(child_ids) == 4
    assert not set(child_ids) & set(parents)
