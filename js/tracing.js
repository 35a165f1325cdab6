// Internal: OpenTelemetry glue, used only when `@opentelemetry/api` can be loaded (an optional
// peer dependency). Without it, both functions do nothing and sepp works unchanged.
//
// The rule lives in the client core (`sepp_rs::trace`): an enqueue without its own trace
// context sends the caller's current one (the native client applies it to what
// `currentTraceContext` returns); a worker runs each handler inside the span the core describes
// (`Lease.handlerSpan()`). This file only reads and starts spans through OpenTelemetry's API.

import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

/** @type {any} `@opentelemetry/api`, `null` when it cannot be loaded; loaded on first use. */
let otel;

function api() {
  if (otel === undefined) {
    try {
      otel = require("@opentelemetry/api");
    } catch {
      otel = null;
    }
  }
  return otel;
}

/**
 * The active span's W3C trace context as `[traceparent, tracestate]`, or `[]` without a valid
 * active span or without OpenTelemetry: the trailing arguments of the native enqueue calls.
 * @returns {[string, string | undefined] | []}
 */
export function currentTraceContext() {
  const o = api();
  if (o === null) return [];
  const sc = o.trace.getSpanContext(o.context.active());
  if (sc === undefined || !o.trace.isSpanContextValid(sc)) return [];
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
  return [`00-${sc.traceId}-${sc.spanId}-${flags}`, sc.traceState?.serialize() || undefined];
}

/**
 * Runs `body` (the job's handler, resolving to its outcome) inside the job's handler span,
 * current while it runs, or just runs it without OpenTelemetry. The span ends when the
 * outcome is known, or when `ended` resolves (the engine let go of the job first); an outcome
 * other than success, or such an end, sets the span's status to error with the reason.
 * @template {{ kind: string, reason?: string }} T
 * @param {import("./index.js").Lease} lease
 * @param {() => Promise<T>} body
 * @param {Promise<{ end: { reason: string } }>} ended
 * @returns {Promise<T>}
 */
export function inHandlerSpan(lease, body, ended) {
  const o = api();
  if (o === null) return body();
  const { name, attributes, parent } = lease.handlerSpan();
  const parentContext =
    parent === undefined || parent === null
      ? o.ROOT_CONTEXT
      : o.trace.setSpanContext(o.ROOT_CONTEXT, {
          traceId: parent.traceId,
          spanId: parent.spanId,
          traceFlags: parent.traceFlags,
          isRemote: true,
          ...(parent.traceState ? { traceState: o.createTraceState(parent.traceState) } : {}),
        });
  const span = o.trace
    .getTracer("sepp")
    .startSpan(name, { kind: o.SpanKind.CONSUMER, attributes }, parentContext);
  let open = true;
  /** @param {string} [reason] */
  const end = (reason) => {
    if (!open) return;
    open = false;
    if (reason !== undefined) span.setStatus({ code: o.SpanStatusCode.ERROR, message: reason });
    span.end();
  };
  ended.then(({ end: e }) => end(e.reason));
  const ran = o.context.with(o.trace.setSpan(parentContext, span), body);
  ran.then((outcome) => end(outcome.kind === "success" ? undefined : (outcome.reason ?? outcome.kind)));
  return ran;
}
