"""The SDK upstream services use: ``AsyncClient`` and its blocking twin ``Client``.

What a submit sends, and in which order, is ``producers.sending``. Requests are
encoded from a template per model and options (``schemas.request_template``),
and every submit, single or many, goes through one coalescer, so concurrent
callers share round trips.
"""

from __future__ import annotations

import asyncio
import atexit
import sys
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from batchfleet.connectors import (
    BrokerURL,
    CombinedSubmit,
    LanePressure,
    open_broker,
    open_control_plane,
    results_url_for,
)
from batchfleet.connectors.control_plane import RequestControl
from batchfleet.connectors.request_control import CancelReport
from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.tracing import format_traceparent
from batchfleet.connectors.tracing import tracer as otel_tracer
from batchfleet.connectors.values import (
    Ownership,
    StorePressure,
)
from batchfleet.producers.admission import Admission, AdmissionLimits
from batchfleet.producers.client_settings import CLIENT_DEFAULTS
from batchfleet.producers.coalescing import Coalescer
from batchfleet.producers.request_ids import new_request_id
from batchfleet.producers.sending import Outgoing, Sender, conflict_error, inputs_fingerprint
from batchfleet.producers.shared_reads import SharedReads
from batchfleet.producers.stage_stamps import DEFAULT_LIMIT as DEFAULT_STAGE_LIMIT
from batchfleet.producers.stage_stamps import StageStamps
from batchfleet.producers.waiting import ResultWaiter
from batchfleet.schemas.envelopes import DEGRADE_ALLOW, NOTIFY_RESULTS, Result, encode_request
from batchfleet.schemas.errors import (
    BatchfleetError,
    OverloadedError,
    RequestConflictError,
    RequestLostError,
    ValidationError,
    WaitTimeoutError,
)
from batchfleet.schemas.names import LANE_BULK, LANE_INTERACTIVE, Names, check_request_id
from batchfleet.schemas.pipeline import Pipeline
from batchfleet.schemas.pipeline_flow import entry_requests
from batchfleet.schemas.registry import ModelRecord, UnregisteredModelError
from batchfleet.schemas.request_template import RequestTemplate
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.tensors import as_array

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = structlog.get_logger("batchfleet.client")
T = TypeVar("T")

#: ``priority=`` accepts lane names and these friendlier aliases.
PRIORITIES = {"interactive": LANE_INTERACTIVE, "high": LANE_INTERACTIVE,
              "bulk": LANE_BULK, "low": LANE_BULK}
SUBMIT_CHUNK = 1000
#: Sends start at most this often (``producers.coalescing``): at thousands of lone
#: ``submit()`` calls a second, each send then carries several, for at most this delay.
#: 2 ms, not 0.5: one submit() per Poisson arrival at 2,000-4,000/s cost the client
#: 158-224 us of CPU a request against 127-168 us, for 0.5 ms more at the median and
#: the same p99 (docs/performance.md, "What changed in issue 31"). A caller that awaits
#: each submit is not held by it for long: the coalescer stops lingering while its lingers
#: gather nothing (``producers.coalescing``).
SUBMIT_LINGER_S = 0.002
#: Models whose registry answer is cached at once; past it the cache starts over.
_MAX_CACHED_MODELS = 1024
#: Encoding templates kept at once (one per model and set of submit options).
_MAX_TEMPLATES = 1024
#: (model, lane, callback_url, owner, version, routing_key, cache, degrade): what a
#: template fixes.
TemplateKey = tuple[str, str, str | None, str | None, str | None, str | None, bool, str]


def _span_attributes(request_id: str, template: RequestTemplate) -> dict[str, str]:
    return {"batchfleet.request_id": request_id, "batchfleet.model": template.model,
            "batchfleet.lane": template.lane}


def _submit_span(tracer: Tracer, request_id: str, template: RequestTemplate) -> str:
    """One short submit span per request of a ``submit_many`` (its chunk is sent later)."""
    from opentelemetry.trace import SpanKind

    span = tracer.start_span("batchfleet.submit", kind=SpanKind.PRODUCER,
                             attributes=_span_attributes(request_id, template))
    span.end()
    return format_traceparent(span.get_span_context())


class AsyncClient:
    """Submit requests and get their results, from asyncio code.

    >>> async with AsyncClient("redis://localhost:6379/0") as client:
    ...     rid = await client.submit("demo-mlp", [0.1] * 10)
    ...     result = await client.wait(rid, timeout=5)

    ``admission`` sets the marks past which submits raise OverloadedError (default: 80%
    of Redis ``maxmemory``; see ``producers.admission``); ``model_list_ttl_s`` how long
    a model's registry record (served or declared, and its declared input spec) is
    trusted before it is read again; ``loss_grace_s`` the default of :meth:`wait`'s.
    The result store's pool holds ``redis_max_connections`` (default 100) and a call
    past them waits up to ``redis_pool_timeout_s`` for one to come free, so any number
    of concurrent submits queue rather than fail (``connectors.redis_client``). Each
    keyword is declared once, with its default, in ``producers/client_settings.py``.
    """

    def __init__(
        self,
        broker: str,
        results: str | None = None,
        *,
        namespace: str = CLIENT_DEFAULTS.namespace,
        result_ttl_s: int = CLIENT_DEFAULTS.result_ttl_s,
        kafka_partitions: int = CLIENT_DEFAULTS.kafka_partitions,
        poll_interval_s: float = CLIENT_DEFAULTS.poll_interval_s,
        check_model: bool = CLIENT_DEFAULTS.check_model,
        callback_policy: CallbackPolicy | None = None,
        redis_max_connections: int | None = CLIENT_DEFAULTS.redis_max_connections,
        redis_pool_timeout_s: float = CLIENT_DEFAULTS.redis_pool_timeout_s,
        admission: AdmissionLimits | None = None,
        model_list_ttl_s: float = CLIENT_DEFAULTS.model_list_ttl_s,
        loss_grace_s: float = CLIENT_DEFAULTS.loss_grace_s,
    ) -> None:
        parsed = BrokerURL.parse(broker)
        self.names = Names(namespace)
        self.client_id = uuid.uuid4().hex[:16]
        # A bounded pool that concurrent submits queue on (``WaitingPool``), never fail on.
        results_url = results_url_for(parsed, results)
        self._plane = open_control_plane(
            results_url, namespace=namespace, result_ttl_s=result_ttl_s,
            max_connections=redis_max_connections, pool_timeout_s=redis_pool_timeout_s)
        self._store = self._plane.results
        self._broker_door = open_broker(parsed.url, namespace=namespace,
                                        partitions=kafka_partitions)
        self._publisher = self._broker_door.publisher()
        self._waiter = ResultWaiter(self._plane, self.names, self.client_id, poll_interval_s,
                                    loss_grace_s)
        self._check_model = check_model
        self._registry = self._plane.models
        #: model -> (monotonic read time, declared input spec). Re-read after the TTL, so a
        #: retired model is refused again and a new declaration's spec is seen; a miss is
        #: never cached, so a model declared or served a moment ago is accepted at once.
        self._models: dict[str, tuple[float, TensorSpec | None]] = {}
        #: model -> its lane_shards, read with the record above; a request goes to shard
        #: crc32(request ID) % K (``shard_for``). Unread (check_model=False): shard 0.
        self._shards: dict[str, int] = {}
        self._models_ttl_s = model_list_ttl_s
        #: name -> (monotonic read time, its pipeline or None for a model's name).
        self._pipelines: dict[str, tuple[float, Pipeline | None]] = {}
        #: The registry reads in flight, one per model and one per name (``SharedReads``).
        self._lookups: SharedReads[tuple[set[str], ModelRecord | None]] = SharedReads()
        self._pipeline_reads: SharedReads[Pipeline | None] = SharedReads()
        self._templates: dict[TemplateKey, RequestTemplate] = {}
        #: The broker's own pressure reading covers the store too (one server).
        self._results_on_broker = (results_url == parsed.url
                                   and isinstance(self._publisher, LanePressure))
        door = self._broker_door
        one_trip = door.one_trip(self._plane) if isinstance(door, CombinedSubmit) else None
        sender = Sender(self._store, self._publisher, self._waiter, self._shards, one_trip)
        #: Every submit, single or many, goes out through here (``producers.coalescing``).
        self._outbox: Coalescer[Outgoing] = Coalescer(sender.send, SUBMIT_CHUNK,
                                                      linger_s=SUBMIT_LINGER_S,
                                                      refuse=conflict_error)
        self._admission = Admission(admission or AdmissionLimits(), self._pressure)
        #: Callback URLs are checked at submit (no DNS), so a bad one is refused up front;
        #: the webhook worker checks again, resolved, before it calls one.
        self._callback_policy = callback_policy or CallbackPolicy()
        #: Opened on the first cancel (it may need a client of the broker's Redis).
        self._control: RequestControl | None = None
        #: None unless OTEL_* turned tracing on: then each request carries a traceparent.
        self._tracer = otel_tracer("batchfleet-producer")

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _pressure(self, lanes: Sequence[tuple[str, str]]) -> list[StorePressure]:
        """One reading per server: the broker's (with lane depths) and, if apart, the store's."""
        reads: list[Awaitable[StorePressure]] = []
        if isinstance(self._publisher, LanePressure):
            reads.append(self._publisher.pressure(lanes, self._shards))
        if not self._results_on_broker:
            reads.append(self._store.pressure())
        return list(await asyncio.gather(*reads))

    async def close(self) -> None:
        if self._control is not None:
            await self._control.close()
        await self._waiter.close()
        await self._publisher.close()
        await self._plane.close()

    def record_stages(self, limit: int = DEFAULT_STAGE_LIMIT) -> StageStamps:
        """Stamp when each announced result reaches this client (received, delivered to
        its waiter), for diagnosing the caller's tail; pop them with ``StageStamps.pop``.
        Off unless called: the stamps cost two clock reads per announcement."""
        if self._waiter.stages is None:
            self._waiter.stages = StageStamps(limit)
        return self._waiter.stages

    def _template(self, model: str, priority: str, deadline_s: float | None,
                  callback_url: str | None, owner: str | None, version: str | None,
                  routing_key: str | None, cache: bool,
                  degrade: str = DEGRADE_ALLOW) -> RequestTemplate:
        """The encoder for these options: built (and its fields validated) once, then reused."""
        if deadline_s is not None and deadline_s <= 0:
            raise ValidationError(f"deadline_s must be positive, got {deadline_s}")
        key = (model, PRIORITIES.get(priority, priority), callback_url, owner, version,
               routing_key, cache, degrade)
        template = self._templates.get(key)
        if template is None:
            template = RequestTemplate(
                model, key[1], notify=self.client_id, callback_url=callback_url, owner=owner,
                version=version, routing_key=routing_key, cache=cache, degrade=degrade,
                notify_format=NOTIFY_RESULTS)  # the waiter reads the bodies it carries
            if len(self._templates) >= _MAX_TEMPLATES:
                self._templates.clear()
            self._templates[key] = template
        return template

    async def submit(
        self, model: str, inputs: Any, *, request_id: str | None = None,
        priority: str = LANE_INTERACTIVE, deadline_s: float | None = None,
        callback_url: str | None = None, owner: str | None = None,
        fingerprint: str | None = None, version: str | None = None,
        routing_key: str | None = None, cache: bool = True, degrade: str = DEGRADE_ALLOW,
    ) -> str:
        """Enqueue one request; returns its request ID. Bad input raises ValidationError now.

        ``version`` pins it to one version label (evaluations, A/B analysis); otherwise the
        workers route it by the model's rollout policy, hashing ``routing_key`` (one user
        always sees one version) or else the request ID (docs/rollout.md, "Routing").

        ``cache=False`` opts out of the result cache: never answered from a stored output,
        and its own output is not stored (docs/cache.md). A result answered from the cache
        says ``result.cached``.

        ``degrade="never"`` fails the request closed (``unavailable``, retryable) where the
        model's fallback chain would have answered it; the default ``"allow"`` takes that
        answer, marked ``result.degraded`` (docs/degradation.md).

        ``owner`` names the API key ID whose callers may read the result through the
        gateway (without one, only admin-scoped keys can). ``fingerprint`` is the
        gateway's idempotency check: an existing record with another one is not published.
        A ``request_id`` of the caller's is fingerprinted by model and inputs unless one is
        given: reused with others, it raises RequestConflictError and nothing is enqueued;
        with the same ones it is an idempotent resubmit. ``fingerprint=""`` says the caller
        made ``request_id`` itself (:func:`new_request_id`): a fresh ID cannot be reused,
        so nothing is hashed or stored.
        Concurrent calls are coalesced into one round trip (see ``producers.coalescing``).
        """
        if callback_url is not None:
            self._callback_policy.check_url(callback_url)
        pipeline = await self.pipeline(model)
        if pipeline is not None:
            return (await self._submit_pipeline(
                pipeline, [inputs], [request_id or ""], priority, deadline_s, callback_url,
                owner, routing_key, cache, degrade, fingerprint))[0]
        spec = await self.ensure_model(model)
        await self._waiter.start()
        template = self._template(model, priority, deadline_s, callback_url, owner, version,
                                  routing_key, cache, degrade)
        rid = check_request_id(request_id) if request_id else new_request_id()
        _check_declared(spec, inputs)
        await self._admission.check(model, template.lane)
        now = time.time()
        deadline_at = None if deadline_s is None else now + deadline_s
        if request_id and fingerprint is None:
            fingerprint = inputs_fingerprint(model, inputs)
        ownership = Ownership(owner, fingerprint or None, self.client_id)
        if self._tracer is None:
            await self._outbox.submit(Outgoing(
                rid, template.encode(rid, now, inputs, deadline_at), template.pending(rid, now),
                template, ownership))
            return rid
        from opentelemetry.trace import SpanKind

        # The submit span covers the round trips; its context travels with the request.
        with self._tracer.start_as_current_span(
                "batchfleet.submit", kind=SpanKind.PRODUCER,
                attributes=_span_attributes(rid, template)) as span:
            parent = format_traceparent(span.get_span_context())
            await self._outbox.submit(Outgoing(
                rid, template.encode(rid, now, inputs, deadline_at, parent),
                template.pending(rid, now), template, ownership, parent))
        return rid

    async def submit_many(
        self, model: str, inputs: Iterable[Any], *, request_ids: Sequence[str] | None = None,
        priority: str = LANE_INTERACTIVE, deadline_s: float | None = None,
        callback_url: str | None = None, owner: str | None = None,
        fingerprint: str | None = None, version: str | None = None,
        routing_key: str | None = None, cache: bool = True, degrade: str = DEGRADE_ALLOW,
    ) -> list[str]:
        """Enqueue many requests to one model, pipelined in chunks of ``SUBMIT_CHUNK``
        (``owner``, ``fingerprint``, ``version``, ``routing_key``, ``cache`` and ``degrade`` as for
        :meth:`submit`; ``fingerprint=""`` for ``request_ids`` the caller made itself).

        Raises UnknownModelError for a model no worker has ever served and nobody
        declared (unless the client was made with ``check_model=False``), rather than
        letting it wait forever; ValidationError for inputs off a declared spec;
        RequestConflictError, once its chunk is sent, if some of ``request_ids`` were
        used before with other inputs (``exc.request_ids``; ``exc.accepted`` names what
        was enqueued, as for OverloadedError).
        """
        if callback_url is not None:
            self._callback_policy.check_url(callback_url)
        pipeline = await self.pipeline(model)
        if pipeline is not None:
            items = list(inputs)
            chosen_ids = list(request_ids) if request_ids is not None else [""] * len(items)
            if len(chosen_ids) < len(items):
                raise ValidationError("request_ids is shorter than inputs")
            return await self._submit_pipeline(pipeline, items, chosen_ids, priority, deadline_s,
                                               callback_url, owner, routing_key, cache, degrade,
                                               fingerprint)
        spec = await self.ensure_model(model)
        await self._waiter.start()
        template = self._template(model, priority, deadline_s, callback_url, owner, version,
                                  routing_key, cache, degrade)
        ownership = Ownership(owner, fingerprint or None, self.client_id)
        tracer = self._tracer
        ids: list[str] = []
        chunk: list[Outgoing] = []
        id_iter = iter(request_ids) if request_ids is not None else None
        for item in inputs:
            chosen = False  # a caller's ID: fingerprinted (see :meth:`submit`)
            if id_iter is None:
                rid = new_request_id()
            else:
                given = next(id_iter, None)
                if given is None:
                    raise ValidationError("request_ids is shorter than inputs")
                chosen = bool(given)
                rid = check_request_id(given) if given else new_request_id()
            owned = ownership if not chosen or fingerprint is not None else Ownership(
                owner, inputs_fingerprint(model, item), self.client_id)
            _check_declared(spec, item)
            now = time.time()
            parent = None if tracer is None else _submit_span(tracer, rid, template)
            chunk.append(Outgoing(
                rid, template.encode(rid, now, item, None if deadline_s is None
                                     else now + deadline_s, parent),
                template.pending(rid, now), template, owned, parent))
            if len(chunk) >= SUBMIT_CHUNK:
                await self._send_admitted(chunk, ids)
                chunk = []
        if chunk:
            await self._send_admitted(chunk, ids)
        return ids

    async def _send_admitted(self, chunk: list[Outgoing], sent: list[str]) -> None:
        """Send a chunk if admission allows; a refusal names what was already sent."""
        try:
            await self._admission.check(chunk[0].template.model, chunk[0].template.lane,
                                        len(chunk))
        except OverloadedError as exc:
            exc.accepted = list(sent)
            raise
        try:
            await self._outbox.submit_many(chunk)
        except OverloadedError as exc:
            # A full store. Concurrent callers may share this send, and so its error.
            refused = OverloadedError(str(exc), exc.retry_after_s)
            refused.accepted = list(sent)
            raise refused from exc
        except RequestConflictError as exc:  # this call's own error: the rest went out
            conflicting = set(exc.request_ids)
            exc.accepted = [*sent, *(o.request_id for o in chunk
                                     if o.request_id not in conflicting)]
            raise
        sent.extend(o.request_id for o in chunk)

    async def pipeline(self, name: str) -> Pipeline | None:
        """The pipeline a submit's name resolves to, or None for a model; cached for
        ``model_list_ttl_s`` (a miss too: one read per name per TTL, shared by the submits
        that find the entry expired together)."""
        now = time.monotonic()
        cached = self._pipelines.get(name)
        if cached is not None and now - cached[0] < self._models_ttl_s:
            return cached[1]
        found = await self._pipeline_reads.get(name, lambda: self._plane.pipelines.get(name))
        if len(self._pipelines) >= _MAX_CACHED_MODELS:
            self._pipelines.clear()
        self._pipelines[name] = (now, found)
        return found

    async def _submit_pipeline(
        self, pipeline: Pipeline, items: Sequence[Any], given: Sequence[str], priority: str,
        deadline_s: float | None, callback_url: str | None, owner: str | None,
        routing_key: str | None, cache: bool, degrade: str, fingerprint: str | None = None,
    ) -> list[str]:
        """Record each caller's pending result under its own ID and enqueue the first
        step(s) on their models' lanes (docs/pipelines.md); the result comes back under
        the caller's ID. A caller's own ID is fingerprinted by pipeline and inputs, as
        :meth:`submit` does for a model (unless ``fingerprint`` is given)."""
        await self._waiter.start()
        caller_template = self._template(pipeline.name, priority, deadline_s, None, owner,
                                         None, routing_key, cache, degrade)
        ids: list[str] = []
        chunk: list[Outgoing] = []
        for item, chosen in zip(items, given, strict=False):
            rid = check_request_id(chosen) if chosen else new_request_id()
            stamp = fingerprint if fingerprint is not None or not chosen else \
                inputs_fingerprint(pipeline.name, item)
            ownership = Ownership(owner, stamp or None, self.client_id)
            now = time.time()
            caller = caller_template.request(
                rid, now, item, None if deadline_s is None else now + deadline_s)
            caller.callback_url = callback_url
            pending = caller_template.pending(rid, now)
            for step in entry_requests(pipeline, caller):
                lane_of = self._template(step.model, priority, deadline_s, None, owner,
                                         step.version, routing_key, cache, degrade)
                chunk.append(Outgoing(rid, encode_request(step), pending, lane_of, ownership))
            if len(chunk) >= SUBMIT_CHUNK:
                await self._send_admitted(chunk, ids)
                chunk = []
        if chunk:
            await self._send_admitted(chunk, ids)
        return list(dict.fromkeys(ids))

    async def ensure_model(self, model: str) -> TensorSpec | None:
        """Refuse a model that is neither served nor declared, nor a pipeline
        (UnregisteredModelError, an UnknownModelError); returns its declared input spec, if
        any. Cached per model for ``model_list_ttl_s``; a no-op with ``check_model=False``."""
        if not self._check_model:
            return None
        now = time.monotonic()
        cached = self._models.get(model)
        if cached is not None and now - cached[0] < self._models_ttl_s:
            return cached[1]
        known, record = await self._lookup(model)
        if model not in known:
            self._models.pop(model, None)
            if await self.pipeline(model) is not None:
                return None  # a pipeline's name: its steps' models are checked at declare
            raise UnregisteredModelError(model, known)
        if len(self._models) >= _MAX_CACHED_MODELS:
            self._models.clear()
            self._shards.clear()
        spec = record.declared_input if record is not None else None
        self._shards[model] = record.lane_shards if record is not None else 1
        self._models[model] = (now, spec)
        return spec

    async def _lookup(self, model: str) -> tuple[set[str], ModelRecord | None]:
        """One registry read per model at a time: a burst of concurrent submits to a model
        not yet cached shares it, rather than taking a connection each."""
        return await self._lookups.get(model, lambda: self._registry.lookup(model))

    async def known_models(self) -> set[str]:
        """Every model submits are accepted for: declared, or ever served (one round trip)."""
        return await self._registry.names()

    async def models(self) -> list[ModelRecord]:
        """What the fleet serves or has declared, by name: each model's versions with their
        input and output specs, its rollout policy and the workers serving it (judge them
        live with ``record.live_workers(time.time())``; ``record.summary(now)`` is the
        ``GET /v1/models`` entry). Two round trips, however many models."""
        return await self._registry.records()

    async def get(self, request_id: str) -> Result | None:
        """The current result (``pending`` or terminal), or None for an unknown ID."""
        return (await self._waiter.fetch([request_id]))[0]

    async def cancel(self, request_id: str) -> CancelReport:
        """Cancel a queued request: its result becomes ``cancelled`` and no worker computes
        it. ``report.outcome`` says what happened: ``cancelled``, ``already_running`` (a
        worker holds it; it finishes), ``already_finished`` or ``unknown``. See
        ``connectors.request_control`` for what Kafka can and cannot tell."""
        return (await self.cancel_many([request_id]))[0]

    async def cancel_many(self, request_ids: Sequence[str]) -> list[CancelReport]:
        """:meth:`cancel` for many IDs in a few round trips; one report per distinct ID."""
        if self._control is None:
            self._control = self._plane.request_control(self._broker_door)
        return await self._control.cancel(request_ids)

    async def wait(self, request_id: str, timeout: float | None = 30.0, *,
                   loss_grace_s: float | None = None) -> Result:
        """Block until the request is terminal; raises WaitTimeoutError after ``timeout`` s
        (up to 10 ms after: waits share their timers, ``producers.result_sink.Alarms``),
        and RequestLostError (within seconds, even with ``timeout=None``) if it can never
        finish: its record is gone (unknown ID, or Redis lost its data) or its queue lost it.

        ``loss_grace_s`` (default: the client's, 2 s) is how long the ID may look lost
        before the wait gives it up, counted from when the wait began at the earliest:
        waiting on an ID that another process will submit later needs at least that
        long (``producers.waiting``)."""
        return (await self._waiter.wait_many([request_id], timeout, loss_grace_s))[0]

    async def wait_many(
        self, request_ids: Sequence[str], timeout: float | None = 60.0, *,
        loss_grace_s: float | None = None,
    ) -> list[Result]:
        """Terminal results in the order of ``request_ids`` (``loss_grace_s`` as for
        :meth:`wait`).

        If some requests were lost (see :meth:`wait`), RequestLostError is raised once all
        the others have finished: ``exc.request_ids`` names the lost ones and
        ``exc.results`` holds every result in ``request_ids`` order, None where lost.
        """
        return await self._waiter.wait_many(request_ids, timeout, loss_grace_s)

    def as_completed(
        self, request_ids: Sequence[str], timeout: float | None = 60.0, *,
        loss_grace_s: float | None = None,
    ) -> AsyncIterator[Result]:
        """Terminal results as they arrive (for progress bars and latency measurement);
        lost requests are skipped, then named by a RequestLostError at the end
        (``loss_grace_s`` as for :meth:`wait`)."""
        return self._waiter.as_completed(request_ids, timeout, loss_grace_s)


class Client:
    """The blocking SDK: the same API as :class:`AsyncClient`, on a private event loop thread.

    >>> with Client("redis://localhost:6379/0") as client:
    ...     rid = client.submit("demo-mlp", [0.1] * 10)
    ...     print(client.wait(rid, timeout=5).outputs)
    """

    def __init__(self, broker: str, results: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="batchfleet-client",
                                        daemon=True)
        self._thread.start()
        self._async = self._call(_make_async(broker, results, options))
        # A script that never closes its client would have the interpreter destroy the loop
        # under an open Kafka producer ("Unclosed AIOKafkaProducer", "Task was destroyed
        # but it is pending!"): close it quietly at exit. Only a weak reference is held, so
        # the hook never keeps a client alive.
        atexit.register(_close_at_exit, weakref.ref(self))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self, timeout_s: float | None = None) -> None:
        """Close the connections and the loop thread (``timeout_s`` bounds the close)."""
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._async.close(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()


    @property
    def client_id(self) -> str:
        return self._async.client_id

    def submit(self, model: str, inputs: Any, **options: Any) -> str:
        return self._call(self._async.submit(model, inputs, **options))

    def submit_many(self, model: str, inputs: Iterable[Any], **options: Any) -> list[str]:
        return self._call(self._async.submit_many(model, inputs, **options))

    def get(self, request_id: str) -> Result | None:
        return self._call(self._async.get(request_id))

    def wait(self, request_id: str, timeout: float | None = 30.0, *,
             loss_grace_s: float | None = None) -> Result:
        return self._call(self._async.wait(request_id, timeout, loss_grace_s=loss_grace_s))

    def cancel(self, request_id: str) -> CancelReport:
        return self._call(self._async.cancel(request_id))

    def cancel_many(self, request_ids: Sequence[str]) -> list[CancelReport]:
        return self._call(self._async.cancel_many(request_ids))

    def models(self) -> list[ModelRecord]:
        """See :meth:`AsyncClient.models`."""
        return self._call(self._async.models())

    def wait_many(self, request_ids: Sequence[str], timeout: float | None = 60.0, *,
                  loss_grace_s: float | None = None) -> list[Result]:
        return self._call(self._async.wait_many(request_ids, timeout,
                                                loss_grace_s=loss_grace_s))


#: How long the exit hook waits for a forgotten client to close before giving up on it.
EXIT_CLOSE_S = 5.0


def _close_at_exit(ref: weakref.ref[Client]) -> None:
    client = ref()
    if client is None:
        return
    try:
        client.close(EXIT_CLOSE_S)
    except (BatchfleetError, OSError, TimeoutError, RuntimeError) as exc:
        # the interpreter is exiting: one line, never a traceback over the script's output
        print(f"batchfleet: a Client left open did not close at exit: {exc}", file=sys.stderr)


def _check_declared(spec: TensorSpec | None, inputs: Any) -> None:
    """Inputs off a declared spec are refused at submit, before anything is enqueued."""
    if spec is not None:
        spec.check(inputs if isinstance(inputs, dict) else as_array(inputs))


async def _make_async(broker: str, results: str | None, options: dict[str, Any]) -> AsyncClient:
    return AsyncClient(broker, results, **options)


__all__ = ["AsyncClient", "CancelReport", "Client", "OverloadedError", "RequestConflictError",
           "RequestLostError", "WaitTimeoutError", "new_request_id"]
