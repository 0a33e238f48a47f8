"""The worker's two circuit breakers, as the loop sees them.

* The **model** breaker trips when batches keep failing. While it is open the
  worker computes nothing and stops pulling from the broker (Kafka ``pause``,
  no ``XREADGROUP``), so queued requests wait safely instead of burning
  attempts. Half-open, exactly one probe batch is computed.
* The **result-store** breaker trips when writes keep failing. While it is
  open the worker stops pulling; in-flight results are held and their writes
  retried (those retries are the probes) until the store is back.
"""

from __future__ import annotations

import asyncio

import structlog

from schemas.errors import ModelError
from workers.breaker import BreakerConfig, BreakerState, CircuitBreaker
from workers.runner import BatchRun

log = structlog.get_logger("batchfleet.breaker")


def _log_change(name: str, old: BreakerState, new: BreakerState) -> None:
    level = log.warning if new is BreakerState.OPEN else log.info
    level("circuit breaker changed state", breaker=name, previous=old.value, state=new.value)


def batch_failed(run: BatchRun) -> bool:
    """A batch counts against the model when every request in it failed in the model."""
    return bool(run.outputs) and all(
        isinstance(o, ModelError) and o.retryable for o in run.outputs)


class Guards:
    def __init__(self, model: BreakerConfig, store: BreakerConfig) -> None:
        self.model = CircuitBreaker("model", model, on_change=_log_change)
        self.store = CircuitBreaker("result_store", store, on_change=_log_change)

    def fetch_paused(self) -> bool:
        return BreakerState.OPEN in (self.model.state, self.store.state)

    def pause_s(self) -> float:
        """How long to stay paused before looking again (short, so a probe is not late)."""
        return min(0.1, max(0.01, self.model.seconds_until_probe(),
                            self.store.seconds_until_probe()))

    async def until_compute_allowed(self, stop: asyncio.Event) -> bool:
        """Wait while the model breaker refuses work; False if stopping meanwhile."""
        while not self.model.allow():
            if stop.is_set():
                return False
            await asyncio.sleep(max(0.01, min(0.1, self.model.seconds_until_probe())))
        return True

    def record_batch(self, run: BatchRun, *, telling: bool = True) -> None:
        """Feed a batch's outcome to the model breaker; ``telling=False`` for a batch whose
        failure says little about the model (a suspect run alone), which must still free
        the half-open probe slot it may have taken."""
        if not telling:
            self.model.record_neutral()
        elif batch_failed(run):
            self.model.record_failure()
        else:
            self.model.record_success()

    def record_store(self, ok: bool) -> None:
        (self.store.record_success if ok else self.store.record_failure)()

    def states(self) -> dict[str, str]:
        return {"model": self.model.state.value, "result_store": self.store.state.value}
