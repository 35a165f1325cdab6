// Trace propagation through OpenTelemetry's API (an optional peer dependency), against the real
// server: the producer's active span goes with each enqueue as the job's trace context, and the
// Worker runs each handler in a `sepp.handle` consumer span whose parent is that context (the
// rule is the core's, sepp_rs::trace). Spans are collected with the SDK's in-memory exporter.
// A child process without `@opentelemetry/api` resolvable shows sepp working unchanged.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { context, propagation, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { HandlerError, SeppClient, Worker } from "sepp";
import { startServer } from "../test-support/server.js";

const T = { timeout: 30_000 };
const exporter = new InMemorySpanExporter();

/** @type {Awaited<ReturnType<typeof startServer>>} */
let server;
/** @type {SeppClient} */
let client;

before(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(
    new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
  );
  server = await startServer();
  client = await SeppClient.connect(server.url, { rpcTimeoutMs: 10_000 });
});

after(async () => {
  client?.close();
  await server?.stop();
  trace.disable();
  context.disable();
  propagation.disable();
});

/** Runs a Worker on `queue` until `count` jobs were handled; resolves to what they saw. */
async function handle(queue, count, handler) {
  const worker = new Worker(client, { queues: [queue] });
  /** @type {{ job: any, active: any }[]} */
  const seen = [];
  worker.fallback(async (job) => {
    seen.push({ job, active: trace.getActiveSpan()?.spanContext() });
    if (seen.length === count) void worker.stop();
    await handler?.(job);
  });
  await worker.run();
  return seen;
}

test("the producer's span goes with each enqueue and parents the handler's sepp.handle span", T, async () => {
  const queue = "traced";
  const tracer = trace.getTracer("test");
  const producer = await tracer.startActiveSpan("produce", async (span) => {
    await client.enqueue({ queue, jobType: "one" });
    await client.enqueueBatch([{ queue, jobType: "batch" }]);
    await client.enqueueAtomic([{ queue, jobType: "atomic" }]);
    span.end();
    return span.spanContext();
  });
  const seen = await handle(queue, 3);
  const handled = exporter.getFinishedSpans().filter((s) => s.name === "sepp.handle");
  assert.equal(handled.length, 3);
  for (const { job, active } of seen) {
    // The job's stored context is the producer span's.
    assert.equal(
      job.traceContext?.traceparent,
      `00-${producer.traceId}-${producer.spanId}-01`,
      job.jobType,
    );
    // The handler ran with its sepp.handle span current, a child of the producer span.
    const span = handled.find((s) => s.spanContext().spanId === active?.spanId);
    assert.ok(span, `the active span of ${job.jobType}'s handler is its sepp.handle span`);
    assert.equal(span.spanContext().traceId, producer.traceId);
    assert.equal(span.parentSpanContext?.spanId, producer.spanId);
    assert.equal(span.parentSpanContext?.isRemote, true);
    assert.equal(span.kind, SpanKind.CONSUMER);
    assert.deepEqual(span.attributes, {
      "messaging.system": "sepp",
      "messaging.operation.type": "process",
      "messaging.destination.name": queue,
      "messaging.message.id": job.id,
      "sepp.job_type": job.jobType,
      "sepp.attempt": "1",
    });
    assert.equal(span.status.code, SpanStatusCode.UNSET);
  }
});

test("an explicit trace context wins; a job without a valid one starts a new trace; a failure marks the span", T, async () => {
  exporter.reset();
  const queue = "traced-explicit";
  const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  await trace.getTracer("test").startActiveSpan("produce", async (span) => {
    await client.enqueue({ queue, jobType: "explicit", traceContext: { traceparent: explicit } });
    span.end();
  });
  // No active span: no context sent.
  await client.enqueue({ queue, jobType: "none" });
  await client.enqueue({ queue, jobType: "invalid", traceContext: { traceparent: "not-w3c" } });
  const seen = await handle(queue, 3, (job) => {
    if (job.jobType === "invalid") throw HandlerError.permanent("bad job");
  });
  const byType = Object.fromEntries(seen.map(({ job, active }) => [job.jobType, { job, active }]));
  const spans = exporter.getFinishedSpans().filter((s) => s.name === "sepp.handle");
  const spanOf = (/** @type {string} */ t) =>
    spans.find((s) => s.spanContext().spanId === byType[t]?.active?.spanId);

  assert.equal(byType.explicit?.job.traceContext?.traceparent, explicit);
  assert.equal(spanOf("explicit")?.parentSpanContext?.spanId, "b7ad6b7169203331");
  assert.equal(spanOf("explicit")?.spanContext().traceId, "0af7651916cd43dd8448eb211c80319c");

  assert.equal(byType.none?.job.traceContext, undefined);
  assert.equal(spanOf("none")?.parentSpanContext, undefined);

  assert.equal(byType.invalid?.job.traceContext?.traceparent, "not-w3c");
  const invalid = spanOf("invalid");
  assert.equal(invalid?.parentSpanContext, undefined);
  assert.equal(invalid?.status.code, SpanStatusCode.ERROR);
  assert.equal(invalid?.status.message, "bad job");
});

test("without @opentelemetry/api resolvable, enqueue and the Worker work unchanged", T, async () => {
  const dir = fileURLToPath(new URL("../test-support/", import.meta.url));
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ["--require", `${dir}no-otel.cjs`, `${dir}trace-child.js`, server.url, "untraced"],
    { timeout: 20_000 },
  );
  const line = stdout.split("\n").find((l) => l.startsWith("ok "));
  assert.ok(line, stdout);
  const { otel, seen, acked } = JSON.parse(line.slice(3));
  assert.equal(otel, "absent");
  assert.deepEqual(seen, ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", null, null]);
  assert.equal(acked, 3);
});
