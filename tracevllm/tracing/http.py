"""The server's span per API call: ``POST /v1/...`` (kind SERVER), the root of a request's trace, or
a child of the caller's span when the HTTP request carries a W3C ``traceparent``."""

from __future__ import annotations

from fastapi import Request
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tracevllm.tracing.otel import extract_trace_context, inject_trace_headers
from tracevllm.tracing.request_tracer import RequestTracer
from tracevllm.tracing.schema import Attr


def start_server_span(tracer: RequestTracer | None, request: Request) -> Span | None:
    """None when tracing is off."""
    if tracer is None:
        return None
    headers = {k: request.headers[k] for k in ("traceparent", "tracestate") if k in request.headers}
    return tracer.tracer.start_span(
        f"{request.method} {request.url.path}", context=extract_trace_context(headers), kind=SpanKind.SERVER,
        attributes={Attr.HTTP_REQUEST_METHOD: request.method, Attr.URL_PATH: request.url.path},
    )


def server_span_headers(span: Span | None) -> dict[str, str] | None:
    """The span's ``traceparent``, for the engine's request to join its trace."""
    return inject_trace_headers(span) if span is not None else None


def end_server_span(span: Span | None, status_code: int | None) -> None:
    """``status_code`` None: the request ended without a response (cancelled, or an error)."""
    if span is None:
        return
    if status_code is None:
        span.set_status(Status(StatusCode.ERROR, "no response: the client left or the handler failed"))
    else:
        span.set_attribute(Attr.HTTP_RESPONSE_STATUS_CODE, int(status_code))
        if status_code >= 500:
            span.set_status(Status(StatusCode.ERROR))
    span.end()
