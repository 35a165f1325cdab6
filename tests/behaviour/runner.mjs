// The Node runner of the cross-language behaviour suite (scenarios.json describes the steps).
//
//   node runner.mjs URL SCENARIOS OUT RUN
//
// Runs every scenario through the `sepp` npm package (js/, built) against the server at URL and
// writes what it observed to OUT, in the format of the Rust runner (src/bin/behaviour_runner.rs).
// To restart the server it prints `restart-server` and waits for `restarted` on standard input.

import { once } from "node:events";
import { readFile, writeFile } from "node:fs/promises";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { HandlerError, JobRejectedError, SeppClient, Worker } from "../../js/sepp.js";

const DEADLINE_MS = 30_000;

const input = createInterface({ input: process.stdin });
const inputLines = input[Symbol.asyncIterator]();

/** `camelCase` (the Node client's enums) as the SCREAMING_SNAKE the other runners record. */
const screaming = (/** @type {string | null | undefined} */ s) =>
  s == null ? null : s.replace(/([A-Z])/g, "_$1").toUpperCase();

/** A rejection error's code, message and fields, under the other runners' names. */
function rejection(/** @type {any} */ e) {
  /** @type {Record<string, unknown>} */
  const fields = {};
  for (const [key, prop] of [
    ["queue", "queue"],
    ["limit", "limit"],
    ["actual", "actual"],
    ["encoding", "encoding"],
    ["allowed", "allowed"],
    ["job_type", "jobType"],
    ["key", "key"],
  ]) {
    // ScheduledTooFar's deprecated `actual` is a Date: a time, left out like the others do.
    if (e[prop] !== undefined && !(e[prop] instanceof Date)) fields[key] = e[prop];
  }
  return { code: e.code, message: e.message, fields };
}

const reached = (/** @type {string} */ state, /** @type {string} */ wanted) =>
  wanted === "gone" ? state === "UNKNOWN" || state === "ACKED" : state === wanted;

async function waitUntil(/** @type {() => Promise<boolean>} */ check, /** @type {string} */ what) {
  const deadline = Date.now() + DEADLINE_MS;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

class Runner {
  /** @type {Map<string, string>} */
  jobs = new Map();
  /** @type {{ worker: Worker, run: Promise<any> } | undefined} */
  worker;
  stopping = deferred();
  started = 0;

  constructor(/** @type {SeppClient} */ client, /** @type {string} */ run) {
    this.client = client;
    this.run = run;
  }

  text(/** @type {any} */ v) {
    if (typeof v === "string") return v.replaceAll("{run}", this.run);
    const [s, n] = v.repeat;
    return String(s).repeat(n);
  }

  request(/** @type {any} */ spec) {
    /** @type {any} */
    const r = { queue: this.text(spec.queue ?? ""), jobType: this.text(spec.job_type ?? "") };
    if (spec.payload) r.payload = { data: Buffer.from(spec.payload.data), encoding: spec.payload.encoding };
    if (spec.idempotency_key !== undefined) r.idempotencyKey = this.text(spec.idempotency_key);
    if (spec.priority !== undefined) r.priority = spec.priority;
    if (spec.max_attempts !== undefined) r.maxAttempts = spec.max_attempts;
    if (spec.custom) r.custom = spec.custom;
    if (spec.traceparent !== undefined) {
      r.traceContext = { traceparent: spec.traceparent };
      if (spec.tracestate !== undefined) r.traceContext.tracestate = spec.tracestate;
    }
    if (spec.scheduled_in_ms !== undefined) r.scheduledAt = new Date(Date.now() + spec.scheduled_in_ms);
    return { request: r, name: spec.as === undefined ? undefined : this.text(spec.as) };
  }

  async step(/** @type {string} */ kind, /** @type {any} */ arg) {
    switch (kind) {
      case "enqueue": {
        const { request, name } = this.request(arg);
        try {
          const ack = await this.client.enqueue(request);
          if (name !== undefined) this.jobs.set(name, ack.jobId);
          return { accepted: true, deduplicated: ack.deduplicated };
        } catch (e) {
          if (e instanceof JobRejectedError) return { rejected: rejection(e) };
          throw e;
        }
      }
      case "enqueue_batch": {
        const specs = arg.map((/** @type {any} */ s) => this.request(s));
        const results = await this.client.enqueueBatch(specs.map((/** @type {any} */ s) => s.request));
        return results.map((r, i) => {
          if (r.status === "rejected") return { rejected: rejection(r.error) };
          if (specs[i].name !== undefined) this.jobs.set(specs[i].name, r.jobId);
          return { accepted: true, deduplicated: r.deduplicated };
        });
      }
      case "enqueue_atomic": {
        const result = await this.client.enqueueAtomic(arg.map((/** @type {any} */ s) => this.request(s).request));
        if (result.status === "committed") return { committed: result.acks.length };
        return { rejected: result.failures.map((f) => ({ index: f.index, rejection: rejection(f.error) })) };
      }
      case "start_worker":
        this.startWorker(arg);
        return null;
      case "wait_started":
        await waitUntil(async () => this.started >= arg, "handlers to start");
        return null;
      case "wait_jobs":
        for (const [name, state] of Object.entries(arg)) {
          const id = /** @type {string} */ (this.jobs.get(name));
          await waitUntil(
            async () => reached(screaming((await this.client.getJob(id)).state) ?? "", /** @type {string} */ (state)),
            `job ${name} to be ${state}`,
          );
        }
        return null;
      case "stop_worker": {
        const running = this.worker;
        if (!running) throw new Error("no worker is running");
        this.stopping.resolve(undefined);
        await running.worker.stop();
        const report = await running.run;
        this.worker = undefined;
        return { acked: report.acked, nacked: report.nacked, lease_lost: report.leaseLost, abandoned: report.abandoned };
      }
      case "restart_server": {
        process.stdout.write("restart-server\n");
        const { value } = await inputLines.next();
        if (value?.trim() !== "restarted") throw new Error(`expected "restarted", got ${value}`);
        return null;
      }
      case "jobs": {
        /** @type {Record<string, unknown>} */
        const record = {};
        for (const name of arg) {
          const info = await this.client.getJob(/** @type {string} */ (this.jobs.get(name)));
          record[name] = {
            state: screaming(info.state),
            attempt: info.attempt,
            dead_letter_cause: screaming(info.deadLetterCause),
            last_reason: info.lastReason ?? null,
          };
        }
        return record;
      }
      case "carried": {
        /** @type {Record<string, unknown>} */
        const record = {};
        for (const name of arg) {
          const info = await this.client.getJob(/** @type {string} */ (this.jobs.get(name)));
          const { payload, traceContext: trace } = info;
          if (payload && !(payload.data instanceof Uint8Array)) throw new Error("payload data is not a Uint8Array");
          record[name] = {
            payload: payload
              ? { encoding: payload.encoding, data_hex: Buffer.from(payload.data).toString("hex") }
              : null,
            custom: info.custom,
            trace_context: trace ? { traceparent: trace.traceparent, tracestate: trace.tracestate ?? null } : null,
          };
        }
        return record;
      }
      case "dead_letters": {
        const page = await this.client.listDeadLetters({ queue: this.text(arg), pageSize: 100 });
        const records = page.records.map((r) => ({
          job_type: r.job.jobType,
          cause: screaming(r.cause),
          final_attempt: r.finalAttempt,
          last_reason: r.lastReason ?? null,
        }));
        const key = (/** @type {{ job_type: string }} */ r) => JSON.stringify(r.job_type);
        return records.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
      }
      case "queue_stats": {
        const s = await this.client.getQueueStats(this.text(arg));
        return { ready: s.ready, scheduled: s.scheduled, in_flight: s.inFlight, dead_lettered: s.deadLettered };
      }
      default:
        throw new Error(`unknown step ${kind}`);
    }
  }

  startWorker(/** @type {any} */ spec) {
    /** @type {any} */
    const options = {
      queues: spec.queues.map((/** @type {any} */ q) => this.text(q)),
      waitTimeoutMs: spec.wait_timeout_ms ?? 500,
      handleSignals: false,
    };
    if (spec.lease_duration_ms !== undefined) options.leaseDurationMs = spec.lease_duration_ms;
    if (spec.auto_extend !== undefined) options.autoExtend = spec.auto_extend;
    if (spec.max_in_flight !== undefined) options.maxInFlight = spec.max_in_flight;
    if (spec.shutdown_timeout_ms !== undefined) options.shutdownTimeoutMs = spec.shutdown_timeout_ms;
    if (spec.handler_timeout_ms !== undefined) options.handlerTimeoutMs = spec.handler_timeout_ms;
    // Handlers that throw on purpose are not worth a line on standard error.
    const worker = new Worker(this.client, { ...options, onError: () => {} });
    for (const [jobType, behaviour] of Object.entries(spec.handlers)) {
      worker.handle(jobType, this.handler(behaviour));
    }
    this.stopping = deferred();
    this.started = 0;
    this.worker = { worker, run: worker.run() };
  }

  handler(/** @type {any} */ behaviour) {
    return async (/** @type {any} */ _job, /** @type {{ signal: AbortSignal }} */ { signal }) => {
      this.started += 1;
      if (behaviour === "ack") return;
      if (behaviour === "hang") {
        await once(signal, "abort"); // the engine let go of the job
        return;
      }
      if (behaviour === "finish_on_stop") {
        await this.stopping.promise;
        return;
      }
      const [[kind, arg]] = Object.entries(behaviour);
      if (kind === "retry") throw HandlerError.retry(arg);
      if (kind === "retry_after") throw HandlerError.retryAfter(arg[0], arg[1]);
      if (kind === "permanent") throw HandlerError.permanent(arg);
      if (kind === "raise") throw new Error(arg);
      throw new Error(`unknown behaviour ${JSON.stringify(behaviour)}`);
    };
  }
}

function deferred() {
  /** @type {(value: unknown) => void} */
  let resolve = () => {};
  /** @type {Promise<unknown>} */
  const promise = new Promise((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const [url, scenarios, out, run] = process.argv.slice(2);
const script = JSON.parse(await readFile(scenarios, "utf8"));
const client = await SeppClient.connect(url);
const runner = new Runner(client, run);
const results = [];
for (const scenario of script.scenarios) {
  const records = [];
  for (const step of scenario.steps) {
    const [[kind, arg]] = Object.entries(step);
    const record = await runner.step(kind, arg);
    if (record !== null) records.push({ step: kind, record });
  }
  results.push({ name: scenario.name, records });
}
client.close();
input.close();
await writeFile(out, JSON.stringify({ scenarios: results }, null, 2));
