"""The worker's circuit breakers, as the loop sees them: one per model, one for the store.

* Each **model** has its own breaker, which trips when that model's batches
  keep failing as a whole. While it is open the worker computes none of that
  model's batches and stops pulling only that model's lanes (Kafka ``pause``
  of its partitions, its streams left out of ``XREADGROUP``), so its queued
  requests wait safely instead of burning attempts, and every other model
  keeps flowing. Half-open, exactly one probe batch is computed.
* A failure that bisection pins on single requests (their neighbours
  succeeded) is those requests' problem, not the model's: it never counts, nor
  does the same request failing again alone. Non-retryable errors (invalid
  input) never count either.
* The **result-store** breaker trips when writes keep failing. While it is
  open the worker stops pulling every lane; in-flight results are held and
  their writes retried (those retries are the probes) until the store is back.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum

import structlog

from batchfleet.schemas.errors import ModelError
from batchfleet.workers.breaker import BreakerConfig, BreakerState, CircuitBreaker
from batchfleet.workers.middleware.base import Batch
from batchfleet.workers.runner import BatchRun

log = structlog.get_logger("batchfleet.breaker")

#: How many request IDs pinned as bad are remembered (so their solo retries stay neutral).
PINNED_MEMORY = 4096


def _log_change(name: str, old: BreakerState, new: BreakerState) -> None:
    level = log.warning if new is BreakerState.OPEN else log.info
    level("circuit breaker changed state", breaker=name, previous=old.value, state=new.value)


class Outcome(Enum):
    OK = "ok"
    #: Every request failed in the model: every split failed, the device errored, timed out.
    FAILED = "failed"
    #: Some requests failed and bisection isolated them; the model computed the rest.
    PINNED = "pinned"


def _model_fault(output: object) -> bool:
    return isinstance(output, ModelError) and output.retryable


def batch_outcome(run: BatchRun) -> Outcome:
    """What a computed batch says about its model's health."""
    faults = sum(1 for o in run.outputs if _model_fault(o))
    if not faults:
        return Outcome.OK
    return Outcome.FAILED if faults == len(run.outputs) else Outcome.PINNED


def batch_failed(run: BatchRun) -> bool:
    """A batch counts against the model when every request in it failed in the model."""
    return bool(run.outputs) and batch_outcome(run) is Outcome.FAILED


class ModelBreakers:
    """One breaker per model. As a whole it reads like one breaker named ``model`` (its
    worst state, its total trips), which is what the fleet-wide views show."""

    name = "model"

    def __init__(self, models: Iterable[str], config: BreakerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config, self._clock = config, clock
        self._breakers: dict[str, CircuitBreaker] = {}
        for model in models:
            self[model]

    def __getitem__(self, model: str) -> CircuitBreaker:
        breaker = self._breakers.get(model)
        if breaker is None:
            breaker = self._breakers[model] = CircuitBreaker(
                f"model:{model}", self._config, self._clock, on_change=_log_change)
        return breaker

    def __iter__(self) -> Iterator[str]:
        return iter(self._breakers)

    def items(self) -> Iterable[tuple[str, CircuitBreaker]]:
        return self._breakers.items()

    @property
    def state(self) -> BreakerState:
        return max((b.state for b in self._breakers.values()), key=lambda s: s.code,
                   default=BreakerState.CLOSED)

    @property
    def trips(self) -> int:
        return sum(b.trips for b in self._breakers.values())


class Guards:
    def __init__(self, model: BreakerConfig, store: BreakerConfig, models: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = ModelBreakers(models, model, clock)
        self.store = CircuitBreaker("result_store", store, clock, on_change=_log_change)
        self._pinned: OrderedDict[str, None] = OrderedDict()
        #: Batches a model's open breaker refused, per model, until it lets a probe through.
        self._held: dict[str, deque[Batch]] = {}
        #: Models whose lanes keep being pulled while their breaker is open: a fallback
        #: chain answers them meanwhile (docs/degradation.md, the ``breaker`` trigger).
        self.draining: frozenset[str] = frozenset()

    def paused_models(self) -> frozenset[str]:
        """Models whose lanes must not be pulled now: all of them while the store is down."""
        if self.store.state is BreakerState.OPEN:
            return frozenset(self.model)
        # a draining model whose chain could not answer a batch (now held) pauses as
        # before: held batches are outside the batcher's bound on what is fetched
        return frozenset(m for m, b in self.model.items() if b.state is BreakerState.OPEN
                         and (m not in self.draining or m in self._held))

    def answering_around(self, model: str) -> bool:
        """Is ``model``'s breaker refusing its batches now (open, or half-open with its probe
        out)? A peek: it takes no probe."""
        breaker = self.model[model]
        return breaker.state is not BreakerState.CLOSED and not breaker.probe_available()

    def fetch_paused(self) -> bool:
        """Is any breaker open (some lanes are not being pulled)?"""
        return BreakerState.OPEN in (self.model.state, self.store.state)

    def pause_s(self) -> float:
        """How long to stay paused before looking again (short, so a probe is not late)."""
        waits = [b.seconds_until_probe() for _, b in self.model.items()]
        return min(0.1, max(0.01, self.store.seconds_until_probe(), *waits))

    # --- compute ---------------------------------------------------------------

    def allow(self, model: str) -> bool:
        """May a batch of ``model`` be computed now (half-open: the one probe)?"""
        return self.model[model].allow()

    def hold(self, model: str, batch: Batch) -> None:
        """Keep a batch its model's breaker refused; the compute loop goes on with others."""
        self._held.setdefault(model, deque()).append(batch)

    def take_held(self) -> Batch | None:
        """A held batch whose model's breaker now lets it run (taking the probe), or None."""
        for model, batches in self._held.items():
            if batches and self.model[model].allow():
                batch = batches.popleft()
                if not batches:
                    del self._held[model]
                return batch
        return None

    def held_wait_s(self) -> float | None:
        """How long until a held batch may be able to run; None when nothing is held."""
        if not self._held:
            return None
        return max(0.01, min(0.1, *(self.model[m].seconds_until_probe() for m in self._held)))

    def held(self) -> dict[str, int]:
        """Requests held back by open breakers, per model (fetched, not yet acked)."""
        return {m: sum(len(b.jobs) for b in batches) for m, batches in self._held.items()}

    def record_batch(self, model: str, run: BatchRun, request_ids: Sequence[str] = (), *,
                     telling: bool = True) -> None:
        """Feed a batch's outcome to its model's breaker; ``telling=False`` for a batch whose
        failure says little about the model (a suspect run alone), which must still free
        the half-open probe slot it may have taken."""
        breaker = self.model[model]
        outcome = batch_outcome(run)
        if outcome is Outcome.PINNED:
            self._remember(rid for rid, o in zip(request_ids, run.outputs, strict=False)
                           if _model_fault(o))
        if not telling or (outcome is Outcome.FAILED and request_ids and all(
                rid in self._pinned for rid in request_ids)):
            breaker.record_neutral()  # known-bad requests failing again alone
        elif outcome is Outcome.FAILED:
            breaker.record_failure()
        else:
            breaker.record_success()

    def _remember(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._pinned[rid] = None
            self._pinned.move_to_end(rid)
        while len(self._pinned) > PINNED_MEMORY:
            self._pinned.popitem(last=False)

    def record_store(self, ok: bool) -> None:
        (self.store.record_success if ok else self.store.record_failure)()

    def states(self) -> dict[str, str]:
        """Fleet-wide view: ``model`` is the worst of the per-model breakers."""
        return {"model": self.model.state.value, "result_store": self.store.state.value}

    def model_states(self) -> dict[str, str]:
        return {m: b.state.value for m, b in self.model.items()}
