"""OpenTelemetry traces (optional: `pip install router[otel]`): a span per request and per
attempt with the GenAI semantic conventions, W3C `traceparent` accepted from clients and sent
on to regions, exported over OTLP/HTTP.

The request span starts in a middleware, which also replaces the client's `traceparent` with the
router's own span so a region's spans hang under the router's; attempt spans are children of the
request span (they are recorded when the attempt's first byte or failure is known, with its real
start time).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from yarl import URL

from router.config import ObservabilityConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError
from router.core.pipeline import CONTEXT
from router.core.request import CHAT, COMPLETIONS, EMBEDDINGS
from router.core.upstream import Upstream
from router.errors import ConfigError
from router.observability.telemetry import usage

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

# The request span of the request this task serves; attempt observers (hedges included: a task
# copies the context it was created in) find their parent here.
_REQUEST_SPAN: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "router_request_span", default=None
)
_OPERATIONS = {CHAT: "chat", COMPLETIONS: "text_completion", EMBEDDINGS: "embeddings"}
_PROVIDER = "openai"


class Tracing:
    """The tracer, the request middleware and the attempt observer."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.propagators.textmap import DefaultGetter, DefaultSetter
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("router")
        self._propagator = TraceContextTextMapPropagator()
        self._getter = DefaultGetter()
        self._setter = DefaultSetter()

    @classmethod
    def from_config(
        cls, config: ObservabilityConfig, exporter: SpanExporter | None = None
    ) -> Tracing | None:
        """None unless [observability] otlp_endpoint is set (or an exporter is given)."""
        if config.otlp_endpoint is None and exporter is None:
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
        except ImportError:
            raise ConfigError(
                "field `observability.otlp_endpoint`: tracing needs the OpenTelemetry SDK: "
                "pip install 'router[otel]'"
            ) from None
        from router.observability.build import build_info

        version, commit = build_info()
        provider = TracerProvider(
            resource=Resource.create(
                {
                    "service.name": config.service_name,
                    "service.version": version,
                    "vcs.ref.head.revision": commit,
                }
            ),
            sampler=ParentBasedTraceIdRatio(config.trace_sample_ratio),
        )
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint))
            )
        return cls(provider)

    def middleware(self) -> Middleware:
        """Starts the request span (child of the client's traceparent, if any), hands the
        region the router's traceparent instead, and ends the span with the request."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        @web.middleware
        async def traced(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            if not request.path.startswith("/v1/") or request.method != "POST":
                return await handler(request)
            parent = self._propagator.extract(request.headers, getter=self._getter)
            span = self.tracer.start_span(
                _route_name(request), context=parent, kind=SpanKind.SERVER
            )
            headers: dict[str, str] = {}
            self._propagator.inject(headers, context=trace.set_span_in_context(span))
            forwarded = request.headers.copy()
            forwarded.popall("traceparent", None)
            forwarded.popall("tracestate", None)
            for key, value in headers.items():
                forwarded[key] = value
            traced_request = request.clone(headers=forwarded)
            token = _REQUEST_SPAN.set(span)
            status = 500
            response: web.StreamResponse | None = None
            try:
                response = await handler(traced_request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                _REQUEST_SPAN.reset(token)
                ctx = traced_request.get(CONTEXT)
                _request_attributes(span, request.path, ctx, status, response)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                span.end()

        return traced

    def attempt(
        self, ctx: RequestContext, upstream: Upstream, error: AttemptError | None, seconds: float
    ) -> None:
        """An attempt observer: one CLIENT span per attempt, under the request span."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        parent = _REQUEST_SPAN.get()
        if parent is None:
            return
        end = time.time_ns()
        start = end - int(seconds * 1e9)
        operation = _OPERATIONS.get(ctx.endpoint, "chat")
        parsed = ctx.parsed
        span = self.tracer.start_span(
            _model_name(operation, ctx) or operation,
            context=trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            start_time=start,
        )
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": _PROVIDER,
            "router.region": upstream.name,
            "router.attempt": ctx.attempts,
            # An attempt after a failed one is a failover (a hedge runs beside, not after).
            "router.failover": ctx.attempts > 1 and ctx.hedged != upstream.name,
        }
        if parsed is not None:
            attributes["gen_ai.request.model"] = parsed.upstream_model or parsed.model
        url = URL(upstream.base)
        if url.host is not None:
            attributes["server.address"] = url.host
        if url.port is not None:
            attributes["server.port"] = url.port
        if error is not None:
            attributes["error.type"] = error.kind.value
            span.set_status(Status(StatusCode.ERROR, error.kind.value))
        span.set_attributes(attributes)
        span.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is buffered (called when the app stops)."""
        self.provider.shutdown()


def _route_name(request: web.Request) -> str:
    """The request span's first name: the route's template, never the path a client sent
    (an unknown path would make a new span name per request)."""
    info = request.match_info
    if info.http_exception is not None:
        return "router unknown"
    return "router " + (info.route.resource.canonical if info.route.resource else "unknown")


def _model_name(operation: str, ctx: RequestContext) -> str | None:
    """`chat gpt-4o` (GenAI conventions) once the model is one the router serves; a model it
    does not know is the client's free text, kept out of span names."""
    parsed = ctx.parsed
    if parsed is None or ctx.assignment is None:
        return None
    return f"{operation} {parsed.model}"


def _request_attributes(
    span: Span,
    path: str,
    ctx: RequestContext | None,
    status: int,
    response: web.StreamResponse | None,
) -> None:
    operation = _OPERATIONS.get(path, "chat")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": _PROVIDER,
        "http.request.method": "POST",
        "url.path": path,
        "http.response.status_code": status,
    }
    if ctx is not None:
        parsed = ctx.parsed
        if parsed is not None:
            attributes["gen_ai.request.model"] = parsed.model
            attributes["gen_ai.response.model"] = parsed.upstream_model or parsed.model
            name = _model_name(operation, ctx)
            if name is not None:
                span.update_name(name)
        if ctx.region is not None:
            attributes["router.region"] = ctx.region
        attributes["router.attempts"] = ctx.attempts
        attributes["router.failovers"] = ctx.failovers
        attributes["router.request_id"] = ctx.request_id
        if ctx.tenant is not None:
            attributes["router.tenant"] = ctx.tenant.name
        if ctx.cache is not None:
            attributes["router.cache"] = ctx.cache.outcome
    if response is not None:
        tokens_in, tokens_out = usage(response, ctx.reported if ctx is not None else ())
        if tokens_in is not None:
            attributes["gen_ai.usage.input_tokens"] = tokens_in
        if tokens_out is not None:
            attributes["gen_ai.usage.output_tokens"] = tokens_out
    if status >= 500:
        attributes["error.type"] = str(status)
    span.set_attributes(attributes)


def lifetime(tracing: Tracing) -> Callable[[web.Application], Any]:
    """A cleanup_ctx: spans still buffered are exported when the app stops."""

    async def ctx(app: web.Application) -> Any:
        yield
        tracing.shutdown()

    return ctx
