"""Output and input statistics per model version (docs/monitoring.md).

Why a middleware and not the spine: counting what a model answered is a side concern,
and its cost must stay off the hot path. ``after_compute`` only keeps references to a
batch's successful outputs and inputs (:func:`counted`, the one place that decides
what counts); once :data:`FOLD_ROWS` requests or :data:`FOLD_BYTES` are held, and at
each flush, they are stacked and summarised (``connectors.output_summary``) on the
middleware's own thread, never on the event loop (an image model's fold takes
milliseconds per request; leases and heartbeats must not wait for it) nor on the compute
thread; every ``every_s`` the deltas are added into the control plane's time windows.
Every ``report_every_s`` the fleet-merged drift of this worker's models is read back into
the Prometheus gauges ``batchfleet_output_drift`` and ``batchfleet_output_nan_ratio``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import structlog

from batchfleet.connectors.output_report import VersionRow, read_rows
from batchfleet.connectors.output_stats import Flush, merge_windows, window_start
from batchfleet.connectors.output_summary import Summary, guess_kind, summarise_batch
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.output_evidence import evidence_of
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.rollout_evidence import OutputEvidence
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")
#: Requests held per (window, model, version) before they are summarised.
FOLD_ROWS: Final = 4096
#: Bytes of outputs and inputs held per (window, model, version) before they are
#: summarised (an image model reaches this long before :data:`FOLD_ROWS`).
FOLD_BYTES: Final = 16 << 20
#: Folds queued on the statistics thread past which a batch is left out of the
#: statistics (with a log line) rather than held: memory stays bounded when the thread
#: falls behind.
MAX_PENDING_FOLDS: Final = 4
#: The period the gauges report over.
REPORT_PERIOD_S: Final = 900.0
#: Windows this far behind the current one count as settled for the guard's evidence.
SETTLED_WINDOWS: Final = 3
#: Deltas a worker keeps while the store refuses them.
_KEEP_UNFLUSHED: Final = 256


def counted(batch: Batch, run: BatchRun) -> tuple[list[Tensors], list[Tensors]]:
    """(outputs, inputs) of a batch's requests that count in the statistics: those that
    succeeded. The one place to leave out another kind of answer (a degraded one)."""
    outs, ins = [], []
    for job, out in zip(batch.jobs, run.outputs, strict=True):
        if not isinstance(out, BaseException):
            outs.append(out)
            ins.append(job.request.inputs)
    return outs, ins


@dataclass(slots=True)
class Held:
    """One version's requests not yet summarised, and what was summarised."""

    outputs: list[Tensors] = field(default_factory=list)
    inputs: list[Tensors] = field(default_factory=list)
    #: Folds running on the statistics thread: (outputs, inputs) summaries, or None.
    pending: list[Future[tuple[Summary, Summary] | None]] = field(default_factory=list)


def _first_array(t: Tensors) -> Any:
    return t[sorted(t)[0]] if isinstance(t, dict) else t


def _nbytes(t: Tensors) -> int:
    if isinstance(t, dict):
        return sum(int(getattr(a, "nbytes", 0)) for a in t.values())
    return int(getattr(t, "nbytes", 0))


def fold(model: str, label: str, kind: str | None, outputs: list[Tensors],
         inputs: list[Tensors]) -> tuple[Summary, Summary] | None:
    """Summarise held requests (runs on the statistics thread). Outputs a summary cannot
    read (shapes that change from request to request, named tensors that come and go)
    give None with a log line: statistics never fail a batch, and they are off the ack
    and write paths."""
    try:
        if kind is None:
            raise ValueError("output kind unknown")
        return summarise_batch(outputs, kind), summarise_batch(inputs, None)
    except Exception as exc:  # a model's odd outputs must not stop its worker
        log.info("output statistics skipped", model=model, version=label,
                 requests=len(outputs), error=f"{type(exc).__name__}: {exc}")
        return None


class OutputStats(Middleware):
    """Summarises each version's outputs and inputs and flushes them into time windows;
    also the rollout guard's ``EvidenceSource`` (it reads the same windows back)."""

    def __init__(self, kinds: PerModel[str | None] | None = None, window_s: int = 60,
                 keep_s: int = 24 * 3600, every_s: float = 2.0,
                 metrics: WorkerMetrics | None = None, report_every_s: float = 15.0,
                 max_pending: int = MAX_PENDING_FOLDS) -> None:
        self._kinds = kinds or PerModel(None)
        self._window_s = window_s
        self._keep_s = keep_s
        self._every_s = every_s
        self._metrics = metrics
        self._report_every_s = report_every_s
        self._ctx: WorkerContext | None = None
        self._held: dict[tuple[int, str, str], Held] = {}
        self._resolved: dict[tuple[str, str], str] = {}
        #: Bytes per request (outputs and inputs), from each version's first request.
        self._row_bytes: dict[tuple[str, str], int] = {}
        #: One thread, the statistics' own: not the loop's, not the compute thread's.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batchfleet-output-stats")
        self._skipped = 0
        self._max_pending = max_pending
        self._unflushed: list[tuple[str, Flush]] = []
        #: One flush at a time: a second one (the test's, or on_stop's) would find
        #: nothing held while the first is still folding and return before it wrote.
        self._flushing = asyncio.Lock()
        #: The guard's evidence: (model, canary, stable, since) -> (settled up to, merged).
        self._settled: dict[tuple[str, str, str, float],
                            tuple[float, dict[tuple[str, str], Summary]]] = {}

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._ctx = ctx

    def kind(self, model: str, label: str, first: Tensors) -> str:
        """The output kind: the setting's, else guessed once from the first output."""
        key = (model, label)
        found = self._resolved.get(key)
        if found is None:
            arr = np.asarray(_first_array(first))
            found = self._kinds.for_model(model, label) or guess_kind(arr.dtype, arr.shape)
            self._resolved[key] = found
        return found

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        outs, ins = counted(batch, run)
        if outs:
            self.record(batch.key.model, batch.key.version or DEFAULT_LABEL, outs, ins)

    def record(self, model: str, label: str, outputs: list[Tensors], inputs: list[Tensors],
               now: float | None = None) -> None:
        """Keep one batch's successful requests (references only); once enough are held
        they are handed to the statistics thread. Never summarises on the caller's thread."""
        start = window_start(time.time() if now is None else now, self._window_s)
        held = self._held.setdefault((start, model, label), Held())
        held.outputs += outputs
        held.inputs += inputs
        row = self._row_bytes.get((model, label))
        if row is None:
            row = self._row_bytes[(model, label)] = max(
                1, _nbytes(outputs[0]) + (_nbytes(inputs[0]) if inputs else 0))
        if len(held.outputs) >= FOLD_ROWS or len(held.outputs) * row >= FOLD_BYTES:
            self._fold_aside(model, label, held)

    def _fold_aside(self, model: str, label: str, held: Held, may_skip: bool = True) -> None:
        """Hand what is held to the statistics thread; from ``record``, leave it out
        instead (logged at the next flush) while that thread is ``max_pending``
        folds behind. A flush's remainder is never left out: it is at most a fold's size."""
        if not held.outputs:
            return
        outputs, inputs = held.outputs, held.inputs
        held.outputs, held.inputs = [], []
        queued = sum(not f.done() for h in self._held.values() for f in h.pending)
        if may_skip and queued >= self._max_pending:
            self._skipped += len(outputs)
            return
        try:
            kind: str | None = self.kind(model, label, outputs[0])
        except Exception:  # an output numpy cannot read: fold() logs and drops it
            kind = None
        held.pending.append(self._pool.submit(fold, model, label, kind, outputs, inputs))

    async def take(self) -> list[tuple[str, Flush]]:
        """Everything held, summarised on the statistics thread, as one :class:`Flush`
        per (window, model)."""
        held_now, self._held = self._held, {}
        for (_, model, label), held in held_now.items():
            self._fold_aside(model, label, held, may_skip=False)
        if self._skipped:
            log.info("output statistics behind; requests left out", requests=self._skipped)
            self._skipped = 0
        by: dict[tuple[int, str], dict[tuple[str, str], Summary]] = {}
        for (start, model, label), held in held_now.items():
            out, ins = Summary(), Summary()
            for done in held.pending:
                got = await asyncio.wrap_future(done)
                if got is not None:
                    out.merge(got[0])
                    ins.merge(got[1])
            deltas = by.setdefault((start, model), {})
            deltas[(label, "outputs")], deltas[(label, "inputs")] = out, ins
        return [(model, Flush(start, self._window_s, self._keep_s, deltas))
                for (start, model), deltas in by.items()]

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        if self._ctx is None:
            return []
        loops = [self._flush_loop()]
        if self._metrics is not None:
            loops.append(self._report_loop())
        return loops

    async def on_stop(self, ctx: WorkerContext) -> None:
        await self.flush()
        self._pool.shutdown(wait=False)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            # Shielded: the worker cancels this loop before on_stop, and a flush cut off
            # after it took what was held would lose it; on_stop's flush waits for it.
            await asyncio.shield(self.flush())

    async def flush(self) -> None:
        """Write every delta held when called (after any flush in progress has written
        its own); one the store refuses is kept for the next flush."""
        if self._ctx is None:
            return
        async with self._flushing:
            todo, self._unflushed = [*self._unflushed, *(await self.take())], []
            for model, flush in todo:
                try:
                    await self._ctx.plane.output_stats.flush(model, flush)
                except BatchfleetError as exc:
                    log.info("output statistics not flushed; kept for the next flush",
                             model=model, error=str(exc))
                    self._unflushed.append((model, flush))
            del self._unflushed[:-_KEEP_UNFLUSHED]

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self._report_every_s)
            await self.report()

    async def output_evidence(self, model: str, canary: str, stable: str,
                              since_unix_s: float
                              ) -> tuple[OutputEvidence, OutputEvidence] | None:
        """The canary's and stable's fleet-merged outputs since ``since_unix_s``. The guard
        asks every few seconds for as long as the canary runs, so windows that closed
        :data:`SETTLED_WINDOWS` windows ago are merged once and kept; only newer ones are
        read again (a flush that lands later than that is left out of the evidence)."""
        if self._ctx is None:
            return None
        store, labels = self._ctx.plane.output_stats, (canary, stable)
        key = (model, canary, stable, since_unix_s)
        settled_to = window_start(time.time(), self._window_s) - (
            SETTLED_WINDOWS * self._window_s)
        upto, merged = self._settled.get(key, (since_unix_s, {}))
        if settled_to > upto:
            more = await store.read(model, upto, settled_to, labels, "outputs")
            merged = merge_windows([*((k[0], k[1], v) for k, v in merged.items()),
                                    *((k[0], k[1], v) for k, v in more.items())])
            upto = settled_to
            self._settled = {k: v for k, v in self._settled.items() if k[0] != model}
            self._settled[key] = (upto, merged)
        recent = await store.read(model, upto, None, labels, "outputs")
        live = merge_windows([*((k[0], k[1], v) for k, v in merged.items()),
                              *((k[0], k[1], v) for k, v in recent.items())])
        return evidence_of(live, canary, stable)

    async def report(self) -> None:
        """Set the drift gauges from the fleet-merged rows of this worker's models."""
        if self._ctx is None or self._metrics is None:
            return
        m = self._metrics
        for model in sorted(self._ctx.versions):
            try:
                rows = await read_rows(self._ctx.plane, model, REPORT_PERIOD_S)
            except BatchfleetError as exc:
                log.info("output drift not read", model=model, error=str(exc))
                continue
            publish(m, model, rows)


def publish(m: WorkerMetrics, model: str, rows: list[VersionRow]) -> None:
    """Set a model's gauges from its rows: ``batchfleet_output_nan_ratio``, and
    ``batchfleet_output_drift`` per stat (inputs' as ``input_psi``, ``input_ks``, ...)."""
    for row in rows:
        side = row.outputs
        if side.count:
            m.output_nan_ratio.labels(model, row.version).set(side.nan_count / side.count)
        for prefix, drifts in (("", side.drift), ("input_", row.inputs.drift)):
            for stat, value in drifts.items():
                if value is not None:
                    m.output_drift.labels(model, row.version, prefix + stat).set(value)
