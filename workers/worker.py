"""The worker's spine: fetch -> batch -> compute -> write -> ack, and nothing else.

The next batch is fetched and decoded while the current one computes (``workers.compute``,
a thread) and the previous one's results are written (shielded tasks, bounded so a slow
store pushes back). Everything else is middleware (``workers.middleware``), called once
per fetch, batch or completion. ``run()`` is for production (signals included); tests
use ``async_run()`` and ``request_stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import structlog

from batchfleet import connectors
from batchfleet.connectors.broker import Consumer, Delivery, Publisher, shard_lanes
from batchfleet.connectors.cancelling import bounded, cancel_until_done
from batchfleet.connectors.control_plane import ControlPlane, StoreResults
from batchfleet.connectors.model_registry import ServedModels
from batchfleet.schemas.envelopes import ErrorInfo, Limits
from batchfleet.schemas.errors import BatchfleetError, ResultStoreError, TransportError
from batchfleet.schemas.names import LANES, Names
from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.schemas.tensors import signature
from batchfleet.workers import aio, intake
from batchfleet.workers import readiness as view
from batchfleet.workers.backoff import compute_backoff
from batchfleet.workers.batching import FixedWait, MicroBatcher, gather_pause_s
from batchfleet.workers.completion import ResultWriter, answers_from_run, split_late
from batchfleet.workers.compute import ComputeThread, compute_pool, leave_wedged_forward_behind
from batchfleet.workers.compute_limits import ComputeLimits
from batchfleet.workers.containment import Containment
from batchfleet.workers.context import WorkerContext
from batchfleet.workers.device import resolve_device
from batchfleet.workers.failures import FailurePolicy
from batchfleet.workers.heap import freeze_long_lived
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.middleware import Batch, BatchKey, Chain, Middleware
from batchfleet.workers.middleware.defaults import DefaultViews, default_middleware
from batchfleet.workers.models import ModelHandler
from batchfleet.workers.models import versions as model_versions
from batchfleet.workers.models.loading import add_app_dir
from batchfleet.workers.models.repository import load_all
from batchfleet.workers.retry import default_policy
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.settings import WorkerSettings

log = structlog.get_logger("batchfleet.worker")
#: After the grace period: how long the cancelled loops get to be gone before the closes.
_GONE_WITHIN_S = 5.0


class Worker(DefaultViews):
    #: Opened by ``async_run`` (middleware reach them from ``on_start`` on).
    consumer: Consumer
    publisher: Publisher
    plane: ControlPlane
    #: ``plane.results``, the seam the spine writes through.
    store: StoreResults
    writer: ResultWriter
    served: ServedModels

    def __init__(
        self,
        settings: WorkerSettings,
        handlers: Mapping[str, ModelHandler] | None = None,
        *,
        versions: Mapping[str, Mapping[str, ModelHandler]] | None = None,
        failure_policy: FailurePolicy | None = None,
        middleware: Sequence[Middleware] | None = None,
    ) -> None:
        self.settings = s = settings
        self.names = Names(s.namespace)
        pool = compute_pool()  # the models are built where they will run (compute_pool)
        try:
            self.versions = (
                {m: dict(v) for m, v in versions.items()} if versions is not None
                else {m: {DEFAULT_LABEL: h} for m, h in handlers.items()} if handlers
                else pool.submit(_load, s).result())
        except BaseException:
            pool.shutdown(wait=False)
            raise
        self.handlers = {m: next(iter(v.values())) for m, v in self.versions.items()}
        self.hooks = Chain(middleware if middleware is not None
                           else default_middleware(s, self.handlers))
        self.ready = asyncio.Event()
        #: What middleware see of this worker (``workers.context``); made by ``async_run``.
        self.context: WorkerContext | None = None
        self.fetch_failures = 0
        self._failure_policy = failure_policy
        self.stopping, self._fetch_done, self._room = (asyncio.Event() for _ in range(3))
        self._limits = Limits(max_message_bytes=s.max_message_bytes)
        wait_s = s.max_wait_ms / 1000.0
        self.batcher: MicroBatcher[BatchKey, Job] = MicroBatcher(
            s.max_batch_size, wait_s, priority=lambda key: key.lane_rank,
            policy=self.hooks.close_policy() or FixedWait(wait_s),
            enqueued_at=lambda job: job.request.enqueued_at)
        self.compute = ComputeThread(model_versions.slots(self.versions), resolve_device(s.device),
                                     ComputeLimits(s.compute_timeout_s), pool)
        self.containment = Containment(self.compute, self._note_stalls)
        #: Stalled batches being split beside the compute loop (``workers.containment``).
        self._contained: set[asyncio.Task[None]] = set()
        #: The process's exit code once stopped (``middleware.stuck``: a thread stuck for good).
        self.exit_code = 0
        # a slow store pushes back; an unexpected error stops the worker (redelivery heals)
        self._completions = aio.BoundedTasks(s.max_pending_writes, self._completion_crashed)
        self._crashed: BaseException | None = None
        #: Set by :meth:`run`: the process is the worker's alone, so its heap may be frozen
        #: at ready (``workers.heap``); a worker run inside a test or an app leaves it be.
        self._owns_process = False

    # --- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        """Run until SIGTERM/SIGINT, then drain gracefully (production entry point)."""
        self._owns_process = True
        aio.run_until_signalled(self.async_run, self.request_stop)
        leave_wedged_forward_behind(exit_code=self.exit_code)
        if self.exit_code:
            raise SystemExit(self.exit_code)

    def request_stop(self) -> None:
        """Stop fetching, finish what is in flight, write, ack, exit (within ``grace_s``)."""
        # the flag first: logging may fail (stderr is a closed pipe) and must not keep us up
        first = not self.stopping.is_set()
        self.stopping.set()
        self.batcher.wake()
        if first:
            log.info("stopping: draining in-flight work", worker=self.settings.worker_id)

    async def async_run(self) -> None:
        s = self.settings
        self.plane = plane = connectors.open_control_plane(
            s.results_url, namespace=s.namespace, result_ttl_s=s.result_ttl_s)
        self.store = store = plane.results
        broker = connectors.open_broker(
            s.broker.url, namespace=s.namespace, claim_idle_ms=s.claim_idle_ms,
            partitions=s.kafka_partitions, session_timeout_ms=s.kafka_session_timeout_ms)
        self.consumer = broker.consumer(s.worker_id)
        self.publisher = broker.publisher()
        policy = self.hooks.failure_policy(self._failure_policy or default_policy(s, plane))
        # the chain is the writer's write hooks: it fans out to every middleware
        # one round trip for the write and the ack where the broker's server holds both
        finish = (broker.one_trip_finish(plane, self.consumer)
                  if isinstance(broker, connectors.CombinedFinish) else None)
        self.writer = ResultWriter(store, self.consumer, plane.undecodable, policy,
                                   hooks=self.hooks, finish=finish)
        self.context = ctx = self._context(plane)
        try:
            await self.hooks.on_start(ctx)
            warm = await aio.unless_stopped(self.stopping, self._start_up(store))
            if warm is None:  # SIGTERM during start-up: the grace period bounds that too
                log.info("stopped during start-up", worker=s.worker_id)
                return
            await self.hooks.on_ready(ctx, warm)
            # a process of its own: freeze its heap before the first fetch (workers/heap.py)
            frozen = freeze_long_lived() if self._owns_process else 0
            log.info("worker ready", worker=s.worker_id, models=list(self.handlers),
                     device=str(self.compute.device), broker=s.broker.kind,
                     warmup_s={k: round(v, 3) for k, v in warm.items()},
                     max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                     frozen_objects=frozen)
            await self._run_loops()
        finally:
            try:
                await self.hooks.on_stop(ctx)
            finally:
                self.compute.shutdown()
                for closable in (self.consumer, self.publisher, plane):
                    await closable.close()
        log.info("worker stopped", worker=s.worker_id, **self.vitals())

    def _context(self, plane: ControlPlane) -> WorkerContext:
        return WorkerContext(
            self.settings, self.versions, self.handlers, plane, plane.results, self.consumer,
            self.publisher, self.compute, self.stopping, self._stop_with, self.in_flight,
            lambda: len(self._completions.tasks), self.vitals, self.readiness,
            lambda: self.containment.quarantined, self.writer, self.hooks)

    @property
    def health_port(self) -> int | None:
        """The health endpoint's port, once bound (``--metrics-port 0`` picks a free one)."""
        return None if self.context is None else self.context.health_port

    def _stop_with(self, exit_code: int) -> None:
        if exit_code:
            self.exit_code = exit_code
        self.request_stop()

    async def _start_up(self, store: StoreResults) -> dict[str, float]:
        """Everything that can fail at start-up, checked before "worker ready" and the first
        fetch (the health port binds before, in its middleware's ``on_start``): the store,
        the models, the broker."""
        s = self.settings
        if not await aio.within(store.ping(), 5.0):
            raise ResultStoreError(f"result store {s.results_url} is not answering")
        unchecked = await model_versions.adopt_declared_specs(self.versions, self.plane.models)
        if unchecked:  # once, at start-up: every request to these reaches the forward
            log.info("no input spec: requests are not checked for dtype or shape; pass "
                     "--input-spec or run 'batchfleet models declare' (docs/models.md)",
                     models=unchecked)
        warm = await self.compute.setup()
        await self.consumer.start(model_versions.lanes(self.versions))
        registry, shards = self.plane.models, s.lane_shards_by_model
        self.served = ServedModels(registry, s.worker_id, self.handlers, shards)  # every beat
        self.served.versions = model_versions.registry_versions(self.versions)
        assert self.context is not None
        self.context.served = self.served
        await self.served.assert_served()
        await shard_lanes(self.consumer, shards, registry)  # and the shards that hold work
        return model_versions.per_model(warm)

    async def _run_loops(self) -> None:
        fetch = asyncio.create_task(self._fetch_loop(), name="fetch")
        compute = asyncio.create_task(self._compute_loop(), name="compute")
        side = [asyncio.create_task(loop) for loop in self.hooks.background_tasks()]
        self.ready.set()
        stop_wait = asyncio.create_task(self.stopping.wait())
        done, _ = await asyncio.wait({stop_wait, fetch, compute},
                                     return_when=asyncio.FIRST_COMPLETED)
        crashed = [t for t in done if t is not stop_wait and t.exception() is not None]
        self.request_stop()
        try:
            await bounded(self._drain(fetch, compute), self.settings.grace_s)
        except TimeoutError:
            log.error("grace period over: exiting with work in flight; it will be redelivered",
                      grace_s=self.settings.grace_s, buffered=len(self.batcher))
            # gone before on_stop and the closes, within a bound: the grace is spent
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_GONE_WITHIN_S):
                    await cancel_until_done(
                        [fetch, compute, *self._contained, *self._completions.tasks])
        finally:  # gone before on_stop runs, even where a cancel is dropped (3.11)
            await cancel_until_done([*side, stop_wait])
        if crashed:
            raise crashed[0].exception()  # type: ignore[misc]
        if self._crashed is not None:
            raise self._crashed

    def _completion_crashed(self, exc: BaseException) -> None:
        """The write path raised what it does not retry; its deliveries were let go unacked."""
        log.error("completion failed; stopping so its requests are redelivered",
                  error=repr(exc), exc_info=exc)
        self._crashed = self._crashed or exc
        self.request_stop()

    async def _drain(self, fetch: asyncio.Task[None], compute: asyncio.Task[None]) -> None:
        await asyncio.gather(fetch, compute, return_exceptions=True)
        while self._contained:  # each spawns its completion when done
            await asyncio.gather(*self._contained, return_exceptions=True)
        await self._completions.drain()

    # --- fetch -------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        consumer, s = self.consumer, self.settings
        capacity, timeout_s = s.max_batch_size * s.prefetch_batches, s.fetch_timeout_ms / 1000.0
        models = frozenset(self.handlers)
        try:
            while not self.stopping.is_set():
                # a middleware (an open breaker) may pause some models' lanes, or all of them
                if await self.hooks.sync_pauses(consumer, models):
                    await self._poll_paused(consumer)
                    await asyncio.sleep(self.hooks.pause_s())
                    continue
                room = capacity - len(self.batcher)
                if room <= 0:
                    self._room.clear()
                    await aio.wait_event(self._room, timeout_s)
                    continue
                try:
                    deliveries = await consumer.fetch(room, timeout_s)
                    if deliveries:
                        await self._accept(deliveries)
                    self.fetch_failures = 0
                    if pause := gather_pause_s(len(deliveries), s.max_batch_size,
                                               s.max_wait_ms / 1000.0):
                        await asyncio.sleep(pause)
                except (TransportError, BatchfleetError) as exc:
                    self.fetch_failures += 1
                    delay = compute_backoff(self.fetch_failures, base_s=0.1, cap_s=5.0)
                    log.warning("fetch failed; retrying", error=str(exc), retry_in_s=delay)
                    await asyncio.sleep(delay)
        finally:
            self._fetch_done.set()
            self.batcher.wake()

    async def _poll_paused(self, consumer: Consumer) -> None:
        """Poll while every lane is paused (they hand out nothing): a Kafka member that
        stops polling for ``max_poll_interval_ms`` (5 min) leaves its group, and an
        operator's pause or a long store outage lasts that long. A failure is the outage
        the pause already reports, so it is not reported again."""
        try:
            deliveries = await consumer.fetch(1, 0.0)
        except BatchfleetError as exc:  # TransportError included
            log.debug("poll while paused failed", error=str(exc))
            return
        if deliveries:
            await self._accept(deliveries)

    async def _accept(self, deliveries: Sequence[Delivery]) -> None:
        held = self.hooks.after_fetch(deliveries)
        fetched = intake.decode_deliveries(held, self.handlers, self._limits)
        try:
            await self.hooks.after_decode(fetched)
        except BaseException:  # let go, so they are redelivered instead of leased forever
            self.hooks.release(held)
            raise
        if fetched.finished:  # redelivered after their result was written: only the ack was lost
            await self.writer.ack(fetched.finished)
        self.batcher.put(self._keyed(fetched.jobs))
        if fetched.answers or fetched.failed:
            await self._spawn_completion(fetched.answers, fetched.failed)
        if fetched.undecodable:
            await self.writer.dead_letter(fetched.undecodable)

    def _keyed(self, jobs: Sequence[Job]) -> list[tuple[BatchKey, Job]]:
        """Each job with its batch key. A fetch's jobs share a few keys, so each key is
        made once: a frozen dataclass per request was 6% of demo-mlp's worker CPU. A single
        tensor is looked up by its dtype object and shape, its signature made only for a
        new key (``dtype.str`` builds a string per call: 0.35 us a request)."""
        keys: dict[tuple[Any, ...], BatchKey] = {}
        out = []
        for job in jobs:
            request = job.request
            inputs = request.inputs
            solo = request.request_id if job.solo else None
            raw = ((request.lane, request.model, inputs.dtype, inputs.shape, solo, job.version)
                   if type(inputs) is np.ndarray else
                   (request.lane, request.model, signature(inputs), solo, job.version))
            key = keys.get(raw)
            if key is None:
                key = keys[raw] = BatchKey(
                    LANES.index(request.lane), request.model, signature(inputs), solo,
                    job.version or next(iter(self.versions[request.model])))
            out.append((key, job))
        return out

    # --- compute -----------------------------------------------------------------

    async def _compute_loop(self) -> None:
        while True:
            # a batch a middleware held back (its model's breaker was open) goes first once
            # it may run; it passed the hooks before the one that held it
            held = self.hooks.take_held()
            batch, resume = held if held is not None else (await self._next_batch(), 0)
            self._room.set()
            if batch is None:
                return  # held batches left now stay unacked: they are redelivered
            if batch is _IDLE:
                continue
            live, late = split_late(batch.jobs, time.time())
            if late:  # expired, unless a middleware answers them (a fallback chain)
                await self._spawn_completion(await self.hooks.late(late))
            if not live:  # a held batch that expired meanwhile gives back what it took
                await self.hooks.dropped(batch, resume)
                continue
            batch.jobs = live
            go = await self.hooks.before_compute(batch, resume)
            if batch.answered or batch.failed:  # answered without compute (result cache)
                await self._spawn_completion(*batch.take_answered())
            if not go:
                continue
            lane = model_versions.version_lane(batch.key.model, batch.key.version)
            run = await self.compute.run(lane, batch.jobs)
            if run.stalled:  # split beside this loop, which goes on on a fresh thread
                task = asyncio.create_task(self._contain(lane, batch, run))
                self._contained.add(task)
                task.add_done_callback(self._contained.discard)
                continue
            await self._finish(batch, run)

    async def _contain(self, lane: str, batch: Batch, stalled: BatchRun) -> None:
        try:
            run = await self.containment.contain(lane, batch.jobs, stalled)
            await self._finish(batch, run)  # in the try: a crash here must not go silent
        except asyncio.CancelledError:  # grace over: let go unacked, so redelivered
            self.hooks.release([j.delivery for j in batch.jobs])
            raise
        except Exception as exc:  # let go unacked (their stall is counted) and stop
            self.hooks.release([j.delivery for j in batch.jobs])
            self._completion_crashed(exc)

    async def _note_stalls(self, request_ids: Sequence[str]) -> list[int]:
        return await self.writer.retrying("note stalls", self.store.note_stalls, request_ids)

    async def _finish(self, batch: Batch, run: BatchRun) -> None:
        """After compute: middleware, answers from the outputs, their write and ack."""
        model, label, jobs = batch.key.model, batch.key.version, batch.jobs
        await self.hooks.after_compute(batch, run)
        version = model_versions.model_version(label, self.versions[model][label])
        answers, failed = answers_from_run(model, version, jobs, run)
        more, more_failed = batch.take_answered()  # e.g. a computed row's in-batch twins
        await self._spawn_completion(answers + more, [*failed, *more_failed])

    async def _next_batch(self) -> Any:
        """The batcher's next batch; ``_IDLE`` when a held batch may be due before one is."""
        try:  # next_batch only awaits its wake-up event: cancelling it loses nothing
            found = await bounded(self.batcher.next_batch(self._fetch_done),
                                           self.hooks.held_wait_s())
        except TimeoutError:
            return _IDLE
        return None if found is None else Batch(*found)

    # --- completion --------------------------------------------------------------

    async def _spawn_completion(self, answers: list[Answer],
                                failed: Sequence[tuple[Job, ErrorInfo]] = ()) -> None:
        await self._completions.spawn(self._complete(answers, failed))

    async def _complete(self, answers: list[Answer],
                        failed: Sequence[tuple[Job, ErrorInfo]]) -> None:
        # shielded: cancelling the loop (grace over) never cuts a write-then-ack short
        self.hooks.after_complete(await asyncio.shield(self.writer.complete(answers, failed)))

    # --- what the fleet sees: /readyz, in-flight counts, heartbeat vitals -------------
    readiness, in_flight, vitals = view.readiness, view.in_flight, view.vitals


def _load(s: WorkerSettings) -> dict[str, dict[str, ModelHandler]]:
    """The models of ``--model`` (``module:factory`` ones imported from ``--app-dir``) and
    of ``--model-repository``."""
    add_app_dir(s.app_dir)
    return load_all(s)


#: ``_next_batch``'s "nothing yet": look at the held batches again.
_IDLE: Any = object()
