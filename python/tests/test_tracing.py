"""Trace propagation with OpenTelemetry's Python API installed: the producer's current span goes
out with the job, and the worker runs the handler in a ``sepp.handle`` span that is its child.
Without OpenTelemetry, nothing changes (checked in a subprocess that cannot import it)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import uuid
from datetime import timedelta

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sepp
from sepp import EnqueueRequest, JobContext, Worker

from conftest import Server

WAIT = timedelta(milliseconds=500)


async def test_the_handler_span_is_a_child_of_the_producer_span(worker_server: Server) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("shop")
    queue = f"traced-{uuid.uuid4().hex[:8]}"
    async with await sepp.SeppClient.connect(worker_server.url) as client:
        # The request sets no trace context: the current span's goes with it.
        with tracer.start_as_current_span("checkout") as producer:
            await client.enqueue(EnqueueRequest(queue, "t"))
        p = producer.get_span_context()

        seen: asyncio.Future[tuple[trace.SpanContext, str]] = asyncio.get_running_loop().create_future()

        async def handle(ctx: JobContext) -> None:
            carried = ctx.job.trace_context
            assert carried is not None
            seen.set_result((trace.get_current_span().get_span_context(), carried.traceparent))

        worker = Worker(client, [queue], wait_timeout=WAIT)
        worker.handle("t", handle)
        running = asyncio.ensure_future(worker.run())
        in_handler, traceparent = await asyncio.wait_for(seen, 30)
        worker.stop()
        await running

    assert traceparent.startswith(f"00-{p.trace_id:032x}-{p.span_id:016x}-")
    assert in_handler.trace_id == p.trace_id
    handle_span = next(s for s in exporter.get_finished_spans() if s.name == "sepp.handle")
    assert handle_span.context.span_id == in_handler.span_id
    assert handle_span.parent is not None and handle_span.parent.span_id == p.span_id
    assert handle_span.kind == trace.SpanKind.CONSUMER
    assert handle_span.attributes is not None
    assert handle_span.attributes["messaging.destination.name"] == queue


def test_without_opentelemetry_nothing_changes(worker_server: Server) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        import sepp

        async def main():
            async with await sepp.SeppClient.connect({worker_server.url!r}) as c:
                await c.enqueue(sepp.EnqueueRequest("untraced", "t"))
                seen = asyncio.get_running_loop().create_future()

                async def handle(ctx):
                    seen.set_result(ctx.job.trace_context)

                w = sepp.Worker(c, ["untraced"], wait_timeout=__import__("datetime").timedelta(milliseconds=500))
                w.handle("t", handle)
                run = asyncio.ensure_future(w.run())
                print("trace_context:", await asyncio.wait_for(seen, 30))
                w.stop()
                await run

        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "trace_context: None" in out.stdout
