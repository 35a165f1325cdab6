"""OpenTelemetry glue, used only when the ``opentelemetry-api`` package is installed (an
optional dependency: ``pip install sepp[opentelemetry]``). Without it, both functions do
nothing and sepp works unchanged.

The rule itself lives in the client core (``sepp_rs::trace``): an enqueue without its own trace
context sends the caller's current one; a worker runs each handler inside a ``sepp.handle``
span, kind consumer, whose parent is the job's trace context. This module only reads and starts
spans through OpenTelemetry's API.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Optional

if TYPE_CHECKING:
    from sepp._native import Lease

try:
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context as _Context
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator as _Propagator,
    )
except ImportError:  # pragma: no cover - exercised by the tests without opentelemetry
    _trace = None  # type: ignore[assignment]


def current_trace_context() -> Optional[tuple[str, Optional[str]]]:
    """The current span's W3C trace context as ``(traceparent, tracestate)``, or ``None`` when
    there is no valid current span or OpenTelemetry is not installed. Called by the native
    client at every enqueue."""
    if _trace is None:
        return None
    carrier: dict[str, str] = {}
    _Propagator().inject(carrier)
    traceparent = carrier.get("traceparent")
    if not traceparent:
        return None
    return traceparent, carrier.get("tracestate") or None


@contextmanager
def handler_span(lease: Lease) -> Iterator[None]:
    """Runs the body inside the job's handler span (current for the body's duration), or
    directly when OpenTelemetry is not installed. An exception leaving the body is recorded on
    the span and sets its status to error."""
    if _trace is None:
        yield
        return
    name, attributes, parent = lease.handler_span()
    if parent is None:
        context = _Context()  # a new trace
    else:
        carrier = {"traceparent": parent[0]}
        if parent[1]:
            carrier["tracestate"] = parent[1]
        context = _Propagator().extract(carrier)
    tracer = _trace.get_tracer("sepp")
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=_trace.SpanKind.CONSUMER,
        attributes=dict(attributes),
    ):
        yield
