from __future__ import annotations

import pytest

from batchfleet.workers.middleware import Batch, BatchKey, Chain, Middleware

pytestmark = pytest.mark.unit


class Gate(Middleware):
    """Holds every batch until opened; notes what reached it."""

    def __init__(self, name: str, seen: list[str], holds: bool = False) -> None:
        self.name, self.seen, self.holds = name, seen, holds
        self.kept: list[Batch] = []

    async def before_compute(self, batch: Batch) -> bool:
        self.seen.append(self.name)
        if self.holds:
            self.kept.append(batch)
            return False
        return True

    def take_held(self) -> Batch | None:
        return self.kept.pop() if self.kept and not self.holds else None

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return models & {self.name}


async def test_a_held_batch_resumes_after_the_middleware_that_held_it() -> None:
    seen: list[str] = []
    first, holder, last = Gate("a", seen), Gate("b", seen, holds=True), Gate("c", seen)
    chain = Chain([first, holder, last])
    batch = Batch(BatchKey(0, "m", ()), [])
    assert not await chain.before_compute(batch)
    assert seen == ["a", "b"] and chain.take_held() is None
    holder.holds = False
    held = chain.take_held()
    assert held == (batch, 2)
    assert await chain.before_compute(batch, held[1])
    assert seen == ["a", "b", "c"]  # the held batch skipped "a" and "b" the second time


def test_paused_models_are_the_union_over_the_chain() -> None:
    chain = Chain([Gate("a", []), Gate("b", []), Middleware()])
    assert chain.paused_models(frozenset({"a", "b", "x"})) == {"a", "b"}
    assert Chain([]).paused_models(frozenset({"a"})) == frozenset()


def test_batch_keys_are_values() -> None:
    key = BatchKey(1, "m", ((4,), "float32"), None)
    assert key == BatchKey(1, "m", ((4,), "float32")) and hash(key) == hash(BatchKey(
        1, "m", ((4,), "float32")))
    assert key != BatchKey(1, "m", ((4,), "float32"), "req-1")  # a suspect runs alone
