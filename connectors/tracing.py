"""OpenTelemetry tracing: off unless the standard ``OTEL_*`` variables ask for it.

The decision is made once per process, on the first :func:`tracer` call (the worker
and the SDK client make it when they are built; the CLI before it logs): tracing is
on when ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``, or when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its ``_TRACES_`` form) is set. Off, nothing here
imports OpenTelemetry, no ``traceparent`` is made and no per-request work happens;
on, the SDK (the ``[otel]`` extra) builds the exporters named there, as its own
auto-configuration would, and ``OTEL_SERVICE_NAME`` and friends name the resource.

The request's W3C ``traceparent`` is the only thing that travels (in the envelope,
and as a Kafka header): :func:`format_traceparent` and :func:`parse_traceparent`
are pure, so neither side needs a propagator object per request.
"""

from __future__ import annotations

import atexit
import os
import re
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from batchfleet.schemas.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext, Tracer
    from opentelemetry.trace import TracerProvider as ApiTracerProvider

#: The W3C Trace Context header and envelope field name.
TRACEPARENT = "traceparent"
INSTRUMENTATION = "batchfleet"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

#: The process's decision: empty until the first ``tracer()``; then [None] (off) or [tracer].
_decided: list[Tracer | None] = []
#: The provider behind it, flushed where a process ends without ``atexit`` (RQ's work horse).
_providers: list[Any] = []


def enabled_by(environ: Mapping[str, str]) -> bool:
    """Whether these variables turn tracing on (``OTEL_TRACES_EXPORTER=none`` wins)."""
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(e.strip() not in ("", "none") for e in exporters.split(","))
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def tracer(default_service: str = "batchfleet") -> Tracer | None:
    """The process's tracer, or None when tracing is off (decided on the first call)."""
    if not _decided:
        environ = os.environ  # the one place tracing reads the environment
        _decided.append(tracer_from_env(environ, default_service)
                        if enabled_by(environ) else None)
    return _decided[0]


def install(provider: ApiTracerProvider | None) -> Tracer | None:
    """Use this provider from now on (tests, embedders with their own set-up); None: off."""
    chosen = None if provider is None else provider.get_tracer(INSTRUMENTATION)
    _decided[:] = [chosen]
    _providers[:] = [] if provider is None else [provider]
    return chosen


def flush(timeout_s: float = 2.0) -> None:
    """Export the spans still batched (a no-op with tracing off)."""
    for provider in _providers:
        if hasattr(provider, "force_flush"):
            provider.force_flush(int(timeout_s * 1000))


@contextmanager
def delivery_span(traceparent: str | None, request_id: str, url: str) -> Iterator[None]:
    """The webhook delivery span, a child of the request's submit span (tracing on, and the
    job carries its traceparent); flushed at once: RQ's work horse ends with ``os._exit``."""
    parent = remote_context(traceparent)
    found = tracer("batchfleet-webhooks") if parent is not None else None
    if found is None or parent is None:
        yield
        return
    from opentelemetry import trace

    context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    try:
        with found.start_as_current_span(
                "batchfleet.webhook", context=context, kind=trace.SpanKind.CLIENT,
                attributes={"batchfleet.request_id": request_id, "url.full": url}):
            yield
    finally:
        flush()


def tracer_from_env(environ: Mapping[str, str], default_service: str) -> Tracer:
    """A tracer whose provider exports through the exporters ``OTEL_TRACES_EXPORTER`` names
    (``otlp`` when only an endpoint is given); a missing SDK or exporter is a ConfigError."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError("OTEL_* variables turn tracing on, but the OpenTelemetry SDK is not "
                          "installed: pip install 'batchfleet[otel]'") from exc
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": default_service}
    provider = TracerProvider(resource=Resource.create(attributes))
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    for name in (n.strip() for n in names.split(",")):
        if name and name != "none":
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)()))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # flushes the last batch of spans
    _providers[:] = [provider]
    return provider.get_tracer(INSTRUMENTATION)


def _exporter(name: str) -> Any:
    """The exporter class registered under ``name`` (the SDK's own entry-point group)."""
    from importlib.metadata import entry_points

    lookup = "otlp_proto_grpc" if name == "otlp" else name
    found = list(entry_points(group="opentelemetry_traces_exporter", name=lookup))
    if not found:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: no such exporter is installed "
                          "(console is built in; otlp needs opentelemetry-exporter-otlp)")
    return found[0].load()


# --- the traceparent -------------------------------------------------------------------


def format_traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace ID, span ID, flags), or None for a missing or malformed one (W3C: ignore it)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value)
    if match is None or match[1] == "ff":
        return None
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(match[4], 16)


def remote_context(value: str | None) -> SpanContext | None:
    """The producer's span as a remote parent, from a request's traceparent."""
    parsed = parse_traceparent(value)
    if parsed is None:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(parsed[0], parsed[1], is_remote=True, trace_flags=TraceFlags(parsed[2]))


def carrier_headers(traceparent: str | None) -> list[tuple[str, bytes]] | None:
    """Kafka record headers carrying the traceparent (None when there is none)."""
    return None if traceparent is None else [(TRACEPARENT, traceparent.encode("ascii"))]


def add_trace_ids(logger: Any, method: str, event: MutableMapping[str, Any]
                  ) -> MutableMapping[str, Any]:
    """structlog processor: the current span's ``trace_id`` and ``span_id`` on every line."""
    from opentelemetry.trace import get_current_span

    ctx = get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", f"{ctx.trace_id:032x}")
        event.setdefault("span_id", f"{ctx.span_id:016x}")
    return event
