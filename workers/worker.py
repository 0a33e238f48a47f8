"""The worker: one class owns the fetch -> batch -> compute -> write -> ack loop.

Tasks run side by side so that the next batch is fetched and decoded while
the current one computes (in a dedicated thread; torch releases the GIL) and
the previous one's results are written:

* ``_fetch_loop`` pulls deliveries while the batcher has room and the breakers
  allow it, decodes them and answers bad input at once;
* ``_compute_loop`` takes ready batches and runs the model;
* completions (failure policy, write results, ack) run as shielded tasks,
  bounded by a semaphore so a slow store pushes back on compute and fetching;
* the retry pump and the heartbeat run on the side.

Retries, the DLQ, the breakers and the heartbeat are separate components
(``workers.retry``, ``workers.guards``, ``workers.heartbeat``); this class only
wires them into the loop. ``run()`` is for production (signals included);
tests use ``async_run()`` and ``request_stop()``.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
import torch
from redis.exceptions import RedisError

from connectors import open_consumer, open_publisher, open_result_store
from connectors.broker import Consumer, Delivery, Publisher
from connectors.dead_letters import DeadLetterQueue, UndecodableSink
from connectors.result_store import ResultStore
from connectors.retry_schedule import RetrySchedule
from schemas.envelopes import ErrorInfo, Limits
from schemas.errors import BatchfleetError, ComputeTimeoutError, TransportError
from schemas.names import LANES, Names
from schemas.tensors import signature
from workers.backoff import compute_backoff
from workers.batching import MicroBatcher, gather_pause_s
from workers.breaker import BreakerConfig
from workers.completion import ResultWriter
from workers.device import resolve_device
from workers.failures import FailurePolicy
from workers.guards import Guards
from workers.health import HealthServer
from workers.heartbeat import Heartbeat
from workers.intake import Answer, Job, answers_from_run, decode_deliveries, split_expired
from workers.metrics import WorkerMetrics
from workers.models import ModelHandler, load_models
from workers.retry import CRASH_LOOP, RetryConfig, RetryingFailurePolicy, RetryPump
from workers.runner import BatchRun, ModelRunner
from workers.settings import WorkerSettings
from workers.stats import WorkerStats
from workers.webhooks import RQCallbackSink

log = structlog.get_logger("batchfleet.worker")


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        handlers: Mapping[str, ModelHandler] | None = None,
        *,
        failure_policy: FailurePolicy | None = None,
    ) -> None:
        self.settings = settings
        self.names = Names(settings.namespace)
        self.handlers = dict(handlers) if handlers is not None else load_models(
            settings.models, settings.max_batch_size)
        self.stats = WorkerStats()
        self.ready = asyncio.Event()
        breaker = BreakerConfig(consecutive_failures=settings.breaker_failures,
                                cooldown_s=settings.breaker_cooldown_s)
        self.guards = Guards(breaker, breaker)
        self.metrics = WorkerMetrics()
        self.health_port: int | None = None
        self._computing: tuple[str, int] = ("", 0)
        self._fetch_failures = 0
        self._failure_policy = failure_policy
        self._stop = asyncio.Event()
        self._fetch_done = asyncio.Event()
        self._room = asyncio.Event()
        self._limits = Limits(max_message_bytes=settings.max_message_bytes)
        # Batch key: (lane rank, model, (signature, suspect ID or None)).
        self._batcher: MicroBatcher[tuple[int, str, Any], Job] = MicroBatcher(
            settings.max_batch_size, settings.max_wait_ms / 1000.0,
            priority=lambda key: key[0])
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self._runner = ModelRunner(self.handlers, resolve_device(settings.device))
        self._completions: set[asyncio.Task[None]] = set()
        self._write_slots = asyncio.Semaphore(settings.max_pending_writes)
        self._batch_ids = itertools.count(1)
        self._consumer: Consumer | None = None
        self._publisher: Publisher | None = None
        self._store: ResultStore | None = None
        self._writer: ResultWriter | None = None

    # --- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        """Run until SIGTERM/SIGINT, then drain gracefully (production entry point)."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
            await self.async_run()

        asyncio.run(main())

    def request_stop(self) -> None:
        """Stop fetching, finish what is in flight, write, ack, exit (within ``grace_s``)."""
        if not self._stop.is_set():
            log.info("stopping: draining in-flight work", worker=self.settings.worker_id)
        self._stop.set()
        self._batcher.wake()

    def _default_policy(self, store: ResultStore) -> FailurePolicy:
        s = self.settings
        default = RetryConfig(s.max_attempts, s.retry_base_s, s.retry_cap_s)
        per_model = {m: RetryConfig.parse(spec, default) for m, spec in s.retry_overrides}
        return RetryingFailurePolicy(RetrySchedule(store.redis, self.names),
                                     DeadLetterQueue(store.redis, self.names), default, per_model)

    async def async_run(self) -> None:
        s = self.settings
        self._store = store = open_result_store(s.results_url, self.names, s.result_ttl_s)
        self._consumer = open_consumer(s.broker, self.names, s.worker_id,
                                       claim_idle_ms=s.claim_idle_ms, partitions=s.kafka_partitions,
                                       kafka_session_timeout_ms=s.kafka_session_timeout_ms)
        self._publisher = open_publisher(s.broker, self.names, partitions=s.kafka_partitions)
        policy = self._failure_policy or self._default_policy(store)
        callbacks = RQCallbackSink(s.webhook_redis_url or s.results_url, self.names,
                                   retry_intervals=s.webhook_retry_intervals,
                                   keep_s=s.result_ttl_s) if s.webhooks else None
        self._writer = ResultWriter(store, self._consumer, UndecodableSink(store.redis, self.names),
                                    policy, callbacks=callbacks, on_store=self.guards.record_store)
        loop = asyncio.get_running_loop()
        try:
            warm = await loop.run_in_executor(self._executor, self._runner.setup)
            await self._consumer.start(list(self.handlers))
            await store.register_models(list(self.handlers))
            for model, seconds in warm.items():
                self.metrics.model_load.labels(model).set(seconds)
                self.metrics.up.labels(model).set(1)
            log.info("worker ready", worker=s.worker_id, models=list(self.handlers),
                     device=str(self._runner.device), broker=s.broker.kind,
                     warmup_s={k: round(v, 3) for k, v in warm.items()},
                     max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms)
            await self._run_loops(store)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
            for closable in (self._consumer, self._publisher, store):
                await closable.close()
            if callbacks is not None:
                callbacks.close()
        log.info("worker stopped", worker=s.worker_id, **self.vitals())

    async def _run_loops(self, store: ResultStore) -> None:
        assert self._publisher is not None
        heartbeat = Heartbeat(store.redis, self.names.worker_heartbeat(self.settings.worker_id),
                              self.vitals)
        pump = RetryPump(RetrySchedule(store.redis, self.names), self._publisher)
        fetch = asyncio.create_task(self._fetch_loop(), name="fetch")
        compute = asyncio.create_task(self._compute_loop(), name="compute")
        side: list[asyncio.Task[Any]] = [
            asyncio.create_task(heartbeat.run(), name="heartbeat"),
            asyncio.create_task(pump.run(self._stop), name="retry-pump"),
            asyncio.create_task(self._sample_loop(store), name="metrics-sampler")]
        health = None
        if self.settings.metrics_port is not None:
            health = HealthServer(self.settings.metrics_host, self.settings.metrics_port,
                                  self.metrics.exposition, self.readiness)
            self.health_port = await health.start()
        self.ready.set()
        stop_wait = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({stop_wait, fetch, compute},
                                     return_when=asyncio.FIRST_COMPLETED)
        crashed = [t for t in done if t is not stop_wait and t.exception() is not None]
        self.request_stop()
        try:
            await asyncio.wait_for(self._drain(fetch, compute), self.settings.grace_s)
        except TimeoutError:
            log.error("grace period over: exiting with work in flight; it will be redelivered",
                      grace_s=self.settings.grace_s, buffered=len(self._batcher))
            for task in (fetch, compute, *self._completions):
                task.cancel()
        finally:
            for task in (*side, stop_wait):
                task.cancel()
            for model in self.handlers:
                self.metrics.up.labels(model).set(0)
            if health is not None:
                await health.close()
            await heartbeat.forget()
        if crashed:
            raise crashed[0].exception()  # type: ignore[misc]

    async def _drain(self, fetch: asyncio.Task[None], compute: asyncio.Task[None]) -> None:
        await asyncio.gather(fetch, compute, return_exceptions=True)
        while self._completions:
            await asyncio.gather(*list(self._completions), return_exceptions=True)

    # --- fetch -------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        assert self._consumer is not None
        capacity = self.settings.max_batch_size * self.settings.prefetch_batches
        timeout_s = self.settings.fetch_timeout_ms / 1000.0
        paused = False
        try:
            while not self._stop.is_set():
                if self.guards.fetch_paused() != paused:
                    paused = not paused
                    await (self._consumer.pause() if paused else self._consumer.resume())
                if paused:
                    await asyncio.sleep(self.guards.pause_s())
                    continue
                room = capacity - len(self._batcher)
                if room <= 0:
                    self._room.clear()
                    await _wait_event(self._room, timeout_s)
                    continue
                try:
                    deliveries = await self._consumer.fetch(room, timeout_s)
                    if deliveries:
                        await self._accept(deliveries)
                    self._fetch_failures = 0
                    pause = gather_pause_s(len(deliveries), self.settings.max_batch_size,
                                           self.settings.max_wait_ms / 1000.0)
                    if pause:
                        await asyncio.sleep(pause)
                except (TransportError, BatchfleetError) as exc:
                    self._fetch_failures += 1
                    delay = compute_backoff(self._fetch_failures, base_s=0.1, cap_s=5.0)
                    log.warning("fetch failed; retrying", error=str(exc), retry_in_s=delay)
                    await asyncio.sleep(delay)
        finally:
            self._fetch_done.set()
            self._batcher.wake()

    async def _accept(self, deliveries: Sequence[Delivery]) -> None:
        assert self._writer is not None and self._store is not None
        intake = decode_deliveries(deliveries, self.handlers, self._limits)
        jobs, suspects, crashed, finished = await self._quarantine_check(intake.jobs)
        if finished:  # redelivered after their result was written: only the ack was lost
            await self._writer.ack(finished)
        # A suspect (redelivered after its worker died) runs alone, so if it kills this
        # worker too, it takes no neighbours down with it.
        self._batcher.put(
            ((LANES.index(job.request.lane), job.request.model,
              (signature(job.request.inputs), job.request.request_id if suspect else None)),
             job)
            for job, suspect in zip(jobs, suspects, strict=True)
        )
        for answer in intake.answers:
            if answer.result.error is not None:
                log.info("request answered without compute", request_id=answer.result.request_id,
                         status=answer.result.status, error=answer.result.error.message)
        if intake.answers or crashed:
            await self._spawn_completion(intake.answers, crashed)
        if intake.undecodable:
            self.stats.undecodable += len(intake.undecodable)
            await self._writer.dead_letter(intake.undecodable)

    async def _quarantine_check(self, jobs: list[Job]) -> tuple[
            list[Job], list[bool], list[tuple[Job, ErrorInfo]], list[Delivery]]:
        """Count each delivery durably; a request redelivered too often crashed its workers.

        Returns the jobs to run, whether each is a suspect (delivered more than once
        per attempt), the quarantined ones with their error, and the deliveries of
        requests that already have their result (to ack, not run). A delivery the
        broker vouches is the first of its message (a new Redis stream entry) costs
        nothing: only redeliveries, and Kafka's, which cannot tell, are counted.
        """
        assert self._store is not None and self._writer is not None
        live: list[Job] = [j for j in jobs if j.delivery.delivery_count == 1]
        suspects: list[bool] = [False] * len(live)
        crashed: list[tuple[Job, ErrorInfo]] = []
        finished: list[Delivery] = []
        counted = [j for j in jobs if j.delivery.delivery_count != 1]
        if not counted:
            return live, suspects, crashed, finished
        # Before a redelivery the request had at least one delivery per attempt; on a
        # transport that skips counting first deliveries, this attempt's is uncounted.
        before = [(j.request.request_id,
                   j.request.attempt - (1 if j.delivery.delivery_count is None else 0))
                  for j in counted]
        # Retried until it works: these deliveries are already fetched, and dropping them
        # would strand them (Kafka only redelivers after a rebalance).
        counts = await self._writer.retrying("count deliveries", self._store.count_deliveries,
                                             before)
        for job, (count, solo_runs, done_gen) in zip(counted, counts, strict=True):
            if done_gen >= job.request.generation:
                finished.append(job.delivery)
                self.stats.duplicates += 1
                continue
            if solo_runs < self.settings.quarantine_after:
                live.append(job)
                suspects.append(count > job.request.attempt)
                continue
            log.error("request quarantined: its deliveries keep dying", deliveries=count,
                      request_id=job.request.request_id, attempt=job.request.attempt)
            self.stats.quarantined += 1
            crashed.append((job, ErrorInfo(
                CRASH_LOOP, f"delivered {count} times without a result; the worker died each "
                f"of the {solo_runs} times it ran alone (killed, out of memory or crashed)",
                retryable=False)))
        return live, suspects, crashed, finished

    # --- compute -----------------------------------------------------------------

    async def _compute_loop(self) -> None:
        while True:
            found = await self._batcher.next_batch(self._fetch_done)
            self._room.set()
            if found is None:
                return
            (lane_rank, model, (_, suspect)), jobs = found
            live, expired = split_expired(jobs, time.time())
            if expired:
                await self._spawn_completion(expired)
            self._computing = (model, len(live))  # in flight, even while a breaker holds it
            if not live or not await self.guards.until_compute_allowed(self._stop):
                self._computing = ("", 0)
                continue  # stopping while the breaker is open: leave them unacked
            if suspect is not None:
                await self._mark_solo(live[0], started=True)
            run = await self._compute(model, live)
            self._computing = ("", 0)
            # a suspect failing alone says little about the model's health
            self.guards.record_batch(run, telling=suspect is None)
            if suspect is not None:
                await self._mark_solo(live[0], started=False)
            self.metrics.on_batch(model, LANES[lane_rank], len(live), run.compute_s)
            answers, failed = answers_from_run(model, self.handlers[model].version, live, run)
            self.stats.batches += 1
            self.stats.computed += len(live)
            log.debug("batch computed", batch_id=next(self._batch_ids), model=model,
                      size=len(live), compute_ms=round(run.compute_s * 1000, 3),
                      forwards=run.forwards, request_ids=[j.request.request_id for j in live])
            for job, error in failed:
                log.warning("request failed in model", request_id=job.request.request_id,
                            model=model, attempt=job.request.attempt, error=error.message)
            await self._spawn_completion(answers, failed)

    async def _mark_solo(self, job: Job, started: bool) -> None:
        """Durably note a suspect's solo run before it starts, and undo it once it has run.
        Retried until the store answers: a suspect must never run uncounted."""
        assert self._store is not None and self._writer is not None
        store, req = self._store, job.request
        await self._writer.retrying(
            "mark solo run",
            lambda flag: store.mark_solo(req.request_id, flag, req.attempt), started)

    async def _compute(self, model: str, jobs: Sequence[Job]) -> BatchRun:
        """Run one batch in the compute thread, under the compute timeout if one is set."""
        loop = asyncio.get_running_loop()
        inputs = [j.request.inputs for j in jobs]
        future = loop.run_in_executor(self._executor, self._runner.run, model, inputs)
        timeout = self.settings.compute_timeout_s
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            # A thread cannot be killed: abandon it to finish on its own and carry on with a
            # fresh one. Its late output is discarded; the requests are retried.
            self._executor.shutdown(wait=False)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
            error = ComputeTimeoutError(f"batch of {len(jobs)} took longer than {timeout}s")
            return BatchRun([error] * len(jobs), time.time(), float(timeout or 0), 1)

    # --- completion --------------------------------------------------------------

    async def _spawn_completion(self, answers: list[Answer],
                                failed: Sequence[tuple[Job, ErrorInfo]] = ()) -> None:
        await self._write_slots.acquire()
        task = asyncio.create_task(self._complete(answers, failed))
        self._completions.add(task)
        task.add_done_callback(self._completions.discard)

    async def _complete(self, answers: list[Answer],
                        failed: Sequence[tuple[Job, ErrorInfo]]) -> None:
        assert self._writer is not None
        try:
            done = await asyncio.shield(self._writer.complete(answers, failed))
            self.stats.count(done)
            self.metrics.on_completed(done, time.time())
        finally:
            self._write_slots.release()

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready to take traffic: warmed up, broker and store answering, no breaker open."""
        assert self._store is not None
        checks = {
            "warmed_up": self.ready.is_set() and not self._stop.is_set(),
            "result_store": await _within(self._store.ping(), 1.0),
            "broker": self._fetch_failures == 0,
            "breakers_closed": not self.guards.fetch_paused(),
        }
        return all(checks.values()), {"checks": checks, "breakers": self.guards.states()}

    async def _sample_loop(self, store: ResultStore) -> None:
        """Refresh the gauges that need a look outside: backlog, DLQ sizes, breakers."""
        assert self._consumer is not None
        dlq = DeadLetterQueue(store.redis, self.names)
        while True:
            try:
                backlog = await self._consumer.backlog()
                sizes = {m: await dlq.size(m) for m in self.handlers}
                in_flight = dict.fromkeys(self.handlers, 0)
                for (_, model, _), count in self._batcher.sizes().items():
                    in_flight[model] += count
                model, computing = self._computing
                if model:
                    in_flight[model] += computing
                self.metrics.sample(backlog, sizes, (self.guards.model, self.guards.store),
                                    in_flight)
                device = self._runner.device
                if device.type == "cuda":
                    self.metrics.device_memory.labels(str(device)).set(
                        torch.cuda.memory_allocated(device))
            except (BatchfleetError, RedisError) as exc:
                log.info("metrics sample skipped", error=str(exc))
            await asyncio.sleep(self.settings.sample_every_s)

    def vitals(self) -> dict[str, Any]:
        """What the heartbeat and the final log line report."""
        return {"worker_id": self.settings.worker_id, "models": list(self.handlers),
                "device": str(self._runner.device), "broker": self.settings.broker.kind,
                "breakers": self.guards.states(), "buffered": len(self._batcher),
                "throughput_rps": round(self.metrics.throughput_rps, 1),
                "lanes": self.metrics.lanes,
                **{k: getattr(self.stats, k) for k in WorkerStats.__dataclass_fields__}}


async def _within(check: Awaitable[bool], timeout_s: float) -> bool:
    """A health check that hangs is a failed one."""
    try:
        return await asyncio.wait_for(check, timeout_s)
    except TimeoutError:
        return False


async def _wait_event(event: asyncio.Event, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return
